"""Importing perf4sight -gt.csv data: merged rows, oom rows, duplicates once, descriptions copied."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from perf4sight.errors import UserError
from perf4sight.importers import import_perf4sight, import_perfseer
from perf4sight.ir.schema import load_description
from perf4sight.profiling.results import COLUMNS, read_rows, results_path, row_key
from perf4sight.wording import plural

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """One import shared by the module's tests (it takes seconds); none of them writes to it."""
    from conftest import TX2_DATA
    if not (TX2_DATA / "graphs").is_dir():
        pytest.skip(f"shared TX2 data not found at {TX2_DATA} (set PERF4SIGHT_TX2_DATA)")
    tmp_path = tmp_path_factory.mktemp("import")
    summary = import_perf4sight(TX2_DATA, "tx2", tmp_path / "prof", tmp_path / "models")
    rows = read_rows(results_path(tmp_path / "prof", "tx2"))
    return summary, rows, tmp_path


def _row(rows, net, bs):
    found = [r for r in rows if r["network"] == net and r["batch_size"] == str(bs)]
    assert len(found) == 1, (net, bs, len(found))
    return found[0]


def test_import_tx2_rows(imported):
    summary, rows, tmp = imported
    assert len(rows) == summary.rows_written == summary.ok + summary.oom
    assert len({row_key(r) for r in rows}) == len(rows)  # duplicates kept once
    assert {r["backend"] for r in rows} == {"imported"}
    assert {r["protocol"] for r in rows} == {"perf4sight_mean3"}
    assert {(r["load_avg_1m"], r["cpu_count"]) for r in rows} == {("", "")}  # not recorded: no load note
    assert {r["family"] for r in rows} == {"resnet18", "resnet50", "mobilenetv2", "squeezenet"}
    assert summary.descriptions == 58
    # the one step that thrashed (18.4 s at batch 110 against 2.8 s at 100): oom, its figures kept
    assert summary.thrashing == ["mobilenetv2_35 at batch 110"]
    r = _row(rows, "mobilenetv2_35", 110)
    assert r["status"] == "oom" and r["message"].startswith("thrashing: 6.0x the step time per sample of batch 100")
    assert float(r["latency_ms_median"]) > 18000 and _row(rows, "mobilenetv2_35", 100)["status"] == "ok"
    # passed=False in both files -> oom with empty figures
    r = _row(rows, "resnet18_50", 230)
    assert r["status"] == "oom" and r["device_mem_used_mb"] == "" and r["latency_ms_median"] == ""
    # memory run failed but the latency run passed: the configuration ran -> ok, memory empty
    r = _row(rows, "resnet18_50", 220)
    assert r["status"] == "ok" and r["device_mem_used_mb"] == "" and float(r["latency_ms_median"]) > 0
    assert "memory run failed" in r["message"]
    # first rows of resnet18_50 as in the source files
    r = _row(rows, "resnet18_50", 2)
    assert r["status"] == "ok"
    assert float(r["device_mem_used_mb"]) == pytest.approx(1626.0)
    assert float(r["torch_reserved_peak_mb"]) == pytest.approx(104.4)
    assert float(r["latency_ms_median"]) == pytest.approx(71.23230997721355)
    assert r["input_shape"] == "3x224x224" and r["pruning_level"] == "50"
    # a repeated latency run (bs 256) is merged into one row: the mean of the two runs
    r = _row(rows, "resnet18_90", 256)
    assert float(r["latency_ms_median"]) == pytest.approx((1564.8890380859375 + 1626.731201171875) / 2)
    assert "repeated" in r["message"]


def test_import_one_sided_rows_and_oom_counts(imported):
    summary, rows, _ = imported
    ok = [r for r in rows if r["status"] == "ok"]
    only_latency = [r for r in ok if r["latency_ms_median"] and not r["device_mem_used_mb"]]
    only_memory = [r for r in ok if r["device_mem_used_mb"] and not r["latency_ms_median"]]
    assert only_latency and only_memory  # batch-size sets differ between the two files
    # 868 passed memory rows, 15 repeated passed pairs merged (resnet18 levels 65-90, bs 220-240), 1 thrashing
    assert sum(1 for r in ok if r["device_mem_used_mb"]) == 868 - 15 - 1
    assert summary.oom >= 500


def test_import_descriptions_copied(imported):
    _, rows, tmp = imported
    folder = tmp / "models" / "imported" / "tx2"
    assert len(list(folder.glob("*.json"))) == 58
    d = load_description(folder / "squeezenet_30.json")
    assert d.name == "squeezenet_30" and d.params > 0
    assert {r["network"] for r in rows} <= {p.stem for p in folder.glob("*.json")}


def test_reimport_skips_existing(imported, tx2_data):
    summary, rows, tmp = imported
    again = import_perf4sight(tx2_data, "tx2", tmp / "prof", tmp / "models")
    assert again.rows_written == 0 and again.rows_skipped_existing == len(rows)
    assert len(read_rows(results_path(tmp / "prof", "tx2"))) == len(rows)


def _write(path: Path, header: str, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([header] + lines) + "\n")


def _graph(source: Path, variant: str) -> Path:
    """A small real network's description as perf4sight's graph of ``variant`` (``<source>/graphs/``)."""
    from torch import nn

    from perf4sight.ir.from_torch import describe
    from perf4sight.ir.schema import save_description

    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, 10))
    return save_description(describe(model, [3, 16, 16], variant), source / "graphs" / f"{variant}.json")


