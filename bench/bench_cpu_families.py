"""Fingerprint accuracy on this machine's CPU with more network families than the default config.

The default config profiles three torchvision families, so holding one out leaves two to learn
from. This bench makes a wider CPU dataset with the tool's own stages, in a temporary folder:

- networks: six torchvision families (resnet18, mobilenet_v2, squeezenet1_0, mnasnet1_0,
  shufflenet_v2_x1_0, googlenet) unpruned and at 50% pruning, plus ``--generated`` networks from
  the multi-style generator (each its own family), at 3x64x64;
- profile: the ``cpu`` backend, 1 thread, batch sizes 2, 8 and 32, a fresh process per measurement
  (``--repeats N``: N fresh processes per row, the median one kept);

then holds out each torchvision family in turn (the generated networks always stay in training)
with ``bench_fingerprint.evaluate``: the whole fit redone without the held-out family, against the
perf4sight-conv baseline on the same folds. Takes about 10 minutes on 2 cores.

    .venv/bin/python bench/bench_cpu_families.py [--generated 12] [--trees 100] [--repeats 1] [--keep DIR]

A second dataset, to check a conclusion drawn on the first (docs/accuracy-notes.md, "CPU: a second wide
set"): ``--zoo`` other torchvision families, ``--levels`` other pruning levels, ``--generator-seed`` other
generated networks.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _stages import run_stage  # noqa: E402
from bench_fingerprint import evaluate, figures, load_csv, table  # noqa: E402
from perf4sight.features.priced_ops import load_op_prices  # noqa: E402
from perf4sight.profiling.results import OP_PRICES_JSON  # noqa: E402

ZOO = ("resnet18", "mobilenet_v2", "squeezenet1_0", "mnasnet1_0", "shufflenet_v2_x1_0", "googlenet")

CONFIG = """
[project]
models_dir = "models"
profiling_dir = "profiling_csvs"
fingerprint_dir = "fingerprinting"
reports_dir = "reports"
seed = 0

[networks]
zoo = {zoo}
input_shape = [3, 64, 64]
num_classes = 1000

[networks.pruning]
strategy = "l1-norm"
levels = {levels}
min_channels = 4

[networks.generator]
count = {generated}
seed = {generator_seed}
min_mflops = 20
max_mflops = 600
max_params = 30000000

[profile]
batch_sizes = [2, 8, 32]
warmup_steps = 2
timed_steps = 5
timeout_s = 300
repeats = {repeats}
op_prices = {op_prices}

[devices.cpu-families]
backend = "cpu"
memory_limit_mb = 0
threads = 1
"""


def _stage(config: Path, stage: str) -> None:
    run_stage(config, stage, "bench_cpu_families")


def write_config(folder: Path, zoo: tuple[str, ...] = ZOO, generated: int = 12, repeats: int = 1,
                 levels: tuple[int, ...] = (0, 50), generator_seed: int = 1, op_prices: bool = False) -> Path:
    """The dataset's ``config.toml`` in ``folder`` (see :func:`run` for the settings); its path."""
    config = folder / "config.toml"
    config.write_text(CONFIG.format(zoo="[" + ", ".join(f'"{z}"' for z in zoo) + "]", generated=generated,
                                    repeats=repeats, levels=list(levels), generator_seed=generator_seed,
                                    op_prices=str(op_prices).lower()))
    return config


def run(generated: int = 12, trees: int = 100, repeats: int = 1, keep: str = "", zoo: tuple[str, ...] = ZOO,
        levels: tuple[int, ...] = (0, 50), generator_seed: int = 1, op_prices: bool = False) -> list[dict]:
    """Make, profile and evaluate the dataset (see module doc); rows for bench/run_all.py. ``keep``: a
    folder to make it in and leave behind (config, networks, measurements), instead of a temporary one.
    ``zoo``, ``levels``, ``generator_seed``: another set of families, pruning levels (%) and generated networks,
    for a second dataset to check a conclusion drawn on the first. ``op_prices``: the profile measures the CPU's op
    prices and the fits use them (``[profile] op_prices``); prices already beside a kept dataset's rows are used
    either way."""
    with tempfile.TemporaryDirectory(prefix="p4s-cpu-families-") as scratch:
        tmp = keep or scratch
        Path(tmp).mkdir(parents=True, exist_ok=True)
        config = write_config(Path(tmp), zoo, generated, repeats, levels, generator_seed, op_prices)
        for stage in ("networks", "profile"):
            _stage(config, stage)
            print(f"  {stage} stage done", flush=True)
        csv = Path(tmp) / "profiling_csvs" / "cpu-families" / "measurements.csv"
        device, rows, descs = load_csv(csv, Path(tmp) / "models")
        prices = load_op_prices(csv.parent / OP_PRICES_JSON)  # the profile stage measures them on a CPU
        n_fams = len({r["family"] for r in rows})
        res = evaluate(device, rows, descs, trees=trees, held_out=list(zoo), op_prices=prices,
                       label=f"cpu, {len(descs)} networks in {n_fams} families ({generated} generated), "
                             f"{len(rows)} rows, {repeats} process(es) each; torchvision families held out"
                             + ("; with its op prices" if prices else ""))
    print("\n".join(table(res)), flush=True)
    return figures(res)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--generated", type=int, default=12)
    ap.add_argument("--trees", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=1, help="[profile] repeats: fresh processes per row, median kept")
    ap.add_argument("--keep", default="", help="make the dataset in this folder and keep it (a rerun resumes it)")
    ap.add_argument("--zoo", nargs="+", default=list(ZOO), help="torchvision families, each held out in turn")
    ap.add_argument("--levels", type=int, nargs="+", default=[0, 50], help="pruning levels (%%) of each family")
    ap.add_argument("--generator-seed", type=int, default=1, help="seed of the generated networks")
    ap.add_argument("--op-prices", action="store_true", help="[profile] op_prices: price the ops between the "
                    "convolutions on this CPU and fit with the prices")
    args = ap.parse_args()
    run(args.generated, args.trees, args.repeats, args.keep, tuple(args.zoo), tuple(args.levels), args.generator_seed,
        args.op_prices)


if __name__ == "__main__":
    main()
