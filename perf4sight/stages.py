"""One function per pipeline stage; ``main.py`` parses arguments and calls :func:`run`.

Each ``run_<stage>(cfg, args)`` returns a process exit code. The work itself lives in the
stage's subpackage; this module only finds inputs, calls the API and prints summaries.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from perf4sight.config import Config
from perf4sight.dataset import (ZOO_CACHE, dataset_descriptions, default_networks, device_dataset,
                                fingerprinted_devices, is_description_file, measured_devices, other_losses,
                                other_phases, read_manifest, resolve_networks, undescribed_note)
from perf4sight.errors import UserError
from perf4sight.features.optimizers import DEFAULT_OPTIMIZER, OPTIMIZER_LABELS
from perf4sight.ir.schema import NetworkDescription
from perf4sight.ir.shapes import shape_text
from perf4sight.networks.zoo import ZOO_NAMES
from perf4sight.profiling.backends.base import LIMIT_OOM
from perf4sight.profiling.plan import DEFAULT_LOSS, training_phase
from perf4sight.profiling.results import (LOAD_MARGIN, batch_size_of, incomplete_note, latest_rows, loss_of, number,
                                         phase_of, read_rows, references_path, results_path, under_load)
from perf4sight.wording import device_table, named, plural, shell_word, shell_words

if TYPE_CHECKING:  # the importers are imported by the import stage alone
    from perf4sight.importers import ImportSummary

__all__ = ["run", "STAGE_ORDER"]

# a long line stays one line, and tables keep their headers, when the output goes to a file or a pipe
console = Console(stderr=False, highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)
#: notes beside a result (stderr: `--stage predict --json` keeps stdout to JSON lines)
notes = Console(stderr=True, highlight=False, soft_wrap=True)
STAGE_ORDER = ("networks", "profile", "fingerprint", "predict", "compare")


def _print_notes(*lines: str | None) -> None:
    """Print each note of ``lines`` on stderr, as written (no rich markup); empty ones and None are none."""
    for line in lines:
        if line:
            notes.print(line, markup=False)


def run(stage: str, cfg: Config, args: argparse.Namespace) -> int:
    """Run ``stage`` (or every stage of ``STAGE_ORDER`` for ``all``); returns the exit code. ``--optimizer``,
    ``--loss``, ``--momentum`` and ``--weight-decay`` stand for their ``[profile]`` keys in this run."""
    given = {key: getattr(args, key, None) for key in ("optimizer", "loss", "momentum", "weight_decay")}
    given = {key: value for key, value in given.items() if value is not None}
    if given:
        cfg = dataclasses.replace(cfg, profile=dataclasses.replace(cfg.profile, **given))
    if stage != "all":
        return STAGES[stage](cfg, args)
    _check_all_arguments(cfg, args)
    # the notes on a device's rows that the profile stage said, which the fingerprint stage does not say again
    args = argparse.Namespace(**vars(args), notes_said=set())
    json_only = bool(getattr(args, "json", False))  # stdout: the predict stage's JSON lines, nothing else
    summary = Table(title="summary of --stage all")
    for col in ("stage", "seconds", "result"):
        summary.add_column(col)
    code = 0
    for name in STAGE_ORDER:
        with _stdout_to_stderr(json_only):
            console.rule(f"[bold]{name}")
        started = time.perf_counter()
        with _stdout_to_stderr(json_only and name != "predict"):
            stage_code = STAGES[name](cfg, _stage_args(cfg, args, name))
        summary.add_row(name, f"{time.perf_counter() - started:.0f}", "ok" if stage_code == 0 else f"exit {stage_code}")
        code = max(code, stage_code)
    with _stdout_to_stderr(json_only):
        console.rule()
        console.print(summary)
        console.print(f"networks: {cfg.models_dir}  measurements: {cfg.profiling_dir}  "
                      f"fingerprints: {cfg.fingerprint_dir}  reports: {cfg.reports_dir}", markup=False)
    return code


def _check_all_arguments(cfg: Config, args: argparse.Namespace) -> None:
    """What the stages of ``--stage all`` would refuse of its arguments and config only when they come to them,
    refused before the first (the networks stage, then a profile of minutes): the devices the profile stage takes,
    the devices [compare] names unless --device stands for them (configured, or with measurements or a fingerprint:
    imported), predict's batch sizes and network names (a name the networks stage gives, or a file it writes,
    passes), and --remeasure's networks and batch sizes (a network of the dataset on disk, or a name the networks
    stage gives)."""
    from perf4sight.config import _made_name, checked_network_names
    from perf4sight.dataset import dataset_network_names, known_devices, unknown_device
    from perf4sight.fingerprint.predict import batch_list

    profiled = _configured(cfg, cfg.devices_to_profile(args.device))
    if getattr(args, "remeasure", None):
        from perf4sight.profiling.fleet import remeasure_specs

        made = [spec.rpartition("@")[0] or spec for spec in args.remeasure]
        remeasure_specs(cfg, profiled, dataset_network_names(cfg) + [n for n in made if _made_name(cfg, n)],
                        args.remeasure)
    known = known_devices(cfg)
    for device in [] if args.device else cfg.compare.devices:  # --device: the compare stage compares those instead
        if device not in known:
            raise UserError(f"{cfg.path}: [compare] devices: {unknown_device(cfg, device, known)}")
    if args.batch_size:
        batch_list(args.batch_size)
    if args.network:
        checked_network_names(cfg, args.network, "--network", Path)  # relative to the current folder


def _stage_args(cfg: Config, args: argparse.Namespace, name: str) -> argparse.Namespace:
    """The arguments stage ``name`` of ``--stage all`` runs with: the fingerprint stage fits the devices this
    run profiled (not every one with measurements on disk) unless ``--device`` names them."""
    if name != "fingerprint" or args.device:
        return args
    configured = cfg.devices_to_profile()
    profiled = [d for d in configured if results_path(cfg.profiling_dir, d).is_file()]
    # none measured: name the configured ones, so the stage says which measurements are missing
    return argparse.Namespace(**{**vars(args), "device": profiled or configured})


def _stdout_to_stderr(on: bool) -> contextlib.AbstractContextManager:
    """While ``on``, whatever would go to stdout (banners, tables, progress bars) goes to stderr: ``--stage all
    --json`` keeps stdout to the predict stage's JSON lines."""
    return contextlib.redirect_stdout(sys.stderr) if on else contextlib.nullcontext()


# ---------------------------------------------------------------- stages

def _measured_as_made(cfg: Config, names: list[str]) -> list[str]:
    """Of ``names`` (variants the networks stage has just written as another description than the last run's), those
    whose description as now written has rows (of ``[profile]``'s step) on every configured device that measured the
    network at all, and some device did: the profile stage measures them on no device again (another pruning strategy
    tried, then the first one back). Best effort: [] where the manifest's settings or a CSV cannot be read."""
    from perf4sight.networks.settings import SETTINGS_FILE

    if not names:
        return []
    try:
        shas = json.loads((cfg.models_dir / SETTINGS_FILE).read_text(encoding="utf-8"))["descriptions"]
        phase, loss = training_phase(cfg.profile.optimizer), cfg.profile.loss
        measured: dict[str, list[set[str]]] = {}
        for device in cfg.devices:
            path = results_path(cfg.profiling_dir, device)
            if not path.is_file():
                continue
            of_device: dict[str, set[str]] = {}
            for r in read_rows(path):
                if r.get("network") in names and phase_of(r) == phase and loss_of(r) == loss:
                    of_device.setdefault(r["network"], set()).add(r.get("description_sha") or "")
            for name, found in of_device.items():
                measured.setdefault(name, []).append(found)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, UserError):
        return []
    return [n for n in names if n in measured and isinstance(shas, dict) and isinstance(shas.get(n), str)
            and all(shas[n] in found for found in measured[n])]


def run_networks(cfg: Config, args: argparse.Namespace) -> int:
    """Make the network descriptions ``[networks]`` names (its zoo, factory and description-file networks at each
    pruning level, and the generated ones) under ``cfg.models_dir``, and print what the manifest gained, changed or
    lost; 0."""
    from perf4sight.networks.build import make_networks, reshaped_description_notes
    from perf4sight.networks.stage_cache import FOLDER

    if cfg.networks.pruning.strategy == "random" and cfg.networks.pruning.levels != [0]:
        notes.print("note: [networks.pruning] strategy 'random' gives the same shapes as 'l1-norm' (a level "
                    "removes the same share of every group's channels whatever the ranking, and a description holds "
                    "only shapes); 'random-weighted' varies the share per layer", markup=False)
    net = cfg.networks
    if not (net.zoo or net.factories or net.description_files or net.generator.count):
        raise UserError(f"{cfg.path}: [networks] names no network: zoo, factories and description_files are empty "
                        "and [networks.generator] count is 0")
    if not net.pruning.levels and (net.zoo or net.factories or net.description_files):
        raise UserError(f"{cfg.path}: [networks.pruning] levels is empty: no variant of the zoo, factory or "
                        "description-file networks would be made (0 = the unpruned network)")
    _print_notes(*reshaped_description_notes(cfg))
    started = time.perf_counter()
    made = make_networks(cfg, progress=lambda message: console.print(f"  {message}", style="dim", markup=False))
    for line in made.skipped:
        notes.print(f"note: {line}", markup=False)
    if made.untrainable_at_batch_one and 1 in cfg.profile.batch_sizes:
        notes.print(f"note: batch 1 does not train {named(made.untrainable_at_batch_one)} at all: a batch norm over a "
                    "1x1 map has one value per channel (torch refuses it in training); the profile stage's rows of "
                    "them at batch 1 ([profile] batch_sizes) will be errors", markup=False)
    reused = (f"; {named(made.cached)} read back from {cfg.models_dir / ZOO_CACHE / FOLDER}, as an earlier run "
              "made them with these settings and files") if made.cached else ""
    console.print(f"networks: {plural(len(made.rows), 'description')} under {cfg.models_dir} "
                  f"in {time.perf_counter() - started:.1f} s{reused}", markup=False)
    changes = [f"{len(made.added)} added ({named(made.added)})"] if made.added else []
    on_record = _measured_as_made(cfg, made.changed)
    again = [n for n in made.changed if n not in on_record]
    if again:
        changes.append(f"{len(again)} changed under the same name ({named(again)}; the profile stage measures them "
                       "again)")
    if on_record:  # e.g. a strategy switched back: the rows of the earlier run of these very descriptions count again
        changes.append(f"{len(on_record)} changed under the same name to what the devices measured before "
                       f"({named(on_record)}; those rows count again: the profile stage does not measure them again)")
    if made.removed:
        changes.append(f"{len(made.removed)} no longer made ({named(made.removed)}; their descriptions and "
                       "measurements stay on disk, and the later stages leave them out)")
    if changes:
        console.print(f"manifest changed: {', '.join(changes)}", markup=False)
    elif made.had_manifest:
        console.print("manifest unchanged: every variant as the last run made it", markup=False)
    return 0


