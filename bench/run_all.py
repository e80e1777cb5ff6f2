"""Run every benchmark in bench/, print one table, write it to bench/results/latest.md (and .json).

    .venv/bin/python bench/run_all.py [NAME ...] [--list] [--timeout S]     (./dev.sh bench [NAME])

The contract for a bench script (any ``bench/*.py`` except this file and ``_*.py``): either it
defines ``run() -> list[dict]`` whose rows have the keys ``benchmark``, ``metric``, ``value``
(a number), ``unit`` and ``note`` — and may print whatever else it likes — or it only prints,
in which case its output is kept verbatim and the table records whether it ran. Each script
runs in its own process (``run()`` through ``--child``), so one crash or slow import does not
touch the others. NAME selects scripts by file stem, with or without the ``bench_`` prefix.
The published figures of related tools (from DESIGN.md) are listed beside ours, each with
what it measured; they were measured elsewhere and are not comparable one to one.
"""
from __future__ import annotations

import argparse
import ast
import datetime as _dt
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
MARKER = "@@perf4sight-bench-rows@@"
KEYS = ("benchmark", "metric", "value", "unit", "note")

#: Published figures, as DESIGN.md ("Reference figures") reports them: (source, what was measured, metric, value).
PUBLISHED: list[tuple[str, str, str, str]] = [
    ("perf4sight (ICCV-W 2021)", "Jetson TX2, CNN training step, its ExtraTrees on 56 conv features",
     "memory accuracy / latency accuracy", "95% / 91%"),
    ("perf4sight (ICCV-W 2021)", "Jetson TX2 data (data/tx2-perf4sight) + other public networks, leave one network out",
     "memory MAPE / latency MAPE", "6–17% / 8–24% (depends on the network held out)"),
    ("PerfSeer", "RTX 3090, 53k training configurations, GNN", "mean MAPE", "5.14%"),
    ("PerfSeer", "CPU, per network", "graph extraction / one prediction", "~248 ms / ~2 ms"),
    ("DNNPerf", "GPU, DNN training, GNN", "training-time error / GPU-memory error", "7.4% / 13.7%"),
    ("nn-Meter", "inference latency, mobile CPU/GPU", "predictions within ±10%", "99%"),
    ("Habitat", "training iteration time, predicted across GPUs", "mean error", "11.8%"),
]


def discover(names: list[str]) -> list[Path]:
    """The bench scripts, optionally narrowed to ``names`` (stems, ``bench_`` prefix optional)."""
    scripts = sorted(p for p in BENCH.glob("*.py") if p.name != Path(__file__).name and not p.name.startswith("_"))
    if not names:
        return scripts
    picked = [p for p in scripts if p.stem in names or p.stem.removeprefix("bench_") in names]
    unknown = [n for n in names if not any(n in (p.stem, p.stem.removeprefix("bench_")) for p in scripts)]
    if unknown:
        sys.exit(f"bench/run_all.py: no bench script named {', '.join(unknown)} "
                 f"(have: {', '.join(p.stem for p in scripts)})")
    return picked


