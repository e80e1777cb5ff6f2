"""The allocator replay against torch's own allocation history, recorded on a GPU: what does the replay lack?

The replay's reserved peak is short on resnet18 on both GPUs measured so far (TX2 -17%, H100 -25%) while its
allocated peak is right to a few percent (docs/accuracy-notes.md). Peaks alone cannot say why. torch can record
every allocation the caching allocator serves and every segment it asks CUDA for
(``torch.cuda.memory._record_memory_history``); this script records that on a GPU machine, one fresh process per
(network, batch size), and compares it on the host with the replay of the same step, step by step:

- the peaks (reserved and allocated, MiB) measured and replayed, as this tool's profiler reads them (``run_peak``);
- per step, the segments CUDA was asked for (count, MiB), measured and replayed;
- in the last step (the steady state), the allocations the device made that the replay does not (e.g. cuDNN
  workspaces), and those the replay makes that the device did not, matched by rounded size, the largest first;
- the device's own allocations run through this tool's allocator (after the replay's setup: the weights and the batch
  exist before the recording starts), with and without those it frees before making any other (workspaces): whether
  the allocator model or the events fed to it are what differs.

The replay compared is the one predictions use, with cuBLAS's workspaces as the history's GPU and torch allocate them
(``fingerprint.fit.blas_workspace``). It writes down SGD's weight-decay temporaries (one parameter-sized
tensor at a time in the optimizer step: perf4sight's TX2 training used weight decay), which this tool's profiler,
and so the recording, does not have: they show as parameter-sized allocations only the replay made (on the H100's
peaks they change nothing: replayed without them, no family's mean error moved by more than 0.1 point).

Record (on the GPU machine; only torch and this project are needed; seconds per configuration):

    python3 bench/bench_allocator_history.py record --models bench/h100/models \\
        --network resnet18_l0 resnet50_l0 squeezenet1_0_l0 --batch-size 64 256 --out DIR [--optimizer adam] \\
        [--loss l1]

``--loss`` (``cross_entropy``, the default, ``mse`` or ``l1``: ``[profile] loss``) compares the output with the
target the profiler makes for it. ``--optimizer`` (``sgd``, the default, ``adam`` or ``adamw``: ``[profile]
optimizer``) trains with that optimiser as the profiler does; the history names it, and its replay writes down that
optimiser's step (Adam's ``foreach`` update, checked so far against the real optimiser on the meta device only).

Compare (on the host; ``run()``, as ``./dev.sh bench allocator_history`` calls it, compares the histories kept
under ``bench/h100/allocator_history/`` and ``bench/h200/allocator_history/``; ``--models`` takes several folders):

    .venv/bin/python bench/bench_allocator_history.py compare DIR --models bench/h100/models
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perf4sight.profiling.plan import DEFAULT_LOSS, LOSSES, OPTIMIZERS, TestPlan  # noqa: E402

#: the shared TX2 folder beside the checkout (PERF4SIGHT_TX2_DATA, as for the tests, where it is elsewhere)
TX2 = Path(os.environ.get("PERF4SIGHT_TX2_DATA", ROOT.parent / "shared" / "data" / "tx2-perf4sight"))
#: kept histories: folder -> where their descriptions are (the H200's were recorded on the H100's descriptions, on
#: five TX2 graphs, read in place from the shared data, and on two of research code: bench/h200/research_nets.py)
KEPT = {ROOT / "bench" / "h100" / "allocator_history": [ROOT / "bench" / "h100" / "models"],
        ROOT / "bench" / "h200" / "allocator_history": [ROOT / "bench" / "h100" / "models",
                                                        ROOT / "bench" / "h200" / "models",
                                                        TX2 / "graphs"]}
MIB = 2 ** 20
#: the profiler's defaults (standard library only, as on a device): warm-up and timed steps, the optimiser
_PROFILER = TestPlan(device="allocator-history")
STEPS = (_PROFILER.warmup_steps, _PROFILER.timed_steps)


def find_description(models: list[Path], network: str) -> Path | None:
    """``<network>.json`` under the first of the folders ``models`` that has it (searched recursively); None
    where none has."""
    for folder in models:
        hits = sorted(folder.rglob(f"{network}.json"))
        if hits:
            return hits[0]
    return None


# ----------------------------------------------------------------------------------------------- on the GPU
def record_one(description: Path, batch_size: int, out: Path, optimizer: str = "sgd",
               loss: str = DEFAULT_LOSS) -> None:
    """One configuration in this process: the profiler's training step (``optimizer`` and ``loss`` with its
    target as the profiler builds them, random data), warm-up and timed steps, with torch's allocation history on;
    writes ``out`` (JSON): the history's entries as ``[action, size, address]``, ``step_starts`` (the entry index
    each step starts at), the optimiser, the loss and the peaks torch's counters read (MiB)."""
    import dataclasses

    import torch

    from perf4sight.ir.schema import load_description
    from perf4sight.ir.to_torch import build_module
    from perf4sight.profiling.child import loss_function, make_optimizer, make_target

    desc = load_description(description)
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = build_module(desc).to(dev).train()
    plan = dataclasses.replace(_PROFILER, optimizer=optimizer, loss=loss)
    opt, criterion = make_optimizer(plan, model.parameters()), loss_function(loss)
    x = torch.randn(batch_size, *desc.input_shape, device=dev)
    y = make_target(plan, desc, list(desc.input_shape), batch_size, dev)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(dev)
    torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=10 ** 7)
    starts = []
    for _ in range(sum(STEPS)):
        starts.append(len(torch.cuda.memory._snapshot()["device_traces"][dev.index or 0]))
        opt.zero_grad(set_to_none=True)
        criterion(model(x), y).backward()
        opt.step()
        torch.cuda.synchronize()
    trace = torch.cuda.memory._snapshot()["device_traces"][dev.index or 0]
    torch.cuda.memory._record_memory_history(enabled=None)
    out.write_text(json.dumps({
        "network": desc.name, "batch_size": batch_size, "optimizer": optimizer, "loss": loss,
        "torch_version": torch.__version__,
        "cudnn_version": torch.backends.cudnn.version(), "device_name": torch.cuda.get_device_name(dev),
        "max_reserved_mb": torch.cuda.max_memory_reserved(dev) / MIB,
        "max_allocated_mb": torch.cuda.max_memory_allocated(dev) / MIB,
        "step_starts": starts, "entries": [[e["action"], int(e["size"]), int(e["addr"])] for e in trace]}))