def _configured(cfg: Config, names: list[str]) -> list[str]:
    """``names``, each a configured device and each once (``UserError`` otherwise, or when there are none): a device
    named twice would be profiled by two followers at once, each pulling its rows into one CSV."""
    names = list(dict.fromkeys(names))
    if not names:
        raise UserError(f"{cfg.path}: no devices configured: add a [devices.<name>] table (e.g. backend = \"cpu\")")
    for name in names:
        if name not in cfg.devices and results_path(cfg.profiling_dir, name).is_file():
            raise UserError(f"{cfg.path}: '{name}' has measurements in {results_path(cfg.profiling_dir, name)} "
                            f"(imported?) but no {device_table(name)} table: only a configured device can be checked "
                            f"or profiled (devices: {', '.join(cfg.devices) or 'none'})")
        cfg.device(name)
    return names


def run_profile(cfg: Config, args: argparse.Namespace) -> int:
    """Profile the dataset's networks on the ``--device`` names (else ``[profile] devices``, else every configured
    device) and print each one's summary; 0 when every device finished, else 1."""
    from perf4sight.networks.settings import changed_settings_note
    from perf4sight.profiling.fleet import format_summaries, profile_devices, remeasure_specs
    from perf4sight.profiling.results import SUPERSEDED_CSV

    names = _configured(cfg, cfg.devices_to_profile(args.device))
    descriptions = dataset_descriptions(cfg)
    _print_notes(changed_settings_note(cfg),
                 *(incomplete_note(results_path(cfg.profiling_dir, name)) for name in names))
    if getattr(args, "retry_errors", False):
        cfg = dataclasses.replace(cfg, profile=dataclasses.replace(cfg.profile, retry_errors=True))
    phase = training_phase(cfg.profile.optimizer)
    if cfg.profile.optimizer != DEFAULT_OPTIMIZER:
        console.print(f"the measured step's optimiser: {OPTIMIZER_LABELS[cfg.profile.optimizer]} ([profile] "
                      f"optimizer): its rows are of phase {phase}, beside any of another optimiser", markup=False)
    if cfg.profile.loss != DEFAULT_LOSS:
        console.print(f"the measured step's loss: {cfg.profile.loss} ([profile] loss): its rows say so, beside any "
                      "of another loss", markup=False)
    remeasure = None
    if getattr(args, "remeasure", None):  # checked before any device is locked or measured
        from perf4sight.ir.schema import load_description
        networks = [load_description(d).name for d in descriptions]
        remeasure = remeasure_specs(cfg, names, networks, args.remeasure)
    summaries = profile_devices(cfg, names, descriptions, remeasure=remeasure)
    console.print(format_summaries(summaries), markup=False)
    for s in summaries:
        if remeasure:
            moved = results_path(cfg.profiling_dir, s.device).with_name(SUPERSEDED_CSV)
            said = f"{plural(s.superseded, 'earlier row')} moved to {moved}"
            if not s.superseded:
                said = "no earlier row to move (none measured yet)"
            elif s.remeasure_left:  # the profile ended before it measured them: the configurations wait, unmeasured
                said += (f"; {plural(s.remeasure_left, 'configuration')} of them not measured again, as the profile "
                         f"of {s.device} did not finish: rerun --stage profile --device {shell_word(s.device)} "
                         "(no --remeasure needed) to measure them")
            else:
                said += ", measured again above"
            console.print(f"{s.device}: --remeasure: {said}", markup=False)
        if results_path(cfg.profiling_dir, s.device).is_file():
            console.print(f"{s.device}: measurements in {results_path(cfg.profiling_dir, s.device)}", markup=False)
            rows = read_rows(results_path(cfg.profiling_dir, s.device))
            profiled = {r["network"] for r in read_manifest(cfg.models_dir / "manifest.csv")}
            mine = latest_rows(r for r in rows  # this optimiser's and this loss's sweep, of the networks it profiles
                               if phase_of(r) == phase and loss_of(r) == cfg.profile.loss
                               and r.get("network") in profiled)
            fitting = getattr(args, "notes_said", None) is not None  # --stage all: its fingerprint stage fits them
            _print_notes(*_once(args, s.device, limit=_limit_note(cfg, s.device, mine),
                                load=_load_note(cfg, s.device, mine, fitting=fitting)))
        refs = references_path(cfg.profiling_dir, s.device)
        if cfg.profile.reference_every > 0 and refs.is_file():
            console.print(f"{s.device}: drift reference, {plural(len(read_rows(refs)), 'measurement')} in {refs}",
                          markup=False)
            _print_notes(*_once(args, s.device, reference_load=_reference_load_note(cfg, s.device)))
    return 0 if all(s.status == "done" for s in summaries) else 1


def _predictor(cfg: Config, args: argparse.Namespace) -> str:
    return getattr(args, "predictor", None) or cfg.fingerprint.predictor


GNN_FEW_ROWS = 200  # below this many training rows the GNN fit is noted as too small to trust


def _limit_note(cfg: Config, device: str, rows: list[dict[str, str]]) -> str:
    """A note on ``device``'s ``oom`` rows (its newest, ``latest_rows``) that its ``memory_limit_mb`` caused ('' if
    none to make): rows recorded under a lower limit than the configured one, not yet measured again (the profile
    stage does, with the batch sizes skipped after them; one under a higher limit is an oom under this one too),
    or, under this limit, every network out of memory at its smallest batch size (a limit below what torch and a
    model take before the first step)."""
    from perf4sight.profiling.runner import raised_limit
    dev = cfg.devices.get(device)
    limit = dev.memory_limit_mb if dev is not None else 0
    by_limit: dict[int, list[dict[str, str]]] = {}
    for r in rows:
        found = LIMIT_OOM.search(str(r.get("message") or "")) if r.get("status") == "oom" else None
        if found:
            by_limit.setdefault(int(found.group(2)), []).append(r)
    csv_path = results_path(cfg.profiling_dir, device)
    lower = [(r, lim) for r in rows if (lim := raised_limit(r, limit)) is not None]  # (row, the limit it had)
    if lower:
        nets = sorted({str(r["network"]) for r, _ in lower})
        was = " / ".join(str(lim) for lim in sorted({lim for _, lim in lower}))
        were, now = "was" if len(lower) == 1 else "were", f"below the {limit} set now" if limit else "none set now"
        return (f"note: {device}: {plural(len(lower), 'oom row')} ({named(nets)}) {were} recorded under "
                f"memory_limit_mb = {was}, {now}: --stage profile measures {'it' if len(lower) == 1 else 'them'} "
                f"again, with the batch sizes skipped after, and passes over the earlier rows (kept in {csv_path})")
    first: dict[str, dict[str, str]] = {}  # each network's smallest batch size measured
    for r in rows:
        net = str(r.get("network"))
        if r.get("status") in ("ok", "oom", "error") and (net not in first
                                                          or batch_size_of(r) < batch_size_of(first[net])):
            first[net] = r
    caused = {id(r) for r in by_limit.get(limit, [])}
    at_limit = [r for r in first.values() if id(r) in caused]
    if limit and first and len(at_limit) == len(first):
        peak = max(float(LIMIT_OOM.search(str(r["message"])).group(1)) for r in at_limit)
        return (f"note: {device}: every network ran out of memory at its smallest batch size under memory_limit_mb = "
                f"{limit} (RSS up to {peak:.0f} MiB): torch, a model and its optimiser take more than that before "
                f"the first step; raise the limit in {device_table(device)} and profile again (the rows of {csv_path} "
                "that a lower limit caused are measured again)")
    return ""


def _over_limit_note(cfg: Config, device: str, rows: list[dict[str, str]]) -> str:
    """A note when ok rows of a cpu device peaked above its ``memory_limit_mb`` (measured before the limit was
    set or lowered): the fingerprint takes the limit as the capacity, and they say otherwise ('' if none)."""
    dev = cfg.devices.get(device)
    limit = dev.memory_limit_mb if dev is not None and dev.backend == "cpu" else 0
    if not limit:
        return ""
    over = [r for r in rows if r.get("status") == "ok" and (number(r.get("peak_rss_mb")) or 0) > limit]
    if not over:
        return ""
    nets = sorted({str(r.get("network")) for r in over})
    return (f"note: {device}: {plural(len(over), 'ok row')} ({named(nets)}) peaked above {device_table(device)} "
            f"memory_limit_mb = {limit:g} MiB, so {'it was' if len(over) == 1 else 'they were'} measured under another "
            "limit; the fingerprint takes the limit as the capacity and predicts such steps not to fit (to record "
            f"them as oom, delete their lines from {results_path(cfg.profiling_dir, device)} and profile again)")


