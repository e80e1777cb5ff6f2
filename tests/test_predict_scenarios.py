"""A user's ``--stage predict`` runs against a project of two fitted fingerprints (real torch CNNs described, rows
that follow their costs), run in this process through the command line's ``main``: what the user is told on
stderr where stdout holds JSON lines alone."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

from perf4sight import cli
from perf4sight.config import FingerprintConfig
from perf4sight.features.aggregate import features_for
from perf4sight.fingerprint import fit_fingerprint
from perf4sight.ir.from_torch import describe
from perf4sight.ir.schema import save_description

SHAPE = [3, 16, 16]
BATCHES = (1, 4, 16)
DEVICES = {"alpha": 1.0, "beta": 3.0}  # device name: how many times slower its steps are


def _cnn(width: int, depth: int) -> nn.Module:
    """A small real CNN: ``depth`` 3x3 convolutions of ``width`` channels, pooled, one linear layer."""
    layers: list[nn.Module] = []
    cin = 3
    for _ in range(depth):
        layers += [nn.Conv2d(cin, width, 3, padding=1), nn.ReLU()]
        cin = width
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10))


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A project folder: ``config.toml`` (no device configured has a fingerprint), ``query.json`` (a description)
    and the trees fingerprints of devices ``alpha`` and ``beta`` under ``fingerprinting/``, fitted on 6 networks
    of two families whose step times differ by device, each with an out-of-memory row at batch 4096."""
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("project")
    (folder / "config.toml").write_text('[project]\nfingerprint_dir = "fingerprinting"\n')
    descs = {f"{family}_w{w}": describe(_cnn(w, depth), SHAPE, name=f"{family}_w{w}", network=family)
             for family, depth in (("shallow", 1), ("deep", 3)) for w in (4, 8, 16)}
    save_description(descs["deep_w8"], folder / "query.json")
    for device, slower in DEVICES.items():
        rows = []
        for name, desc in descs.items():
            for b in BATCHES:
                f = features_for(desc, b)
                rows.append({"device": device, "backend": "cpu", "network": name, "family": desc.network,
                             "batch_size": b, "status": "ok",
                             "latency_ms_median": slower * (2.0 + f["flops_total"] / 2e6),
                             "peak_rss_mb": 20.0 + 40.0 * f["mem_analytic_mb"]})
            rows.append({"device": device, "backend": "cpu", "network": name, "family": desc.network,
                         "batch_size": 4096, "status": "oom"})  # a capacity to fit under
        fit_fingerprint(rows, descs, device, folder / "fingerprinting" / device, FingerprintConfig(n_estimators=10))
    return folder