def has_run(path: Path) -> bool:
    """Whether the script defines a module-level ``run`` function (read with ast, not imported)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return any(isinstance(n, ast.FunctionDef) and n.name == "run" for n in tree.body)


def child(path: Path) -> None:
    """Import ``path``, call its ``run()`` and print the rows as one marked JSON line."""
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT))
    spec.loader.exec_module(module)
    rows = module.run()
    sys.stdout.flush()
    print(MARKER + json.dumps(list(rows), default=float), flush=True)


def _normalise(row: dict, default_name: str) -> dict:
    out = {k: row.get(k, "") for k in KEYS}
    out["benchmark"] = out["benchmark"] or default_name
    try:
        out["value"] = float(out["value"])
    except (TypeError, ValueError):
        out["note"] = f"{out['note']} (value: {out['value']})".strip()
        out["value"] = math.nan
    return out


def run_script(path: Path, timeout: float | None) -> tuple[list[dict], str, float]:
    """Run one script in its own process, echoing its output; (rows, printed output, seconds)."""
    if has_run(path):  # its run() through --child (see child), which prints the rows it returns
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(path)]
    else:
        cmd = [sys.executable, str(path)]
    t0 = time.perf_counter()
    lines: list[str] = []
    rows: list[dict] = []
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = None if not timeout else t0 + timeout
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(MARKER):
            rows = [_normalise(r, path.stem) for r in json.loads(line[len(MARKER):])]
            continue
        lines.append(line)
        print(f"  | {line}", end="", flush=True)
        if deadline and time.perf_counter() > deadline:
            proc.kill()
            lines.append(f"(killed after {timeout:.0f} s)\n")
            break
    code = proc.wait()
    took = time.perf_counter() - t0
    if code != 0:
        last = next((ln.strip() for ln in reversed(lines) if ln.strip()), "")
        rows.append(_normalise({"metric": "failed", "value": code, "unit": "exit status", "note": last}, path.stem))
    elif not rows:
        rows.append(_normalise({"metric": "ran (prints only; output below)", "value": 0, "unit": "exit status"},
                               path.stem))
    rows.append(_normalise({"metric": "wall time of the script", "value": took, "unit": "s"}, path.stem))
    return rows, "".join(lines), took


def _fmt(v: float) -> str:
    if math.isnan(v):
        return "–"
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    esc = [[str(c).replace("|", "\\|") for c in r] for r in rows]
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                     + ["| " + " | ".join(r) + " |" for r in esc])


def write_results(rows: list[dict], outputs: dict[str, str], out_dir: Path) -> Path:
    """bench/results/latest.md (tables + every script's printed output) and latest.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    when = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    machine = f"{platform.node()}, {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    md = ["# perf4sight benchmarks", "", f"Run {when} on {machine}. CPU timings are noisy (about ±20%).", "",
          "## Ours", "",
          _md_table(["benchmark", "metric", "value", "unit", "note"],
                    [[r["benchmark"], r["metric"], _fmt(r["value"]), r["unit"], r["note"]] for r in rows]), "",
          "## Published figures (measured elsewhere; for orientation, not a like-for-like comparison)", "",
          _md_table(["source", "what was measured", "metric", "value"], [list(p) for p in PUBLISHED]), ""]
    for name, text in outputs.items():
        md += [f"## Output of {name}", "", "```", text.rstrip(), "```", ""]
    path = out_dir / "latest.md"
    path.write_text("\n".join(md))
    (out_dir / "latest.json").write_text(json.dumps({"when": when, "machine": machine, "rows": rows,
                                                     "published": PUBLISHED}, indent=1, default=float))
    return path


def print_table(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="perf4sight benchmarks (ours)")
    for col in ("benchmark", "metric", "value", "unit"):
        t.add_column(col, justify="right" if col == "value" else "left")
    for r in rows:
        t.add_row(r["benchmark"], r["metric"], _fmt(r["value"]), r["unit"])
    p = Table(title="published figures (measured elsewhere)")
    for col in ("source", "what was measured", "metric", "value"):
        p.add_column(col)
    for row in PUBLISHED:
        p.add_row(*row)
    console = Console()
    console.print(t)
    console.print(p)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="bench scripts to run (default: all)")
    ap.add_argument("--list", action="store_true", help="list the bench scripts and exit")
    ap.add_argument("--timeout", type=float, default=0, help="seconds per script (0 = no limit)")
    ap.add_argument("--out", type=Path, default=RESULTS, help=argparse.SUPPRESS)
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return 0
    scripts = discover(args.names)
    if args.list:
        for p in scripts:
            print(f"{p.stem:24s} {'run() rows' if has_run(p) else 'prints only'}")
        return 0
    rows: list[dict] = []
    outputs: dict[str, str] = {}
    for path in scripts:
        print(f"== {path.name}", flush=True)
        got, text, took = run_script(path, args.timeout or None)
        print(f"== {path.name}: {took:.0f} s", flush=True)
        rows += got
        outputs[path.name] = text
    print_table(rows)
    out = write_results(rows, outputs, args.out)
    print(f"written: {out}")
    return 1 if any(r["metric"] == "failed" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