def _once(args: argparse.Namespace, device: str, **said: str) -> list[str]:
    """The notes of ``said`` (kind -> note on ``device``'s rows) not said yet in this run: ``--stage all`` keeps in
    ``args.notes_said`` the (kind, device) of each said by its profile stage, and its fingerprint stage, reading the
    same rows, does not say them again. A stage run alone says them all."""
    done = getattr(args, "notes_said", None)
    if done is None:
        return list(said.values())
    kept = [note for kind, note in said.items() if note and (kind, device) not in done]
    done.update((kind, device) for kind, note in said.items() if note)
    return kept


def _load_note(cfg: Config, device: str, rows: list[dict[str, str]], fitting: bool = False) -> str:
    """A note on ``device``'s ``ok`` rows measured while its 1-minute load average was more than half a CPU above
    its CPU count (``results.under_load``: other work shared its cores), '' if none: how many, the largest load,
    that their step times read high and noisy, and how to measure them again (``--remeasure``).
    ``fitting``: said by the fingerprint stage, which fits them (a device profiled earlier learns it there too)."""
    ok = [r for r in rows if r.get("status") == "ok"]
    loaded = [r for r in ok if under_load(r)]
    if not loaded:
        return ""
    peak = max(number(r.get("load_avg_1m")) or 0.0 for r in loaded)
    counts = sorted({int(number(r.get("cpu_count")) or 0) for r in loaded})
    above = (f"above {counts[0] + LOAD_MARGIN:g} (its {plural(counts[0], 'CPU')} and half a CPU more"
             if len(counts) == 1 else f"more than half a CPU above its CPU count ({' / '.join(map(str, counts))}")
    gpu = all(r.get("backend") in ("nvml", "jetson") for r in loaded)
    dev = cfg.devices.get(device)
    one = len(loaded) == 1
    it = "it" if one else "them"
    nets = sorted({str(r.get("network")) for r in loaded})
    again = (f"run --stage profile --device {shell_word(device)} --remeasure {shell_words(nets[:5])}"
             f"{' ...' * (len(nets) > 5)}"
             " while the device is quiet (the earlier rows move to superseded.csv)" if dev is not None
             else f"rerun {it} on a quiet device (no {device_table(device)} table here to profile it)")  # imported rows
    return (f"note: {device}: {len(loaded)} of {plural(len(ok), 'ok row')} {'was' if one else 'were'} measured while "
            f"its 1-minute load average was {above}; up to {peak:g}, column load_avg_1m): other "
            f"work shared {'the CPU cores that launch its kernels' if gpu else 'its cores'}, so "
            f"{'its' if one else 'their'} step time{'' if one else 's'} {'may ' if gpu else ''}read high and noisy"
            f"{', and the fingerprint fits ' + it if fitting else ''}; to measure {it} again, {again}")


def _reference_load_note(cfg: Config, device: str) -> str:
    """A note on ``device``'s ``ok`` drift-reference measurements (``references.csv``, of ``[profile]``'s step)
    taken under load (``results.under_load``, as :func:`_load_note` reads the rows), '' if none. They stay in the
    drift correction: a reference slowed by other work is the slowdown the correction is there to take out of the
    rows measured near it in time; but the load average is a 1-minute figure and other work comes and goes, so
    the rows between such a reference and the next are corrected by a slowdown they may not have shared."""
    path = references_path(cfg.profiling_dir, device)
    phase = training_phase(cfg.profile.optimizer)
    ok = [r for r in read_rows(path) if r.get("status") == "ok" and phase_of(r) == phase
          and loss_of(r) == cfg.profile.loss]
    loaded = [r for r in ok if under_load(r)]
    if not loaded:
        return ""
    peak = max(number(r.get("load_avg_1m")) or 0.0 for r in loaded)
    one = len(loaded) == 1
    return (f"note: {device}: {len(loaded)} of {plural(len(ok), 'drift reference measurement')} in {path} "
            f"{'was' if one else 'were'} taken while its 1-minute load average was more than half a CPU above its "
            f"CPU count (up to {peak:g}, column load_avg_1m): the drift correction takes that slowdown for drift and "
            f"scales the rows measured near {'it' if one else 'them'} by it, rightly where they shared the load, "
            "wrongly where it came and went between measurements; profile again while the device is quiet to be "
            "sure")


def run_fingerprint(cfg: Config, args: argparse.Namespace) -> int:
    """Fit the fingerprint (``--predictor``'s, else ``[fingerprint] predictor``) of each measured device named (all
    of them by default), unless its stored one was fitted from the same inputs (``--refit`` fits all the same); 0,
    or ``UserError`` naming the devices that could not be fitted."""
    devices = measured_devices(cfg, args.device)
    if not devices:
        raise UserError(f"no measurements under {cfg.profiling_dir}: run --stage profile first")
    predictor = _predictor(cfg, args)
    refit = bool(getattr(args, "refit", False))  # else a fit from the inputs of the stored one is skipped
    skipped = []
    failed = []
    for device in devices:  # a device that cannot be fitted does not keep the others from theirs
        try:
            if not _fingerprint_device(cfg, args, device, predictor, refit):
                skipped.append(device)
        except UserError as exc:
            if len(devices) == 1:
                raise
            notes.print(f"error: {exc}", markup=False)
            failed.append(device)
    if skipped and len(skipped) == len(devices):  # nothing fitted: the first one's error says why
        from perf4sight.fingerprint.api import device_measurements
        device_measurements(cfg, skipped[0])
    if failed:
        fitted = len(devices) - len(failed) - len(skipped)
        others = f"; {plural(fitted, 'other')} fitted" if fitted else ""
        raise UserError(f"fingerprint: {plural(len(failed), 'device')} of {len(devices)} not fitted ({named(failed)}; "
                        f"the {'errors' if len(failed) > 1 else 'error'} above {'say' if len(failed) > 1 else 'says'} "
                        f"why){others}")
    return 0


def _fingerprint_device(cfg: Config, args: argparse.Namespace, device: str, predictor: str, refit: bool) -> bool:
    """Fit ``device``'s fingerprint (``predictor``'s) and print its accuracy and notes; False where it is passed
    over (its rows are all of other optimisers' steps)."""
    from perf4sight.fingerprint.api import fit_device

    descriptions, shas, rows, note = device_dataset(cfg, device)  # each description parsed once per device
    passed_over = "" if rows or args.device else _other_optimizers_note(cfg, device)
    if passed_over:
        notes.print(passed_over, markup=False)
        return False
    fitted = [r for r in rows if r.get("network") in descriptions]  # not those of networks passed over
    _print_notes(note, undescribed_note(cfg, device, rows, descriptions), _over_limit_note(cfg, device, fitted),
                 *_once(args, device, limit=_limit_note(cfg, device, fitted),
                        load=_load_note(cfg, device, fitted, fitting=True),
                        reference_load=_reference_load_note(cfg, device) if cfg.fingerprint.drift_reference else ""))
    if predictor in ("trees", "ensemble"):
        meta = fit_device(cfg, device, descriptions, shas, rows=rows, refit=refit)  # the rows read above
        meta["folder"] = str(cfg.fingerprint_dir / device)
        _print_accuracy(device, meta)
        _print_notes(_other_update_note(cfg, device, rows, meta))
        ok = sum(r.get("status") == "ok" and r.get("network") in descriptions for r in rows)
        unused = sorted({str(r["network"]) for r in rows if r.get("network") in descriptions}
                        - {str(r["network"]) for r in rows if r.get("status") == "ok"})
        if unused:  # e.g. out of memory at the smallest batch size: nothing to learn from, no row in the table
            notes.print(f"{device}: no ok row for {plural(len(unused), 'network')} ({named(unused, 5)}: out of "
                        "memory or failed at every batch size measured): not in the fit (their out-of-memory "
                        "rows still teach the capacity)", markup=False)
        for target, n in meta["training_rows"].items():
            if n < ok:
                notes.print(f"{device}: {ok - n} of {plural(ok, 'ok row')} {'has' if ok - n == 1 else 'have'} "
                            f"no usable {target} figure (empty: not measured, or 0) and "
                            f"{'was' if ok - n == 1 else 'were'} left out of its model", markup=False)
    if predictor in ("gnn", "ensemble"):
        from perf4sight.fingerprint.api import fit_device_gnn
        from perf4sight.fingerprint.gnn import gnn_accuracy_lines

        started = time.perf_counter()
        meta = fit_device_gnn(cfg, device, descriptions, shas, rows=rows, refit=refit)
        done = (_up_to_date(meta) if meta.get("up_to_date")
                else f"fitted and cross-validated in {time.perf_counter() - started:.0f} s")
        console.print(Text.assemble((device, "bold"), f": GNN ({meta['settings']['arch']}) in "
                                    f"{cfg.fingerprint_dir / device}, {done}"))  # Text: [brackets] are no markup
        for line in gnn_accuracy_lines(meta):
            console.print(line, markup=False)
        _print_notes(_few_rows_note(device, meta))
    return True


def _few_rows_note(device: str, meta: dict) -> str:
    """The note on a GNN fitted on too few rows to trust (:data:`GNN_FEW_ROWS`), '' otherwise: said where it is
    fitted and again where it predicts."""
    rows = int(meta.get("training_rows") or 0)
    if rows >= GNN_FEW_ROWS:
        return ""
    nets = plural(len(meta.get("networks", [])), "network")
    return (f"{device}: the GNN learnt from {plural(rows, 'row')} of {nets}, too few for a graph network (PerfSeer "
            "trained on 53k): its figures and intervals mean little; the trees fingerprint is the one to use here")


def _other_optimizers_note(cfg: Config, device: str) -> str:
    """Where ``device``'s rows are all of other optimisers' steps than ``[profile] optimizer``'s (imported perf4sight
    data, say, under a config of Adam's step), or of its step with other losses than ``[profile] loss``'s
    (:func:`_other_losses_note`), the note that passes it over, saying what stays as it is; else ""."""
    others, losses = other_phases(cfg, device), other_losses(cfg, device)
    if not others or losses:  # rows of [profile] optimizer's step there are, of other losses
        return _other_losses_note(cfg, device, losses)
    step = OPTIMIZER_LABELS[cfg.profile.optimizer]
    stored = cfg.fingerprint_dir / device / "metadata.json"
    stays = (f"its fingerprint stays as it is, and predict estimates {step}'s step from it" if stored.is_file()
             else f"--optimizer {others[0]} fits one of its rows")
    return (f"note: {device}: not fitted: its rows are of steps with {' and '.join(others)}, none with {step} "
            f"([profile] optimizer or --optimizer); {stays}")