def _predict(project: Path, capsys, *args: str) -> tuple[list[dict], str]:
    """``--stage predict --json`` of ``query.json`` at batch 4 in ``project``: the JSON lines and stderr."""
    code = cli.main(["--config", str(project / "config.toml"), "--stage", "predict", "--network",
                     str(project / "query.json"), "--batch-size", "4", "--json", *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()], err


def test_json_lines_of_a_device_chosen_by_default_say_on_stderr_which_it_is(project, capsys):
    """Without ``--device`` predict takes the first device with a fingerprint (``alpha``, none being configured);
    its JSON lines do not name it and the table that does is not printed, so a user with two fingerprints read
    alpha's figures as whichever device they meant, told nothing. stderr names the device and the others now;
    stdout keeps its JSON lines as they were."""
    chosen, err = _predict(project, capsys)
    assert "note: predicted on alpha (" in err and "also fingerprinted: beta" in err and "--device" in err
    named, named_err = _predict(project, capsys, "--device", "alpha")
    assert chosen == named and "predicted on" not in named_err  # the device named: nothing to say
    beta, _ = _predict(project, capsys, "--device", "beta")
    assert beta[0]["latency_ms"] > 2 * chosen[0]["latency_ms"]  # the note matters: the figures differ by device
    assert list(chosen[0]) == ["network", "batch_size", "latency_ms", "latency_ms_low", "latency_ms_high",
                               "memory_mb", "memory_mb_low", "memory_mb_high", "fits"]


CHATTY = '''"""A user's network file whose module and function print as they run."""
import torch.nn as nn

print("chatty: imported")


def chatty(num_classes=10):
    print("chatty: building", num_classes)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, num_classes))
'''


def test_json_lines_stay_alone_on_stdout_when_the_user_s_code_prints(project, tmp_path, capsys):
    """``--network FILE.py:FUNCTION --json``: what the user's file printed as it was imported and called went to
    stdout among the JSON lines ("chatty: imported" first), so a reader of JSON lines failed on the first. It goes
    to stderr now, with the notes; stdout holds the JSON lines alone, in every mode of predict."""
    (tmp_path / "chatty_net.py").write_text(CHATTY)
    factory = f"{tmp_path / 'chatty_net.py'}:chatty"
    said = []
    for mode in ([], ["--max-batch-size", "64"], ["--device", "alpha", "beta"]):
        shutil.rmtree(project / "models" / "zoo-cache", ignore_errors=True)  # described anew: the function runs
        code = cli.main(["--config", str(project / "config.toml"), "--stage", "predict", "--network", factory,
                         "--json", *mode])
        out, err = capsys.readouterr()
        assert code == 0, err
        lines = [json.loads(line) for line in out.splitlines()]  # every line is JSON
        assert lines and all(line["network"] == "chatty" for line in lines)
        said.append(err)
    assert all("chatty: building 1000" in err for err in said)  # the user's words are kept, on stderr


def test_a_network_name_with_brackets_is_shown_as_it_is_in_the_tables(project, tmp_path, capsys):
    """A description named ``unet[small]`` read ``unet`` in predict's table (rich took ``[small]`` for a style), so
    ``unet[small]`` and ``unet[large]`` showed as one name; ``net [red]x`` lost its tag too. The tables show the
    names as written (the batch-size table and ``--max-batch-size``'s here; ``--prune-to-fit``'s and compare's
    alike)."""
    desc = json.loads((project / "query.json").read_text())
    names = ("unet[small]", "unet[large]", "net [red]x")
    files = []
    for name in names:
        files.append(tmp_path / f"{len(files)}.json")
        files[-1].write_text(json.dumps(desc | {"name": name}))
    config = ['--config', str(project / "config.toml"), "--stage", "predict", "--device", "alpha", "--network"]
    for mode in (["--batch-size", "4"], ["--max-batch-size", "64"]):
        assert cli.main([*config, *map(str, files), *mode]) == 0
        table = capsys.readouterr().out
        assert all(f" {name} " in table for name in names), table


def test_batch_one_that_fits_but_cannot_train_is_said_plainly(project, tmp_path, capsys):
    """A network whose batch norm sees a 1x1 map, at batch 1: the table said ``fits: yes`` beside a note that batch 1
    "does not train it at all", which read as a contradiction. The note now says that it fits in memory ('fits'
    answers memory alone) and that a training step at batch 1 fails; ``--json``'s fields are as they were, and
    ``--max-batch-size``'s largest batch of 1 is told the same."""
    from perf4sight.fingerprint import PREDICTION_KEYS
    net = nn.Sequential(nn.Conv2d(3, 4, 3, stride=32), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 10))
    path = save_description(describe(net, SHAPE, "pointwise"), tmp_path / "pointwise.json")
    config = ["--config", str(project / "config.toml"), "--stage", "predict", "--device", "alpha", "--network",
              str(path)]
    said = ("note: pointwise: predicted to fit in memory at batch 1 ('fits' answers memory alone), but a training step "
            "at batch 1 fails: a batch norm over a 1x1 map has one value per channel")
    assert cli.main([*config, "--batch-size", "1", "2"]) == 0
    out, err = capsys.readouterr()
    assert "│ pointwise │ 1     │" in out and "│ yes  │" in out and said in err and "does not train" not in err
    assert cli.main([*config, "--batch-size", "1", "--json"]) == 0
    out, err = capsys.readouterr()
    (line,) = [json.loads(x) for x in out.splitlines()]
    assert tuple(line) == PREDICTION_KEYS and line["fits"] is True and said in err
    assert cli.main([*config, "--max-batch-size", "1"]) == 0
    assert said in capsys.readouterr().err
    assert cli.main([*config, "--batch-size", "2"]) == 0  # no batch 1 asked: nothing to say
    assert "batch 1" not in capsys.readouterr().err