def test_small_folder_with_a_network_without_graph(tmp_path):
    """A network without a graph is imported beside those with one, its input shape from the dataset folder."""
    src = tmp_path / "src" / "profiling_csvs" / "dev" / "cifar10"
    _write(src / "latency" / "net_0-gt.csv", "passed|latency|test_var|bs|dataset|net_name|model",
           ["True|12.5|latency|8|cifar10|net|/x/net_0.py", "False|None|latency|16|cifar10|net|/x/net_0.py"])
    _write(src / "latency" / "other_0-gt.csv", "passed|latency|bs", ["True|3.5|8"])
    _graph(tmp_path / "src", "other_0")
    s = import_perf4sight(tmp_path / "src", "d1", tmp_path / "prof", tmp_path / "models")
    rows = read_rows(results_path(tmp_path / "prof", "d1"))
    assert (s.ok, s.oom, s.descriptions) == (2, 1, 1)
    assert rows[0]["input_shape"] == "3x32x32" and rows[0]["device_mem_used_mb"] == ""
    assert rows[2]["network"] == "other_0" and rows[2]["input_shape"] == "3x16x16"
    assert "no memory measurement" in rows[0]["message"]
    assert set(rows[0]) == set(COLUMNS)


def test_networks_whose_files_hold_no_row_are_said_and_a_source_of_no_row_is_refused(tmp_path, capsys):
    """A network whose memory and latency files were both empty was passed over without a word (the note named a
    network missing one kind only), and a source whose every file was empty imported '0 new rows' into a new, empty
    device folder, exit 0."""
    import argparse

    from perf4sight import stages
    from perf4sight.config import load_config

    src = tmp_path / "src" / "profiling_csvs" / "dev" / "cifar10"
    for kind, header in (("memory", "passed|mem_used|bs"), ("latency", "passed|latency|bs")):
        _write(src / kind / "net_0-gt.csv", header, ["True|12.5|8"])
        _write(src / kind / "other_0-gt.csv", header, [])  # a header alone: cut short before its first row
    _graph(tmp_path / "src", "net_0")
    (tmp_path / "config.toml").write_text("[devices.local]\nbackend = 'cpu'\n")
    cfg = load_config(tmp_path / "config.toml")
    args = argparse.Namespace(format="perf4sight", source=str(tmp_path / "src"), device=["d1"])
    assert stages.run_import(cfg, args) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert ("note: d1: no row for 1 network (other_0): both its memory/ and latency/*-gt.csv files are missing, empty "
            "or cut short before their first row; nothing of it was measured here") in err
    assert "no graph found" not in err  # it said "the rows were imported" of other_0, which has none
    assert [r["network"] for r in read_rows(results_path(cfg.profiling_dir, "d1"))] == ["net_0"]
    (src / "memory" / "net_0-gt.csv").write_text("passed|mem_used|bs\n")
    (src / "latency" / "net_0-gt.csv").write_text("")  # empty
    args.device = ["d2"]
    with pytest.raises(UserError) as exc:
        stages.run_import(cfg, args)
    assert str(exc.value) == (f"{src}: no row in any of its -gt.csv files (2 networks read, every memory/ and latency/ "
                              "file empty or cut short before its first row): nothing imported")
    assert not (cfg.profiling_dir / "d2").exists() and not (cfg.models_dir / "imported" / "d2").exists()


def test_the_source_suggested_for_a_folder_with_a_space_is_quoted(tmp_path):
    """The folder suggested for ``--source`` (one above ``profiling_csvs/``) is one shell word, quoted where it
    holds a space: ``--source /tmp/my data`` was two."""
    import shlex

    src = tmp_path / "my data"
    _write(src / "profiling_csvs" / "dev" / "cifar10" / "latency" / "net_0-gt.csv", "passed|latency|bs", ["True|3|8"])
    (src / "graphs").mkdir()
    with pytest.raises(UserError, match="no graphs found") as exc:
        import_perf4sight(src / "profiling_csvs", "d1", tmp_path / "prof", tmp_path / "models")
    assert shlex.split(str(exc.value).split("(here: ", 1)[1][:-1]) == ["--source", str(src)], str(exc.value)


def test_a_figure_that_is_no_measurement_is_refused_with_its_line(tmp_path):
    """A passed row's figure that is infinite or negative is no measurement: refused with its file, line and column,
    nothing written. They were imported as they were ('inf', '-inf', '-50.0', 'nan' the mean of inf and -inf), into
    a file whose rows the measurements' reader refuses (``results.read_rows``)."""
    memory = tmp_path / "src" / "dev" / "cifar10" / "memory" / "net_0-gt.csv"
    _graph(tmp_path / "src", "net_0")
    for cells, column in (("inf|5", "mem_used 'inf'"), ("-inf|5", "mem_used '-inf'"), ("-50|5", "mem_used '-50'"),
                          ("1e400|5", "mem_used '1e400'"), ("100|-3", "mem_alloc '-3'")):
        _write(memory, "passed|mem_used|mem_alloc|bs", ["True|100|5|8", f"True|{cells}|16"])
        with pytest.raises(UserError, match=rf"net_0-gt.csv: line 3: {column} is not a finite number >= 0"):
            import_perf4sight(tmp_path / "src", "d", tmp_path / "prof", tmp_path / "models")
        assert not results_path(tmp_path / "prof", "d").exists()
    _write(memory, "passed|mem_used|mem_alloc|bs", ["True|100|None|8", "False|None|None|16"])  # None: not measured
    import_perf4sight(tmp_path / "src", "d", tmp_path / "prof", tmp_path / "models")
    rows = read_rows(results_path(tmp_path / "prof", "d"))
    assert [(r["device_mem_used_mb"], r["torch_alloc_peak_mb"]) for r in rows] == [("100.0", ""), ("", "")]