def _other_losses_note(cfg: Config, device: str, others: list[str]) -> str:
    """Where ``device``'s rows of ``[profile] optimizer``'s step are all of ``others``, losses other than ``[profile]
    loss``'s (:func:`dataset.other_losses`), the note that passes it over, saying what stays as it is; else ""."""
    if not others:
        return ""
    stored = cfg.fingerprint_dir / device / "metadata.json"
    stays = (f"its fingerprint stays as it is, and predict estimates the step with {cfg.profile.loss} from it"
             if stored.is_file() else f"--loss {others[0]} fits those rows")
    return (f"note: {device}: not fitted: its rows are of steps with loss {' and '.join(others)}, none with "
            f"{cfg.profile.loss} ([profile] loss or --loss); {stays}")


def _other_update_note(cfg: Config, device: str, rows: list[dict], meta: dict) -> str:
    """Where ``device``'s rows (this tool's own) ran another update than ``[profile]`` asks for (with or without
    SGD's momentum buffer or an L2 weight decay: the fingerprint's metadata says which they ran), the note that the
    fingerprint is of its rows' step; else ""."""
    from perf4sight.features.step_runtime import StepRuntime
    from perf4sight.profiling.plan import effective_weight_decay

    p = cfg.profile
    if not rows or any(r.get("backend") == "imported" for r in rows):
        return ""
    fitted = StepRuntime.from_metadata(meta)
    decayed = effective_weight_decay(p.optimizer, p.weight_decay) > 0
    # momentum is SGD's alone: the others' rows read as with it whatever [profile] momentum is (fit.rows_update)
    asked = StepRuntime(optimizer=p.optimizer, momentum=p.optimizer != "sgd" or p.momentum > 0, weight_decay=decayed,
                        decoupled_decay=p.optimizer != "adamw" or decayed)
    if all(getattr(fitted, rule) == getattr(asked, rule) for rule in ("momentum", "decays", "decoupled_decay")):
        return ""
    return (f"note: {device}: its rows' step is {fitted.label()}, where [profile] asks for {asked.label()} "
            "(momentum, weight_decay): the fingerprint is of its rows' step; --stage profile measures the other")


def _print_accuracy(device: str, meta: dict) -> None:
    from perf4sight.fingerprint.predict import accuracy_lines

    done = f", {_up_to_date(meta)}" if meta.get("up_to_date") else ""
    console.print(Text.assemble((device, "bold"), f": fingerprint in {meta.get('folder', '')}{done}"))
    for line in accuracy_lines(meta):
        console.print(line, markup=False)


def _up_to_date(meta: dict) -> str:
    """How a fingerprint that was not fitted again is announced."""
    return (f"up to date (fitted {meta.get('created', '')} from the same measurements, networks, settings and code; "
            "--refit fits it again)")


def run_predict(cfg: Config, args: argparse.Namespace) -> int:
    """Predictions on one device; with several ``--device`` names (``--stage all --device A B`` too), on each in
    turn, every JSON line then naming its ``device`` first. With ``--json`` stdout holds the JSON lines alone:
    whatever else would go there (what a user's ``FILE.py:FUNCTION`` prints as it is imported and called) goes to
    stderr."""
    if not args.json or getattr(args, "json_out", None) is not None:
        return _predict_on_each(cfg, args)
    args = argparse.Namespace(**{**vars(args), "json_out": sys.stdout})
    with _stdout_to_stderr(True):
        return _predict_on_each(cfg, args)


def _predict_on_each(cfg: Config, args: argparse.Namespace) -> int:
    """:func:`run_predict`, its stdout settled."""
    if getattr(args, "input_shape", None):
        _refuse_other_channels(cfg, args.network or default_networks(cfg), args.input_shape)
    devices = list(dict.fromkeys(args.device or []))
    if len(devices) < 2:
        return _predict_on_one(cfg, args)
    for device in devices:  # a device without a fingerprint is said before any is predicted for
        _predict_device(cfg, [device], _predictor(cfg, args))
    code = 0
    for device in devices:  # its notes come before its table (or lines): named, they are not read as the last one's
        notes.print(f"on {device}:", markup=False)
        code = max(code, _predict_on_one(cfg, argparse.Namespace(**{**vars(args), "device": [device],
                                                                        "json_device": device})))
    return code


def _refuse_other_channels(cfg: Config, names: list[str], input_shape: list[int]) -> None:
    """``UserError`` where ``--input-shape`` gives other channels than a queried description file or network of the
    dataset is described at (:func:`perf4sight.networks.reshape.other_channels`, as its rebuild at the shape refuses
    it, or its variant pruned there fails), or than a zoo network takes (``zoo.check_channels``: RGB), itself or its
    variant pruned on request (``resnet18_l30`` where the dataset has none): said before torch loads, which took
    seconds before that refusal. Other names (factories, the config's own networks and their variants) and a file
    that cannot be read are left to the rebuild."""
    from perf4sight.dataset import _dataset_files, read_manifest
    from perf4sight.ir.schema import load_description
    from perf4sight.networks.on_request import VARIANT, own_network
    from perf4sight.networks.reshape import other_channels
    from perf4sight.networks.zoo import check_channels

    manifest: list[dict[str, str]] | None = None
    for name in dict.fromkeys(names):
        if is_description_file(name, cfg):
            paths = [Path(name)]
        elif ":" in name or not name.strip():
            continue
        elif name in ZOO_NAMES:
            if own_network(cfg, name) is None:  # the config's own network of the name wins (resolve_networks)
                check_channels(name, input_shape)
            continue
        else:
            manifest = read_manifest(cfg.models_dir / "manifest.csv") if manifest is None else manifest
            paths = _dataset_files(cfg, name, manifest)[:1]
            variant = VARIANT.fullmatch(name)
            if not paths and variant and variant.group("network") in ZOO_NAMES \
                    and own_network(cfg, variant.group("network")) is None:  # pruned on request from the zoo's
                check_channels(variant.group("network"), input_shape, called=name)
        for path in paths:
            try:
                said = other_channels(load_description(path), input_shape)
            except (UserError, OSError):
                continue
            if said:
                raise UserError(said)


def _rounded(prediction: dict) -> dict:
    """A prediction's figures to 0.001 ms / MiB for JSON: far below the accuracy, free of float noise."""
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in prediction.items()}


def _json_line(args: argparse.Namespace, fields: dict) -> None:
    """One JSON object on stdout (``args.json_out``, the stdout :func:`run_predict` found); ``device`` first where
    several devices are predicted for."""
    device = getattr(args, "json_device", None)
    print(json.dumps({"device": device, **fields} if device else fields), file=getattr(args, "json_out", None))


def _queries(fp: object, descs: list[NetworkDescription]) -> list:
    """What to ask ``fp`` about ``descs``: a trees fingerprint's features of each (computed once for its several
    questions: the predictions and the notes on its training data), else the descriptions."""
    from perf4sight.fingerprint.predict import Fingerprint
    return fp.features(descs) if isinstance(fp, Fingerprint) else descs


def _predict_on_one(cfg: Config, args: argparse.Namespace) -> int:
    from perf4sight.fingerprint.api import load_device_predictor
    from perf4sight.fingerprint.predict import batch_list

    predictor = _predictor(cfg, args)
    device = _predict_device(cfg, args.device, predictor)
    if args.json and not args.device:
        _chosen_device_note(cfg, device, predictor)
    fp = _for_loss(_for_optimizer(load_device_predictor(cfg, device, predictor), cfg.profile.optimizer, device),
                   cfg.profile.loss, device)
    _stale_fingerprint_note(cfg, device)
    if predictor == "ensemble":
        _ensemble_note(fp)
    if predictor == "gnn":
        _print_notes(_few_rows_note(device, fp.metadata))
    names = list(dict.fromkeys(args.network or default_networks(cfg)))  # each once, in order
    if not names:  # whichever question is asked of them
        raise UserError("predict: no networks given")
    if getattr(args, "max_batch_size", None) is not None:
        return _predict_max_batch(cfg, args, fp, device, names)
    if getattr(args, "prune_to_fit", False):
        return _predict_prune_to_fit(cfg, args, fp, device, names)
    # checked before describing (seconds); a size given twice is predicted once
    batch_sizes = list(dict.fromkeys(batch_list(args.batch_size or cfg.predict.batch_sizes)))
    started = time.perf_counter()
    descs = _described(cfg, args, fp, names)
    described = time.perf_counter()
    queries = _queries(fp, descs)
    preds = fp.predict(queries, batch_sizes)
    elapsed, describing = time.perf_counter() - described, described - started  # the notes are not the prediction
    _domain_note(fp, queries, batch_sizes, shape_noted=True)
    _family_note(fp, descs)
    _one_image_note(descs, batch_sizes, [p["network"] for p in preds if p["batch_size"] == 1 and p["fits"]])
    if args.json:
        for p in preds:
            _json_line(args, _rounded(p))
        _capacity_note(fp, preds)
        return 0
    cap = getattr(fp, "capacity_mb", None)
    fits_against = f"; fits: under {capacity_words(fp, preds)}" if cap is not None else ""
    step = fp.runtime.label()  # as the fingerprint stage names it: with momentum and weight decay where recorded
    if (fp.optimizer, fp.loss) != (fp.fitted_optimizer, fp.fitted_loss):
        fitted = fp.runtime.with_optimizer(fp.fitted_optimizer).with_loss(fp.fitted_loss)
        step += f", from a fingerprint of {fitted.label()}"
    _print_predictions(preds, f"predicted training step ({step}) on {device} by the {predictor} predictor "
                              f"(90% interval{fits_against})", cap)
    _capacity_note(fp, preds)
    shape = shape_text(_query_shape(cfg, args, fp))
    whose = ("the input shape asked for" if getattr(args, "input_shape", None)
             else "the input shape of the fingerprint's training networks")
    zoo = (f" (zoo networks: described at {shape}, {whose}; "
           f"the first time with torch and torchvision, then from {cfg.models_dir / ZOO_CACHE})") if any(
        n in ZOO_NAMES and not is_description_file(n, cfg) for n in names) else ""
    console.print(f"{len(preds)} prediction{'s' if len(preds) != 1 else ''} in {elapsed * 1000:.0f} ms; "
                  f"describing the networks took {describing * 1000:.0f} ms{zoo}", markup=False)
    return 0


