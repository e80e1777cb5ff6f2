"""Description to memory prediction, one network never seen before: the allocation events written down and the
allocator replayed at 4 batch sizes (issue 5's "under 50 ms per network"; the README's Speed bullet).

Each network is described once (untimed); then, per round, for each network in turn: the simulation cache cleared,
Python's collector run, and the process time taken of ``simulate(desc)`` (the events written down by
``alloc_model.py`` and made a trace) and of the trace's replay at batch sizes 2, 8, 32 and 64. Prints, per network,
the median (and the range) over the rounds of the whole, and of simulate alone, in ms, and the load average.

``--code DIR`` times the perf4sight package of another tree (a clone of a base commit), so that base and change can
be run one after the other, alternating, on a shared machine:

    .venv/bin/python bench/bench_replay_speed.py --rounds 7 maxvit_t swin_v2_t swin_t resnet18
    .venv/bin/python bench/bench_replay_speed.py --code /tmp/base --rounds 7 maxvit_t

``--against DIR`` loads both trees' packages in one process and times them alternately, round by round (the first
of a round alternating too): on a loaded machine the paired differences (the median printed) move less than two
processes' medians do. Each side runs with its own tree's modules alone in ``sys.modules`` and its tree first on
``sys.path`` (swapped in and out around each run, outside the timing): the imports a function makes when called (the
meta trace's ``from perf4sight.ir.from_torch import ...``, for a network the allocation model does not cover) had
found this tree's modules on the base side. Each side describes the networks and reads the fingerprint itself, and
runs each network once untimed first (the imports its calls make).

``--fingerprint DIR`` traces and replays each network as that fingerprint's predictions do (its step's rules: a GPU
fingerprint's ``zero_grad(set_to_none=True)``, its update and cuBLAS workspaces; its replay protocol) instead of
perf4sight's TX2 step. A network given as a path ending in ``.json`` is read from that description file (its own
input shape), else described from the zoo at ``--side``:

    .venv/bin/python bench/bench_replay_speed.py --fingerprint bench/h200/fingerprinting/h200 --rounds 15 \
        --against /tmp/base densenet121 bench/h100/models/pruned/l1-norm/resnet50_l0.json
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BATCHES = (2, 8, 32, 64)
NETWORKS = ["maxvit_t", "swin_v2_t", "swin_t", "resnet18"]


def _descriptions(networks: list[str], side: int) -> dict:
    """Each network's description: read from its file (a name ending in ``.json``) or described from the zoo."""
    from perf4sight.ir.schema import load_description
    from perf4sight.networks.zoo import describe_zoo
    descs = {}
    for n in networks:
        desc = load_description(n) if n.endswith(".json") else describe_zoo(n, [3, side, side])
        descs[desc.name] = desc
    return descs


def _fingerprint_rules(fingerprint: Path | None, protocol: str) -> tuple[dict, str]:
    """``simulate``'s keywords and the replay's protocol for the predictions of ``fingerprint`` (as
    ``alloc_trace.attach_simulation`` gives them); without one, none and ``protocol``."""
    if fingerprint is None:
        return {}, protocol
    from perf4sight.features.alloc_trace import _traced_rules
    from perf4sight.fingerprint.predict import load_fingerprint
    fp = load_fingerprint(fingerprint)
    rt = fp.runtime
    return {"relu6_clone": rt.relu6_clone, **rt.traced_update(), **_traced_rules(rt)}, fp.memory_replay


def measure(networks: list[str], rounds: int = 7, side: int = 224, protocol: str = "run_peak",
            code: Path = ROOT, fingerprint: Path | None = None) -> dict[str, tuple[list[float], list[float]]]:
    """Per network: (whole times, simulate times) in ms over ``rounds``, ``code``'s perf4sight timed."""
    sys.path.insert(0, str(Path(code).resolve()))
    from perf4sight.features.alloc_trace import clear_cache, simulate

    descs = _descriptions(networks, side)
    rules, protocol = _fingerprint_rules(fingerprint, protocol)
    out: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in descs}
    for _ in range(rounds):
        for name, desc in descs.items():
            clear_cache()
            gc.collect()
            t0 = time.process_time()
            trace = simulate(desc, **rules).with_protocol(protocol)
            t1 = time.process_time()
            for b in BATCHES:
                trace.replay(b)
            t2 = time.process_time()
            out[name][0].append(1e3 * (t2 - t0))
            out[name][1].append(1e3 * (t1 - t0))
    return out


def _ours(name: str) -> bool:
    return name == "perf4sight" or name.startswith("perf4sight.")


