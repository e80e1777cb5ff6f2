"""perf4sight command line: a thin layer over perf4sight.stages.

    python main.py --config config.toml --stage all       # in the project folder
    perf4sight --config config.toml --stage all           # once installed (pip install .)
    python -m perf4sight --config config.toml --stage all
"""
from __future__ import annotations

import argparse
import math
import os
import shlex
import signal
import sys
import textwrap
from typing import Callable

from perf4sight import __version__

STAGE_HELP = """\
stages (run in this order by --stage all):
  networks     make the network dataset: torchvision/models-file networks pruned at the configured
               levels and generated networks, as JSON descriptions under models/ with a manifest
  profile      measure a training step (time and memory) of every network at ascending batch sizes
               on each device, stopping a network at its first OOM; CSVs land in profiling_csvs/<device>/
  fingerprint  fit per-device fingerprints for step time and memory (--predictor trees, gnn, or
               ensemble = both), print held-out error (MAPE), store them in fingerprinting/<device>/
  predict      predict step time and memory for --network (zoo names, dataset networks, files) at
               --batch-size on --device (defaults: [predict] networks and batch_sizes); or the
               largest batch that fits (--max-batch-size), or the least pruning that fits (--prune-to-fit)
  compare      a report comparing every fingerprinted device (or --device A B): what was measured,
               held-out accuracy, predicted curves, largest batch that fits, step time and largest
               batch against the pruning level ([compare] pruning_levels); reports/compare-<time>/
  all          networks, profile, fingerprint (of the devices it profiled), predict, compare
other stages:
  init         write the default configuration (every stage on this machine's CPU) to --config's file,
               config.toml by default; a file already there is left as it is
  import       turn another tool's measurements into this tool's schema:
               --format perf4sight|perfseer --source DIR --device NAME
  export       write a device's measurements and graphs as a PerfSeer/GAPP-style dataset:
               --format perfseer --output DIR [--device NAME ...]
  check        report, per device, whether it is reachable and has python, torch and its backend,
               its memory, swap and free disk, and whether its work folder is writable
"""

#: what an interrupted stage leaves behind (Ctrl-C)
INTERRUPTED = {
    "networks": "the networks made so far are kept in zoo-cache/ under the models folder, and a rerun reads them "
                "back; the descriptions and manifest are written at the end: rerun the networks stage",
    "profile": "measurements taken so far are on disk; rerun to resume",
    "all": "what finished is on disk (measurements row by row); rerun to resume",
    "fingerprint": "a fingerprint's files are replaced only after its fit: the previous one, if any, is kept",
    "import": "rows imported so far are on disk; rerun to import the rest (nothing is imported twice)",
    "export": "the export folder may be incomplete: rerun the export",
    "compare": "no report was finished",
}

STAGES = ("networks", "profile", "fingerprint", "predict", "compare", "all", "import", "export", "check", "init")

#: the stages that read each option; any other stage would pass over it without a word
OPTION_STAGES = {
    "network": ("predict", "all"), "batch_size": ("predict", "all"), "json": ("predict", "all"),
    "max_batch_size": ("predict",), "prune_to_fit": ("predict",), "max_latency_ms": ("predict",),
    "input_shape": ("predict",),
    "optimizer": ("profile", "fingerprint", "predict", "all"), "loss": ("profile", "fingerprint", "predict", "all"),
    "momentum": ("profile", "fingerprint", "all"), "weight_decay": ("profile", "fingerprint", "all"),
    "retry_errors": ("profile", "all"), "remeasure": ("profile", "all"),
    "predictor": ("fingerprint", "predict", "all"), "refit": ("fingerprint", "all"),
    "format": ("import", "export"), "source": ("import",), "output": ("export",),
    "device": ("profile", "fingerprint", "predict", "compare", "all", "import", "export", "check"),
}


