"""What a device's data is, on disk: the networks the profile stage measures, each device's descriptions
and measured rows (with the rows measured on an earlier version of a description set apart), which
devices have measurements or fingerprints, and networks named on a command line (zoo names, the dataset's
networks, or files). Shared by the stages and the Python API."""
from __future__ import annotations

import csv
import difflib
import re
from collections import Counter
from pathlib import Path
from typing import Callable, NamedTuple

from perf4sight.config import Config
from perf4sight.errors import UserError
from perf4sight.ir.schema import NetworkDescription, load_description
from perf4sight.ir.shapes import shape_text
from perf4sight.profiling.plan import phase_optimizer, training_phase
from perf4sight.profiling.results import (file_sha, incomplete_note, latest_rows, loss_of, phase_of, read_rows,
                                         results_path, split_stale)
from perf4sight.wording import device_table, named, plural, shell_words

__all__ = ["read_manifest", "is_description_file", "dataset_descriptions", "dataset_descriptions_or_empty",
           "description_shas", "descriptions_and_shas", "current_rows", "other_phases", "other_losses", "stale_note",
           "undescribed_note", "split_other_shapes", "other_shapes_note", "DeviceDataset", "device_dataset",
           "measured_devices", "fingerprinted_devices", "resolve_networks", "default_networks", "ZOO_CACHE"]


def read_manifest(path: Path) -> list[dict[str, str]]:
    """The rows of a networks manifest (``<models_dir>/manifest.csv``, the columns of
    ``perf4sight.networks.build.MANIFEST_COLUMNS``, strings), read without torch; [] when there is none (before the
    networks stage). A damaged one (not UTF-8 CSV, a row without a network or a path, or with fields beyond the
    header) raises a one-line ``UserError`` naming it."""
    if not path.is_file():
        return []
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            numbered = [(reader.line_num, r) for r in reader]  # the file's line where each row ends
    except (UnicodeDecodeError, csv.Error) as exc:
        raise UserError(f"{path}: not a readable manifest ({exc}): run --stage networks again") from None
    for line, row in numbered:
        if not row.get("network") or not row.get("path") or None in row:  # None: fields beyond the header
            raise UserError(f"{path}: line {line}: incomplete row (the networks stage writes every row with "
                            "a network and a path): run --stage networks again")
    return [row for _, row in numbered]


def dataset_descriptions(cfg: Config) -> list[Path]:
    """The networks the profile stage measures: those in the networks stage's manifest (``UserError`` where one of
    their files is gone: deleted by hand, the networks stage writes it again)."""
    manifest = cfg.models_dir / "manifest.csv"
    if not manifest.is_file():
        raise UserError(f"no network descriptions: {manifest} is missing (run --stage networks first)")
    paths = [cfg.models_dir / r["path"] for r in read_manifest(manifest)]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise UserError(f"{manifest} lists {plural(len(missing), 'description file')} no longer there "
                        f"({named(missing)}): run --stage networks again, which writes them")
    return paths


def _description_paths(cfg: Config, device: str) -> list[Path]:
    """The networks stage's descriptions, then the device's imported graphs (later ones win a name)."""
    return dataset_descriptions_or_empty(cfg) + sorted((cfg.models_dir / "imported" / device).glob("*.json"))


def descriptions_and_shas(cfg: Config, device: str) -> tuple[dict[str, NetworkDescription], dict[str, str]]:
    """(every known description by name, network name -> ``description_sha`` of its file as it is now), each
    file parsed once; a device's imported graphs take precedence for that device (later ones win a name)."""
    index: dict[str, NetworkDescription] = {}
    shas: dict[str, str] = {}
    for p in _description_paths(cfg, device):
        desc = load_description(p)
        index[desc.name], shas[desc.name] = desc, file_sha(p.read_bytes())
    return index, shas


def description_shas(cfg: Config, device: str) -> dict[str, str]:
    """Network name -> ``description_sha`` of its description file as it is now (see ``descriptions_and_shas``)."""
    return descriptions_and_shas(cfg, device)[1]