def record(models: Path, networks: list[str], batch_sizes: list[int], out: Path, optimizer: str = "sgd",
           loss: str = DEFAULT_LOSS) -> int:
    """:func:`record_one` for every (network, batch size), each in a fresh process (cuDNN's plan cache and the
    allocator start empty, as in a profile); a configuration that fails is reported and skipped. Returns how
    many failed. Files are ``<network>_bs<batch>.json``, with ``_<optimizer>`` before ``.json`` but for SGD and
    ``_<loss>`` but for a cross entropy."""
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for net in networks:
        desc = find_description([models], net)
        if desc is None:
            sys.exit(f"no description {net}.json under {models}")
        for b in batch_sizes:
            suffix = ('' if optimizer == 'sgd' else '_' + optimizer) + ('' if loss == DEFAULT_LOSS else '_' + loss)
            target = out / f"{net}_bs{b}{suffix}.json"
            done = subprocess.run([sys.executable, __file__, "_one", str(desc), str(b), str(target), optimizer, loss],
                                  capture_output=True, text=True)
            tail = (done.stderr.strip().splitlines() or [""])[-1]
            print(f"{net} batch {b}: {'ok' if done.returncode == 0 else 'failed: ' + tail}", flush=True)
            failed += done.returncode != 0
    return failed


# --------------------------------------------------------------------------------------------- on the host
def step_segments(history: dict[str, Any]) -> list[tuple[int, float]]:
    """Per step of a recorded history: (segments CUDA was asked for, their MiB)."""
    entries, starts = history["entries"], history["step_starts"] + [len(history["entries"])]
    out = []
    for a, b in zip(starts, starts[1:]):
        grown = [size for action, size, _ in entries[a:b] if action == "segment_alloc"]
        out.append((len(grown), sum(grown) / MIB))
    return out


def last_step_sizes(history: dict[str, Any]) -> Counter:
    """Rounded sizes (bytes) of the allocations of a recorded history's last step."""
    from perf4sight.features.allocator import round_size
    entries = history["entries"][history["step_starts"][-1]:]
    return Counter(int(round_size(size)) for action, size, _ in entries if action == "alloc")