class _Tree:
    """One tree's perf4sight package in a process that holds two: :meth:`entered` puts its modules (and only its) in
    ``sys.modules`` and its root first on ``sys.path`` for the time a side runs, then sets them aside again, so that
    the imports its functions make when called (``from perf4sight.ir.from_torch import ...`` inside a function: the
    meta trace's, a network the allocation model does not cover) find this tree's modules, and a module not yet
    loaded is loaded from this tree."""

    def __init__(self, code: Path) -> None:
        self.root = str(Path(code).resolve())
        self.modules: dict = {}

    def entered(self) -> "_Tree":
        for name in [m for m in sys.modules if _ours(m)]:
            del sys.modules[name]
        sys.modules.update(self.modules)
        sys.path.insert(0, self.root)
        return self

    def __enter__(self) -> "_Tree":
        return self.entered()

    def __exit__(self, *exc: object) -> None:
        self.modules = {m: mod for m, mod in sys.modules.items() if _ours(m)}
        for name in self.modules:
            del sys.modules[name]
        sys.path.remove(self.root)


def _side(tree: _Tree, networks: list[str], side: int, protocol: str, fingerprint: Path | None) -> tuple:
    """``tree``'s (clear_cache, simulate, descriptions, simulate's keywords, protocol), each made by its own
    package (a base tree describes the networks as it did)."""
    with tree:
        from perf4sight.features.alloc_trace import clear_cache, simulate
        return (clear_cache, simulate, _descriptions(networks, side)) + _fingerprint_rules(fingerprint, protocol)


def paired(networks: list[str], base: Path, rounds: int = 21, side: int = 224,
           protocol: str = "run_peak", fingerprint: Path | None = None) -> dict[str, dict[str, list[float]]]:
    """Per network, the whole times (ms) of ``base``'s package and of this tree's, alternating in one process, each
    run with its own tree's modules in ``sys.modules`` (:class:`_Tree`)."""
    held = {m: mod for m, mod in sys.modules.items() if _ours(m)}  # the caller's, put back after
    trees = {"base": _Tree(base), "this": _Tree(ROOT)}
    try:
        sides = {which: _side(tree, networks, side, protocol, fingerprint) for which, tree in trees.items()}
        out: dict[str, dict[str, list[float]]] = {n: {"base": [], "this": []} for n in sides["this"][2]}
        for r in range(-1, rounds):  # round -1 untimed: each side's imports made when called
            for name in out:
                for which in (("base", "this") if r % 2 == 0 else ("this", "base")):
                    clear_cache, simulate, descs, rules, how = sides[which]
                    with trees[which]:
                        clear_cache()
                        gc.collect()
                        t0 = time.process_time()
                        trace = simulate(descs[name], **rules).with_protocol(how)
                        for b in BATCHES:
                            trace.replay(b)
                        if r >= 0:
                            out[name][which].append(1e3 * (time.process_time() - t0))
    finally:
        sys.modules.update(held)
    return out


def run() -> list[dict]:
    """The default networks, 7 rounds: one row per network (bench/run_all.py)."""
    import numpy as np
    times = measure(NETWORKS)
    load = os.getloadavg()[0]
    return [{"benchmark": "replay_speed", "metric": f"{name} description -> 4 batch sizes (median of 7)",
             "value": float(np.median(whole)), "unit": "ms",
             "note": f"simulate {np.median(sim):.1f} ms; process time; load average {load:.1f}"}
            for name, (whole, sim) in times.items()]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("networks", nargs="*", default=NETWORKS)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--side", type=int, default=224, help="input side (px), 3 channels")
    ap.add_argument("--protocol", default="run_peak", help="the replay's protocol (allocator.REPLAY_PROTOCOLS)")
    ap.add_argument("--code", type=Path, default=ROOT, help="the tree whose perf4sight package is timed")
    ap.add_argument("--against", type=Path, help="a base tree, timed alternately with this one in one process")
    ap.add_argument("--fingerprint", type=Path, help="trace and replay under this fingerprint's rules and protocol")
    args = ap.parse_args(argv)
    import numpy as np
    if args.fingerprint is not None and not (args.fingerprint / "metadata.json").is_file():
        sys.exit(f"bench_replay_speed: --fingerprint {args.fingerprint}: no fingerprint there (no metadata.json)")
    how = args.protocol if args.fingerprint is None else f"{args.fingerprint}'s rules and protocol"
    if args.against is not None:
        times = paired(args.networks, args.against, args.rounds, args.side, args.protocol, args.fingerprint)
        print(f"{args.against.resolve()} against {ROOT}, {args.rounds} rounds, {args.side}px, {how}, "
              f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        for name, t in times.items():
            base, this = np.array(t["base"]), np.array(t["this"])
            print(f"{name:12s} base {np.median(base):6.1f} ms, this {np.median(this):6.1f} ms, "
                  f"paired difference {np.median(this - base):+.1f} ms")
        return
    times = measure(args.networks, args.rounds, args.side, args.protocol, args.code, args.fingerprint)
    print(f"code {args.code.resolve()}, {args.rounds} rounds, {args.side}px, {how}, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for name, (t, e) in times.items():
        print(f"{name:12s} total {np.median(t):6.1f} ms ({min(t):.1f}-{max(t):.1f}), "
              f"simulate {np.median(e):5.1f} ms, replay x{len(BATCHES)} {np.median(t) - np.median(e):5.1f} ms")


if __name__ == "__main__":
    main()
