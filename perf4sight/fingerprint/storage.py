"""Fingerprint files: numbers in ``models.npz`` (no pickle), everything else in ``metadata.json``.

Layout of ``<fingerprint_dir>/<device>/``::

    metadata.json   device, versions, feature set, training-data hash, inputs hash (``fit_inputs.py``), targets,
                    accuracy, models' scalars
    models.npz      flat tree arrays and linear coefficients, loaded with ``allow_pickle=False`` (a mean
                    form's members under ``<target>.<k>.``)
    held_out.csv    each training row's out-of-fold prediction (target, network, batch_size, measured,
                    predicted): what the accuracy table was computed from, reused by the compare stage

Loading executes no code from the files: JSON and plain numeric arrays only.
"""
from __future__ import annotations

import contextlib
import csv
import fcntl
import json
import math
import os
import zipfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from perf4sight.errors import UserError
from perf4sight.files import atomic_path
from perf4sight.features.step_runtime import StepRuntime
from perf4sight.features.allocator import REPLAY_PROTOCOLS
from perf4sight.fingerprint.trees import OVERLAP, MeanModel, Model, TargetModel, TreeEnsemble, tree_features
from perf4sight.profiling.results import batch_size_of

__all__ = ["save_models", "load_models", "reading", "load_held_out", "stored_predictions", "damaged", "check_metadata",
           "HeldOut", "METADATA_FILE", "MODELS_FILE", "HELD_OUT_FILE", "FEATURE_SET"]

#: The features a tree fingerprint is fitted on; a fingerprint stored with another set is refused.
FEATURE_SET = "perf4sight-graph-v1"

METADATA_FILE = "metadata.json"
MODELS_FILE = "models.npz"
HELD_OUT_FILE = "held_out.csv"
HELD_OUT_COLUMNS = ("target", "network", "batch_size", "measured", "predicted")

# target -> (network, batch size, measured value) -> out-of-fold prediction (ms or MiB)
HeldOut = dict[str, dict[tuple[str, int, float], float]]


def _write_held_out(tmp: Path, held_out: dict[str, tuple[list[str], list[int], np.ndarray, np.ndarray]]) -> None:
    with tmp.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(HELD_OUT_COLUMNS)
        for target, (nets, bss, measured, predicted) in held_out.items():
            for net, bs, m, p in zip(nets, bss, measured, predicted):
                w.writerow([target, net, int(bs), repr(float(m)), repr(float(p))])


