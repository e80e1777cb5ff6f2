"""One small run of every stage through the real command line, on this machine's CPU."""
from __future__ import annotations

import csv
import functools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from perf4sight.features.aggregate import feature_matrix, network_features
from perf4sight.fingerprint.gnn import load_predictor
from perf4sight.fingerprint.predict import load_fingerprint
from perf4sight.ir.schema import load_description

ROOT = Path(__file__).resolve().parents[1]

CONFIG = """
[networks]
zoo = ["squeezenet1_1", "resnet18"]
input_shape = [3, 32, 32]
num_classes = 10
[networks.pruning]
levels = [0, 50]
[profile]
batch_sizes = [2, 4]
warmup_steps = 1
timed_steps = 2
timeout_s = 120
op_prices = true
[devices.local]
backend = "cpu"
threads = 1
[fingerprint]
n_estimators = 20
gnn_hidden = 16
gnn_layers = 2
gnn_max_epochs = 30
[compare]
networks = ["squeezenet1_1"]
pruning_levels = [75, 0, 50]
pruning_batch_size = 4
"""


def main_py(tmp_path: Path, *args: str, python: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *python, str(ROOT / "main.py"), "--config", str(tmp_path / "config.toml"),
                           *args], capture_output=True, text=True, cwd=tmp_path, timeout=600)