def test_bad_sources(tmp_path):
    with pytest.raises(UserError, match="not found"):
        import_perf4sight(tmp_path / "nope", "d", tmp_path, tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no perf4sight"):
        import_perf4sight(tmp_path / "empty", "d", tmp_path, tmp_path)
    # a folder given by mistake (a home folder, /tmp) is not walked to the bottom: three folders down at most
    _write(tmp_path / "wide" / "x" / "b" / "imagenet" / "memory" / "net_0-gt.csv", "passed|mem_used|bs", ["True|1|8"])
    with pytest.raises(UserError, match=r"wide: no perf4sight .* up to three folders down.*--source should be"):
        import_perf4sight(tmp_path / "wide", "d", tmp_path, tmp_path)
    with pytest.raises(UserError, match="no graphs found"):  # one level lower, the layout is found
        import_perf4sight(tmp_path / "wide" / "x", "d", tmp_path / "p", tmp_path / "m")
    bad = tmp_path / "bad" / "b" / "imagenet" / "memory" / "net_0-gt.csv"
    _write(bad, "passed|mem_used|bs", ["True|100|two"])
    with pytest.raises(UserError, match="bad batch size"):
        import_perf4sight(tmp_path / "bad", "d", tmp_path / "p", tmp_path / "m")
    _write(bad, "passed|mem_used|bs", ["True|100|inf"])  # not an OverflowError from int()
    with pytest.raises(UserError, match="bad batch size 'inf'"):
        import_perf4sight(tmp_path / "bad", "d", tmp_path / "p", tmp_path / "m")
    # a renamed figure column, or a passed row whose figure is no number: named, not imported as empty
    renamed = tmp_path / "renamed" / "b" / "imagenet" / "latency" / "net_0-gt.csv"
    _write(renamed, "passed|step_ms|bs", ["True|12.5|8"])
    with pytest.raises(UserError, match=r"need \['bs', 'latency', 'passed'\]"):
        import_perf4sight(tmp_path / "renamed", "d", tmp_path / "p", tmp_path / "m")
    garbled = tmp_path / "garbled" / "b" / "imagenet" / "memory" / "net_0-gt.csv"
    _write(garbled, "passed|mem_used|bs", ["True|100|8", "True|lots|16", "False|None|32"])
    with pytest.raises(UserError, match=r"net_0-gt.csv: line 3: mem_used 'lots' is not a number"):
        import_perf4sight(tmp_path / "garbled", "d", tmp_path / "p", tmp_path / "m")
    for line, fields in (("True|100", 2), ("True|100|8|9", 4)):  # a cell short, a cell over
        short = tmp_path / f"short{fields}" / "b" / "imagenet" / "memory" / "net_0-gt.csv"
        _write(short, "passed|mem_used|bs", ["True|100|8", line])
        with pytest.raises(UserError, match=rf"net_0-gt.csv: line 3: {fields} fields where the header has 3$"):
            import_perf4sight(short.parents[3], "d", tmp_path / "p", tmp_path / "m")


@pytest.mark.parametrize("name", ["..", ".", "a/b", "tx2 ", "", ".hidden"])
def test_import_device_name_must_name_a_folder(tmp_path, name):
    """`--device ..` wrote the measurements beside the config and the graphs into models/."""
    from perf4sight.importers.perf4sight_csv import import_source
    with pytest.raises(UserError, match="cannot name a folder"):
        import_source(tmp_path, name, "perf4sight")


def test_a_device_name_refused_leaves_no_folder_behind(tmp_path):
    """The import stage took its lock (making the device's folder) before the importer refused the name: ``--device
    a/b`` left ``profiling_csvs/a/``, and ``--device ../../x/y`` made ``x/`` outside the project."""
    from argparse import Namespace

    from perf4sight import stages
    from perf4sight.config import load_config

    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "config.toml").write_text("")
    cfg = load_config(tmp_path / "p" / "config.toml")
    for name in ("a/b", "../../x/y"):
        with pytest.raises(UserError, match="cannot name a folder"):
            stages.run_import(cfg, Namespace(format="perf4sight", source=str(tmp_path), device=[name]))
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["config.toml", "p"]


def _cli_import(tmp_path: Path, source: Path, device: str = "tx3") -> subprocess.CompletedProcess:
    """``--stage import --format perf4sight`` through the command line, with a config in ``tmp_path``."""
    config = tmp_path / "config.toml"
    config.write_text('[networks]\nzoo = ["resnet18"]\n')
    return subprocess.run([sys.executable, str(ROOT / "main.py"), "--config", str(config), "--stage", "import",
                           "--format", "perf4sight", "--source", str(source), "--device", device],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)


