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


def _fake_tree(root, tag: str) -> None:
    """A perf4sight package of its own at ``root``: its simulate imports ``perf4sight.late`` when called and writes
    down which tree's simulate ran with which tree's ``late`` (to the file named by ``SEEN``)."""
    files = {"__init__.py": "", "ir/__init__.py": "", "networks/__init__.py": "", "features/__init__.py": "",
             "late.py": f"WHO = {tag!r}\n",
             "ir/schema.py": "from types import SimpleNamespace\n\n\ndef load_description(n):\n"
                             "    return SimpleNamespace(name='net')\n",
             "networks/zoo.py": "def describe_zoo(*a):\n    raise AssertionError\n",
             "features/alloc_trace.py": (
                 "import os\n\n\nclass _Trace:\n    def with_protocol(self, p):\n        return self\n\n"
                 "    def replay(self, b):\n        pass\n\n\ndef clear_cache():\n    pass\n\n\n"
                 "def simulate(desc):\n    from perf4sight.late import WHO\n\n"
                 f"    with open(os.environ['SEEN'], 'a') as f:\n        f.write({tag!r} + ' ' + WHO + '\\n')\n"
                 "    return _Trace()\n")}
    for name, text in files.items():
        (root / "perf4sight" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "perf4sight" / name).write_text(text)


def test_replay_speed_against_a_base_tree_runs_each_side_with_its_own_modules(tmp_path, monkeypatch):
    """``bench_replay_speed --against DIR`` loaded both trees in one process, the base's modules set aside: a base
    function's import made when called (the meta trace's ``from perf4sight.ir.from_torch import ...``) found this
    tree's module, so the 'before' side ran the new code. Each side runs with its own modules now, and the caller's
    perf4sight modules are put back after."""
    import sys

    import perf4sight.errors

    bench = load_bench("bench_replay_speed")
    for tag in ("base", "this"):
        _fake_tree(tmp_path / tag, tag)
    monkeypatch.setattr(bench, "ROOT", tmp_path / "this")
    monkeypatch.setenv("SEEN", str(tmp_path / "seen.txt"))
    mine = sys.modules["perf4sight"], perf4sight.errors
    times = bench.paired(["net.json"], tmp_path / "base", rounds=2, fingerprint=None)
    assert {k: len(v) for k, v in times["net"].items()} == {"base": 2, "this": 2}
    seen = (tmp_path / "seen.txt").read_text().split("\n")[:-1]
    assert len(seen) == 6 and set(seen) == {"base base", "this this"}
    assert (sys.modules["perf4sight"], sys.modules["perf4sight.errors"]) == mine
    assert str(tmp_path) not in " ".join(sys.path)


def test_replay_speed_takes_a_fingerprints_step_rules_as_its_predictions_do(monkeypatch):
    """``bench_replay_speed --fingerprint DIR`` traces each network under the fingerprint's step rules: the
    keywords ``attach_simulation`` gives ``simulate`` (the update, the loss and cuBLAS's workspaces where they are not
    the defaults) and the fingerprint's replay protocol. It imported two helpers ``alloc_trace`` no longer has."""
    from types import SimpleNamespace

    from perf4sight.features.step_runtime import StepRuntime
    from perf4sight.fingerprint import predict

    bench = load_bench("bench_replay_speed")
    runtime = StepRuntime(foreach=True, grads_to_none=True, loss="mse", blas_workspace=(8 << 20, 32 << 20))
    monkeypatch.setattr(predict, "load_fingerprint", lambda folder: SimpleNamespace(runtime=runtime,
                                                                                    memory_replay="run_peak"))
    rules, protocol = bench._fingerprint_rules("h200", "perf4sight")
    assert protocol == "run_peak" and rules["set_to_none"] and rules["loss"] == "mse"
    assert rules["blas_workspace"] == (8 << 20, 32 << 20) and rules["relu6_clone"] == runtime.relu6_clone
    assert bench._fingerprint_rules(None, "perf4sight") == ({}, "perf4sight")