def imported(stderr: str) -> set[str]:
    """The modules a run under ``python -X importtime`` imported."""
    return {line.rsplit("|", 1)[-1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def analytic_part(tmp_path: Path, description: Path, batch_size: int, target: str = "memory") -> float:
    """The analytic part of the run's CPU model of ``target`` for one description file (MiB or ms): what must grow
    with a network's size, where the tree correction of 8 rows is within the noise of the rows it was fitted on (the
    RSS of a ~700 MB process; step times that move +-20% on a busy host)."""
    fp = load_fingerprint(tmp_path / "fingerprinting" / "local")
    nf = network_features(load_description(description), fp.runtime)
    return float(fp.models[target].analytic(feature_matrix([nf], [batch_size]))[0])


PREDICTION_KEYS = {"network", "batch_size", "latency_ms", "latency_ms_low", "latency_ms_high", "memory_mb",
                   "memory_mb_low", "memory_mb_high", "fits"}


@pytest.fixture(scope="module")
def all_stages(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """``--stage all --json`` with CONFIG in a folder of its own (8 real measurements): the folder and the run. The
    tests below each work on a copy (``shutil.copytree`` keeps the files' times, which the stages compare)."""
    folder = tmp_path_factory.mktemp("all")
    (folder / "config.toml").write_text(CONFIG)
    run = main_py(folder, "--stage", "all", "--json")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return folder, run


def test_all_stages_then_predict_json(all_stages, tmp_path, cli_here):
    folder, run = all_stages
    shutil.copytree(folder, tmp_path, dirs_exist_ok=True)
    # a predict that imports torch, where the process boundary is not what is checked: in this process
    here = functools.partial(cli_here, tmp_path, "--config", str(tmp_path / "config.toml"))
    # --json: stdout is the predict stage's JSON lines alone ([networks] zoo at [predict] batch_sizes' default 8);
    # banners, progress, accuracy tables, the compare table and the summary go to stderr
    predicted = [json.loads(line) for line in run.stdout.splitlines()]
    assert [(p["network"], p["batch_size"]) for p in predicted] == [("squeezenet1_1", 8), ("resnet18", 8)]
    assert all(set(p) == PREDICTION_KEYS for p in predicted)
    assert "MAPE" in run.stderr and "summary of --stage all" in run.stderr and "networks held out" in run.stderr
    manifest = list(csv.DictReader((tmp_path / "models" / "manifest.csv").open()))
    assert len(manifest) == 4
    rows = list(csv.DictReader((tmp_path / "profiling_csvs" / "local" / "measurements.csv").open()))
    assert len(rows) == 8 and all(r["status"] == "ok" for r in rows)
    assert all(float(r["peak_rss_mb"]) >= float(r["baseline_rss_mb"]) > 0 for r in rows)
    meta = json.loads((tmp_path / "fingerprinting" / "local" / "metadata.json").read_text())
    assert meta["memory_target"] == "peak_rss_mb" and meta["device"] == "local"
    # the CPU's op prices, measured after the sweep, are the fingerprint's, and a step-time term of its forms
    prices = tmp_path / "profiling_csvs" / "local" / "op_prices.json"
    assert meta["op_prices"] == json.loads(prices.read_text())["ops"]
    assert "priced_ops_ms" in meta["linear_terms"]["latency"]
    priced_at = prices.stat().st_mtime_ns
    held = list(csv.DictReader((tmp_path / "fingerprinting" / "local" / "held_out.csv").open()))
    assert "held_out.csv" in meta["files"] and len(held) == sum(meta["training_rows"].values())
    # the compare report's pruning section: the dataset's variants (crosses: their rows at batch 4), and a level
    # nobody profiled pruned on request
    (report,) = (tmp_path / "reports").glob("compare-*")
    pruned = json.loads((report / "data.json").read_text())["pruning"]
    assert [(p["level"], p["measured_status"]) for p in pruned] == [(0, "ok"), (50, "ok"), (75, "")]
    assert pruned[0]["measured_latency_ms"] == float(next(
        r["latency_ms_median"] for r in rows if r["network"] == "squeezenet1_1_l0" and r["batch_size"] == "4"))
    # step time and memory: the analytic parts fall with pruning; the tree corrections, fitted on 8 rows, may order
    # the levels either way within those rows' noise. Step time: a host at load 5.8 once predicted level 75 at
    # 24.8 ms against level 0's 22.6 (the analytic parts fell); memory: pruning squeezenet at 3x32x32 frees ~1 % of
    # a ~700 MB process (a CI host: 703.7 MB at level 0, 707.4 MB at 75)
    level0 = next(tmp_path / "models" / m["path"] for m in manifest if m["network"] == "squeezenet1_1_l0")
    (level75,) = (tmp_path / "models" / "zoo-cache").glob("squeezenet1_1_l75-3x32x32-*.json")
    assert analytic_part(tmp_path, level0, 4, "latency") > analytic_part(tmp_path, level75, 4, "latency")
    assert pruned[2]["latency_ms"] < 1.2 * pruned[0]["latency_ms"]
    assert analytic_part(tmp_path, level0, 4) > analytic_part(tmp_path, level75, 4)
    assert abs(pruned[2]["memory_mb"] / pruned[0]["memory_mb"] - 1) < 0.03
    assert 70 < pruned[2]["achieved"] < 80 and all(p["max_batch"] is None for p in pruned)  # no capacity known
    assert json.loads((report / "data.json").read_text())["pruning_least"] == []  # nothing to fit under
    assert (report / "pruning.png").is_file() and "## Pruning" in (report / "report.md").read_text()
    assert ("pruned on request as the networks stage would (l1-norm, min_channels 4, seed 0): at 3x32x32: "
            "squeezenet1_1_l75") in " ".join(run.stderr.split())

    # resume: nothing new, nothing duplicated, the prices kept; the host loads no torch for it (seconds on a small one)
    again = main_py(tmp_path, "--stage", "profile", python=("-X", "importtime"))
    assert again.returncode == 0 and "changed since the networks stage" not in again.stderr
    assert "perf4sight.profiling.fleet" in imported(again.stderr) and "torch" not in imported(again.stderr)
    assert prices.stat().st_mtime_ns == priced_at
    assert len(list(csv.DictReader((tmp_path / "profiling_csvs" / "local" / "measurements.csv").open()))) == 8
    (tmp_path / "config.toml").write_text(CONFIG.replace("levels = [0, 50]", "levels = [0, 40]"))
    edited = main_py(tmp_path, "--stage", "profile")  # [networks] edited, networks stage not rerun: said so
    assert edited.returncode == 0 and "changed since the networks stage wrote" in edited.stderr
    assert len(list(csv.DictReader((tmp_path / "profiling_csvs" / "local" / "measurements.csv").open()))) == 8
    (tmp_path / "config.toml").write_text(CONFIG)

    pred = here("--stage", "predict", "--device", "local", "--network", "resnet18",
                manifest[0]["path"] and str(tmp_path / "models" / manifest[0]["path"]), "resnet18_l25",
                "--batch-size", "2", "8", "--json")
    assert pred.returncode == 0, pred.stderr
    assert "batch size 8: outside the training rows' 2..4" in pred.stderr  # a note, on stderr beside the JSON
    assert "capacity is unknown" in pred.stderr  # no oom row, no memory_limit_mb: 'fits' says nothing
    assert "or set the device's memory_limit_mb" in pred.stderr  # a cpu device takes one (an nvml GPU refuses it)
    # a level no one profiled: pruned on request, as the networks stage would, and said so
    assert "note: resnet18_l25: not in the dataset: resnet18 pruned on request as the networks stage would (l1-norm, " \
           "min_channels 4, seed 0: 2" in " ".join(pred.stderr.split())
    # all three are of the two training families: their interval where the fit stored one (a band of their own
    # that held its coverage on these measured rows, select.seen_family_band; else a family never seen's), and the
    # CPU's mean form's tree corrections
    own = sorted(meta["interval"]["log_ratio_quantiles_seen"])
    band = {"latency memory": "the interval of such networks",
            "latency": "the interval of such networks for its step time, a family never seen's for the other",
            "memory": "the interval of such networks for its memory, a family never seen's for the other",
            "": "the interval of a family never seen (no band of such networks held its coverage)"}[" ".join(own)]
    assert (f"note: resnet18, {manifest[0]['network']}, resnet18_l25: of a family this fingerprint was trained on: "
            f"{band}; the step time with its forms' tree corrections") in " ".join(pred.stderr.split())
    assert "changed after its fingerprint was fitted" not in pred.stderr  # the resumed profile wrote nothing
    lines = [json.loads(line) for line in pred.stdout.splitlines()]
    assert [(p["network"], p["batch_size"]) for p in lines] == [
        ("resnet18", 2), ("resnet18", 8), (manifest[0]["network"], 2), (manifest[0]["network"], 8),
        ("resnet18_l25", 2), ("resnet18_l25", 8)]
    for p in lines:
        assert set(p) == PREDICTION_KEYS and p["fits"] is None  # unknown capacity: not known, not 'yes'
        assert p["latency_ms_low"] <= p["latency_ms"] <= p["latency_ms_high"]
        assert p["memory_mb_low"] <= p["memory_mb"] <= p["memory_mb_high"]

    # description files, and zoo names and variants described before (models/zoo-cache/): predicting imports
    # neither torch nor scipy (seconds to load)
    assert len(list((tmp_path / "models" / "zoo-cache").glob("resnet18-3x32x32-*.json"))) == 1
    assert len(list((tmp_path / "models" / "zoo-cache").glob("resnet18_l25-3x32x32-*.json"))) == 1
    desc_only = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "main.py"), "--config",
                                str(tmp_path / "config.toml"), "--stage", "predict", "--device", "local", "--network",
                                str(tmp_path / "models" / manifest[0]["path"]), "resnet18", "resnet18", "resnet18_l25",
                                "--batch-size", "2", "2", "--json"],  # each given twice: predicted once
                               capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert desc_only.returncode == 0, desc_only.stderr[-3000:]
    assert "perf4sight.fingerprint" in imported(desc_only.stderr)
    assert not {"torch", "torchvision", "scipy"} & imported(desc_only.stderr)
    assert [json.loads(line) for line in desc_only.stdout.splitlines()] == [lines[2], lines[0], lines[4]]

    # --input-shape: the zoo name described at it and the dataset's variant rebuilt at it are one network, larger
    # than at the training shape; a description file of three channels cannot take one
    at_48 = here("--stage", "predict", "--network", "resnet18", "resnet18_l0", "--batch-size", "2",
                 "--input-shape", "3", "48", "48", "--json")
    assert at_48.returncode == 0, at_48.stderr
    zoo_48, dataset_48 = ({k: v for k, v in json.loads(line).items() if k != "network"}
                          for line in at_48.stdout.splitlines())
    assert zoo_48 == dataset_48  # larger than at the training shape: the analytic part (the trees' is RSS noise)
    cached = {n: next((tmp_path / "models" / "zoo-cache").glob(f"resnet18-3x{n}x{n}-*.json")) for n in (32, 48)}
    assert analytic_part(tmp_path, cached[48], 2) > analytic_part(tmp_path, cached[32], 2)
    assert ("resnet18, resnet18_l0 described at another input shape than this fingerprint's training networks "
            "(3x32x32): expect larger errors") in " ".join(at_48.stderr.split())
    assert " ".join(at_48.stderr.split()).count("described at another input shape") == 1  # not again in the domain's
    gray = here("--stage", "predict", "--network", str(tmp_path / "models" / manifest[0]["path"]),
                "--batch-size", "2", "--input-shape", "1", "32", "32")
    assert gray.returncode == 2 and gray.stderr.strip().splitlines()[-1].startswith(
        f"error: {manifest[0]['network']}: takes 3-channel images (described at 3x32x32), not 1-channel ones")

    csv_path = tmp_path / "profiling_csvs" / "local" / "measurements.csv"
    with csv_path.open(newline="") as f:
        measured = list(csv.DictReader(f))
    first_ok = next(r for r in measured if r["status"] == "ok")  # measured again since, a little slower
    first_ok["latency_ms_median"] = str(float(first_ok["latency_ms_median"]) * 1.01)
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(measured[0]))
        writer.writeheader()
        writer.writerows(measured)
    os.utime(csv_path, (csv_path.stat().st_atime, csv_path.stat().st_mtime + 60))  # later than the fingerprint
    stale = here("--stage", "predict", "--network", "resnet18", "--batch-size", "2")
    assert "local: " in stale.stderr and "changed after its fingerprint was fitted" in stale.stderr
    # squeezenet's layers under resnet18's name: predicted as a family never seen, and told so
    (squeeze,) = [r for r in manifest if r["network"] == "squeezenet1_1_l0"]
    impostor = json.loads((tmp_path / "models" / squeeze["path"]).read_text()) | {"name": "sq", "network": "resnet18"}
    (tmp_path / "sq.json").write_text(json.dumps(impostor))
    named = here("--stage", "predict", "--network", str(tmp_path / "sq.json"), "--batch-size", "2")
    assert named.returncode == 0 and ("note: sq (resnet18): named as a training family but with other layers than "
                                      "its training networks") in " ".join(named.stderr.split())
    unknown = here("--stage", "predict", "--network", "resnet18", "--max-batch-size")
    assert unknown.returncode == 2 and "capacity is unknown" in unknown.stderr  # no oom row, no limit
    (tmp_path / "config.toml").write_text(CONFIG.replace('backend = "cpu"', 'backend = "cpu"\nmemory_limit_mb = 100'))
    low = here("--stage", "fingerprint")  # a limit set after the rows were measured under none
    assert low.returncode == 0 and "8 ok rows (resnet18_l0, resnet18_l50, squeezenet1_1_l0, ...) peaked above " \
        "[devices.local] memory_limit_mb = 100 MiB" in " ".join(low.stderr.split())
    (tmp_path / "config.toml").write_text(CONFIG.replace('backend = "cpu"', 'backend = "cpu"\nmemory_limit_mb = 2000'))
    refit = here("--stage", "fingerprint")  # the limit is the capacity now
    assert refit.returncode == 0 and "MAPE" in refit.stdout  # without --json the tables are on stdout
    big = here("--stage", "predict", "--network", "resnet18", "--max-batch-size", "4096", "--json")
    assert big.returncode == 0, big.stderr
    (found,) = [json.loads(line) for line in big.stdout.splitlines()]
    assert set(found) == {"network", "max_batch_size", "search_limit", "capacity_mb", "latency_ms", "memory_mb"}
    b = found["max_batch_size"]
    assert found["capacity_mb"] == 2000 and 1 <= b < 4096 and found["memory_mb"] <= 2000
    over = here("--stage", "predict", "--network", "resnet18", "--batch-size", str(b), str(b + 1), "--json")
    assert [json.loads(line)["fits"] for line in over.stdout.splitlines()] == [True, False]
    # a family never seen (no tree corrections): the search reads the memory that predict gives it too
    import torchvision

    from perf4sight.ir.from_torch import describe
    unseen = describe(torchvision.models.squeezenet1_0(num_classes=10), [3, 32, 32], "squeezenet1_0")
    fp = load_fingerprint(tmp_path / "fingerprinting" / "local")
    b0 = fp.max_batch_size(unseen, 4096)
    assert [p["fits"] for p in fp.predict(unseen, [b0, b0 + 1])] == [True, False]
    table = here("--stage", "predict", "--network", "resnet18", "--batch-size", str(b + 1))
    # the table says what 'fits' means (to 0.1 MiB where a row's memory would read as the capacity: _capacity_mib)
    assert table.returncode == 0 and re.search(r"fits: under 2,000(\.0)? MiB", table.stdout), table.stdout
    # the least pruning at which resnet18 fits a batch it does not fit unpruned: the level below it does not fit
    prune = here("--stage", "predict", "--network", "resnet18", "--batch-size", str(b), str(b + 1),
                 "--prune-to-fit", "--json")
    assert prune.returncode == 0, prune.stderr
    whole, least = [json.loads(line) for line in prune.stdout.splitlines()]
    assert set(least) == PREDICTION_KEYS | {"max_latency_ms", "pruning_level", "achieved_level", "variant"}
    assert whole["pruning_level"] == 0 and whole["variant"] == "resnet18_l0" and whole["fits"] is True
    level = least["pruning_level"]
    assert 0 < level < 99 and least["fits"] is True and least["variant"] == f"resnet18_l{level}"
    assert least["network"] == "resnet18" and abs(least["achieved_level"] - level) <= 2
    below = here("--stage", "predict", "--network", f"resnet18_l{level - 1}", f"resnet18_l{level}",
                 "--batch-size", str(b + 1), "--json")
    assert [json.loads(line)["fits"] for line in below.stdout.splitlines()] == [False, True]
    said = " ".join(prune.stderr.split())
    assert "searched pruning levels 0..99 (whole percents of the parameters) one by one from 0 up" in said
    wrong = here("--stage", "predict", "--network", "gen_0_0", "--batch-size", "2", "--prune-to-fit")
    assert wrong.returncode == 2 and "--prune-to-fit: gen_0_0: cannot be pruned here" in wrong.stderr
    # your own code, named on the command line (FILE.py:FUNCTION): predicted, and pruned as [networks] factories are
    shutil.copy(ROOT / "models" / "imagenet" / "tiny_nets.py", tmp_path / "nets.py")
    mine = here("--stage", "predict", "--network", "nets.py:tiny_vgg", "--batch-size", str(b + 1),
                "--prune-to-fit", "--json")
    assert mine.returncode == 0, mine.stderr
    (own,) = [json.loads(line) for line in mine.stdout.splitlines()]
    assert own["network"] == "tiny_vgg" and own["variant"] == f"tiny_vgg_l{own['pruning_level']}" and own["fits"]
    assert list((tmp_path / "models" / "zoo-cache").glob(f"{own['variant']}-3x32x32-10-*.json"))
    (tmp_path / "spare.py").write_text(  # weights no layer of the forward reads: said, not silently left out
        "from torch import nn\n\n\nclass Spare(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.conv, self.fc, self.spare = nn.Conv2d(3, 8, 3), nn.Linear(8, 10), nn.Linear(512, 512)\n\n"
        "    def forward(self, x):\n        return self.fc(self.conv(x).mean((2, 3)))\n\n\n"
        "def spare(num_classes=10):\n    model = Spare()\n    model.conv.requires_grad_(False)  # a frozen layer\n"
        "    return model\n")
    spare = here("--stage", "predict", "--network", "spare.py:spare", "--batch-size", "2", "--json")
    assert spare.returncode == 0, spare.stderr
    assert ("parameters that no layer of the forward reads are left out of the description, and so of the "
            "prediction: spare 0.26 M (1 MiB as fp32)") in " ".join(spare.stderr.split())
    assert "frozen parameters (requires_grad False): spare 224; the prediction trains the others alone" in " ".join(
        spare.stderr.split())
    from perf4sight.stages import _parameter_notes
    _parameter_notes([SimpleNamespace(name="odd", extra={"unused_params": "1000"}),  # a hand-written file's: none
                         SimpleNamespace(name="flag", extra={"unused_params": True})])
    alone = here("--stage", "predict", "--network", "resnet18", "--max-latency-ms", "5")
    assert alone.returncode == 2 and "--max-latency-ms is the step-time budget of --prune-to-fit" in alone.stderr