def _imported_project(folder: Path) -> Path:
    """A project whose device ``dd`` has rows imported (perf4sight's -gt.csv files of two small real CNNs) and a
    trees fingerprint fitted on them by the fingerprint stage; its ``config.toml``."""
    from perf4sight.ir.schema import save_description

    for net, width in (("net_0", 4), ("net_50", 8)):
        measured = folder / "src" / "dd" / "cifar10"
        for target, figures in (("latency", ("10", "19", "37")), ("memory", ("900", "950", "1100"))):
            lines = ["passed|latency|bs" if target == "latency" else "passed|mem_used|bs"]
            lines += [f"True|{float(f) * width / 4}|{b}" for f, b in zip(figures, (2, 4, 8))]
            (measured / target).mkdir(parents=True, exist_ok=True)
            (measured / target / f"{net}-gt.csv").write_text("\n".join(lines) + "\n")
        save_description(describe(_cnn(width, 1), SHAPE, net), folder / "src" / "graphs" / f"{net}.json")
    config = folder / "config.toml"
    config.write_text("[fingerprint]\nn_estimators = 10\n")
    for stage in (["import", "--format", "perf4sight", "--source", str(folder / "src")], ["fingerprint"]):
        assert cli.main(["--config", str(config), "--stage", *stage, "--device", "dd"]) == 0
    return config


def test_a_project_copied_without_its_times_is_not_called_stale(tmp_path, capsys):
    """``cp -r`` of a project (no ``-p``) wrote measurements.csv after the fingerprint, and predict said the rows
    "changed after its fingerprint was fitted" of rows that had not. Where the times say newer, the rows are
    hashed as the fit hashed them (the metadata's ``training_data_sha256``): the same rows, no note; a figure
    edited since, the note."""
    _imported_project(tmp_path / "original")
    shutil.copytree(tmp_path / "original", tmp_path / "copy", copy_function=shutil.copy)  # times not kept
    csv_path = tmp_path / "copy" / "profiling_csvs" / "dd" / "measurements.csv"
    later = (tmp_path / "copy" / "fingerprinting" / "dd" / "metadata.json").stat().st_mtime + 60
    os.utime(csv_path, (later, later))  # written after the fingerprint, whatever order the copy took
    predict = ["--config", str(tmp_path / "copy" / "config.toml"), "--stage", "predict", "--device", "dd",
               "--network", "net_0", "--batch-size", "4"]
    capsys.readouterr()
    assert cli.main(predict) == 0
    assert "changed after its fingerprint was fitted" not in capsys.readouterr().err
    csv_path.write_text(csv_path.read_text().replace(",19.0,", ",23.0,", 1))  # a step time measured again
    assert ",23.0," in csv_path.read_text()
    assert cli.main(predict) == 0
    assert "dd: " in (err := capsys.readouterr().err) and "changed after its fingerprint was fitted" in err


def test_a_bare_network_name_is_the_network_whatever_file_of_that_name_the_folder_holds(project, tmp_path,
                                                                                        monkeypatch, capsys):
    """The names were read by two rules: the command line's check kept ``deep_l35`` (a level of the config's
    network ``deep``, pruned on request) as a network, and predict then read a log called ``deep_l35`` in the current
    folder as its description ("not valid JSON"); a log called ``deep`` was read so too. One rule now: a bare name
    of a network (the zoo's, one pruned on request, the config's own, the dataset's) is that network; a path to the
    file (``./deep``) is the file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.toml").write_text(f'[project]\nfingerprint_dir = "{project / "fingerprinting"}"\n[networks]\n'
                                          f'zoo = []\ndescription_files = ["{project / "query.json"}"]\n')
    for log in ("deep_l35", "deep"):
        (tmp_path / log).write_text("a log line\n")
    code = cli.main(["--config", "config.toml", "--stage", "predict", "--device", "alpha", "--network", "deep_l35",
                     "deep", "--batch-size", "4", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert [json.loads(line)["network"] for line in out.splitlines()] == ["deep_l35", "deep"]
    assert cli.main(["--config", "config.toml", "--stage", "predict", "--device", "alpha", "--network", "./deep"]) != 0
    assert "not valid JSON" in capsys.readouterr().err