def transient_allocations(entries: list) -> set[int]:
    """Indices of the allocations a history frees before it makes any other: scratch such as cuDNN's workspaces."""
    out, open_, last = set(), {}, None
    for i, (action, _, addr) in enumerate(entries):
        if action == "alloc":
            open_[addr], last = i, i
        elif action == "free_completed" and addr in open_ and open_.pop(addr) == last:
            out.add(last)
    return out


def self_replay(history: dict[str, Any], trace: Any, skip: set[int] = frozenset()) -> tuple[float, float]:
    """(reserved, allocated) peaks in MiB of the device's own allocations run through this tool's
    ``CachingAllocator``, after the replay's setup (weights, buffers, batch: made before the recording started),
    leaving out the allocations at the indices ``skip`` and their frees."""
    from perf4sight.features.allocator import ALLOC, FREE, STEP, CachingAllocator

    sizes, kinds, ids = trace.sizes(int(history["batch_size"])).tolist(), trace.kind.tolist(), trace.tensor.tolist()
    alloc, live, skipped = CachingAllocator(), {}, set()
    for i in range(kinds.index(STEP)):
        if kinds[i] == ALLOC:
            live[("setup", ids[i])] = alloc.malloc(sizes[i])
        elif kinds[i] == FREE:
            alloc.free(live.pop(("setup", ids[i]), None))
    for i, (action, size, addr) in enumerate(history["entries"]):
        if action == "alloc":
            if i in skip:
                skipped.add(addr)
            else:
                live[addr] = alloc.malloc(size)
        elif action == "free_completed":
            if addr in skipped:
                skipped.discard(addr)
            else:
                alloc.free(live.pop(addr, None))
    return alloc.peak_reserved / MIB, alloc.peak_allocated / MIB


def replayed(trace: Any, batch_size: int, steps: int) -> tuple[list[tuple[int, float]], Counter]:
    """The replay's counterpart of :func:`step_segments` and :func:`last_step_sizes`, for a run of ``steps``
    steps (its recorded steps, the last one repeated)."""
    from perf4sight.features.allocator import ALLOC, FREE, STEP, CachingAllocator, round_size

    sizes = [int(round_size(s)) if s > 0 else 0 for s in trace.sizes(batch_size).tolist()]
    kinds, ids = trace.kind.tolist(), trace.tensor.tolist()
    marks = [i for i, k in enumerate(kinds) if k == STEP]
    bounds = [(s, e) for s, e in zip(marks, marks[1:] + [len(kinds)])]
    bounds = [(0, marks[0])] + bounds + [bounds[-1]] * max(0, steps - len(bounds))
    alloc, live, per_step, last = CachingAllocator(), {}, [], Counter()
    for n, (start, end) in enumerate(bounds):
        before, grown, last = alloc.reserved, 0, Counter()
        for i in range(start, end):
            if kinds[i] == ALLOC:
                new = alloc.reserved
                live[ids[i]] = alloc.malloc_rounded(sizes[i]) if sizes[i] else None
                grown += alloc.reserved > new
                last[sizes[i]] += sizes[i] > 0
            elif kinds[i] == FREE:
                alloc.free(live.pop(ids[i], None))
        if n > 0:
            per_step.append((grown, (alloc.reserved - before) / MIB))
    return per_step, +last