def _store_model(prefix: str, m: TargetModel, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """Put ``m``'s arrays into ``arrays`` under ``prefix``; returns its metadata entry."""
    arrays[f"{prefix}.coef"] = np.asarray(m.coef, dtype=np.float64)
    entry: dict[str, Any] = {"terms": list(m.terms), "correction": None}
    if m.correction is not None:
        arr, scalars = m.correction.to_arrays(f"{prefix}.trees")
        arrays.update(arr)
        entry["correction"] = scalars
    return entry


def _load_model(target: str, prefix: str, entry: dict[str, Any], arrays: Any) -> TargetModel:
    """One target's model stored under ``prefix``; ``ValueError`` for coefficients that are not numbers, or trees
    that are not whole (``TreeEnsemble.from_arrays``)."""
    corr = entry.get("correction")
    terms = entry["terms"]
    if not (isinstance(terms, list) and all(isinstance(t, str) for t in terms)):
        raise ValueError(f"{prefix}.terms is {terms!r}, not a list of names")
    coef = np.asarray(arrays[f"{prefix}.coef"])
    if coef.dtype.kind not in "fiu" or not np.all(np.isfinite(coef)):
        raise ValueError(f"{prefix}.coef: not finite numbers")
    columns = len([t for t in terms if t != OVERLAP])  # one coefficient a term (the overlap's separator has none)
    if coef.shape != (columns,):
        raise ValueError(f"{prefix}.coef: {coef.size} coefficients for {columns} terms")
    trees = None if corr is None else TreeEnsemble.from_arrays(f"{prefix}.trees", arrays, corr,
                                                               len(tree_features(target)))
    return TargetModel(target=target, terms=tuple(terms), coef=coef, correction=trees)


@contextlib.contextmanager
def _folder_locked(folder: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``folder`` itself for the block, waited for: one writer of a fingerprint's files at a
    time, a second one's turn after the first's renames (seconds); readers hold it shared (:func:`reading`). No lock
    file is left; the kernel releases the lock of a process that dies."""
    fd = os.open(str(folder), os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):  # a file system without flock: written unlocked, as before
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # the lock goes with the descriptor


@contextlib.contextmanager
def reading(folder: str | Path) -> Iterator[None]:
    """Hold ``folder`` (a shared lock) while its fingerprint's files are read, so that a fit renaming its files
    meanwhile (models.npz first, metadata.json last) is not read half old, half new; a folder that cannot be opened
    (missing) is read unlocked, and its reader says what is missing."""
    try:
        fd = os.open(str(folder), os.O_RDONLY)
    except OSError:  # missing, or not ours to list
        yield
        return
    try:
        with contextlib.suppress(OSError):  # a file system without flock: read unlocked
            fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def save_models(out_dir: str | Path, models: dict[str, Model], metadata: dict[str, Any],
                held_out: dict[str, tuple[list[str], list[int], np.ndarray, np.ndarray]] | None = None) -> Path:
    """Write ``models`` (target -> model) and ``metadata`` to ``out_dir``; returns the folder.

    ``held_out``: target -> (networks, batch sizes, measured, out-of-fold predicted), one entry per
    training row, written to ``held_out.csv`` (an older file is removed when there is none)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    model_meta: dict[str, Any] = {}
    for target, m in models.items():
        if isinstance(m, MeanModel):  # each member under its own prefix: latency.0.coef, latency.0.trees...
            model_meta[target] = {"members": [_store_model(f"{target}.{k}", one, arrays)
                                              for k, one in enumerate(m.members)], "families": list(m.families),
                                  "gemm_split": m.gemm_split}
        else:
            model_meta[target] = _store_model(target, m, arrays)
    meta = dict(metadata)
    meta["models"] = model_meta
    meta["files"] = [METADATA_FILE, MODELS_FILE] + ([HELD_OUT_FILE] if held_out else [])
    # every file written beside its final name first, under names of this writer's own (two fits of one device at
    # once), then all renamed at once, innermost first (metadata last): an interrupt or a full disk while writing
    # leaves the previous fingerprint whole and no half-written file beside it; the folder locked meanwhile, so
    # that another fit's renames cannot fall between these (its models.npz beside this one's metadata.json)
    with _folder_locked(out), atomic_path(out / METADATA_FILE) as tmp_meta, \
            atomic_path(out / MODELS_FILE, ".tmp.npz") as tmp_models, \
            (atomic_path(out / HELD_OUT_FILE) if held_out else contextlib.nullcontext()) as tmp_held:
        np.savez_compressed(tmp_models, **arrays)
        if held_out:
            _write_held_out(tmp_held, held_out)
        tmp_meta.write_text(json.dumps(meta, indent=2, sort_keys=False))
        if not held_out:  # every file written: an older fit's is not this one's
            (out / HELD_OUT_FILE).unlink(missing_ok=True)
    return out


def load_models(folder: str | Path) -> tuple[dict[str, Model], dict[str, Any]]:
    """Read a fingerprint folder; ``UserError`` if it is missing or damaged."""
    d = Path(folder)
    mpath, npath = d / METADATA_FILE, d / MODELS_FILE
    if not mpath.is_file() or not npath.is_file():
        try:
            inside = sorted(sub.name for sub in d.iterdir() if (sub / METADATA_FILE).is_file()) if d.is_dir() else []
        except OSError:  # a folder that cannot be listed: said as before
            inside = []
        if inside:  # the fingerprint stage's folder, one fingerprint per device below it
            raise UserError(f"{d}: no fingerprint here, but in its device folders: give one of them, e.g. "
                            f"{d / inside[0]} (devices: {', '.join(inside)})")
        raise UserError(f"{d}: no fingerprint here (need {METADATA_FILE} and {MODELS_FILE}; run the fingerprint stage)")
    try:
        with reading(d):  # not between a fit's renames
            meta = json.loads(mpath.read_text())
            arrays = np.load(npath, allow_pickle=False)
        models: dict[str, Model] = {}
        with arrays:
            for target, entry in meta["models"].items():
                if "members" in entry and not entry["members"]:  # its mean was NaN
                    raise ValueError(f"models.{target}.members is empty")
                if "members" in entry:
                    models[target] = MeanModel(target, [_load_model(target, f"{target}.{k}", one, arrays)
                                                        for k, one in enumerate(entry["members"])],
                                               tuple(str(f) for f in entry.get("families", ())),
                                               bool(entry.get("gemm_split", False)))  # since 2026-11-26
                else:
                    models[target] = _load_model(target, target, entry, arrays)
    except (KeyError, ValueError, TypeError, AttributeError, IndexError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise damaged(d, exc) from None
    return models, meta


def check_metadata(meta: Any, feature_set: str | None = None) -> None:
    """``ValueError`` naming the first field a predictor reads from ``meta`` (a fingerprint's or a GNN's
    metadata) that does not have the form the fit writes; ``feature_set``: the one a trees fingerprint needs."""
    if not isinstance(meta, dict):
        raise ValueError(f"metadata is a {type(meta).__name__}, not an object")
    if feature_set is not None and meta.get("feature_set") != feature_set:
        raise ValueError(f"feature_set is {meta.get('feature_set')!r}; this version computes {feature_set!r}")
    if not isinstance(meta.get("device", ""), str):
        raise ValueError("device is not a string")
    shape = meta.get("input_shape")
    if shape is not None and not _is_shape(shape):
        raise ValueError(f"input_shape {shape!r} is not [C, H, W]")
    shapes = meta.get("input_shapes")
    if shapes is not None and not (isinstance(shapes, list) and all(_is_shape(s) for s in shapes)):
        raise ValueError(f"input_shapes {shapes!r} is not a list of [C, H, W]")
    cap = meta.get("capacity_mb")
    if cap is not None and not (isinstance(cap, (int, float)) and not isinstance(cap, bool)
                                and math.isfinite(cap) and cap > 0):
        raise ValueError(f"capacity_mb {cap!r} is not a positive number (or null: unknown)")
    StepRuntime.from_metadata(meta)  # the rules of the rows' torch: a ValueError naming one of another form
    replay = meta.get("memory_replay", next(iter(REPLAY_PROTOCOLS)))  # the first query's replay refused another
    if replay not in REPLAY_PROTOCOLS:
        raise ValueError(f"memory_replay {replay!r} is not one of {', '.join(REPLAY_PROTOCOLS)}")
    if meta.get("capacity_basis", "prediction") not in CAPACITY_BASES:  # another word was read as "prediction"
        raise ValueError(f"capacity_basis {meta['capacity_basis']!r} is not one of {', '.join(CAPACITY_BASES)}")
    if feature_set is not None:  # a trees fingerprint's table (a GNN's holds one per predictor)
        _check_accuracy(meta.get("accuracy", {}))
        _check_tree_features(meta)
    else:
        _check_gnn_accuracy(meta.get("accuracy", {}))
    _check_domain(meta.get("training_domain"))
    interval = meta.get("interval")
    quantiles = interval.get("log_ratio_quantiles") if isinstance(interval, dict) else None
    if not isinstance(quantiles, dict):
        raise ValueError("interval.log_ratio_quantiles is missing")
    coverage = interval.get("coverage", 0.9)  # the band's nominal coverage, which the table prints
    if not (_is_number(coverage) and 0 < coverage < 1):
        raise ValueError(f"interval.coverage is {coverage!r}, not a fraction between 0 and 1")
    missing = [t for t in ("latency", "memory") if t not in quantiles]
    if feature_set is not None and missing:  # a trees fingerprint's band of each target (else read as [0, 0])
        raise ValueError(f"interval.log_ratio_quantiles has no band for {' and '.join(missing)}")
    seen = interval.get("log_ratio_quantiles_seen", {})  # fingerprints since 2026-11-25
    if not isinstance(seen, dict):
        raise ValueError("interval.log_ratio_quantiles_seen is not an object")
    families = meta.get("training_families", [])
    if not (isinstance(families, list) and all(isinstance(f, str) for f in families)):
        raise ValueError("training_families is not a list of names")
    structures = meta.get("training_structures", {})  # fingerprints since 2026-11-25
    if not (isinstance(structures, dict) and all(isinstance(v, list) and all(isinstance(k, str) for k in v)
                                                 for v in structures.values())):
        raise ValueError("training_structures is not an object of lists of structure keys")
    if not isinstance(meta.get("structure_version", 0), int):
        raise ValueError("structure_version is not an integer")
    for key, band in _bands(quantiles) + [(f"seen.{k}", b) for k, b in _bands(seen)]:
        # an end of inf made a figure of Infinity in --json's lines (not JSON); a finite end whose exp overflows
        # is a real fit's too (a GNN fitted on 4 rows: about 838): it loads, and a query it makes inf is refused
        # then (predict._check_finite)
        if not (isinstance(band, list) and len(band) == 2 and all(_is_number(v) for v in band)
                and band[0] <= band[1]):
            raise ValueError(f"interval band '{key}' is {band!r}, not [low, high] (logs of finite ratios)")


#: What a fingerprint's capacity is compared with (``fit.capacity_basis``).
CAPACITY_BASES = ("prediction", "analytic")


def _check_tree_features(meta: dict[str, Any]) -> None:
    """``ValueError`` where a trees fingerprint's trees were fitted on other inputs than this version's
    (``tree_features_by_target``, or before it ``tree_features`` for both targets): they read the columns by their
    place, so a feature added in between, or reordered, would be read as another without a word. Inputs appended
    since (the step time's ``lt_work_per_launch``) are not read by older trees."""
    stored = meta.get("tree_features_by_target")
    if stored is None and "tree_features" in meta:
        stored = {t: meta["tree_features"] for t in ("latency", "memory")}
    for target, names in (stored or {}).items():
        now = list(tree_features(target))
        if not (isinstance(names, list) and names == now[:len(names)]):
            raise ValueError(f"the {target} trees read {names!r}; this version computes {now!r}")


#: The figures of an accuracy table's row (``evaluate.metrics``): rows held out, and percents.
_METRICS = ("n", "mape", "rmspe", "within10")


def _check_accuracy(accuracy: Any) -> None:
    """``ValueError`` naming the first part of a trees fingerprint's ``accuracy`` (per target: ``overall`` and the
    splits' rows of figures, ``per_group`` an object of such rows) that has not the form the fit writes. Compare
    and the fingerprint stage's table read them at once: an ``overall`` edited to null ended compare in a
    traceback."""
    if not isinstance(accuracy, dict) or not all(isinstance(acc, dict) for acc in accuracy.values()):
        raise ValueError("accuracy is not an object of the targets' tables")
    for target, acc in accuracy.items():
        groups = acc.get("per_group", {})
        if not isinstance(groups, dict):
            raise ValueError(f"accuracy.{target}.per_group is not an object")
        rows = [("overall", acc.get("overall", {}))] + [(f"per_group.{g}", m) for g, m in groups.items()]
        rows += [(key, acc[key]) for key in ("random_split", "network_split", "network_split_seen")
                 if acc.get(key) is not None]
        for name, row in rows:  # the table prints every figure of a row
            if not (isinstance(row, dict) and all(_is_figure(row.get(k)) for k in _METRICS)):
                raise ValueError(f"accuracy.{target}.{name} is {row!r}, not an object of figures "
                                 f"({', '.join(_METRICS)})")
        for key in ("column", "grouping"):  # the table's head names them
            if not isinstance(acc.get(key), str):
                raise ValueError(f"accuracy.{target}.{key} is {acc.get(key)!r}, not a name")
        for key in ("interval_coverage_held_out", "interval_seen_coverage_held_out"):  # the table's percents
            _check_percent(acc.get(key), f"accuracy.{target}.{key}")
        forms = acc.get("forms_per_fold", {})
        if not (isinstance(forms, dict) and all(isinstance(f, str) for f in forms.values())):
            raise ValueError(f"accuracy.{target}.forms_per_fold is {forms!r}, not an object of form names")
        selection = acc.get("selection")
        if selection is not None and not (isinstance(selection, dict) and isinstance(selection.get("chosen"), str)):
            raise ValueError(f"accuracy.{target}.selection does not name the form chosen")
        _check_selection(selection or {}, f"accuracy.{target}.selection")


def _check_selection(selection: dict[str, Any], where: str) -> None:
    """``ValueError`` where a stored model choice's parts the table reads have another form: its ``terms`` (null,
    or a list of feature names) and its grouped-CV scores (``cv_mean_group_mape``: form name -> MAPE percent)."""
    terms = selection.get("terms")
    if terms is not None and not (isinstance(terms, list) and all(isinstance(t, str) for t in terms)):
        raise ValueError(f"{where}.terms is {terms!r}, not a list of feature names (or null)")
    scores = selection.get("cv_mean_group_mape", {})
    if not isinstance(scores, dict):
        raise ValueError(f"{where}.cv_mean_group_mape is {scores!r}, not an object of MAPE figures")
    for form, score in scores.items():
        if not _is_figure(score):
            raise ValueError(f"{where}.cv_mean_group_mape's '{form}' is {score!r}, not a MAPE figure")


def _check_percent(value: Any, where: str) -> None:
    """``ValueError`` naming ``where`` unless ``value``, a held-out coverage the tables print, is a percent figure or
    null (not tested)."""
    if value is not None and not _is_figure(value):
        raise ValueError(f"{where} is {value!r}, not a percent (or null: not tested)")


def _check_gnn_accuracy(accuracy: Any) -> None:
    """``ValueError`` naming the first part of a GNN's ``accuracy`` (per target, each predictor's ``overall`` and
    ``per_group`` rows and its held-out coverage; ``trees_source`` an object) that has not the form the fit writes:
    the fingerprint stage's table (``gnn_accuracy_lines``) prints each figure, and a string ended it in a traceback."""
    if not isinstance(accuracy, dict) or not isinstance(accuracy.get("trees_source", {}), dict):
        raise ValueError("accuracy is not an object of the targets' tables")
    for target in ("latency", "memory"):
        entry = accuracy.get(target)
        if not entry:  # the table leaves it out
            continue
        for kind in ("gnn", "trees", "ensemble"):
            table = entry.get(kind) if isinstance(entry, dict) else None
            groups = table.get("per_group") if isinstance(table, dict) else None
            if not isinstance(groups, dict):
                raise ValueError(f"accuracy.{target}.{kind} is not an object with overall and per_group rows")
            rows = [("overall", table.get("overall"))] + [(f"per_group.{g}", m) for g, m in groups.items()]
            for name, row in rows:  # the table prints each row's MAPE
                if not (isinstance(row, dict) and _is_figure(row.get("mape", math.nan))):
                    raise ValueError(f"accuracy.{target}.{kind}.{name} is {row!r}, not an object of figures")
            key = "interval_coverage_held_out"
            _check_percent(table.get(key), f"accuracy.{target}.{kind}.{key}")


def _is_figure(value: Any) -> bool:
    """Whether ``value`` is an int or a float (NaN included: a row held out of nothing), not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_shape(shape: Any) -> bool:
    """Whether ``shape`` is ``[C, H, W]``: a list of three positive integers."""
    return isinstance(shape, list) and len(shape) == 3 and all(isinstance(v, int) and v > 0 for v in shape)


def _check_domain(domain: Any) -> None:
    """``ValueError`` naming the first part of a stored ``training_domain`` (``domain.training_domain``: ``ranges``
    of [low, high], ``traits`` of lists of true and false, ``ops`` of names) that has not the form the fit writes;
    none where it is absent (older fingerprints). Read at each query, a part of another form ended it in a
    traceback, or gave notes read off a string's letters."""
    if domain is None:
        return
    if not isinstance(domain, dict):
        raise ValueError("training_domain is not an object")
    ranges, traits, ops = domain.get("ranges", {}), domain.get("traits", {}), domain.get("ops", [])
    if not isinstance(ranges, dict) or not isinstance(traits, dict):
        raise ValueError("training_domain.ranges or .traits is not an object")
    for key, span in ranges.items():
        if not (isinstance(span, list) and len(span) == 2 and all(_is_number(v) for v in span)):
            raise ValueError(f"training_domain.ranges.{key} is {span!r}, not [low, high]")
    for key, seen in traits.items():
        if not (isinstance(seen, list) and seen and all(isinstance(v, bool) for v in seen)):
            raise ValueError(f"training_domain.traits.{key} is {seen!r}, not a list of true and false")
    if not (isinstance(ops, list) and all(isinstance(op, str) for op in ops)):
        raise ValueError(f"training_domain.ops is {ops!r}, not a list of op names")


def _is_number(value: Any) -> bool:
    """Whether ``value`` is a finite int or float (a bool is not)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _bands(quantiles: dict[str, Any]) -> list[tuple[str, Any]]:
    """(name, [low, high]) of a trees fingerprint's ``{target: band}`` or a GNN's ``{predictor: {target: band}}``."""
    out: list[tuple[str, Any]] = []
    for key, value in quantiles.items():
        out += [(f"{key}.{t}", b) for t, b in value.items()] if isinstance(value, dict) else [(key, value)]
    return out


def damaged(folder: str | Path, exc: BaseException) -> UserError:
    """The one-line error for a fingerprint folder whose files cannot be used as they are."""
    return UserError(f"{folder}: fingerprint files are damaged or from an incompatible version "
                     f"({type(exc).__name__}: {str(exc)[:200]}); run the fingerprint stage again")


def load_held_out(folder: str | Path) -> HeldOut:
    """The out-of-fold predictions stored beside a fingerprint; empty when there are none or the
    file cannot be read (they are a cache: the compare stage recomputes what it does not find)."""
    path = Path(folder) / HELD_OUT_FILE
    out: HeldOut = {}
    try:
        with path.open(newline="") as fh:
            for r in csv.DictReader(fh):
                key = (r["network"], int(r["batch_size"]), float(r["measured"]))
                out.setdefault(r["target"], {})[key] = float(r["predicted"])
    except (OSError, KeyError, ValueError, TypeError, UnicodeDecodeError, csv.Error):
        return {}
    return out


def stored_predictions(table: dict[tuple[str, int, float], float], rows: list[dict[str, Any]],
                       column: str) -> np.ndarray | None:
    """The stored out-of-fold predictions of ``rows`` (in their order; ``table`` is one target's part of
    :func:`load_held_out`, ``column`` the measured figure), or None unless the fit was on exactly these
    rows: rows measured, changed or left out since the fit change its folds."""
    keys = [(str(r["network"]), batch_size_of(r), float(r[column])) for r in rows]
    if not table or set(keys) != set(table):
        return None
    return np.array([table[k] for k in keys])