def test_source_one_level_too_deep_is_refused_before_anything_is_written(tmp_path, tx2_data):
    """``--source .../profiling_csvs`` read every CSV, found no graph, imported rows no fingerprint could use and
    exited 0: now one line says where graphs were looked for and which folder to give, and nothing is written."""
    src = tmp_path / "tx2-perf4sight"
    for kind in ("memory", "latency"):
        part = Path("profiling_csvs") / "tx2" / "imagenet" / kind / "squeezenet_30-gt.csv"
        (src / part).parent.mkdir(parents=True)
        shutil.copy(tx2_data / part, src / part)
    (src / "graphs").mkdir()
    shutil.copy(tx2_data / "graphs" / "squeezenet_30.json", src / "graphs")

    deep = _cli_import(tmp_path, src / "profiling_csvs")
    assert deep.returncode == 2 and deep.stdout == "", deep.stderr
    (line,) = deep.stderr.splitlines()
    assert line == (f"error: {src / 'profiling_csvs'}: no graphs found for the 1 network read: looked for "
                    f"{src / 'profiling_csvs' / 'graphs'}/<network>.json; --source should be the folder that holds "
                    f"both profiling_csvs/ and graphs/ (here: --source {src})")
    assert not (tmp_path / "profiling_csvs").exists() and not (tmp_path / "models").exists()

    right = _cli_import(tmp_path, src)
    assert right.returncode == 0, right.stderr
    rows = read_rows(results_path(tmp_path / "profiling_csvs", "tx3"))
    ok = sum(r["status"] == "ok" for r in rows)
    alone = sum(r["status"] == "ok" and not r["latency_ms_median"] for r in rows)  # the latency file lacks them
    assert right.stdout.startswith(f"tx3: 1 network read from {src}, {len(rows)} new rows in ") and alone
    assert right.stdout.rstrip().endswith(f"({ok} ok, {len(rows) - ok} oom, {plural(alone, 'ok row')} without a "
                                          f"step time; 1 description in {tmp_path / 'models' / 'imported' / 'tx3'})")
    again = _cli_import(tmp_path, src)
    assert again.returncode == 0 and "0 new rows in" in again.stdout, again.stderr
    assert f"(0 ok, 0 oom, {len(rows)} rows already imported, skipped; 1 description in " in again.stdout
    assert "_" not in again.stdout.split("(", 1)[1].split(";")[0]  # no snake_case count names


