"""bench/bench_allocator_history.py's host side: a recorded history compared with the replay, step by step.

No GPU here, so the "recorded" history is written from the replay's own events through the allocator model, in the
format the record side writes (torch's trace actions); the comparison must then find nothing, and must find exactly
an allocation added to the device's side (a workspace the replay lacks) in the step it was added to.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from perf4sight.features.alloc_trace import simulate
from perf4sight.features.allocator import ALLOC, FREE, STEP, CachingAllocator, round_size
from perf4sight.ir.schema import save_description
from perf4sight.networks.zoo import describe_zoo

ROOT = Path(__file__).resolve().parents[1]
MIB = 2 ** 20


def _bench():
    spec = importlib.util.spec_from_file_location("bench_allocator_history",
                                                  ROOT / "bench" / "bench_allocator_history.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _resnet18(folder: Path):
    """resnet18 at 32x32 (its activations reach the large pool at batch 64), saved as ``folder/<name>.json``."""
    desc = describe_zoo("resnet18", [3, 32, 32], num_classes=10)
    return desc, save_description(desc, folder / f"{desc.name}.json")


def _history(desc, batch: int, steps: int, extra_in_last: int = 0, optimizer: str = "sgd",
             loss: str = "cross_entropy") -> dict:
    """A history as the record side writes it, of ``steps`` steps (the trace's last step repeated), the weights and
    batch allocated before recording starts; ``extra_in_last`` bytes allocated and freed once in the last step;
    ``optimizer`` and ``loss``: the step's (a history of SGD's or of a cross entropy's, as those recorded before
    either could be chosen, does not say). Its GPU's cuBLAS workspaces are the ones the compare replays with."""
    from perf4sight.fingerprint.fit import blas_workspace
    workspace = blas_workspace([{"backend": "nvml", "torch_version": "2.11.0+cu130", "device_model": "replayed"}])
    trace = simulate(desc, **({} if optimizer == "sgd" else {"optimizer": optimizer}),
                     **({} if loss == "cross_entropy" else {"loss": loss}), blas_workspace=workspace)
    sizes = [int(round_size(s)) if s > 0 else 0 for s in trace.sizes(batch).tolist()]
    kinds, ids = trace.kind.tolist(), trace.tensor.tolist()
    marks = [i for i, k in enumerate(kinds) if k == STEP]
    spans = [(s, e) for s, e in zip(marks, marks[1:] + [len(kinds)])]
    spans = [(0, marks[0])] + spans + [spans[-1]] * (steps - len(spans))
    alloc, live, entries, starts = CachingAllocator(), {}, [], []

    def malloc(size: int):
        before = alloc.reserved
        block = alloc.malloc_rounded(size)
        if alloc.reserved > before:
            entries.append(["segment_alloc", alloc.reserved - before, 0])
        entries.append(["alloc", size, block.ptr])
        return block

    for n, (start, end) in enumerate(spans):
        if n > 0:
            starts.append(len(entries))
        for i in range(start, end):
            if kinds[i] == ALLOC and sizes[i]:
                live[ids[i]] = malloc(sizes[i])
            elif kinds[i] == FREE and ids[i] in live:
                block = live.pop(ids[i])
                entries.append(["free_completed", block.size, block.ptr])
                alloc.free(block)
            if n == steps and extra_in_last and i == (start + end) // 2:  # mid-step, as a workspace would be
                block = malloc(extra_in_last)
                alloc.free(block)
                entries.append(["free_completed", block.size, block.ptr])
        if n == 0:
            entries.clear()  # recording starts after the setup
    reserved, allocated = (v / MIB for v in trace.replay(batch))
    return {"network": desc.name, "batch_size": batch, "torch_version": "2.11.0+cu130", "cudnn_version": 91900,
            "device_name": "replayed", "max_reserved_mb": reserved, "max_allocated_mb": allocated,
            "step_starts": starts, "entries": entries, **({} if optimizer == "sgd" else {"optimizer": optimizer}),
            **({} if loss == "cross_entropy" else {"loss": loss})}


def test_a_history_of_the_replays_own_events_matches_it_step_by_step(tmp_path: Path) -> None:
    bench, (desc, path) = _bench(), _resnet18(tmp_path)
    history = _history(desc, 64, 7)
    assert len(history["step_starts"]) == 7 and history["entries"][0][0] in ("alloc", "segment_alloc")
    lines = bench.compare_one(history, path)
    assert lines[1].replace("measured", "") == lines[2].replace("replayed", "")  # the same segments, every step
    assert lines[3].endswith("only measured: none; only replayed: none")
    assert "reserved" in lines[0] and lines[1].count("MiB") == 7


