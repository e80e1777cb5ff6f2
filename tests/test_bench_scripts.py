"""bench/'s scripts as run from any checkout: where they look for the shared TX2 data."""
from __future__ import annotations

from bench_module import load_bench


def test_allocator_bench_reads_the_tx2_folder_named_by_the_environment(tmp_path, monkeypatch, capsys):
    """The TX2 benchmarks looked only beside the checkout (``../shared/data``), so a clone elsewhere skipped
    them; they now take ``PERF4SIGHT_TX2_DATA`` as the tests do (and bench_allocator ``--data DIR``), and a
    folder without the data says both ways to name it."""
    monkeypatch.setenv("PERF4SIGHT_TX2_DATA", str(tmp_path / "elsewhere"))
    bench = load_bench("bench_allocator")
    assert bench.TX2 == tmp_path / "elsewhere"
    assert bench.run(tmp_path / "elsewhere") == []
    said = capsys.readouterr().out
    assert f"not found at {tmp_path / 'elsewhere'}" in said and "--data DIR" in said and "PERF4SIGHT_TX2_DATA" in said


def test_allocator_history_bench_finds_the_tx2_graphs_named_by_the_environment(tmp_path, monkeypatch):
    """The kept H200 histories of TX2 networks are compared on the TX2 graphs: looked for under
    ``PERF4SIGHT_TX2_DATA`` too, not only beside the checkout."""
    monkeypatch.setenv("PERF4SIGHT_TX2_DATA", str(tmp_path / "elsewhere"))
    bench = load_bench("bench_allocator_history")
    assert tmp_path / "elsewhere" / "graphs" in bench.KEPT[bench.ROOT / "bench" / "h200" / "allocator_history"]


def test_drift_bench_holds_out_the_families_its_dataset_was_made_with(tmp_path):
    """bench_drift held out bench_cpu_families' default six families whatever ``--dataset`` it was given: on a set
    made with ``--zoo`` (the README's second wide set) the first fold had no rows and ExtraTrees stopped on an
    empty array. It now holds out the families of the folder's own config."""
    drift = load_bench("bench_drift")
    families = load_bench("bench_cpu_families")
    second = ("alexnet", "densenet121", "efficientnet_b0", "mobilenet_v3_large", "resnet34", "squeezenet1_1")
    families.write_config(tmp_path, zoo=second, generated=2)
    assert drift.held_out_families(tmp_path) == list(second)
