"""Importing perf4sight -gt.csv data: merged rows, oom rows, duplicates once, descriptions copied."""
from __future__ import annotations

from pathlib import Path

import pytest

from perf4sight.errors import UserError
from perf4sight.importers import import_perf4sight
from perf4sight.ir.schema import load_description
from perf4sight.profiling.results import COLUMNS, read_rows, results_path, row_key


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
    assert {r["family"] for r in rows} == {"resnet18", "resnet50", "mobilenetv2", "squeezenet"}
    assert summary.descriptions == 58
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
    # 868 passed memory rows, 15 repeated passed pairs merged (resnet18 levels 65-90, bs 220-240)
    assert sum(1 for r in ok if r["device_mem_used_mb"]) == 868 - 15
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


def test_small_folder_without_graphs(tmp_path):
    src = tmp_path / "src" / "profiling_csvs" / "dev" / "cifar10"
    _write(src / "latency" / "net_0-gt.csv", "passed|latency|test_var|bs|dataset|net_name|model",
           ["True|12.5|latency|8|cifar10|net|/x/net_0.py", "False|None|latency|16|cifar10|net|/x/net_0.py"])
    s = import_perf4sight(tmp_path / "src", "d1", tmp_path / "prof", tmp_path / "models")
    rows = read_rows(results_path(tmp_path / "prof", "d1"))
    assert (s.ok, s.oom, s.descriptions) == (1, 1, 0)
    assert rows[0]["input_shape"] == "3x32x32" and rows[0]["device_mem_used_mb"] == ""
    assert "no memory measurement" in rows[0]["message"]
    assert set(rows[0]) == set(COLUMNS)


def test_infinite_figures_are_imported_as_they_are(tmp_path):
    """perf4sight's 'inf' is a number to the importer (the fingerprint passes over it: ``results.number``)."""
    _write(tmp_path / "src" / "dev" / "cifar10" / "memory" / "net_0-gt.csv", "passed|mem_used|bs",
           ["True|inf|8", "True|-inf|16"])
    import_perf4sight(tmp_path / "src", "d", tmp_path / "prof", tmp_path / "models")
    rows = read_rows(results_path(tmp_path / "prof", "d"))
    assert [r["device_mem_used_mb"] for r in rows] == ["inf", "-inf"]


def test_bad_sources(tmp_path):
    with pytest.raises(UserError, match="not found"):
        import_perf4sight(tmp_path / "nope", "d", tmp_path, tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no perf4sight"):
        import_perf4sight(tmp_path / "empty", "d", tmp_path, tmp_path)
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


@pytest.mark.parametrize("name", ["..", ".", "a/b", "tx2 ", "", ".hidden"])
def test_import_device_name_must_name_a_folder(tmp_path, name):
    """`--device ..` wrote the measurements beside the config and the graphs into models/."""
    from perf4sight.importers.perf4sight_csv import import_source
    with pytest.raises(UserError, match="cannot name a folder"):
        import_source(tmp_path, name, "perf4sight")