def test_gnn_ensemble_and_perfseer_round_trip_through_the_cli(all_stages, tmp_path, cli_here):
    """After the stages: fit the GNN only, predict with it and with the ensemble, export the device's data
    as a PerfSeer dataset and import it back as another device."""
    shutil.copytree(all_stages[0], tmp_path, dirs_exist_ok=True)
    shutil.rmtree(tmp_path / "fingerprinting")  # the measured rows alone: the GNN is fitted first
    # the trees' fit loads scikit-learn (seconds a process): in this process; the GNN's is the real CLI's, as the
    # predictions of the Python API are compared with the CLI's below (OpenBLAS's kernels as main.py pins them)
    here = functools.partial(cli_here, tmp_path, "--config", str(tmp_path / "config.toml"))
    fit = main_py(tmp_path, "--stage", "fingerprint", "--predictor", "gnn")
    assert fit.returncode == 0, fit.stderr[-3000:]
    fp_dir = tmp_path / "fingerprinting" / "local"
    assert (fp_dir / "gnn.json").is_file() and not (fp_dir / "metadata.json").exists()  # only the GNN was fitted
    assert "gnn" in fit.stdout and "MAPE" in fit.stdout
    assert "too few for a graph network" in fit.stderr  # 8 rows: the fit says how little it means

    gnn = main_py(tmp_path, "--stage", "predict", "--predictor", "gnn", "--network", "resnet18",
                  "--batch-size", "2", "8", "--json")
    assert gnn.returncode == 0, gnn.stderr
    assert "batch size 8: outside the training rows' 2..4" in gnn.stderr  # the GNN stores its domain too
    assert "too few for a graph network" in gnn.stderr  # said where it predicts too, not only where it was fitted
    preds = [json.loads(line) for line in gnn.stdout.splitlines()]
    assert [p["batch_size"] for p in preds] == [2, 8] and all(p["latency_ms"] > 0 for p in preds)
    # a network's figures are its own whatever else the query asks, and the Python API's are the CLI's
    pair = main_py(tmp_path, "--stage", "predict", "--predictor", "gnn", "--network", "squeezenet1_1", "resnet18",
                   "--batch-size", "8", "4", "2", "--json")
    assert pair.returncode == 0, pair.stderr
    beside = {p["batch_size"]: p for p in map(json.loads, pair.stdout.splitlines()) if p["network"] == "resnet18"}
    assert [beside[p["batch_size"]] for p in preds] == preds
    (cached,) = (tmp_path / "models" / "zoo-cache").glob("resnet18-3x32x32-*.json")
    api = load_predictor(fp_dir, "gnn").predict(load_description(cached), [2, 8])
    # the same figures to the CLI's 3 decimals, relatively where they are huge: 8 rows give the GNN's band an upper
    # end of 1e12 ms, whose last digits moved between processes in one full run (1047523824279.21 against
    # 1047523834910.975, 1e-8 apart)
    assert [{k: round(v, 3) if isinstance(v, float) else v for k, v in p.items()} for p in api] == [
        {k: pytest.approx(v, rel=1e-6, abs=1e-3) if isinstance(v, float) else v for k, v in p.items()} for p in preds]
    missing = here("--stage", "predict", "--predictor", "ensemble", "--network", "resnet18")
    assert missing.returncode == 2 and "trees" in missing.stderr  # the ensemble needs the trees too

    assert here("--stage", "fingerprint", "--predictor", "trees").returncode == 0
    ens = main_py(tmp_path, "--stage", "predict", "--predictor", "ensemble", "--network", "resnet18",
                  "--batch-size", "2", "--json", python=("-X", "importtime"))
    assert ens.returncode == 0, ens.stderr[-3000:]
    assert not {"torch", "torch_geometric"} & imported(ens.stderr)  # the GNN runs in numpy; resnet18 described before
    (e,) = [json.loads(line) for line in ens.stdout.splitlines()]  # --json: stdout is JSON lines only (notes: stderr)
    t = json.loads(here("--stage", "predict", "--predictor", "trees", "--network", "resnet18", "--batch-size", "2",
                        "--json").stdout)
    # the ensemble is the geometric mean of trees and GNN (figures printed to 0.001 ms, so within 0.002)
    assert abs(e["latency_ms"] - (t["latency_ms"] * preds[0]["latency_ms"]) ** 0.5) < 2e-3
    shutil.copytree(fp_dir, tmp_path / "fingerprinting" / "other")  # another device's folder under this name
    for predictor in ("trees", "gnn", "ensemble"):
        borrowed = here("--stage", "predict", "--device", "other", "--predictor", predictor, "--network", "resnet18",
                        "--batch-size", "2")
        assert borrowed.returncode == 2 and "holds a fingerprint of device 'local', not of 'other'" in borrowed.stderr

    exp = here("--stage", "export", "--format", "perfseer", "--output", str(tmp_path / "ds"))
    assert exp.returncode == 0, exp.stderr
    assert len(list((tmp_path / "ds").glob("*.pkl"))) == len(list((tmp_path / "ds").glob("*.txt"))) == 8
    twice = here("--stage", "export", "--format", "perfseer", "--output", str(tmp_path / "ds"))
    assert twice.returncode == 2 and "is not empty; export into a new or empty folder" in twice.stderr
    assert len(list((tmp_path / "ds").iterdir())) == 16
    imp = here("--stage", "import", "--format", "perfseer", "--source", str(tmp_path / "ds"), "--device", "copy")
    assert imp.returncode == 0, imp.stderr
    assert "copy: 4 networks read from" in imp.stdout and "8 new rows" in imp.stdout
    into_own = here("--stage", "import", "--format", "perfseer", "--source", str(tmp_path / "ds"),
                    "--device", "local")  # the profiled device's own CSV is never mixed with imported rows
    assert into_own.returncode == 2 and "'local' is a device of" in into_own.stderr
    mine = list(csv.DictReader((tmp_path / "profiling_csvs" / "local" / "measurements.csv").open()))
    theirs = list(csv.DictReader((tmp_path / "profiling_csvs" / "copy" / "measurements.csv").open()))
    assert sorted((r["network"], r["batch_size"], float(r["latency_ms_median"])) for r in theirs) == \
        sorted((r["network"], r["batch_size"], float(r["latency_ms_median"])) for r in mine)
    shutil.rmtree(tmp_path / "models")  # the rows lose their descriptions (the imported ones and the manifest's)
    empty = here("--stage", "export", "--format", "perfseer", "--output", str(tmp_path / "ds2"), "--device", "copy")
    assert empty.returncode == 2 and "device 'copy' has no ok measurement whose network has a description" in \
        empty.stderr and not (tmp_path / "ds2").exists()


def test_all_fits_only_devices_it_measured(tmp_path):
    """`--stage all` whose device could not be reached fits nothing: not another device's rows lying on disk."""
    import socket
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tiny = ROOT / "models" / "imagenet" / "tiny_nets.py"  # a network of its own: no torchvision to import for it
    cfg = CONFIG.replace('zoo = ["squeezenet1_1", "resnet18"]', f'zoo = []\nfactories = ["{tiny}:tiny_vgg"]')
    cfg = cfg.replace("levels = [0, 50]", "levels = [0]")
    cfg = cfg.replace('[devices.local]\nbackend = "cpu"',
                      f'[devices.dead]\nbackend = "cpu"\nhost = "127.0.0.1"\nport = {port}\nuser = "nobody"')
    (tmp_path / "config.toml").write_text(cfg)
    other = tmp_path / "profiling_csvs" / "other"
    other.mkdir(parents=True)
    (other / "measurements.csv").write_text("device,network,batch_size,status\n")  # e.g. an imported device
    run = main_py(tmp_path, "--stage", "all")
    assert run.returncode != 0
    assert "no measurements for device(s) dead" in run.stderr, run.stderr[-2000:]
    assert not (tmp_path / "fingerprinting" / "other").exists()
