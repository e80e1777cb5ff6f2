"""How the CPU fingerprint's held-out torchvision families read with other draws of the generated networks.

The default config's six generated networks are what teaches the fingerprint the kinds of layer its three
torchvision families lack (depthwise convolutions, for mobilenet_v2). This bench keeps one set of torchvision
rows and, for each generator seed and draw (the plain draw, and ``cover_styles``: each style leads a network in
turn), profiles that draw's generated networks beside them in a folder of its own, fits the device's fingerprint
(the fingerprint stage's own nested table) and prints each torchvision family's held-out latency MAPE, %.

``--dataset DIR``: a folder the shipped ``config.toml`` ran in (``--stage all`` or ``networks`` + ``profile``);
its torchvision rows are used. Without it the bench profiles them first (the config's networks, no generated
ones: about 3 minutes). Each seed and draw then takes about 2 minutes on 2 cores. docs/accuracy-notes.md, "CPU:
the generated networks' draw, and the tree corrections", has what it printed for seeds 0-4.

    .venv/bin/python bench/bench_generator_draw.py [--dataset DIR] [--seeds 0 1 2 3 4] [--draws plain cover]
                                                   [--keep DIR]
"""
from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

# bench_cpu_families imports bench_fingerprint, which pins OpenBLAS's kernels before numpy loads, as main.py does
from bench_cpu_families import _stage  # noqa: E402
from perf4sight.config import load_config  # noqa: E402
from perf4sight.profiling.results import append_row, read_rows, results_path  # noqa: E402

DRAWS = ("plain", "cover")


def with_generator(config_text: str, count: int, seed: int | None = None, cover: bool | None = None) -> str:
    """``config_text`` with ``[networks.generator]``'s ``count``, and ``seed`` and ``cover_styles`` where given
    (a key the table lacks is added under its header)."""
    wanted = {"count": str(count)}
    if seed is not None:
        wanted["seed"] = str(seed)
    if cover is not None:
        wanted["cover_styles"] = "true" if cover else "false"
    out, section, seen = [], "", set()
    for line in config_text.splitlines():
        header = re.match(r"\s*\[([^\]]+)\]", line)
        if header:
            if section == "networks.generator":
                out[len(out):] = [f"{k} = {v}" for k, v in wanted.items() if k not in seen]
            section = header.group(1).strip()
        key = re.match(r"\s*(\w+)\s*=", line)
        if section == "networks.generator" and key and key.group(1) in wanted:
            line = f"{key.group(1)} = {wanted[key.group(1)]}"
            seen.add(key.group(1))
        out.append(line)
    if section == "networks.generator":
        out += [f"{k} = {v}" for k, v in wanted.items() if k not in seen]
    elif "networks.generator" not in config_text:
        out += ["[networks.generator]"] + [f"{k} = {v}" for k, v in wanted.items()]
    return "\n".join(out) + "\n"


def torchvision_rows(dataset: Path) -> tuple[str, list[dict]]:
    """(the device, its rows of networks the generator did not make) of the folder ``dataset``."""
    cfg = load_config(dataset / "config.toml")
    device = next(iter(cfg.devices))
    rows = [r for r in read_rows(results_path(cfg.profiling_dir, device)) if not r["network"].startswith("gen_")]
    if not rows:
        sys.exit(f"bench_generator_draw: no measured torchvision rows under {cfg.profiling_dir / device}")
    return device, rows


def held_out(folder: Path, device: str) -> dict[str, float]:
    """Held-out latency MAPE (%) per torchvision family of the fingerprint fitted in ``folder``."""
    from perf4sight.dataset import device_dataset
    from perf4sight.fingerprint.api import fit_device

    cfg = load_config(folder / "config.toml")
    descs, shas, rows, _ = device_dataset(cfg, device)
    per = fit_device(cfg, device, descs, shas, rows=rows)["accuracy"]["latency"]["per_group"]
    return {fam: float(m["mape"]) for fam, m in sorted(per.items()) if not fam.startswith("gen-")}


def run(dataset: str = "", seeds: tuple[int, ...] = (0, 1), draws: tuple[str, ...] = DRAWS,
        keep: str = "") -> list[dict]:
    """Profile and evaluate each draw (see module doc); rows for bench/run_all.py. ``keep``: a folder to make the
    draws' folders in and leave behind, instead of a temporary one."""
    with tempfile.TemporaryDirectory(prefix="p4s-generator-draw-") as scratch:
        work = Path(keep or scratch)
        work.mkdir(parents=True, exist_ok=True)
        base = Path(dataset) if dataset else work / "torchvision"
        if not dataset:  # the shipped config's torchvision networks, profiled once for every draw
            base.mkdir(exist_ok=True)
            (base / "config.toml").write_text(with_generator((ROOT / "config.toml").read_text(), 0))
            for stage in ("networks", "profile"):
                _stage(base / "config.toml", stage)
            print("  torchvision rows profiled", flush=True)
        device, rows = torchvision_rows(base)
        results = []
        for draw in draws:
            for seed in seeds:
                folder = work / f"{draw}-{seed}"
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir(parents=True)
                text = with_generator((base / "config.toml").read_text(), 6, seed, draw == "cover")
                (folder / "config.toml").write_text(text)
                csv_path = results_path(load_config(folder / "config.toml").profiling_dir, device)
                for r in rows:
                    append_row(csv_path, r)
                for stage in ("networks", "profile"):
                    _stage(folder / "config.toml", stage)
                fams = held_out(folder, device)
                results.append((draw, seed, fams))
                print(f"  {draw} draw, generator seed {seed}: "
                      + ", ".join(f"{f} {v:.1f}" for f, v in fams.items())
                      + f" (mean {statistics.mean(fams.values()):.1f})", flush=True)
    out = []
    for draw in draws:
        means = [statistics.mean(f.values()) for d, _, f in results if d == draw]
        print(f"{draw} draw: torchvision mean per seed {', '.join(f'{m:.1f}' for m in means)}; "
              f"mean {statistics.mean(means):.1f}, worst {max(means):.1f}")
        out += [{"benchmark": "generator_draw", "metric": f"{draw} draw: torchvision held-out latency MAPE, mean "
                 f"over generator seeds {', '.join(map(str, seeds))}", "value": round(statistics.mean(means), 1),
                 "unit": "%", "note": f"worst seed {max(means):.1f}"}]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="", help="a folder the shipped config.toml profiled in (its torchvision "
                                                  "rows are used); default: profile them first")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1], help="generator seeds (default 0 1)")
    ap.add_argument("--draws", nargs="+", choices=DRAWS, default=list(DRAWS), help="which draws (default both)")
    ap.add_argument("--keep", default="", help="make the draws' folders here and leave them")
    args = ap.parse_args()
    run(args.dataset, tuple(args.seeds), tuple(args.draws), args.keep)


if __name__ == "__main__":
    main()