def _query_shape(cfg: Config, args: argparse.Namespace, fp: object) -> list[int]:
    """The input shape ``[C, H, W]`` the queries are described at: ``--input-shape``, else the fingerprint's training
    networks', else ``[networks] input_shape``."""
    if getattr(args, "input_shape", None):
        from perf4sight.ir.from_torch import check_input_shape  # torch: asked only with --input-shape

        return check_input_shape(args.input_shape, "--input-shape")
    return list(fp.input_shape or cfg.networks.input_shape)


def _described(cfg: Config, args: argparse.Namespace, fp: object, names: list[str]) -> list[NetworkDescription]:
    """The queries' descriptions at the query shape (``resolve_networks``; with ``--input-shape``, description files
    and dataset networks rebuilt at it too), with a note for each variant pruned on request and one when a
    description's shape differs from the fingerprint's."""
    made: list[str] = []
    shape = _query_shape(cfg, args, fp)
    descs = resolve_networks(cfg, names, shape, made)
    if getattr(args, "input_shape", None):
        from perf4sight.networks.reshape import query_at  # torch: a description is rebuilt as a module
        descs = [query_at(cfg, name, d, shape, made) for name, d in zip(names, descs)]
    else:
        descs = [_named_at(cfg, fp, name, d, shape, made) for name, d in zip(names, descs)]
    _print_notes(*(f"note: {line}" for line in made))
    _shape_note(fp, descs)
    _parameter_notes(descs)
    return descs


def _named_at(cfg: Config, fp: object, name: str, desc: NetworkDescription, shape: list[int],
              made: list[str]) -> NetworkDescription:
    """A network asked for by name (not a description file), as a zoo name is: at the fingerprint's input ``shape``
    where the dataset's description of it is at another (resnet18_l30 of a 64x64 dataset asked of a 224x224
    fingerprint read 114 ms against its neighbours' 700), with a sentence in ``made``. A description file, a name
    of the networks stage's extra shapes (``resnet18_l30_128x96``), a network at one of the fingerprint's shapes,
    or one whose description cannot be rebuilt at ``shape`` are kept as they are (``_shape_note`` warns)."""
    from perf4sight.networks.reshape import query_at, shaped_name  # torch: only where query_at rebuilds

    if fp.at_training_shape(desc) or list(desc.input_shape) == shape or is_description_file(name, cfg) \
            or name.endswith(shaped_name("", desc.input_shape)):  # a name of the extra shapes: resnet18_l30_128x96
        return desc

    try:
        at = query_at(cfg, name, desc, shape, made)
    except UserError:
        return desc
    made.append(f"{name}: described in the dataset at {shape_text(desc.input_shape)}, predicted at "
                f"{shape_text(shape)}, the fingerprint's (--input-shape {' '.join(map(str, desc.input_shape))} "
                "predicts it as described)")
    return at


def _parameter_notes(descs: list[NetworkDescription]) -> None:
    """Say which queries' modules hold parameters that no layer of their forward reads, or frozen ones
    (``predict.parameter_notes``)."""
    from perf4sight.fingerprint.predict import parameter_notes

    for line in parameter_notes(descs):
        notes.print(f"note: {line}", style="yellow", markup=False)


def _predict_max_batch(cfg: Config, args: argparse.Namespace, fp: object, device: str, names: list[str]) -> int:
    """``--max-batch-size``: per network, the largest batch size predicted to fit the device's memory, with
    the step time (ms) and memory (MiB) predicted there; JSON lines ``network, max_batch_size, search_limit,
    capacity_mb, latency_ms, memory_mb`` (null where nothing fits; max_batch_size = search_limit: maybe more)."""
    if args.batch_size:
        raise UserError("--max-batch-size finds the batch size itself: give it or --batch-size, not both")
    if args.max_batch_size < 1:
        raise UserError(f"--max-batch-size: the search limit must be a positive integer, got {args.max_batch_size}")
    limit = args.max_batch_size
    if fp.capacity_mb is None:
        raise UserError(f"{device}: {unknown_capacity(fp)}: there is no largest batch size to find")
    descs = _described(cfg, args, fp, names)
    found, queries = [], _queries(fp, descs)
    for d in queries:
        b = fp.max_batch_size(d, limit)
        at = fp.predict(d, [b])[0] if b else {}
        found.append({"network": d.name, "max_batch_size": b or None, "search_limit": limit,
                      "capacity_mb": round(fp.capacity_mb, 3), "latency_ms": round(at["latency_ms"], 3) if at else None,
                      "memory_mb": round(at["memory_mb"], 3) if at else None})
    # the batch sizes found may lie beyond the trained ones; where none fits, batch 1 was the last query
    _domain_note(fp, queries, sorted({f["max_batch_size"] for f in found if f["max_batch_size"]}) or [1],
                 shape_noted=True)
    ones = [d for d, f in zip(descs, found) if f["max_batch_size"] == 1]
    _one_image_note(ones, [1], [d.name for d in ones])  # the largest batch that fits: 1
    if args.json:
        for f in found:
            _json_line(args, f)
        return 0
    cap, shown = fp.capacity_mb, [f for f in found if f["max_batch_size"]]
    table = Table(title=escape(f"largest batch size predicted to fit {device} ({capacity_words(fp, shown)}; "
                               f"searched up to {limit})"))
    for col in ("network", "largest batch", "step time ms there", "memory MiB there"):
        table.add_column(col, justify="left" if col == "network" else "right")
    for f in found:
        b = f["max_batch_size"]
        table.add_row(Text(f["network"]), "none fits" if b is None else f"{b}{'+' if b == limit else ''}",
                      "" if b is None else f"{f['latency_ms']:,.1f}", "" if b is None else _mib(f["memory_mb"], cap))
    console.print(table)
    if any(f["max_batch_size"] == limit for f in found):
        notes.print(f"note: '{limit}+': every batch size up to the search limit fits; raise it with "
                    "--max-batch-size LIMIT", markup=False)
    return 0


def _predict_prune_to_fit(cfg: Config, args: argparse.Namespace, fp: object, device: str, names: list[str]) -> int:
    """``--prune-to-fit``: per network and batch size, the least pruning level (whole %, pruned as the networks
    stage would) predicted to fit the device's memory, and to step within ``--max-latency-ms`` when given; JSON
    lines ``network, batch_size, max_latency_ms, pruning_level, achieved_level, variant``, then the figures of
    ``--batch-size`` queries at that level (null where no level the network reaches does)."""
    from perf4sight.fingerprint.predict import batch_list
    from perf4sight.fingerprint.pruning_search import TOP_LEVEL, least_prunings
    from perf4sight.networks.on_request import (PRUNABLE, LevelVariants, prunable_networks, pruned_as,
                                                with_command_line_factories)

    budget = args.max_latency_ms  # positive and finite: the command line's parser checks it
    if fp.capacity_mb is None and budget is None:
        raise UserError(f"{device}: {unknown_capacity(fp)}: there is no pruning level to find that fits "
                        "(--max-latency-ms alone searches for a step-time budget)")
    cfg, names = with_command_line_factories(cfg, names)  # FILE.py:FUNCTION: pruned as [networks] factories are
    networks, refused = prunable_networks(cfg, names)
    if refused:  # a name no one knows (a typo) is told as --network tells it, with the closest names
        from perf4sight.config import checked_network_names
        checked_network_names(cfg, refused, "--network", Path)
        raise UserError(f"--prune-to-fit: {', '.join(refused)}: cannot be pruned here, only {PRUNABLE}")
    batch_sizes = list(dict.fromkeys(batch_list(args.batch_size or cfg.predict.batch_sizes)))
    shape = _query_shape(cfg, args, fp)
    made: list[str] = []  # variants pruned on request
    started = time.perf_counter()
    found: list[tuple[dict, Any]] = []  # (the JSON line, the search's LeastPruning)
    for network in networks:
        variant = LevelVariants(cfg, network, shape)  # shared by the batch sizes
        for b, r in zip(batch_sizes, least_prunings(fp, variant, batch_sizes, budget)):  # each level asked once
            figures = {k: v for k, v in _rounded(r.prediction or {}).items() if k not in ("network", "batch_size")}
            line = {"network": network, "batch_size": b, "max_latency_ms": budget, "pruning_level": r.level,
                    "achieved_level": None if r.variant is None else round(r.variant.pruning_level, 3),
                    "variant": None if r.variant is None else r.variant.name,
                    **(figures or dict.fromkeys(("latency_ms", "latency_ms_low", "latency_ms_high", "memory_mb",
                                                 "memory_mb_low", "memory_mb_high", "fits")))}
            found.append((line, r))
        made += variant.pruned
    elapsed = time.perf_counter() - started
    answers = [(f, r) for f, r in found if r.variant is not None]
    if answers:
        _domain_note(fp, [r.variant for _, r in answers], sorted({f["batch_size"] for f, _ in answers}))
        _family_note(fp, [r.variant for _, r in answers])
    _print_notes(f"note: searched pruning levels 0..{TOP_LEVEL} (whole percents of the parameters) one by one "
                 "from 0 up to the first that meets the limits (the predicted memory and step time need not fall as "
                 "the level rises); "
                 + (f"{plural(len(set(made)), 'variant')} not in the dataset pruned on request as the networks "
                    f"stage would ({pruned_as(cfg)}; each read from {cfg.models_dir / ZOO_CACHE} once pruned); "
                    if made else "")
                 + f"{elapsed:.1f} s")
    if args.json:
        for f, _ in found:
            _json_line(args, f)
        return 0
    cap, shown = fp.capacity_mb, [f for f, r in found if r.variant is not None]
    wanted = " and".join(filter(None, (f" fit {device}'s {capacity_words(fp, shown)}" if cap else "",
                                       f" step within {budget:g} ms" if budget else "")))
    table = Table(title=escape(f"least pruning predicted to{wanted}"))
    for col in ("network", "batch", "level %", "removed %", "step time ms", "memory MiB", "fits"):
        table.add_column(col, justify="left" if col == "network" else "right")
    for f, r in found:
        if r.variant is None:  # the highest level asked about: 99, or what min_channels lets the network reach
            table.add_row(Text(f["network"]), str(f["batch_size"]), f"none up to {max(r.tried)}", "", "", "", "")
            continue
        table.add_row(Text(f["network"]), str(f["batch_size"]), str(f["pruning_level"]), f"{f['achieved_level']:.1f}",
                      f"{f['latency_ms']:,.1f} [{f['latency_ms_low']:,.1f}, {f['latency_ms_high']:,.1f}]",
                      f"{_mib(f['memory_mb'], cap)} [{f['memory_mb_low']:,.0f}, {f['memory_mb_high']:,.0f}]",
                      "?" if f["fits"] is None else "yes" if f["fits"] else "no")
    console.print(table)
    return 0