def test_a_latency_file_cut_before_its_first_row_is_said_in_the_import_summary(tmp_path, tx2_data):
    """A network whose latency file holds its header alone (a run cut short, a file truncated) or is missing: its
    rows come in with memory alone, and the summary counts them and names the network; it read as a complete
    import ("44 ok, 19 oom"), the step times lost without a word."""
    src = tmp_path / "src"
    for net in ("resnet18_0", "squeezenet_0"):
        for kind in ("memory", "latency"):
            part = Path("profiling_csvs") / "tx2" / "imagenet" / kind / f"{net}-gt.csv"
            (src / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(tx2_data / part, src / part)
        shutil.copytree(tx2_data / "graphs", src / "graphs", dirs_exist_ok=True,
                        ignore=lambda _d, names: [n for n in names if n != f"{net}.json"])
    cut = src / "profiling_csvs" / "tx2" / "imagenet" / "latency" / "resnet18_0-gt.csv"
    cut.write_text(cut.read_text().splitlines()[0] + "\n")
    done = _cli_import(tmp_path, src)
    assert done.returncode == 0, done.stderr
    rows = read_rows(results_path(tmp_path / "profiling_csvs", "tx3"))
    alone = [r for r in rows if r["status"] == "ok" and not r["latency_ms_median"]]
    assert alone and {r["network"] for r in alone} == {"resnet18_0"}
    assert f", {len(alone)} ok rows without a step time; 2 descriptions in " in done.stdout
    assert done.stderr.strip() == ("note: tx3: no latency row for 1 network (resnet18_0): its latency/*-gt.csv file "
                                   "is missing, empty or cut short before its first row; the rows carry the memory "
                                   "alone")
    whole = import_perf4sight(tx2_data, "tx2", tmp_path / "p2", tmp_path / "m2")  # perf4sight's own one-sided rows
    assert (whole.no_latency, whole.no_memory, whole.kind_missing) == (12, 18, {})
    config = tmp_path / "config.toml"  # exported as a PerfSeer dataset and imported back: counted there too
    out = subprocess.run([sys.executable, str(ROOT / "main.py"), "--config", str(config), "--stage", "export",
                          "--format", "perfseer", "--output", str(tmp_path / "seer"), "--device", "tx3"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    back = import_perfseer(tmp_path / "seer", "tx4", tmp_path / "profiling_csvs", tmp_path / "models")
    assert (back.ok, back.no_latency, back.no_memory) == (sum(r["status"] == "ok" for r in rows), len(alone), 0)


def test_thrashing_is_judged_against_the_last_sound_batch_size_of_the_same_network():
    from perf4sight.importers.perf4sight_csv import mark_thrashing

    def rows():
        return [{"network": "a", "batch_size": b, "status": "ok", "latency_ms_median": ms, "message": ""}
                for b, ms in ((2, 100.0), (4, 180.0), (8, 900.0), (16, 800.0), (32, 4000.0))] + [
            {"network": "a", "batch_size": 64, "status": "oom", "latency_ms_median": "", "message": "x"},
            {"network": "b", "batch_size": 2, "status": "ok", "latency_ms_median": 10.0, "message": ""},
            {"network": "b", "batch_size": 4, "status": "ok", "latency_ms_median": 39.0, "message": ""}]
    marked = rows()
    # a@8: 112.5 ms per sample against 45 at batch 4 (2.5x); a@16: 50 against 45, sound; a@32: 125 against 50
    assert mark_thrashing(marked) == ["a at batch 8", "a at batch 32"]
    assert [r["status"] for r in marked] == ["ok", "ok", "oom", "ok", "oom", "oom", "ok", "ok"]
    assert marked[2]["message"].startswith("thrashing: 2.5x the step time per sample of batch 4")
    assert marked[2]["latency_ms_median"] == 900.0  # the figures stay
    untouched = rows()
    assert mark_thrashing(untouched, 0) == [] and untouched == rows()


def test_a_network_without_its_graph_is_named(tmp_path, tx2_data):
    """Rows of a network whose graph is missing are imported with a note naming it (they were imported
    silently, and the fingerprint's note then advised the networks stage)."""
    src = tmp_path / "src"
    for net in ("squeezenet_30", "resnet18_30"):
        for kind in ("memory", "latency"):
            part = Path("profiling_csvs") / "tx2" / "imagenet" / kind / f"{net}-gt.csv"
            (src / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(tx2_data / part, src / part)
    (src / "graphs").mkdir()
    shutil.copy(tx2_data / "graphs" / "squeezenet_30.json", src / "graphs")
    proc = _cli_import(tmp_path, src)
    assert proc.returncode == 0, proc.stderr
    assert "note: tx3: no graph found for 1 network (resnet18_30): the rows were imported" in " ".join(
        proc.stderr.split())
    from perf4sight.config import load_config
    from perf4sight.dataset import device_dataset, undescribed_note
    cfg = load_config(tmp_path / "config.toml")
    descriptions, _, rows, _ = device_dataset(cfg, "tx3")
    assert "their graphs were not among those imported" in undescribed_note(cfg, "tx3", rows, descriptions)

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(ROOT / "main.py"), "--config", str(tmp_path / "config.toml"),
                               *args], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    two = cli("--stage", "import", "--format", "perf4sight", "--source", str(src), "--device", "t3", "t4")
    assert two.returncode == 2 and "import takes one --device" in two.stderr, two.stderr
    imported = cli("--stage", "profile", "--device", "tx3")  # an imported device has no [devices] table
    assert imported.returncode == 2 and "'tx3' has measurements in" in imported.stderr and \
        "no [devices.tx3] table: only a configured device can be checked or profiled" in imported.stderr


def test_source_that_is_a_file_says_so(tmp_path):
    (tmp_path / "data.csv").write_text("passed|latency|bs\n")
    proc = _cli_import(tmp_path, tmp_path / "data.csv")
    assert proc.returncode == 2 and proc.stderr == (f"error: {tmp_path / 'data.csv'}: is a file, not a folder: "
                                                    "--source takes the folder of the perf4sight data\n"), proc.stderr
    with pytest.raises(UserError, match="data.csv: is a file, not a folder: --source takes the folder of the PerfSeer"):
        import_perfseer(tmp_path / "data.csv", "d", tmp_path / "p", tmp_path / "m")
    with pytest.raises(UserError, match="nope: perf4sight source folder not found"):
        import_perf4sight(tmp_path / "nope", "d", tmp_path / "p", tmp_path / "m")


def test_a_source_of_two_boards_is_refused_not_averaged(tmp_path):
    """Rows were keyed by (network, batch size) only: a source holding ``tx2/`` and ``nano/`` had each pair's runs
    of both boards averaged as repeated runs and labelled with the board that sorted last. Now one line names the
    folders and nothing is written; ``--source`` naming one board's folder imports it, its graphs read from the
    ``graphs/`` beside ``profiling_csvs/``."""
    src = tmp_path / "src"
    for board, ms in (("tx2", 90.0), ("nano", 10.0)):
        _write(src / "profiling_csvs" / board / "imagenet" / "latency" / "net_0-gt.csv", "passed|latency|bs",
               [f"True|{ms}|2"])
    _graph(src, "net_0")
    csvs = src / "profiling_csvs"
    for source in (src, csvs):
        with pytest.raises(UserError) as err:
            import_perf4sight(source, "d", tmp_path / "prof", tmp_path / "models")
        assert str(err.value) == (
            f"{source}: holds perf4sight measurements of 2 board/dataset folders (nano/imagenet, tx2/imagenet), "
            f"which one device's rows cannot mix: import one at a time, e.g. --source {csvs / 'nano' / 'imagenet'} "
            f"(graphs read from {src / 'graphs'}); nothing written")
    assert not (tmp_path / "prof").exists() and not (tmp_path / "models").exists()
    # two datasets of one board are two folders as well; outside the profiling_csvs/ layout no --source is named
    other = tmp_path / "other"
    for dataset in ("cifar10", "imagenet"):
        _write(other / "b" / dataset / "memory" / "net_0-gt.csv", "passed|mem_used|bs", ["True|100|8"])
    with pytest.raises(UserError, match=r"other: holds perf4sight measurements of 2 board/dataset folders \(b/cifar10, "
                                        r"b/imagenet\), .*each from a folder holding graphs/ and its profiling_csvs/"):
        import_perf4sight(other, "d", tmp_path / "prof", tmp_path / "models")

    for board, ms in (("nano", 10.0), ("tx2", 90.0)):
        for source in (csvs / board, csvs / board / "imagenet"):
            s = import_perf4sight(source, board + source.name, tmp_path / "prof", tmp_path / "models")
            assert (s.rows_written, s.descriptions, s.duplicates_merged) == (1, 1, 0)
            (row,) = read_rows(results_path(tmp_path / "prof", board + source.name))
            assert (row["device_model"], float(row["latency_ms_median"])) == (board, ms)
            assert row["message"] == "no memory measurement" and row["input_shape"] == "3x16x16"
    # one board at a time into one device mixed the two boards' rows all the same, unsaid
    with pytest.raises(UserError, match=r"nanonano/measurements.csv holds rows measured on nano and the source's "
                                        r"were measured on tx2 \(column device_model\), which one device's rows "
                                        r"cannot mix"):
        import_perf4sight(csvs / "tx2", "nanonano", tmp_path / "prof", tmp_path / "models")
    assert len(read_rows(results_path(tmp_path / "prof", "nanonano"))) == 1
    assert import_perf4sight(csvs / "nano", "nanonano", tmp_path / "prof", tmp_path / "models").rows_written == 0


def test_passed_cells_byte_order_marks_and_impossible_figures(tmp_path):
    """``passed`` written ``1``/``yes`` was read as a failed run (an oom row saying passed=False); a byte-order mark
    made the first column unknown; a mem_used above the device's capacity and a batch size of 8.5 were imported."""
    src = tmp_path / "src" / "b" / "imagenet" / "memory" / "net_0-gt.csv"
    src.parent.mkdir(parents=True)
    src.write_text("\ufeffpassed|mem_used|capacity|bs\nTrue|100|7859|2\n1|200|7859|4\nyes|300|7859|8\n"
                   " True |400|7859|16\n0|None|7859|32\n", encoding="utf-8")
    _graph(tmp_path / "src", "net_0")
    s = import_perf4sight(tmp_path / "src", "d", tmp_path / "prof", tmp_path / "models")
    rows = read_rows(results_path(tmp_path / "prof", "d"))
    assert (s.ok, s.oom) == (4, 1)
    assert [r["device_mem_used_mb"] for r in rows if r["status"] == "ok"] == ["100.0", "200.0", "300.0", "400.0"]
    for cells, error in ((["maybe|100|7859|2"], r"net_0-gt.csv: line 2: passed 'maybe' is neither True nor False"),
                         (["True|100|7859|2", "|100|7859|4"], r"line 3: passed '' is neither True nor False"),
                         (["True|9000|7859|2"], r"line 2: mem_used 9000 MiB is more than the device's capacity "
                                                r"\(7859 MiB\)"),
                         (["True|100|7859|8.5"], r"line 2: bad batch size '8.5'")):
        bad = tmp_path / "bad" / "b" / "imagenet" / "memory" / "net_0-gt.csv"
        _write(bad, "passed|mem_used|capacity|bs", cells)
        _graph(tmp_path / "bad", "net_0")
        with pytest.raises(UserError, match=error):
            import_perf4sight(tmp_path / "bad", "e", tmp_path / "prof", tmp_path / "models")
        assert not results_path(tmp_path / "prof", "e").exists()


def test_graphs_are_all_checked_first_and_a_changed_source_is_not_taken_silently(tmp_path):
    """A malformed graph failed the import after the graphs before it were written; importing again after the
    source's graph changed tied the rows on disk to the new network, and changed figures were skipped unsaid."""
    src = tmp_path / "src"
    for net in ("a_0", "b_0"):
        _write(src / "profiling_csvs" / "b" / "imagenet" / "latency" / f"{net}-gt.csv", "passed|latency|bs",
               ["True|10|2", "True|20|4"])
        _graph(src, net)
    good = (src / "graphs" / "a_0.json").read_text()
    (src / "graphs" / "b_0.json").write_text(good[:200])  # cut short
    models = tmp_path / "models"
    with pytest.raises(UserError, match=r"b_0.json: network description file is not valid JSON"):
        import_perf4sight(src, "d", tmp_path / "prof", models)
    assert not models.exists() and not (tmp_path / "prof").exists()

    _graph(src, "b_0")
    import_perf4sight(src, "d", tmp_path / "prof", models)
    csv_path = results_path(tmp_path / "prof", "d")
    before = (csv_path.read_bytes(), (models / "imported" / "d" / "b_0.json").read_bytes())
    from torch import nn

    from perf4sight.ir.from_torch import describe
    from perf4sight.ir.schema import save_description
    wider = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(16, 10))
    save_description(describe(wider, [3, 16, 16], "b_0"), src / "graphs" / "b_0.json")
    with pytest.raises(UserError, match=r"the source's description of b_0 differs from the one imported before "
                                        r"\(.*b_0.json\), which its 2 rows of device 'd' were measured on: import "
                                        r"under another --device name.*nothing written"):
        import_perf4sight(src, "d", tmp_path / "prof", models)
    assert (csv_path.read_bytes(), (models / "imported" / "d" / "b_0.json").read_bytes()) == before
    assert import_perf4sight(src, "d2", tmp_path / "prof", models).rows_written == 4  # under another name it is new

    _graph(src, "b_0")  # the graph as imported, one figure changed and one row added
    _write(src / "profiling_csvs" / "b" / "imagenet" / "latency" / "b_0-gt.csv", "passed|latency|bs",
           ["True|10|2", "True|25|4", "True|40|8"])
    again = import_perf4sight(src, "d", tmp_path / "prof", models)
    assert (again.rows_written, again.rows_skipped_existing, again.rows_differing) == (1, 4, 1)
    assert sorted(float(r["latency_ms_median"]) for r in read_rows(csv_path) if r["network"] == "b_0") == [10, 20, 40]


def test_a_graph_named_otherwise_than_its_file_takes_the_files_name(tmp_path):
    """The rows are named by the CSV files' names, the description by the graph's own ``name``: a graph named
    otherwise was imported and then never found, and the fingerprint's hint said to import it again."""
    src = tmp_path / "src"
    _write(src / "profiling_csvs" / "b" / "imagenet" / "latency" / "net_50-gt.csv", "passed|latency|bs",
           ["True|10|2"])
    from perf4sight.ir.schema import save_description
    desc = load_description(_graph(src, "net_50"))
    desc.name = "net_l50"
    save_description(desc, src / "graphs" / "net_50.json")
    proc = _cli_import(tmp_path, src)
    assert proc.returncode == 0, proc.stderr
    assert "1 graph named otherwise than its file, imported under the file's name" in " ".join(proc.stderr.split())
    saved = tmp_path / "models" / "imported" / "tx3" / "net_50.json"
    assert load_description(saved).name == "net_50"
    save_description(desc, saved)  # as an earlier version imported it, under the graph's own name: the same network
    again = _cli_import(tmp_path, src)
    assert again.returncode == 0 and "differs" not in again.stderr, again.stderr
    assert load_description(saved).name == "net_50"


def test_a_source_without_the_dataset_folder_names_its_board(tmp_path, monkeypatch):
    """profiling_csvs/<board>/memory/ without perf4sight's <dataset>/ level: every row read 'profiling_csvs' as its
    board, and a network without its graph was refused as of an 'unknown dataset folder' named for the board."""
    src = tmp_path / "src"
    _write(src / "profiling_csvs" / "nano" / "latency" / "net_0-gt.csv", "passed|latency|bs", ["True|12.5|8"])
    _write(src / "profiling_csvs" / "nano" / "latency" / "other_0-gt.csv", "passed|latency|bs", ["True|3.5|8"])
    _graph(src, "net_0")
    with pytest.raises(UserError, match=r"src: no graph for other_0, and no dataset folder \(imagenet, cifar10, "
                                        r"cifar100, as in <board>/<dataset>/memory/\) tells its input shape"):
        import_perf4sight(src, "nano", tmp_path / "prof", tmp_path / "models")
    assert not results_path(tmp_path / "prof", "nano").exists()
    _graph(src, "other_0")
    import_perf4sight(src, "nano", tmp_path / "prof", tmp_path / "models")
    rows = read_rows(results_path(tmp_path / "prof", "nano"))
    assert [(r["network"], r["device_model"]) for r in rows] == [("net_0", "nano"), ("other_0", "nano")]
    # that board's folder given as --source (as README allows): it read 'profiling_csvs' as the board again
    import_perf4sight(src / "profiling_csvs" / "nano", "nano2", tmp_path / "prof", tmp_path / "models")
    assert {r["device_model"] for r in read_rows(results_path(tmp_path / "prof", "nano2"))} == {"nano"}
    assert import_perf4sight(src / "profiling_csvs" / "nano", "nano", tmp_path / "prof",
                             tmp_path / "models").rows_written == 0  # the same rows: no other board
    monkeypatch.chdir(src / "profiling_csvs" / "nano")  # --source . (it read '' as the board)
    import_perf4sight(".", "nano3", tmp_path / "prof", tmp_path / "models")
    assert {r["device_model"] for r in read_rows(results_path(tmp_path / "prof", "nano3"))} == {"nano"}
    # <board>/<dataset>/ with a dataset of another name than this tool knows: the board is still the board
    other = tmp_path / "other"
    _write(other / "profiling_csvs" / "tx2" / "tinyimagenet" / "latency" / "net_0-gt.csv", "passed|latency|bs",
           ["True|12.5|8"])
    _graph(other, "net_0")
    import_perf4sight(other, "t", tmp_path / "prof", tmp_path / "models")
    assert [r["device_model"] for r in read_rows(results_path(tmp_path / "prof", "t"))] == ["tx2"]


def test_a_device_that_cannot_be_fitted_does_not_stop_the_others(tmp_path):
    """--stage fingerprint over every device stopped at the first one that could not be fitted (all its rows out of
    memory, say), and the devices after it were never fitted: each is tried, and the exit says which were not."""
    for device, figures in (("aa", ["False|None|2", "False|None|4"]), ("bb", ["True|10|2", "True|19|4", "True|37|8"])):
        src = tmp_path / f"src_{device}"
        for net in ("net_0", "net_50"):
            _write(src / device / "cifar10" / "latency" / f"{net}-gt.csv", "passed|latency|bs", figures)
            _write(src / device / "cifar10" / "memory" / f"{net}-gt.csv", "passed|mem_used|bs",
                   [line.replace("|10|", "|900|").replace("|19|", "|950|").replace("|37|", "|1100|")
                    for line in figures])
            _graph(src, net)
    config = tmp_path / "config.toml"
    config.write_text("[fingerprint]\nn_estimators = 10\n")
    run = [sys.executable, str(ROOT / "main.py"), "--config", str(config)]
    for device in ("aa", "bb"):
        done = subprocess.run(run + ["--stage", "import", "--format", "perf4sight", "--source",
                                     str(tmp_path / f"src_{device}"), "--device", device],
                              capture_output=True, text=True, cwd=tmp_path, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    fit = subprocess.run(run + ["--stage", "fingerprint"], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert fit.returncode == 2, fit.stderr[-2000:]
    assert (tmp_path / "fingerprinting" / "bb" / "metadata.json").is_file()  # fitted after aa failed
    assert not (tmp_path / "fingerprinting" / "aa").exists()
    last = fit.stderr.strip().splitlines()
    assert any(line.startswith("error: ") and "'aa'" in line for line in last[:-1]), fit.stderr
    assert last[-1] == "error: fingerprint: 1 device of 2 not fitted (aa; the error above says why); 1 other fitted"


def test_an_import_while_another_writes_the_device_is_refused(tmp_path):
    """Two imports of one device at once each wrote every row (2,802 rows of 1,401 configurations): an import
    holds the device's lock, as a profile does, and one that finds it held does nothing."""
    from perf4sight.profiling.fleet import import_lock

    _write(tmp_path / "src" / "dev" / "cifar10" / "latency" / "net_0-gt.csv", "passed|latency|bs", ["True|12.5|8"])
    _graph(tmp_path / "src", "net_0")
    (tmp_path / "config.toml").write_text("")
    cmd = [sys.executable, str(ROOT / "main.py"), "--config", str(tmp_path / "config.toml"), "--stage", "import",
           "--format", "perf4sight", "--source", str(tmp_path / "src"), "--device", "d"]
    with import_lock(tmp_path / "profiling_csvs", "d"):
        busy = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert busy.returncode == 2 and busy.stderr.startswith(  # the lock's holder named
        f"error: device 'd' is being imported into by another run on this machine (pid {os.getpid()}, since "), \
        busy.stderr
    assert not results_path(tmp_path / "profiling_csvs", "d").exists()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0 and len(read_rows(results_path(tmp_path / "profiling_csvs", "d"))) == 1


def test_an_export_of_several_devices_writes_only_into_a_new_or_empty_folder(tmp_path):
    """One device's export into a folder holding anything is refused (README: export writes only into a new or empty
    folder), but several devices' went on, each into its own subfolder beside what was there (an earlier export's
    files, which an import of the folder then read as one device's)."""
    from argparse import Namespace

    from perf4sight import stages
    from perf4sight.config import load_config

    csvs = tmp_path / "src" / "profiling_csvs" / "dev" / "cifar10"
    _write(csvs / "latency" / "net_0-gt.csv", "passed|latency|bs", ["True|12.5|8"])
    _graph(tmp_path / "src", "net_0")
    (tmp_path / "config.toml").write_text("")
    cfg = load_config(tmp_path / "config.toml")
    for device in ("a", "b"):
        import_perf4sight(tmp_path / "src", device, cfg.profiling_dir, cfg.models_dir)
    out = tmp_path / "ds"
    out.mkdir()
    (out / "net_0_bs8.txt").write_text("an earlier export's label\n")
    args = Namespace(format="perfseer", output=str(out), device=["a", "b"])
    with pytest.raises(UserError, match=r"ds is not empty; export into a new or empty folder; nothing written"):
        stages.run_export(cfg, args)
    assert [p.name for p in out.iterdir()] == ["net_0_bs8.txt"]
    (out / "net_0_bs8.txt").unlink()
    assert stages.run_export(cfg, args) == 0 and sorted(p.name for p in out.iterdir()) == ["a", "b"]


def test_a_config_naming_an_imported_network_can_import_it(tmp_path, capsys):
    """``[predict] networks = ["net_0"]``, a graph an import brings: the config was refused at load as naming an
    unknown network by every stage, the import too, so it could never be imported (after its imported folder was
    deleted to start over, say). The import stage loads it; the others still refuse the name until it is there."""
    from perf4sight import cli
    from perf4sight.config import load_config

    _write(tmp_path / "src" / "profiling_csvs" / "dev" / "cifar10" / "latency" / "net_0-gt.csv",
           "passed|latency|bs", ["True|12.5|8"])
    _graph(tmp_path / "src", "net_0")
    config = tmp_path / "config.toml"
    config.write_text('[predict]\nnetworks = ["net_0"]\n')
    with pytest.raises(UserError, match=r"\[predict\] networks: unknown network 'net_0'"):
        load_config(config)
    assert cli.main(["--config", str(config), "--stage", "import", "--format", "perf4sight", "--source",
                     str(tmp_path / "src"), "--device", "d"]) == 0, capsys.readouterr().err
    assert load_config(config).predict.networks == ["net_0"]