def test_an_allocation_the_replay_lacks_is_named_with_its_size(tmp_path: Path) -> None:
    bench, (desc, path) = _bench(), _resnet18(tmp_path)
    history = _history(desc, 64, 7, extra_in_last=3 * MIB)
    lines = bench.compare_one(history, path)
    assert "only measured: 1 (3.0 MiB; largest 3.00 x1); only replayed: none" in lines[3]
    (tmp_path / "histories").mkdir()
    (tmp_path / "histories" / "resnet18_bs64.json").write_text(json.dumps(history))
    assert bench.compare(tmp_path / "histories", tmp_path) == lines  # the description found by the network's name
    grown = bench.compare_one(_history(desc, 64, 7, extra_in_last=300 * MIB), path)  # past every cached block
    assert grown[1].endswith(", 1 (300 MiB)") and grown[2].endswith(", 0 (0 MiB)")


def test_a_history_of_adams_step_is_compared_with_adams_replay(tmp_path: Path) -> None:
    """A history that names Adam is replayed with Adam's step (its second moments, its square roots): nothing
    differs; read as SGD's, the replay's allocated peak lacks the second moment (43 MiB for resnet18's 11.2 M
    parameters). The last step's sizes alone do not tell them apart: SGD's replay has perf4sight's weight-decay
    sums, one the size of each parameter, where Adam has a square root of each."""
    import re
    bench = _bench()
    desc, path = _resnet18(tmp_path)
    history = _history(desc, 64, 7, optimizer="adam")
    lines = bench.compare_one(history, path)
    assert "batch 64, adam (" in lines[0] and lines[3].endswith("only measured: none; only replayed: none")
    as_sgd = bench.compare_one({k: v for k, v in history.items() if k != "optimizer"}, path)
    measured, replayed = (float(v) for v in re.search(r"allocated (\d+), (\d+)", as_sgd[0]).groups())
    assert "batch 64, sgd (" in as_sgd[0] and measured - replayed >= 0.9 * desc.params * 4 / MIB


def test_a_history_of_an_l1_loss_is_compared_with_the_replay_of_that_loss(tmp_path: Path) -> None:
    """A history that names its loss (record --loss) is replayed with that loss: nothing differs; read as a cross
    entropy's (a history recorded before the loss could be chosen), the last step's small allocations differ (the
    loss's own tensors: a log-softmax of the scores against the difference from a target)."""
    bench = _bench()
    desc, path = _resnet18(tmp_path)
    history = _history(desc, 64, 7, loss="l1")
    lines = bench.compare_one(history, path)
    assert "batch 64, sgd, l1 (" in lines[0] and lines[3].endswith("only measured: none; only replayed: none")
    as_cross_entropy = bench.compare_one({k: v for k, v in history.items() if k != "loss"}, path)
    assert "batch 64, sgd (" in as_cross_entropy[0]
    assert not as_cross_entropy[3].endswith("only measured: none; only replayed: none")


def test_the_devices_own_allocations_run_through_the_allocator_with_and_without_its_workspaces(tmp_path: Path) -> None:
    """The history's own events through this tool's allocator give the history's peak; a 300 MiB workspace in the
    last step (past every cached block) raises the reserved peak by a new segment, and leaving out the allocations
    freed before the next one takes it out again."""
    import re
    bench, (desc, path) = _bench(), _resnet18(tmp_path)
    plain, scratch = _history(desc, 64, 7), _history(desc, 64, 7, extra_in_last=300 * MIB)
    trace = simulate(desc)
    own, _ = bench.self_replay(plain, trace)
    assert abs(own - plain["max_reserved_mb"]) < 0.5
    with_ws, _ = bench.self_replay(scratch, trace)
    assert with_ws >= own + 300
    skipped = bench.transient_allocations(scratch["entries"])
    assert any(scratch["entries"][i][1] == 300 * MIB for i in skipped)
    assert bench.self_replay(scratch, trace, skipped)[0] == bench.self_replay(
        plain, trace, bench.transient_allocations(plain["entries"]))[0]
    line = bench.compare_one(scratch, path)[4]
    assert re.search(rf"reserved {with_ws:.0f} MiB, allocated \d+; without the {len(skipped)} freed", line)