def _predict_device(cfg: Config, wanted: list[str] | None, predictor: str) -> str:
    """The device to predict for: the one named, else the first configured device with a fingerprint of
    ``predictor``, else the first fingerprinted one."""
    have = fingerprinted_devices(cfg, wanted, predictor)
    configured = [d for d in cfg.devices if d in have]
    device = (configured or have or [""])[0]
    if not device:
        raise UserError(f"no {predictor} fingerprint under {cfg.fingerprint_dir}"
                        + _how_to_fit(cfg, f"--stage fingerprint --predictor {predictor}"))
    return device


def _how_to_fit(cfg: Config, fit: str) -> str:
    """What to run where no device has a fingerprint: ``fit`` where some device has measurements, else the stages
    before it too (a fresh project told to fit was told next that there is nothing to fit, then nothing to profile)."""
    if measured_devices(cfg, None):
        return f": run {fit} first"
    return (f", nor any measurements under {cfg.profiling_dir}: run --stage all first (the networks, profile and "
            f"fingerprint stages), or --stage import and then {fit}")


def _chosen_device_note(cfg: Config, device: str, predictor: str) -> None:
    """Say which device ``--json`` lines without ``--device`` are of, where more than one has a fingerprint: the
    lines do not name it, and the table's title, which does, is not printed."""
    others = [d for d in fingerprinted_devices(cfg, None, predictor) if d != device]
    if others:
        chosen = "the first configured device with a fingerprint" if device in cfg.devices else \
            "the first device with a fingerprint, none configured having one"
        notes.print(f"note: predicted on {device} ({chosen}; also fingerprinted: {', '.join(others)}): "
                    "name one with --device", markup=False)


def _ensemble_note(fp: object) -> None:
    """Say for which targets the ensemble did not measure best on the device's held-out networks."""
    best = {t: e.get("best") for t, e in fp.metadata.get("accuracy", {}).items() if isinstance(e, dict)}
    worse = {t: b for t, b in best.items() if b and b != "ensemble"}
    if worse:
        notes.print("note: on this device's held-out networks the ensemble did not measure best for "
                    + ", ".join(f"{t} ({b} did)" for t, b in worse.items()), style="yellow", markup=False)


def _shape_note(fp: object, descs: list[NetworkDescription]) -> None:
    """Warn about networks described at none of the input shapes of the fingerprint's training networks."""
    line = fp.shape_line(descs)  # outside_training's line too
    if line:
        notes.print(f"note: {line}: expect larger errors", style="yellow", markup=False)


def _domain_note(fp: object, descs: list, batch_sizes: list[int], shape_noted: bool = False) -> None:
    """Say which queries leave what the predictor's training rows covered (every predictor that stored them), and
    which are described at another input shape than its training networks unless ``shape_noted`` (``_shape_note``
    said it before). ``descs``: the descriptions, or a trees fingerprint's features of them (:func:`_queries`)."""
    outside = getattr(fp, "outside_training", None)
    lines = outside(descs, batch_sizes) if outside else []
    if shape_noted:
        lines = [line for line in lines if line != fp.shape_line(descs)]
    if lines:
        notes.print("note: outside this fingerprint's training data, expect larger errors:\n  "
                    + "\n  ".join(lines), style="yellow", markup=False)


def _one_image_note(descs: list[NetworkDescription], batch_sizes: list[int],
                    fitting: list[str] | None = None) -> None:
    """Say which queries at batch 1 cannot train at all: a batch norm over a 1x1 map has one value per channel in
    a batch of one image, which torch refuses in training (DeepLabV3's pooled branch), whatever the memory.
    ``fitting``: the networks predicted to fit at batch 1, told plainly that 'fits' answers memory alone (a
    ``fits: yes`` beside "does not train at all" read as a contradiction)."""
    if 1 not in batch_sizes:
        return
    nets = [d.name for d in descs if d.untrainable_at_batch_one]
    why = "a batch norm over a 1x1 map has one value per channel (torch refuses it in training)"
    fit = [n for n in nets if n in (fitting or ())]
    if fit:
        notes.print(f"note: {named(fit)}: predicted to fit in memory at batch 1 ('fits' answers memory alone), but a "
                    f"training step at batch 1 fails: {why}; its profile rows at batch 1 are errors",
                    style="yellow", markup=False)
    rest = [n for n in nets if n not in fit]
    if rest:
        notes.print(f"note: batch 1 does not train {named(rest)} at all: {why}, whatever the memory; its profile "
                    "rows are errors", style="yellow", markup=False)


_TARGET_WORDS = {"latency": "step time", "memory": "memory"}


def _family_note(fp: object, descs: list[NetworkDescription]) -> None:
    """Say which queries are of a family the fingerprint's training rows had (a description's ``network`` with
    the layer structure of one of its training networks, e.g. another pruning level): they get the interval of
    such networks where the fit stored one (at a shape of its rows; at another, or where it stored none, the
    interval of a family never seen), and a mean step-time form's tree corrections (a CPU fingerprint's; any other
    network gets its members' linear sums alone). A query that names a training family but has other layers is said
    to be predicted as a family never seen."""
    from perf4sight.fingerprint.predict import Fingerprint
    from perf4sight.fingerprint.trees import MeanModel
    if not isinstance(fp, Fingerprint):
        return
    known = fp.training_family_of(descs)
    shaped = [fp.at_training_shape(d) for d in descs]
    model = fp.models.get("latency")
    trees = "; the step time with its forms' tree corrections" if isinstance(model, MeanModel) and model.corrected \
        else ""
    own = fp.seen_band_targets
    seen_band = ("the interval of such networks" if len(own) == 2 else
                 f"the interval of such networks for its {_TARGET_WORDS[own[0]]}, a family never seen's for the other"
                 if own else "the interval of a family never seen (no band of such networks held its coverage)")
    for at_shape, interval in ((True, seen_band),
                               (False, "at another shape than its rows', the interval of a family never seen")):
        names = [d.name for d, f, s in zip(descs, known, shaped) if f and s == at_shape]
        if names:
            notes.print(f"note: {', '.join(names)}: of a family this fingerprint was trained on: {interval}{trees}",
                        markup=False)
    others = [f"{d.name} ({d.family})" for d, f in zip(descs, known) if not f and d.family in fp.training_families]
    if others:
        notes.print(f"note: {', '.join(others)}: named as a training family but with other layers than its "
                    "training networks: predicted as a family never seen", markup=False)


def _for_optimizer(fp: Any, optimizer: str, device: str) -> Any:
    """``fp``, or where ``optimizer`` (``[profile] optimizer``, or ``--optimizer`` for the run) is not the step its
    rows were measured with, ``fp`` reading the features of a step with ``optimizer`` (``predict.for_optimizer``),
    with a note saying so."""
    from perf4sight.fingerprint.predict import for_optimizer
    fitted = fp.fitted_optimizer
    if optimizer == fitted:
        return fp
    asked = fp.runtime.with_optimizer(optimizer).label()
    notes.print(f"note: {device}'s fingerprint was fitted on steps with {fp.runtime.label()}; predicted for {asked} "
                "([profile] optimizer or --optimizer) by its models reading that step's features (the optimiser's "
                "state and update passes), which no row measured, so the interval may not hold (README: \"The "
                "training step's optimiser\"); profile and fit that step for a fingerprint of it, or --optimizer "
                f"{fitted} for the step it measured", markup=False)
    return for_optimizer(fp, optimizer)


def _for_loss(fp: Any, loss: str, device: str) -> Any:
    """``fp``, or where ``loss`` (``[profile] loss``, or ``--loss`` for the run) is not the loss its rows were
    measured with, ``fp`` reading the features of a step with ``loss`` (``predict.for_loss``), with a note saying
    so."""
    from perf4sight.fingerprint.predict import for_loss
    fitted = fp.fitted_loss
    if loss == fitted:
        return fp
    notes.print(f"note: {device}'s fingerprint was fitted on steps with loss {fitted}; predicted for loss {loss} "
                "([profile] loss or --loss) by its models reading that step's features (the loss's passes and "
                "bytes), which no row measured, so the interval may not hold; profile and fit that step for a "
                f"fingerprint of it, or --loss {fitted} for the step it measured", markup=False)
    return for_loss(fp, loss)