class _Parser(argparse.ArgumentParser):
    """An argument mistake (a typo'd --stage, --batch-size x) is one line, as every other user error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"error: {message}; see --help\n")


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; ``prog``: the command shown in usage lines (default: the script's name)."""
    from perf4sight.networks.zoo import ZOO_NAMES  # names only: no torch
    from perf4sight.profiling.plan import LOSSES, OPTIMIZERS  # standard library only

    zoo = textwrap.fill(", ".join(ZOO_NAMES), width=100, initial_indent="  ", subsequent_indent="  ")
    parser = _Parser(
        prog=prog, description="perf4sight: predict a CNN training step's time and memory on edge devices.",
        epilog=f"{STAGE_HELP}zoo networks (torchvision's classifiers and segmentation networks, by name: --network, "
               f"[networks] zoo):\n{zoo}\n",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"perf4sight {__version__}")
    parser.add_argument("--config", default="config.toml", help="TOML configuration file (default: config.toml)")
    parser.add_argument("--stage", required=True, choices=STAGES, help="pipeline stage to run (see below)")
    parser.add_argument("--device", nargs="+", metavar="NAME",
                        help="device(s) to act on (default: profile: [profile] devices, else every device of the "
                             "config; check: every device of the config; fingerprint, export: every device with "
                             "measurements; compare: every device with a fingerprint; predict: the first "
                             "configured device with a fingerprint, else the first device with one; several: each "
                             "in turn, JSON lines naming their device first)")
    parser.add_argument("--network", nargs="+", metavar="NET",
                        help="predict: zoo names (e.g. resnet18), names of the dataset's networks (a variant the "
                             "networks stage made, e.g. resnet18_l30, or a graph imported for a device), a variant "
                             "the dataset lacks of a zoo network or of one [networks] names (e.g. resnet18_l45: "
                             "pruned on request, as the networks stage would), a network [networks] names, "
                             "description JSON files, or FILE.py:FUNCTION (a function that returns the nn.Module)")
    parser.add_argument("--batch-size", nargs="+", type=int, metavar="N", help="predict: batch sizes")
    parser.add_argument("--max-batch-size", nargs="?", type=int, const=1024, metavar="LIMIT",
                        help="predict: the largest batch size predicted to fit each network in the device's memory "
                             "(searched up to LIMIT, default 1024), instead of predictions at --batch-size")
    parser.add_argument("--prune-to-fit", action="store_true",
                        help="predict: the least pruning level (whole %% of parameters, pruned as the networks stage "
                             "would) at which each network is predicted to fit the device's memory at each "
                             "--batch-size; the networks: zoo networks, those [networks] names, a variant's name "
                             "for its network, or FILE.py:FUNCTION")
    parser.add_argument("--input-shape", nargs=3, type=int, metavar=("C", "H", "W"),
                        help="predict: at this input shape of one training image (e.g. 3 224 224) instead of the "
                             "fingerprint's training networks' (a network given by file or dataset name is rebuilt "
                             "and described at it; predictions at another shape than the rows' are extrapolations, "
                             "see the README's Results)")
    parser.add_argument("--max-latency-ms", type=_milliseconds, metavar="MS",
                        help="predict, with --prune-to-fit: the step must also take at most MS milliseconds")
    parser.add_argument("--optimizer", choices=OPTIMIZERS,
                        help="the training step's optimiser, for this run instead of [profile] optimizer: profile "
                             "measures it, fingerprint fits its rows, predict predicts it (from a fingerprint of "
                             "another optimiser's rows: its models read this step's features, which no row "
                             "measured, with a note saying so)")
    parser.add_argument("--loss", choices=LOSSES,
                        help="the training step's loss, for this run instead of [profile] loss: profile measures it "
                             "(mse and l1 against a float target of the output's shape; a configuration measured "
                             "with another loss is measured again, beside it), fingerprint fits its rows, predict "
                             "predicts it (from a fingerprint of another loss's rows, with a note saying so)")
    parser.add_argument("--momentum", type=_unit_interval("--momentum"), metavar="M",
                        help="SGD's momentum, for this run instead of [profile] momentum (0: no momentum buffer): "
                             "profile measures that step (a configuration measured with another is measured again), "
                             "fingerprint says when its rows ran another")
    parser.add_argument("--weight-decay", type=_unit_interval("--weight-decay"), metavar="WD",
                        help="the optimiser's weight decay, for this run instead of [profile] weight_decay; as "
                             "--momentum")
    parser.add_argument("--json", action="store_true",
                        help="predict: one JSON object per query on stdout, notes on stderr (with --stage all, "
                             "everything the other stages print goes to stderr too)")
    parser.add_argument("--retry-errors", action="store_true",
                        help="profile: measure again the configurations whose row is an error (a crashed or timed-out "
                             "measurement); the new row is appended and counts, the old one stays in the CSV")
    parser.add_argument("--remeasure", nargs="+", metavar="NET[@BATCH]",
                        help="profile: measure these networks again (at every batch size, or at BATCH alone); "
                             "their earlier rows move to superseded.csv beside the measurements (off an SSH "
                             "device's own CSV too), and the fingerprint fits the new ones")
    parser.add_argument("--predictor", choices=("trees", "gnn", "ensemble"),
                        help="fingerprint: which predictor to fit (ensemble = trees and GNN); predict: which to use "
                             "(default: [fingerprint] predictor of the config)")
    parser.add_argument("--refit", action="store_true",
                        help="fingerprint: fit again even where the stored fingerprint was fitted from the same "
                             "measurements, networks, settings and code (by default such a fit is skipped)")
    parser.add_argument("--format", choices=("perf4sight", "perfseer"),
                        help="import/export: format of the other tool's data")
    parser.add_argument("--source", metavar="DIR", help="import: folder holding the source measurements")
    parser.add_argument("--output", metavar="DIR", help="export: folder to write to")
    return parser