def current_rows(cfg: Config, device: str, shas: dict[str, str] | None = None, incomplete: list[int] | None = None,
                 optimizer: str | None = None,
                 loss: str | None = None) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(rows of ``device`` measured on its descriptions as they are now, stale rows), of the training step with
    ``optimizer`` (default: ``[profile] optimizer``; the rows' ``phase``; :func:`other_phases` says what else the
    device has) and ``loss`` (default: ``[profile] loss``; the rows' ``loss``; :func:`other_losses` says what else
    the device has): a row whose network's description file changed since it was measured is stale (the profile stage
    measures it again), and a row measured again later is left out of both (``latest_rows``: an ``oom`` of a lower
    memory_limit_mb, an ``error`` retried).
    ``shas``: ``description_shas`` of the device when the caller has them already (else they are read);
    ``incomplete``: a list to receive the numbers of the lines ``read_rows`` passed over."""
    phase, loss = training_phase(optimizer or cfg.profile.optimizer), loss or cfg.profile.loss
    rows = latest_rows(r for r in _device_rows(cfg, device, incomplete) if phase_of(r) == phase and loss_of(r) == loss)
    return split_stale(rows, description_shas(cfg, device) if shas is None else shas)


def _device_rows(cfg: Config, device: str, incomplete: list[int] | None = None) -> list[dict[str, str]]:
    """The rows of ``device``'s measurements file; ``UserError`` where some name another device in their ``device``
    cell (a device renamed, or rows copied in from another device's file), which would be left out unsaid."""
    path = results_path(cfg.profiling_dir, device)
    rows = read_rows(path, incomplete)
    others = Counter(r.get("device") or "" for r in rows if r.get("device", device) != device)
    if others:
        found = ", ".join(f"'{name}' ({k})" if name else f"an empty cell ({k})" for name, k in others.most_common())
        n = sum(others.values())
        raise UserError(f"{path}: {plural(n, 'row')} of {len(rows)} {'names' if n == 1 else 'name'} another device "
                        f"than '{device}' in their device column: {found}; a device's file holds its own rows only (a "
                        f"renamed device: rename its rows' device cells too)")
    return rows


def other_phases(cfg: Config, device: str, optimizer: str | None = None) -> list[str]:
    """The phases of ``device``'s rows other than ``optimizer``'s (default: ``[profile] optimizer``'s), sorted:
    ``sgd``, ``adam`` or ``adamw`` for a training step with that optimiser (``profiling.plan.phase_optimizer``),
    else the phase as written."""
    phase = training_phase(optimizer or cfg.profile.optimizer)
    found = {phase_of(r) for r in _device_rows(cfg, device)}
    return sorted(phase_optimizer(p) or p for p in found - {phase})


def other_losses(cfg: Config, device: str, optimizer: str | None = None, loss: str | None = None) -> list[str]:
    """The losses of ``device``'s rows of ``optimizer``'s step (default: ``[profile] optimizer``'s) other than
    ``loss`` (default: ``[profile] loss``), sorted."""
    phase, loss = training_phase(optimizer or cfg.profile.optimizer), loss or cfg.profile.loss
    return sorted({loss_of(r) for r in _device_rows(cfg, device) if phase_of(r) == phase} - {loss})


def stale_note(device: str, stale: list[dict[str, str]], current: list[dict[str, str]] = ()) -> str:
    """One line saying which rows were passed over because their description changed ('' if none), and
    whether ``current`` rows (measured on the descriptions as they are) have replaced them."""
    if not stale:
        return ""
    measured = {(r["network"], r["batch_size"]) for r in current}
    todo = [r for r in stale if (r["network"], r["batch_size"]) not in measured]
    nets = sorted({r["network"] for r in stale})
    action = (f"{len(todo)} of them not measured again yet: profile them again" if todo
              else "all measured again since")
    return (f"{device}: {plural(len(stale), 'row')} of {plural(len(nets), 'network')} ({named(nets)}) "
            f"{'was' if len(stale) == 1 else 'were'} measured on an earlier version of their description and "
            f"{'is' if len(stale) == 1 else 'are'} passed over ({action})")


def undescribed_note(cfg: Config, device: str, rows: list[dict[str, str]],
                     descriptions: dict[str, NetworkDescription]) -> str:
    """One line saying how many of ``rows`` the fingerprint passes over because their network has no
    description in the dataset any more ('' if none): the networks stage's manifest no longer lists it (the
    network was removed from the config) and the device's imported graphs do not have it either."""
    gone = [r for r in rows if r.get("network") not in descriptions]
    if not gone:
        return ""
    nets = sorted({str(r.get("network")) for r in gone})
    imported = all(r.get("backend") == "imported" for r in gone)
    why = ("their graphs were not among those imported: to use the rows, put the graphs in the source's graphs/ "
           "folder and import it again" if imported else
           "networks removed from the config? to use the rows, add the networks back and rerun --stage networks")
    return (f"{device}: {plural(len(gone), 'row')} of {plural(len(nets), 'network')} ({named(nets)}) "
            f"{'is' if len(gone) == 1 else 'are'} passed over: no description of them in "
            f"{cfg.models_dir / 'manifest.csv'} or {cfg.models_dir / 'imported' / device} ({why})")


def split_other_shapes(rows: list[dict[str, str]], descriptions: dict[str, NetworkDescription]
                       ) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(rows at their description's input shape, rows measured at another): a description is of one input shape,
    so a row whose ``input_shape`` cell names another cannot be paired with it (fitted as if measured at the
    description's, it read 108% off). An empty cell, or a network without a description, counts as the first."""
    same, other = [], []
    for r in rows:
        desc = descriptions.get(str(r.get("network")))
        shape = str(r.get("input_shape") or "")
        (other if desc is not None and shape and shape != shape_text(desc.input_shape) else same).append(r)
    return same, other


def other_shapes_note(device: str, other: list[dict[str, str]], descriptions: dict[str, NetworkDescription]) -> str:
    """One line on the rows :func:`split_other_shapes` set apart ('' if none)."""
    if not other:
        return ""
    first = other[0]
    was = shape_text(descriptions[str(first["network"])].input_shape)
    return (f"{device}: {plural(len(other), 'row')} measured at another input shape than their network's description "
            f"{'is' if len(other) == 1 else 'are'} passed over (e.g. {first['network']} at {first['input_shape']}, "
            f"described at {was}): a description is of one input shape; measure or import the network at that shape "
            "under a name of its own ([networks] extra_input_shapes does)")


class DeviceDataset(NamedTuple):
    """A device's data as the fingerprint, export and compare stages read it (see :func:`device_dataset`)."""
    descriptions: dict[str, NetworkDescription]  # every known description by name
    shas: dict[str, str]                          # network name -> ``description_sha`` of its file now
    rows: list[dict[str, str]]                    # rows measured on the descriptions as they are now
    note: str  # ``incomplete_note`` and ``stale_note`` on the lines and rows passed over, one a line ('' if none)


def device_dataset(cfg: Config, device: str, optimizer: str | None = None,
                   loss: str | None = None) -> DeviceDataset:
    """``device``'s descriptions and their shas (``descriptions_and_shas``: each file parsed once), its current
    rows (``current_rows``, of the step with ``optimizer`` and ``loss``: default ``[profile]``'s) and the notes on
    the CSV lines and stale rows passed over (``incomplete_note``, ``stale_note``), which the caller prints or not."""
    descriptions, shas = descriptions_and_shas(cfg, device)
    incomplete: list[int] = []
    rows, stale = current_rows(cfg, device, shas, incomplete, optimizer, loss)
    rows, other = split_other_shapes(rows, descriptions)
    notes = (incomplete_note(results_path(cfg.profiling_dir, device), incomplete), stale_note(device, stale, rows),
             other_shapes_note(device, other, descriptions))
    return DeviceDataset(descriptions, shas, rows, "\n".join(n for n in notes if n))


def default_networks(cfg: Config) -> list[str]:
    """The networks predict and compare show when none are named on the command line: ``[predict] networks``, else
    ``[networks] zoo``, else the config's factories and description files, else the networks stage's unpruned
    networks (a dataset of generated networks alone: each at ``[networks] input_shape``, not again at the extra ones);
    [] when none of these names one."""
    from perf4sight.networks.named import named_networks

    names = cfg.predict.networks or cfg.networks.zoo or [n.name for n in named_networks(cfg)]
    if not names:  # each once: not again as made at a [networks] extra_input_shapes (an older manifest: no column)
        here = shape_text(cfg.networks.input_shape)
        names = [r["network"] for r in read_manifest(cfg.models_dir / "manifest.csv")
                 if float(r.get("target_level") or 0) == 0 and (r.get("input_shape") or here) == here]
    return list(names)


def dataset_descriptions_or_empty(cfg: Config) -> list[Path]:
    """:func:`dataset_descriptions`, or [] before the networks stage (a damaged manifest is still an error)."""
    return dataset_descriptions(cfg) if (cfg.models_dir / "manifest.csv").is_file() else []


def known_devices(cfg: Config) -> list[str]:
    """The devices a name may stand for: the config's, and those with measurements or a fingerprint on disk (an
    imported device has no [devices] table)."""
    return sorted({*cfg.devices, *(p.parent.name for p in cfg.profiling_dir.glob("*/measurements.csv")),
                   *(p.parent.name for p in cfg.fingerprint_dir.glob("*/*.json"))})


def unknown_device(cfg: Config, name: str, known: list[str]) -> str:
    """The line saying that device ``name`` is none of ``known`` (:func:`known_devices`), with the closest names."""
    close = difflib.get_close_matches(name, known, n=2, cutoff=0.6)
    guess = f" (did you mean {' or '.join(repr(n) for n in close)}?)" if close else ""
    return (f"unknown device '{name}'{guess}: no {device_table(name)} in {cfg.path}, and no measurements or "
            f"fingerprint of that name (devices: {', '.join(known) or 'none'})")


def _devices_having(cfg: Config, folder: Path, marker: str, what: str, wanted: list[str] | None,
                    stage: str) -> list[str]:
    """Devices with ``<folder>/<device>/<marker>`` on disk; ``wanted`` must all have it. A wanted name that no
    config section, measurement or fingerprint knows is a typo, and said so; a known device without the file is
    told to run ``stage`` for it."""
    have = sorted(p.parent.name for p in folder.glob(f"*/{marker}"))
    if not wanted:
        return have
    missing = [d for d in wanted if d not in have]
    if not missing:
        return list(dict.fromkeys(wanted))  # a device named twice is one device
    known = known_devices(cfg)
    for name in missing:
        if name not in known:
            raise UserError(unknown_device(cfg, name, known))
    found = f"found for: {', '.join(have)}; " if have else ""
    raise UserError(f"no {what} for device(s) {', '.join(missing)} under {folder} ({found}run "
                    f"{stage.format(device=shell_words(missing))} first)")


def measured_devices(cfg: Config, wanted: list[str] | None) -> list[str]:
    """Devices with measurements on disk (``--device`` narrows the list)."""
    return _devices_having(cfg, cfg.profiling_dir, "measurements.csv", "measurements", wanted,
                           "--stage profile --device {device} (or --stage import ... --device {device})")


def fingerprinted_devices(cfg: Config, wanted: list[str] | None, predictor: str = "trees") -> list[str]:
    """Devices with a fitted fingerprint of ``predictor`` (``--device`` narrows the list)."""
    marker = "metadata.json" if predictor == "trees" else "gnn.json"  # the ensemble needs both; loading checks
    fit = "--stage fingerprint --device {device}" + ("" if predictor == cfg.fingerprint.predictor
                                                     else f" --predictor {predictor}")
    unmeasured = [d for d in wanted or [] if not (cfg.fingerprint_dir / d / marker).is_file()
                  and not results_path(cfg.profiling_dir, d).is_file()]
    if unmeasured:  # fitting would fail for want of measurements: say the whole way
        fit = f"--stage all, or --stage profile --device {{device}} (or --stage import) and then {fit},"
    return _devices_having(cfg, cfg.fingerprint_dir, marker, f"{predictor} fingerprint", wanted, fit)


ZOO_CACHE = "zoo-cache"  # under models_dir: zoo descriptions made for predict and compare, reused


def is_description_file(name: str, cfg: Config | None = None, resolve: Callable[[str], Path] = Path) -> bool:
    """Whether a network named on the command line or in [predict]/[compare] is a description file (else a
    network's name): a name ending in .json, or a file (``resolve``: where a name is looked for, the current folder
    by default); but a bare name (no folder in it) of a network is that network, whatever file of that name is
    there (a log or a checkpoint called ``resnet18`` was read as a description: "not valid JSON"), as it wins a
    folder: a zoo network's or, with ``cfg``, a name the networks stage gives (``resnet18_l30``, pruned on request
    where it has not run), a network ``[networks]`` names or a network of the dataset."""
    if name.endswith(".json"):
        return True
    if not resolve(name).is_file():
        return False
    if Path(name).name != name:  # a path with a folder in it: the file
        return True
    from perf4sight.config import _made_name
    from perf4sight.networks.named import named_networks  # no torch
    from perf4sight.networks.zoo import ZOO_NAMES  # names only: no torch

    if name in ZOO_NAMES:
        return False
    return cfg is None or not (_made_name(cfg, name) or name in dataset_network_names(cfg)
                               or name in (n.name for n in named_networks(cfg)))


def _dataset_files(cfg: Config, name: str, manifest: list[dict[str, str]]) -> list[Path]:
    """The description files of the dataset networks (networks stage, then each device's import) called
    ``name``: none, one, or several (one per device that imported a graph of that name); ``manifest``: the rows
    of ``models/manifest.csv`` (:func:`read_manifest`)."""
    found = [cfg.models_dir / row["path"] for row in manifest if row["network"] == name][:1]
    return found + sorted(p for p in (cfg.models_dir / "imported").glob("*/*.json") if p.stem == name)


def resolve_networks(cfg: Config, names: list[str], input_shape: list[int],
                     notes: list[str] | None = None) -> list[NetworkDescription]:
    """Zoo names, and factories given as ``path/to/file.py:function``, are described at ``input_shape`` (cached
    under ``<models_dir>/zoo-cache/``); anything ending in .json is a description file; another name is a network
    of the dataset (a variant the networks stage made, or a graph imported for a device), read from its description
    file, else the pruned variant (``resnet18_l45``) of a zoo network or of one the config names, made now as the
    networks stage would (:mod:`perf4sight.networks.on_request`; a sentence saying so appended to ``notes`` when a
    list is given), else a network the config names, unpruned (``tiny_resnet``: its level 0, at ``input_shape``);
    any other name raises ``UserError`` (:func:`unknown_network`). The manifest is read once, at the first name of
    the dataset."""
    from perf4sight.networks.factories import COMMAND_LINE_FACTORY, describe_factory
    from perf4sight.networks.on_request import own_network
    from perf4sight.networks.zoo import ZOO_NAMES, describe_zoo

    out = []
    manifest: list[dict[str, str]] | None = None  # read at the first dataset name (zoo names and files need none)
    for name in names:
        if not name.strip():
            raise UserError(f"network name {name!r} is empty: give a zoo name, a description file or FILE.py:FUNCTION")
        if Path(name).is_dir() and name not in ZOO_NAMES:  # a zoo name wins a folder of that name in the cwd
            raise UserError(f"{name}: is a folder; give description files (e.g. {Path(name) / '*.json'})")
        if name.endswith(".py") and Path(name).is_file():
            raise UserError(f"{name}: a Python file, not a network: name the function that builds the network, "
                            f"{name}:function (a factory), or give a description .json file")
        near_factory = re.fullmatch(r"(.+\.py):(.*)", name, re.DOTALL)
        if near_factory and not COMMAND_LINE_FACTORY.fullmatch(name):  # good.py:, good.py:net(), good.py:my-net
            function = near_factory.group(2)
            raise UserError(f"{name}: FILE.py:FUNCTION names after the colon the function that returns the network, a "
                            f"Python name such as mynet without parentheses or arguments; got {function!r}")
        if is_description_file(name, cfg):
            _refuse_a_path_of_the_configs_folder(cfg, name)
            out.append(load_description(name))
        elif COMMAND_LINE_FACTORY.fullmatch(name):
            _refuse_a_path_of_the_configs_folder(cfg, name.rpartition(":")[0], f"factory '{name}': file")
            out.append(describe_factory(name, input_shape, cfg.networks.num_classes, cfg.models_dir / ZOO_CACHE))
        elif name in ZOO_NAMES and own_network(cfg, name) is None:  # the config's own network of the name wins
            out.append(describe_zoo(name, input_shape, cfg.networks.classes_of(name),
                                    cache_dir=cfg.models_dir / ZOO_CACHE))
        else:
            manifest = read_manifest(cfg.models_dir / "manifest.csv") if manifest is None else manifest
            out.append(_dataset_network(cfg, name, manifest, input_shape, notes))
    return out


def _refuse_a_path_of_the_configs_folder(cfg: Config, name: str, what: str = "") -> None:
    """``UserError`` where the file ``name`` (a description file or a factory's Python file given on the command
    line: relative to the current folder) is not there but is relative to the config file's folder, as the config's
    own paths are: a user running from another folder (``--config proj/config.toml --network models/...json``) read
    only "not found". ``what`` opens the line (default: the name, as a description file)."""
    given = Path(name).expanduser()
    if given.is_absolute() or given.exists():
        return
    beside = cfg.root / given
    if beside.is_file():
        what = what or f"{name}: network description file"
        raise UserError(f"{what} not found in the current folder ({Path.cwd()}); the "
                        f"config's folder has one: give it as {beside} (command-line paths are relative to the "
                        "current folder, the config's to the config file)")


def _dataset_network(cfg: Config, name: str, manifest: list[dict[str, str]], input_shape: list[int],
                     notes: list[str] | None) -> NetworkDescription:
    """The description of the dataset network ``name`` (a variant the networks stage made, or an imported graph;
    ``manifest``: the rows of ``models/manifest.csv``), else of a variant pruned on request (see
    :func:`resolve_networks`); ``UserError`` when there is none, or several that differ."""
    paths = _dataset_files(cfg, name, manifest)
    if not paths:
        from perf4sight.networks.on_request import pruned_as, pruned_on_request, unpruned_own
        desc = pruned_on_request(cfg, name, input_shape)
        if desc is None:
            unpruned = unpruned_own(cfg, name, input_shape)
            if unpruned is None:
                raise UserError(unknown_network(cfg, name, dataset_network_names(cfg, manifest)))
            return unpruned
        if notes is not None:
            notes.append(f"{name}: not in the dataset: {desc.network} pruned on request as the networks stage "
                         f"would ({pruned_as(cfg)}: {desc.pruning_level:.1f}% of its parameters removed)")
        return desc
    found = [load_description(p) for p in paths]  # a missing or damaged file: one line naming it
    if len({d.to_json() for d in found}) > 1:
        raise UserError(f"'{name}' names {len(paths)} different networks of the dataset: give one of their "
                        f"description files, {', '.join(map(str, paths))}")
    return found[0]


def dataset_network_names(cfg: Config, manifest: list[dict[str, str]] | None = None) -> list[str]:
    """Names of the dataset's networks: those of ``models/manifest.csv`` (``manifest``: its rows, when the caller
    has read them already) and the graphs imported for a device."""
    rows = read_manifest(cfg.models_dir / "manifest.csv") if manifest is None else manifest
    names = [row["network"] for row in rows]  # read_manifest refuses a row without one
    names += [p.stem for p in (cfg.models_dir / "imported").glob("*/*.json")]
    return sorted(set(names))


def unknown_network(cfg: Config, name: str, dataset: list[str] | None = None) -> str:
    """The line for a network name that is neither a zoo network, a network of the dataset nor a file: the
    closest names (a typo, another case), and the three kinds of name a network can be given by (``dataset``:
    :func:`dataset_network_names`, when the caller has them already)."""
    from perf4sight.networks.zoo import ZOO_NAMES

    dataset = dataset_network_names(cfg) if dataset is None else dataset
    by_lower = {n.lower(): n for n in (*ZOO_NAMES, *dataset)}
    close = [by_lower[n] for n in difflib.get_close_matches(name.lower(), list(by_lower), n=3, cutoff=0.75)]
    guess = f" (did you mean {' or '.join(repr(n) for n in close)}?)" if close else ""
    mine = (f"a network of the dataset ({len(dataset)}: {named(dataset, 4)}), " if dataset
            else "a network of the dataset (none yet: run --stage networks or --stage import), ")
    return (f"unknown network '{name}'{guess}: give a zoo network (one of torchvision's classifiers or segmentation "
            f"networks by name, e.g. resnet18, mobilenet_v2, efficientnet_b0: --help lists the {len(ZOO_NAMES)}), a "
            "pruned variant of one "
            f"or of a network [networks] names (e.g. {ZOO_NAMES[0]}_l30: pruned on request as the networks stage "
            f"would), {mine}a description .json file, or FILE.py:FUNCTION (a function that returns the network)")