def _reads_as(value: float, cap: float | None) -> bool:
    """Whether a memory figure in whole MiB would read as the capacity ``cap`` in whole MiB."""
    return cap is not None and round(value) == round(cap)


def _mib(value: float, cap: float | None, sep: str = ",") -> str:
    """A memory figure in whole MiB (``sep``: the thousands separator, "" for none), or to 0.1 MiB where it would
    read as the capacity ``cap`` itself (899.8 MiB shown as 900 under a capacity of 900 that it fits)."""
    return format(value, f"{sep}.1f" if _reads_as(value, cap) else f"{sep}.0f")


def capacity_words(fp: object, rows: list[dict]) -> str:
    """``fp``'s capacity as a table's title says it: its MiB where predicted memory is compared with it (a configured
    limit), else what it is, a threshold on the memory model's demand learnt from out-of-memory rows, which a
    reader would otherwise take for the device's size and compare with the memory shown (MiB); a configured limit
    compared with the demand (a memory model whose form saturates: ``fit.capacity_basis``) is said to be one."""
    mib = f"{_capacity_mib(fp.capacity_mb, rows)} MiB"
    if getattr(fp, "capacity_basis", "") != "analytic":
        return mib
    if _configured_capacity(fp):  # a saturating memory form's
        return f"{mib}, the configured limit, against the memory model's demand"
    return f"{mib} of the memory model's demand, learnt from out-of-memory rows, not the device's size"


def _configured_capacity(fp: object) -> bool:
    """Whether ``fp``'s capacity is the configured ``memory_limit_mb`` (not learnt from out-of-memory rows)."""
    return str(getattr(fp, "metadata", {}).get("capacity_source", "")).startswith("configured")


def _capacity_mib(cap: float, rows: list[dict]) -> str:
    """The capacity in a table's title: to 0.1 MiB where a row's memory is shown so (:func:`_mib`)."""
    return format(cap, ",.1f" if any(_reads_as(r["memory_mb"], cap) for r in rows) else ",.0f")


def _print_predictions(preds: list[dict], title: str, cap: float | None = None) -> None:
    """The predictions as a table: step time and memory with their 90% interval, the training images per second
    that step time gives (the batch size over it), and whether it fits (memory to 0.1 MiB where a whole number
    would read as the capacity ``cap``)."""
    table = Table(title=escape(title))  # a device's or network's [brackets] are no markup
    for col in ("network", "batch", "step time ms", "images/s", "memory MiB", "fits"):
        table.add_column(col)
    for p in preds:
        table.add_row(Text(p["network"]), str(p["batch_size"]),  # Text: a name's [brackets] are no markup
                      f"{p['latency_ms']:.1f} [{p['latency_ms_low']:.1f}, {p['latency_ms_high']:.1f}]",
                      _images_per_s(p["batch_size"], p["latency_ms"]),
                      f"{_mib(p['memory_mb'], cap, '')} [{p['memory_mb_low']:.0f}, {p['memory_mb_high']:.0f}]",
                      "?" if p["fits"] is None else "yes" if p["fits"] else "no")
    console.print(table)


def _images_per_s(batch_size: int, latency_ms: float) -> str:
    """The training images per second of a step: whole from 10 on, else to two significant figures (a step of one
    image in 1,274 ms read '1' for 0.79)."""
    if not latency_ms > 0:
        return "–"
    rate = 1000 * batch_size / latency_ms
    return f"{rate:,.0f}" if rate >= 9.5 else f"{rate:.2g}"


def unknown_capacity(fp: object) -> str:
    """Why ``fp``'s capacity is unknown and how to learn it: a limit to set is offered where the config takes one (a
    cpu device's ``memory_limit_mb``; an ``nvml`` GPU's capacity comes from its out-of-memory rows alone)."""
    meta = getattr(fp, "metadata", {})  # the trees' name the column memory_target; a GNN's, its targets' memory
    column = meta.get("memory_target") or meta.get("targets", {}).get("memory", {}).get("column")
    on_cpu = column == "peak_rss_mb"
    limit = ", or set the device's memory_limit_mb," if on_cpu else ""
    return ("its memory capacity is unknown: its measurements have no out-of-memory row; profile batch sizes up to "
            f"the first out-of-memory{limit} and run --stage fingerprint again")


def _capacity_note(fp: object, preds: list[dict]) -> None:
    """Say when `fits` means nothing (the capacity is unknown); explain a `fits: no` whose predicted memory is
    under the capacity (the capacity is compared with the analytic demand, not with the shown figure; an ensemble's
    with its two predictors' own figures, not with their mean)."""
    cap = getattr(fp, "capacity_mb", None)
    if cap is None and preds:
        notes.print(f"note: {unknown_capacity(fp)}: 'fits' is unknown ('?', null in --json)", markup=False)
    elif hasattr(fp, "trees") and hasattr(fp, "gnn") and any(p["fits"] is False and p["memory_mb"] <= cap
                                                             for p in preds):  # an ensemble's
        demand = (" (the trees' against their memory model's analytic demand)"
                  if getattr(fp, "capacity_basis", "") == "analytic" else "")
        notes.print("note: the ensemble's 'fits' is where the trees and the GNN each predict the step to fit, each "
                    f"against its own capacity{demand}; the memory shown is their geometric mean, so a row can show "
                    "memory under the capacity and not fit", markup=False)
    elif (getattr(fp, "capacity_basis", "") == "analytic"
          and any(not p["fits"] and p["memory_mb"] <= cap for p in preds)):
        learnt = "configured" if _configured_capacity(fp) else "learnt from this device's out-of-memory rows"
        notes.print(f"note: 'fits' compares the capacity {learnt} ({cap:.0f} MiB) "
                    "with the memory model's analytic demand, which keeps growing where measured memory levels off "
                    "near the limit: a row can show memory under the capacity and not fit", markup=False)


def run_compare(cfg: Config, args: argparse.Namespace) -> int:
    """Write the compare report (:func:`~perf4sight.report.compare.compare_devices`) of the trees fingerprints of
    the named devices (else ``[compare] devices``, else every fingerprinted one); 0."""
    from perf4sight.report.compare import compare_devices

    asked = args.device or cfg.compare.devices or None
    gnn_only = sorted(p.parent.name for p in cfg.fingerprint_dir.glob("*/gnn.json")
                      if not (p.parent / "metadata.json").is_file() and (asked is None or p.parent.name in asked))
    if gnn_only:  # compare shows the trees fingerprints (and their held-out figures)
        one = len(gnn_only) == 1
        notes.print(f"note: {', '.join(gnn_only)} {'has' if one else 'have'} only a GNN; compare shows trees "
                    f"fingerprints: run --stage fingerprint --predictor trees (or ensemble) for "
                    f"{'it' if one else 'them'}", markup=False)
    try:
        devices = fingerprinted_devices(cfg, args.device or cfg.compare.devices or None)
    except UserError as exc:  # the config's names: say where they are, as --stage all does
        if args.device or not cfg.compare.devices:
            raise
        raise UserError(f"{cfg.path}: [compare] devices: {exc}") from None
    if not devices:
        raise UserError(f"no trees fingerprint under {cfg.fingerprint_dir}" + _how_to_fit(cfg, "--stage fingerprint")
                        + (" (--predictor trees or ensemble: a GNN alone is not compared)" if gnn_only else ""))
    for device in devices:  # a device without measurements here: the report's notes say so
        _stale_fingerprint_note(cfg, device)
    compare_devices(cfg, devices, console)
    return 0


def _stale_fingerprint_note(cfg: Config, device: str) -> None:
    """Say when ``device``'s measurements changed after its fingerprint was fitted (rows measured or imported
    since): the fingerprint does not know them until the fingerprint stage runs again. A file written later than
    the fingerprint whose rows hash as the trees fit's (a project copied without its files' times) is not news."""
    folder = cfg.fingerprint_dir / device
    _print_notes(_changed_limit_note(cfg, device, folder))
    fitted = [p.stat().st_mtime for p in (folder / n for n in ("metadata.json", "gnn.json")) if p.is_file()]
    csv_path = results_path(cfg.profiling_dir, device)
    if (fitted and csv_path.is_file() and csv_path.stat().st_mtime > max(fitted)
            and _trees_rows_differ(cfg, device, folder / "metadata.json")):
        notes.print(f"note: {device}: {csv_path} changed after its fingerprint was fitted: rows measured or "
                    f"imported since are not in it; run --stage fingerprint --device {shell_word(device)} to use them",
                    markup=False)


def _changed_limit_note(cfg: Config, device: str, folder: Path) -> str:
    """A note where ``device``'s configured ``memory_limit_mb`` is not the one its fingerprint in ``folder`` (the
    trees', else the GNN's) was fitted under: 'fits' and the largest batch are against the stored capacity until the
    fingerprint stage fits it again; '' where they agree, or for a device the config does not name."""
    dev = cfg.devices.get(device)
    meta: Any = None
    for name in ("metadata.json", "gnn.json"):
        try:
            meta = json.loads((folder / name).read_text())
            break
        except (OSError, ValueError):
            continue
    if dev is None or not isinstance(meta, dict):
        return ""
    cap, source = meta.get("capacity_mb"), str(meta.get("capacity_source", ""))
    if cap is not None and not isinstance(cap, (int, float)):
        return ""  # a damaged file: loading it says so
    fitted = float(cap) if cap is not None and source.startswith("configured") else 0.0
    now = float(dev.memory_limit_mb or 0)
    if now == fitted:
        return ""
    said_now = f"is {now:g} MiB now" if now else "is not set now"
    then = f"{fitted:g} MiB" if fitted else "none set"
    capacity = "unknown" if cap is None else f"{cap:.0f} MiB ({source})"
    return (f"note: {device}: {device_table(device)} memory_limit_mb {said_now}, {then} when its fingerprint was "
            f"fitted: 'fits' and the largest batch are against the fingerprint's capacity, {capacity}; run --stage "
            f"fingerprint --device {shell_word(device)} to fit it under the limit set now")