def _unit_interval(flag: str) -> Callable[[str], float]:
    """An argparse type: a number in [0, 1), else the parser's one-line error naming ``flag``."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} takes a number, got {text!r}") from None
        if not 0 <= value < 1:
            raise argparse.ArgumentTypeError(f"{flag} must lie in [0, 1), got {text}")
        return value
    return parse


def _milliseconds(text: str) -> float:
    """An argparse type: a positive, finite number of milliseconds (``inf`` wrote ``Infinity`` into --json's lines,
    which is no JSON), else the parser's one-line error."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--max-latency-ms takes a number of milliseconds, got {text!r}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"--max-latency-ms must be a positive number of milliseconds, got {text}")
    return value


def unused_option(args: argparse.Namespace) -> str:
    """The first option given that ``args.stage`` does not read, as the line saying so ('' if none)."""
    for dest, stages in OPTION_STAGES.items():
        value = getattr(args, dest)
        if value is not None and value is not False and args.stage not in stages:
            names = " or ".join(filter(None, (", ".join(stages[:-1]), stages[-1])))
            return (f"--{dest.replace('_', '-')} is for --stage {names}; "
                    f"--stage {args.stage} does not use it")
    return ""


def _conflicting_options(args: argparse.Namespace) -> str:
    """The line saying two options given together ask two questions, one of which would go unanswered ('' if not)."""
    if getattr(args, "max_batch_size", None) is not None and (args.prune_to_fit or args.max_latency_ms is not None):
        return ("--max-batch-size answers alone (the largest batch that fits the memory): give it without "
                "--prune-to-fit and --max-latency-ms, which answer at --batch-size")
    if getattr(args, "max_latency_ms", None) is not None and not args.prune_to_fit:  # said once a fingerprint loaded
        return "--max-latency-ms is the step-time budget of --prune-to-fit: give that too"
    return ""


def _terminated(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM cleans up as Ctrl-C does (the profiling runner and its child stop too)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Runs one stage as the command line asks (``argv``: default ``sys.argv[1:]``); the exit code: 0 done, 1 a
    device not ready or an OS error, 2 a user error, 130 interrupted."""
    try:
        return _run(argv, prog)
    except KeyboardInterrupt:  # before a stage began (reading the arguments, pinning the BLAS): a traceback before
        print(f"interrupted: {INTERRUPTED_EARLY}", file=sys.stderr)
        return 130


#: What an interrupt before any stage began leaves.
INTERRUPTED_EARLY = "nothing was written"


def _run(argv: list[str] | None, prog: str | None) -> int:
    """:func:`main` but for an interrupt before its stage's own handling of one."""
    args = build_parser(prog).parse_args(argv)
    unused = unused_option(args) or _conflicting_options(args)
    if unused:  # e.g. --stage profile --network x: it would profile every network of the dataset
        print(f"error: {unused}", file=sys.stderr)
        return 2
    from perf4sight.blas import pin_kernels
    from perf4sight.errors import UserError

    pin_kernels()  # before numpy loads: the same rows give the same fingerprint on any x86-64 host

    signal.signal(signal.SIGTERM, _terminated)

    try:
        from perf4sight.config import load_config, write_default_config
        from perf4sight import stages

        if args.stage == "init":
            written = write_default_config(args.config)
            print(f"wrote {written}: the default configuration, every stage on this machine's CPU; next: "
                  f"--config {shlex.quote(str(written))} --stage all")
            return 0
        cfg = load_config(args.config, importing=args.stage == "import")
        return stages.run(args.stage, cfg, args)
    except UserError as exc:  # one line, whatever a message quotes (a user's exception can span several)
        print(f"error: {' '.join(line.strip() for line in str(exc).splitlines() if line.strip())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # the stage's own words where it gave some (fleet: SSH devices' runs go on)
        print(f"interrupted: {str(exc) or INTERRUPTED.get(args.stage, INTERRUPTED_EARLY)}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of our output went away (e.g. `| head -1`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 1
    except OSError as exc:  # e.g. the output cannot be written (disk full)
        print(f"error: {exc}", file=sys.stderr)
        return 1
