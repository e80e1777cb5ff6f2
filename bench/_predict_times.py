"""Whole predictions timed against the code before a speed change (run by hand, not by run_all.py: its name starts
with an underscore): each description cold (``clear_cache()`` and a collection before it, not timed), ``predict`` at
batch sizes 2, 8, 32, 64, process time; a round is one process of each tree in turn (this tree, then BASE's), and the
medians of the rounds are printed side by side.

    .venv/bin/python bench/_predict_times.py --against /path/to/base_clone --rounds 5 \\
        --fingerprint /tmp/p82/tx2/fingerprinting/tx2 bench/h200/fingerprinting/h200 -- DESCRIPTION.json ...

One process (``--one TREE OUT.json``) times every description on every fingerprint after one warm-up prediction of
the last description on each.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BATCHES = [2, 8, 32, 64]


def one(tree: Path, out: Path, fingerprints: list[str], files: list[str]) -> None:
    sys.path.insert(0, str(tree.resolve()))
    from perf4sight.features.alloc_trace import clear_cache
    from perf4sight.fingerprint.predict import load_fingerprint
    from perf4sight.ir.schema import load_description

    descs = [load_description(f) for f in files]
    times = {}
    for folder in fingerprints:
        fp = load_fingerprint(folder)
        fp.predict(descs[-1], BATCHES)  # the code paths' first run
        for d in descs:
            clear_cache()
            gc.collect()
            start = time.process_time()
            fp.predict(d, BATCHES)
            times[f"{Path(folder).name}/{d.name}"] = (time.process_time() - start) * 1e3
    out.write_text(json.dumps(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", type=Path, help="the clone of the code before")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--fingerprint", nargs="+", required=True)
    ap.add_argument("--one", nargs=2, metavar=("TREE", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    if args.one:
        one(Path(args.one[0]), Path(args.one[1]), args.fingerprint, args.files)
        return
    trees = [Path(__file__).resolve().parents[1]] + ([args.against] if args.against else [])
    runs: list[list[dict[str, float]]] = [[] for _ in trees]
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for k, tree in enumerate(trees):
                out = Path(tmp) / f"{k}-{r}.json"
                subprocess.run([sys.executable, __file__, "--one", str(tree), str(out), "--fingerprint",
                                *args.fingerprint, "--", *args.files], check=True)
                runs[k].append(json.loads(out.read_text()))
    for key in runs[0][0]:
        now = statistics.median(run[key] for run in runs[0])
        if len(trees) == 1:
            print(f"{key:40s} {now:7.1f} ms")
            continue
        before = statistics.median(run[key] for run in runs[1])
        print(f"{key:40s} before {before:7.1f} ms  after {now:7.1f} ms  ({(now - before) / before * 100:+.0f}%)")


if __name__ == "__main__":
    main()