def _trees_rows_differ(cfg: Config, device: str, metadata_path: Path) -> bool:
    """Whether ``device``'s measurements differ from those of its trees fingerprint's fit (``metadata_path``);
    True where there is no trees fingerprint or its metadata cannot be read (the files' times then decide)."""
    from perf4sight.fingerprint.api import measurements_differ

    try:
        metadata = json.loads(metadata_path.read_text())
    except (OSError, ValueError):
        return True
    return not isinstance(metadata, dict) or measurements_differ(cfg, device, metadata)


def run_import(cfg: Config, args: argparse.Namespace) -> int:
    """Import ``--source`` (``--format``: an importer of :data:`~perf4sight.importers.IMPORTERS`) as the
    measurements of ``--device``, a name no configured device has, and print the counts and notes; 0."""
    from perf4sight.importers import IMPORTERS

    if args.device and len(args.device) > 1:
        raise UserError(f"import takes one --device (the name the imported measurements get), got {len(args.device)}: "
                        f"{' '.join(args.device)}")
    if args.format not in IMPORTERS or not args.source or not args.device:
        missing = [flag for flag, given in (("--format", args.format), ("--source", args.source),
                                            ("--device", args.device)) if not given]
        raise UserError(f"import needs --format {{{','.join(IMPORTERS)}}} --source DIR --device NAME "
                        f"({' and '.join(missing)} missing)")
    device = args.device[0]
    from perf4sight.importers.perf4sight_csv import check_device_name

    check_device_name(device)  # before the lock makes the device's folder: '../x' made one outside the project
    if device in cfg.devices:
        raise UserError(f"import: '{device}' is a device of {cfg.path} ({device_table(device)}, backend "
                        f"{cfg.devices[device].backend}): its CSV holds this tool's own measurements; "
                        "import under another name")
    csv_path = results_path(cfg.profiling_dir, device)
    from perf4sight.profiling.fleet import import_lock

    with import_lock(cfg.profiling_dir, device):  # two imports at once wrote every row twice
        summary = IMPORTERS[args.format](args.source, device, cfg.profiling_dir, cfg.models_dir)
    console.print(f"{device}: {plural(len(summary.networks), 'network')} read from {args.source}, "
                  f"{plural(summary.rows_written, 'new row')} in {csv_path} ({_import_counts(summary)})", markup=False)
    if summary.without_graph:
        missing = summary.without_graph
        notes.print(f"note: {device}: no graph found for {plural(len(missing), 'network')} ({named(missing, 5)}): "
                    "the rows were imported, but no stage can use them until the graph is in the source's graphs/ "
                    "folder and the source is imported again", style="yellow", markup=False)
    if summary.without_rows:
        missing = summary.without_rows
        notes.print(f"note: {device}: no row for {plural(len(missing), 'network')} ({named(missing, 5)}): both "
                    f"{'its' if len(missing) == 1 else 'their'} memory/ and latency/*-gt.csv files are missing, empty "
                    "or cut short before their first row; nothing of it was measured here", style="yellow",
                    markup=False)
    for kind, missing in summary.kind_missing.items():
        other = "step time" if kind == "memory" else "memory"
        notes.print(f"note: {device}: no {kind} row for {plural(len(missing), 'network')} ({named(missing, 5)}): "
                    f"{'its' if len(missing) == 1 else 'their'} {kind}/*-gt.csv file is missing, empty or cut short "
                    f"before its first row; the rows carry the {other} alone", style="yellow", markup=False)
    if summary.renamed:
        notes.print(f"note: {device}: {plural(len(summary.renamed), 'graph')} named otherwise than its file, imported "
                    f"under the file's name, which its CSV files use ({named(summary.renamed, 3)})", markup=False)
    if summary.without_phase:
        notes.print(f"note: {device}: {plural(len(summary.without_phase), 'label file')} held no training step's "
                    f"figures (no 'train' entry: {named(summary.without_phase, 3)}); no row was made from "
                    f"{'them' if len(summary.without_phase) > 1 else 'it'}", style="yellow", markup=False)
    if summary.rows_differing:
        notes.print(f"note: {device}: {plural(summary.rows_differing, 'row')} already imported read otherwise now (the "
                    "source changed, or an earlier version of this tool read it otherwise); the rows on disk are "
                    f"kept: to import the source's, remove {csv_path} (or those rows) and import again",
                    style="yellow", markup=False)
    return 0


def _import_counts(summary: ImportSummary) -> str:
    """An import's counts in words, e.g. "870 ok, 531 oom, 23 rows merged from repeated runs; 58 descriptions
    in models/imported/tx2" (rows already on disk, skipped, and merged rows only where there are some)."""
    done = [f"{summary.ok} ok", f"{summary.oom} oom"] + ([f"{summary.error} error"] if summary.error else [])
    if summary.no_latency:
        done.append(f"{plural(summary.no_latency, 'ok row')} without a step time")
    if summary.no_memory:
        done.append(f"{plural(summary.no_memory, 'ok row')} without a memory figure")
    if summary.rows_skipped_existing:
        done.append(f"{plural(summary.rows_skipped_existing, 'row')} already imported, skipped")
    if summary.duplicates_merged:
        done.append(f"{plural(summary.duplicates_merged, 'row')} merged from repeated runs")
    if summary.thrashing:
        done.append(f"{plural(len(summary.thrashing), 'thrashing step')} recorded as oom "
                    f"({named(summary.thrashing)})")
    return ", ".join(done) + f"; {plural(summary.descriptions, 'description')} in {summary.models_path}"


def run_export(cfg: Config, args: argparse.Namespace) -> int:
    """Write each named device's ok rows with a description as PerfSeer graph + label pairs under ``--output``
    (one folder per device when there are several), every device checked before the first file is written; 0."""
    from perf4sight.exporters import export_perfseer
    from perf4sight.exporters.perfseer import check_exportable, exportable_rows
    from perf4sight.fingerprint.fit import memory_column

    if args.format and args.format != "perfseer":
        raise UserError(f"export: --format {args.format} cannot be written; perfseer is the only export format "
                        "(perf4sight's own CSV layout can be imported, not exported)")
    if args.format != "perfseer" or not args.output:
        raise UserError("export needs --format perfseer --output DIR [--device NAME ...]")
    if Path(args.output).exists() and not Path(args.output).is_dir():
        raise UserError(f"export: --output {args.output} is a file, not a folder")
    if Path(args.output).is_dir() and any(Path(args.output).iterdir()):  # several devices too: two exports in one
        # folder (an earlier export's files beside the devices' folders) would read back as one device
        raise UserError(f"export: {args.output} is not empty; export into a new or empty folder; nothing written")
    devices = measured_devices(cfg, args.device)
    if not devices:
        raise UserError(f"no measurements under {cfg.profiling_dir}: run --stage profile or --stage import first")
    todo = {}
    for device in devices:  # every device checked before the first file is written
        # SGD's and cross entropy's rows, whatever [profile] says: a PerfSeer label holds one training figure, read
        # back as theirs
        descriptions, _, rows, note = device_dataset(cfg, device, DEFAULT_OPTIMIZER, DEFAULT_LOSS)
        _print_notes(note)
        if not rows and other_phases(cfg, device, DEFAULT_OPTIMIZER):
            raise UserError(f"export: device '{device}' has no rows of a step with {DEFAULT_OPTIMIZER}, the only "
                            "optimiser a PerfSeer label holds (its 'train' figure, which an import reads back as "
                            f"{DEFAULT_OPTIMIZER}'s); nothing written")
        losses = other_losses(cfg, device, DEFAULT_OPTIMIZER, DEFAULT_LOSS) if not rows else []
        if losses:
            raise UserError(f"export: device '{device}' has no rows of a step with a cross entropy ({DEFAULT_LOSS}), "
                            f"the only loss a PerfSeer label holds; its rows are of {' and '.join(losses)}; nothing "
                            "written")
        pairs, skipped = exportable_rows(rows, descriptions)
        if not pairs and not skipped:  # every row passed over (another input shape, an earlier description)
            raise UserError(f"export: device '{device}' has no ok measurement to export (any rows passed over are "
                            "named in the note above); nothing written")
        if not pairs:
            raise UserError(f"export: device '{device}' has no ok measurement whose network has a description "
                            f"({plural(skipped, 'ok row')} without one; see --stage fingerprint's notes); "
                            "nothing written")
        check_exportable(pairs)
        out = Path(args.output) / device if len(devices) > 1 else Path(args.output)
        todo[device] = (rows, descriptions, out)
    for device, (rows, descriptions, out) in todo.items():
        try:
            done = export_perfseer(rows, descriptions, out, memory_column(rows))
        except OSError as exc:  # a folder that cannot be made or written: where, and why
            raise UserError(f"export: cannot write {exc.filename or out} ({exc.strerror or exc})") from None
        console.print(f"{device}: {done['graphs_written']} graph + label pairs in {done['folder']}"
                      + (f" ({plural(done['skipped_no_description'], 'row')} without a description skipped)"
                         if done["skipped_no_description"] else ""), markup=False)
    return 0


def run_check(cfg: Config, args: argparse.Namespace) -> int:
    """Probe the named configured devices (all by default) and print what each has; 0 when every one is reachable
    with torch and its backend's library, else 1."""
    from perf4sight.profiling.fleet import check_devices, format_checks

    checks = check_devices(cfg, _configured(cfg, args.device or list(cfg.devices)))
    console.print(format_checks(checks), markup=False)
    return 0 if all(c.ok for c in checks) else 1


STAGES: dict[str, Callable[[Config, argparse.Namespace], int]] = {
    "networks": run_networks, "profile": run_profile, "fingerprint": run_fingerprint,
    "predict": run_predict, "compare": run_compare, "import": run_import, "export": run_export,
    "check": run_check,
}