def compare_one(history: dict[str, Any], description: Path) -> list[str]:
    """Lines comparing one recorded history with the replay of the same step (see the module docstring)."""
    from perf4sight.features.alloc_trace import simulate
    from perf4sight.fingerprint.fit import blas_workspace, relu6_clone
    from perf4sight.ir.schema import load_description

    b, optimizer = int(history["batch_size"]), history.get("optimizer", "sgd")  # histories before it: SGD's
    loss = history.get("loss", DEFAULT_LOSS)  # and a cross entropy's
    clone = relu6_clone([{"torch_version": history["torch_version"]}])
    workspace = blas_workspace([{"backend": "nvml", "torch_version": history["torch_version"],
                                 "device_model": history["device_name"]}])
    trace = simulate(load_description(description), relu6_clone=clone,
                     **({} if optimizer == "sgd" else {"optimizer": optimizer}),
                     **({} if loss == DEFAULT_LOSS else {"loss": loss}), blas_workspace=workspace)
    res, al = (v / MIB for v in trace.replay(b))
    seg_measured, measured = step_segments(history), last_step_sizes(history)
    seg_replay, replay = replayed(trace, b, len(history["step_starts"]))
    extra, missing = measured - replay, replay - measured
    scratch = transient_allocations(history["entries"])
    (own_res, own_al), (bare_res, _) = self_replay(history, trace), self_replay(history, trace, scratch)
    return [f"{history['network']} batch {b}, {optimizer}{'' if loss == DEFAULT_LOSS else ', ' + loss} "
            f"({history['device_name']}, torch "
            f"{history['torch_version']}, cuDNN {history['cudnn_version']}): reserved "
            f"{history['max_reserved_mb']:.0f} MiB measured, {res:.0f} replayed; allocated "
            f"{history['max_allocated_mb']:.0f}, {al:.0f}",
             "  segments per step, measured: " + _steps(seg_measured),
             "  segments per step, replayed: " + _steps(seg_replay),
             f"  last step: {sum(measured.values())} allocations measured, {sum(replay.values())} replayed; "
             f"only measured: {_sizes(extra)}; only replayed: {_sizes(missing)}",
             f"  the device's own allocations through this tool's allocator: reserved {own_res:.0f} MiB, allocated "
             f"{own_al:.0f}; without the {len(scratch)} freed before the next allocation (workspaces): reserved "
             f"{bare_res:.0f}"]


def _steps(per_step: list[tuple[int, float]]) -> str:
    return ", ".join(f"{n} ({mb:.0f} MiB)" for n, mb in per_step)


def _sizes(counts: Counter, shown: int = 6) -> str:
    """``total`` allocations and MiB, then the largest sizes (MiB) with their counts."""
    if not counts:
        return "none"
    top = sorted(counts.items(), reverse=True)[:shown]
    return (f"{sum(counts.values())} ({sum(s * c for s, c in counts.items()) / MIB:.1f} MiB; largest "
            + ", ".join(f"{s / MIB:.2f} x{c}" for s, c in top) + ")")


def compare(folder: Path, models: Path | list[Path]) -> list[str]:
    """:func:`compare_one` for every history JSON in ``folder``; a line saying so for one whose description is
    under none of ``models``."""
    lines, models = [], [models] if isinstance(models, Path) else list(models)
    for path in sorted(folder.glob("*.json")):
        history = json.loads(path.read_text())
        description = find_description(models, history["network"])
        lines += (compare_one(history, description) if description else
                  [f"{path.name}: no description {history['network']}.json under {', '.join(map(str, models))}: "
                   "skipped"])
    return lines


def run() -> list[dict]:
    """For bench/run_all.py: compare the kept histories, if any (no figures rows: the output is the result)."""
    for folder, models in KEPT.items():
        if not any(folder.glob("*.json")):
            print(f"no recorded allocator histories under {folder.relative_to(ROOT)}: record them on a GPU machine "
                  "(see this script's docstring); skipped")
            continue
        print("\n".join(compare(folder, models)))
    return []


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_one":  # the fresh process of one configuration
        record_one(Path(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), *sys.argv[5:7])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    rec = sub.add_parser("record", help="on a GPU machine: record allocation histories")
    rec.add_argument("--models", type=Path, required=True)
    rec.add_argument("--network", nargs="+", required=True)
    rec.add_argument("--batch-size", type=int, nargs="+", required=True)
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd", help="the training step's optimiser")
    rec.add_argument("--loss", choices=LOSSES, default=DEFAULT_LOSS, help="the training step's loss")
    cmp_ = sub.add_parser("compare", help="on the host: compare recorded histories with the replay")
    cmp_.add_argument("folder", type=Path)
    cmp_.add_argument("--models", type=Path, nargs="+", required=True, help="folders holding the descriptions")
    args = ap.parse_args()
    if args.mode == "record":
        sys.exit(1 if record(args.models, args.network, args.batch_size, args.out, args.optimizer,
                            args.loss) else 0)
    else:
        print("\n".join(compare(args.folder, args.models)))


if __name__ == "__main__":
    main()
