"""Fit a device fingerprint from tidy measurement rows and network descriptions.

Targets: latency = ``latency_ms_median`` (ms); memory = ``peak_rss_mb`` for the ``cpu`` backend,
``device_mem_used_mb`` (MiB) for GPU, Jetson and imported data. Fitted on ``ok`` rows; ``oom``
rows teach the device's memory capacity (a threshold on the memory model's analytic part, which
keeps growing where measured memory saturates near the limit). Each target's model form is chosen
among a few candidates by leave-one-family-out CV (leave-one-network-out when the data holds a
single family; see ``select.py``); the chosen form's out-of-fold predictions calibrate the prediction
interval (group-conformal on the log-ratio residuals). The accuracy table is nested where there are at
most ``NESTED_MAX_GROUPS`` groups: each held-out group's form is chosen again on the other groups alone
(``select.nested_cv``), so the table is what a new family would see; with more groups it is the chosen
form's own cross-validation (a little optimistic). Accuracy on random 5-fold row splits is stored beside it.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import platform
import re
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from perf4sight.errors import UserError
from perf4sight.features.aggregate import FEATURE_NAMES, NetworkFeatures, feature_matrix, network_features
from perf4sight.features.allocator import PERF4SIGHT, RUN_PEAK
from perf4sight.features.optimizers import DEFAULT_OPTIMIZER, adds_decay
from perf4sight.features.priced_ops import prices_key, prices_table
from perf4sight.features.step_runtime import CPU_MASK_BYTES, CUDA_MASK_BYTES, StepRuntime
from perf4sight.fingerprint.domain import training_domain
from perf4sight.fingerprint.evaluate import choose_groups, metrics, row_family
from perf4sight.fingerprint.families import structures_by_family
from perf4sight.fingerprint.fit_inputs import INPUTS_KEY, inputs_sha256
from perf4sight.fingerprint.select import (PREFERRED, can_nest, describe_choice, fit_form, group_conformal,
                                           held_out_coverage, nested_cv, network_split,
                                           random_split_metrics, seen_family_band, select_candidate)
from perf4sight.fingerprint.storage import FEATURE_SET, save_models
from perf4sight.fingerprint.trees import CEILING, MODELS, TREE_FEATURES, Model, tree_features
from perf4sight.importers.perf4sight_csv import PROTOCOL as PERF4SIGHT_ROWS
from perf4sight.importers.perf4sight_csv import UPDATE as PERF4SIGHT_UPDATE
from perf4sight.ir.schema import STRUCTURE_VERSION, NetworkDescription
from perf4sight.profiling.plan import DEFAULT_LOSS, OPTIMIZERS, phase_optimizer, recorded_update, training_phase
from perf4sight.profiling.results import batch_size_of, loss_of, number, phase_of
from perf4sight.wording import plural

__all__ = ["fit_fingerprint", "fit_inputs_sha256", "memory_column", "memory_replay", "step_runtime", "relu6_clone",
           "rows_optimizer", "rows_update", "rows_loss", "torch_at_least", "ran_on_cpu", "native_conv_dispatch",
           "hold_native_conv",
           "device_kind", "choice_rule", "memory_capacity", "capacity_basis", "records",
           "software_versions", "input_shape_metadata", "training_data_sha256", "LATENCY_COLUMN", "FEATURE_SET"]

LATENCY_COLUMN = "latency_ms_median"


def memory_column(rows: list[dict[str, Any]]) -> str:
    """The memory target for these rows: ``peak_rss_mb`` (cpu) or ``device_mem_used_mb`` (others)."""
    backends = {str(r.get("backend", "")) for r in rows}
    if backends == {"cpu"}:
        return "peak_rss_mb"
    if "cpu" in backends:
        raise UserError(f"fingerprint: rows mix the cpu backend with {sorted(backends - {'cpu'})}; "
                        "fit one device (one backend) at a time")
    return "device_mem_used_mb"


def memory_replay(rows: list[dict[str, Any]]) -> str:
    """How the allocator replay reads memory for these rows (``features/allocator.py``, REPLAY_PROTOCOLS):
    ``perf4sight`` where every row comes from perf4sight's profiler (imported), else ``run_peak`` (this
    tool's profiler: the peak over the warm-up and timed steps)."""
    if rows and all(str(r.get("protocol", "")) == PERF4SIGHT_ROWS for r in rows):
        return PERF4SIGHT
    return RUN_PEAK


def torch_at_least(rows: list[dict[str, Any]], version: tuple[int, int]) -> bool:
    """Whether these rows' steps ran on torch ``version`` (major, minor) or newer: every row that names its
    ``torch_version`` names such a one, and some row does (imported perf4sight data names none)."""
    versions = [str(r.get("torch_version") or "") for r in rows]
    parsed = [tuple(int(p) for p in re.findall(r"\d+", v)[:2]) for v in versions if re.match(r"\d+\.\d+", v)]
    return bool(parsed) and all(v >= version for v in parsed)


def relu6_clone(rows: list[dict[str, Any]]) -> bool:
    """Whether these rows' steps ran on a torch whose in-place ReLU6 keeps a clone of its input (1.10 and
    newer; pytorch/pytorch#95432). Rows naming no torch (imported perf4sight data, whose TX2 runs kept the result)
    keep the old rule."""
    return torch_at_least(rows, (1, 10))


#: cuBLAS's workspace per handle on torch >= 2.0 (``CUBLAS_WORKSPACE_CONFIG``'s default, ``:4096:2:16:8``: 8 MiB and
#: 128 KiB), 32 MiB on a Hopper GPU (compute capability 9: ``parseChosenWorkspaceSize`` in torch's
#: CublasHandlePool.cpp; measured on an H200, torch 2.11); cuBLASLt's, 1 MiB, kept per handle from torch 2.8
#: (pytorch/pytorch#156495; before, allocated for each call and freed at once).
CUBLAS_WORKSPACE, CUBLAS_WORKSPACE_HOPPER, CUBLASLT_WORKSPACE = 4096 * 1024 * 2 + 16 * 1024 * 8, 32 << 20, 1 << 20
#: GPU names of compute capability 9 (Hopper), as ``torch.cuda.get_device_name`` and the rows' ``device_model`` give
_HOPPER = re.compile(r"\bG?H(100|200|800|20)\b")


def blas_workspace(rows: list[dict[str, Any]]) -> tuple[int, int]:
    """The bytes of cuBLAS's workspace per handle and of cuBLASLt's that the torch of these rows allocated through its
    caching allocator and kept (``StepRuntime.blas_workspace``): (0, 0) but for rows of a GPU (no cpu backend, no
    imported rows) on torch >= 2.0 (pytorch/pytorch#95668: 1.13 left it to cuBLAS); the Hopper size where every row
    names such a GPU (``device_model``), cuBLASLt's on torch >= 2.8."""
    if not rows or any(str(r.get("backend")) in ("cpu", "imported") for r in rows) or not torch_at_least(rows, (2, 0)):
        return 0, 0
    hopper = all(_HOPPER.search(str(r.get("device_model") or "")) for r in rows)
    return (CUBLAS_WORKSPACE_HOPPER if hopper else CUBLAS_WORKSPACE,
            CUBLASLT_WORKSPACE if torch_at_least(rows, (2, 8)) else 0)


def rows_update(rows: list[dict[str, Any]], optimizer: str) -> tuple[bool, bool, bool]:
    """(momentum, weight decay, decoupled decay) of these rows' update: whether SGD kept a momentum buffer, whether
    SGD or Adam added an L2 weight-decay term, and whether AdamW's in-place decay ran (``features/optimizers.py``;
    true for the others), from their ``momentum`` and ``weight_decay`` cells.
    An empty cell reads what its profiler ran then: perf4sight's recipe for an imported row (momentum 0.9, weight
    decay 5e-4), this tool's defaults for its own (``profiling.plan.recorded_update``). ``UserError`` where the rows
    differ in either."""
    seen: dict[tuple[bool, bool, bool], str] = {}
    for r in rows:
        cells = (PERF4SIGHT_UPDATE if str(r.get("protocol", "")) == PERF4SIGHT_ROWS
                 and not (r.get("momentum") or r.get("weight_decay")) else recorded_update(r, optimizer))
        decayed = float(cells["weight_decay"]) > 0
        key = (optimizer != "sgd" or float(cells["momentum"]) > 0, adds_decay(optimizer, decayed),
               optimizer != "adamw" or decayed)
        seen.setdefault(key, f"momentum {cells['momentum'] or '-'}, weight decay {cells['weight_decay']}")
    if len(seen) > 1:
        raise UserError(f"fingerprint: rows of several updates ({'; '.join(sorted(seen.values()))}): momentum and "
                        "weight decay change what the step keeps and runs; fit the rows of one (profile them again "
                        "with one [profile] momentum and weight_decay)")
    return next(iter(seen)) if seen else (True, optimizer == "sgd", True)


def rows_optimizer(rows: list[dict[str, Any]]) -> str:
    """The optimiser of these rows' training step, from their ``phase`` (``profiling.plan.training_phase``;
    an empty phase is SGD's ``train``). ``UserError`` where they mix optimisers or hold another phase."""
    phases = sorted({phase_of(r) for r in rows})
    optimizers = [phase_optimizer(p) for p in phases]
    if None in optimizers:
        raise UserError(f"fingerprint: rows of phase {phases[optimizers.index(None)]!r}: a fingerprint is of a "
                        f"training step ({', '.join(training_phase(o) for o in OPTIMIZERS)})")
    if len(phases) > 1:
        raise UserError(f"fingerprint: rows of several optimisers ({', '.join(str(o) for o in optimizers)}); fit "
                        "the rows of one at a time")
    return str(optimizers[0]) if optimizers else DEFAULT_OPTIMIZER


def rows_loss(rows: list[dict[str, Any]]) -> str:
    """The loss of these rows' training step (their ``loss`` cells; an empty one is a cross entropy's).
    ``UserError`` where they mix losses."""
    losses = sorted({loss_of(r) for r in rows})
    if len(losses) > 1:
        raise UserError(f"fingerprint: rows of several losses ({', '.join(losses)}); fit the rows of one at a time")
    return losses[0] if losses else DEFAULT_LOSS


def ran_on_cpu(rows: list[dict[str, Any]]) -> bool:
    """Whether these rows' steps ran on a CPU (the ``cpu`` backend, every row): there the optimiser updates one
    parameter at a time, where a GPU's torch >= 2.0 updates all at once (``foreach``; the allocator replay writes
    Adam's scratch and a weight decay's down either way), and a dropout keeps the float noise it multiplied by, where
    CUDA's fused kernel keeps a one-byte mask."""
    return bool(rows) and all(str(r.get("backend")) == "cpu" for r in rows)


def native_conv_dispatch(rows: list[dict[str, Any]]) -> bool:
    """Whether these rows' steps ran where torch sends small-batch 1x1 convolutions outside oneDNN: the cpu
    backend on one thread (``native_conv_macs`` in features/aggregate.py)."""
    return bool(rows) and all(str(r.get("backend")) == "cpu" and number(r.get("threads")) == 1 for r in rows)


def step_runtime(rows: list[dict[str, Any]]) -> StepRuntime:
    """The rules of the torch that ran these rows' training step (``features/step_runtime.py``), read from the rows:
    their optimiser and its momentum and weight decay, their loss, their torch's ReLU6, a CPU's update and dropout
    mask or a GPU's (whose update is ``foreach`` from torch 2.0 on, with cuBLAS's workspaces: :func:`blas_workspace`),
    the CPU's 1x1 dispatch, and the gradients freed
    by each step's ``zero_grad`` (this tool's profiler; imported rows keep the rule of perf4sight's, which zeroed
    them); the update counted kernel by kernel as torch runs it."""
    on_cpu, optimizer = ran_on_cpu(rows), rows_optimizer(rows)
    momentum, decay, decoupled = rows_update(rows, optimizer)
    return StepRuntime(optimizer=optimizer, relu6_clone=relu6_clone(rows),
                       foreach=not on_cpu and torch_at_least(rows, (2, 0)),
                       dropout_mask_bytes=CPU_MASK_BYTES if on_cpu else CUDA_MASK_BYTES,
                       native_conv=native_conv_dispatch(rows), momentum=momentum, weight_decay=decay,
                       grads_to_none=bool(rows) and all(r.get("backend") != "imported" for r in rows),
                       update_as_run=True, loss=rows_loss(rows), decoupled_decay=decoupled,
                       blas_workspace=blas_workspace(rows))


def hold_native_conv(F: np.ndarray, runtime: StepRuntime) -> np.ndarray:
    """Feature rows ``F`` with ``native_conv_macs`` zeroed unless their rows ran under that dispatch rule
    (``runtime.native_conv``), so a fit on another device keeps the term's coefficient at 0 (in place; returns
    ``F``)."""
    if not runtime.native_conv:
        F[:, FEATURE_NAMES.index("native_conv_macs")] = 0.0
    return F


def device_kind(memory_col: str) -> str:
    """"cpu" for a cpu-backend device (its memory target is the process's peak RSS), else "gpu"."""
    return "cpu" if memory_col == "peak_rss_mb" else "gpu"


def choice_rule(target: str, memory_col: str) -> tuple[str, str | None]:
    """(device kind, preferred form or None) with which ``target``'s model form is chosen on a device whose
    memory target is ``memory_col`` (:func:`device_kind`, :data:`~perf4sight.fingerprint.select.PREFERRED`)."""
    kind = device_kind(memory_col)
    return kind, PREFERRED.get((target, kind))


def records(rows: Any) -> list[dict[str, Any]]:
    """Measurement rows as a list of plain dicts, from dicts or a pandas DataFrame (empty cells "")."""
    if hasattr(rows, "to_dict"):  # pandas DataFrame
        rows = rows.fillna("").to_dict("records")
    return [dict(r) for r in rows]


def _data_hash(rows: list[dict[str, Any]], cols: Iterable[str]) -> str:
    keep = sorted(json.dumps([str(r.get(c, "")) for c in cols]) for r in rows)
    return hashlib.sha256("\n".join(keep).encode()).hexdigest()


#: Every column of a row :func:`fit_fingerprint` reads but ``device`` (which selects the rows) and the memory column
#: (the device's, :func:`memory_column`): its targets, its folds (``family``) and the rules of the step it ran
#: (:func:`step_runtime`, :func:`memory_replay`).
FIT_COLUMNS = ("network", "batch_size", "status", LATENCY_COLUMN, "family", "backend", "threads", "protocol",
               "torch_version", "phase", "loss", "momentum", "weight_decay", "device_model")


def training_data_sha256(rows: Any, device: str, descriptions: dict[str, NetworkDescription],
                         memory_target: str) -> str:
    """The hash a fit stores as ``training_data_sha256``: of the rows it uses (``device``'s, of networks with one of
    ``descriptions``) by every column it reads (:data:`FIT_COLUMNS` and ``memory_target``, the memory column), in
    any order. (Fingerprints fitted when it hashed five of them differ from it: their rows read as changed.)"""
    usable = [r for r in records(rows) if str(r.get("device", device)) == device and str(r["network"]) in descriptions]
    return _data_hash(usable, (*FIT_COLUMNS, memory_target))


def software_versions() -> dict[str, str]:
    """The versions of Python and the libraries a trees fit computes with, and of perf4sight."""
    import scipy
    import sklearn

    import perf4sight
    return {"python": platform.python_version(), "numpy": np.__version__, "scipy": scipy.__version__,
            "scikit-learn": sklearn.__version__, "perf4sight": perf4sight.__version__}


def memory_capacity(limit_mb: float, n_oom: int,
                    predicted: Callable[[], tuple[np.ndarray, np.ndarray]]) -> tuple[float | None, str]:
    """Memory capacity (MiB) and where it came from: the configured limit, else the threshold on
    predicted memory that best separates ``ok`` (<=) from ``oom`` (>) rows, else unknown (None).

    ``predicted()`` returns the predicted memory of the ok rows and of the ``n_oom`` oom rows; it is
    called only when the threshold is learnt."""
    if limit_mb > 0:
        return float(limit_mb), "configured memory_limit_mb"
    if n_oom == 0:
        return None, "no oom rows and no memory_limit_mb"
    p_ok, p_oom = predicted()
    cands = np.unique(np.concatenate([p_ok, p_oom]))
    errs = [int(np.sum(p_ok > t) + np.sum(p_oom <= t)) for t in cands]  # fits <=> predicted <= t
    k = int(np.argmin(errs))
    return float(cands[k]), f"learned from {len(p_oom)} oom and {len(p_ok)} ok rows ({errs[k]} misclassified)"


def capacity_basis(capacity: float | None, memory_limit_mb: float, memory_model: Model) -> str:
    """What the capacity is compared with: the predicted memory ("prediction") for a configured limit, or
    the memory model's demand ("analytic": its linear sum, before a saturating form's ceiling) for a
    learnt capacity, and for any capacity when the memory form saturates, since a saturated prediction
    never reaches the device's limit however large the batch."""
    if capacity is None or (memory_limit_mb > 0 and CEILING not in memory_model.terms):
        return "prediction"
    return "analytic"


def training_input_shapes(descriptions: dict[str, NetworkDescription], names: Iterable[str]) -> list[list[int]]:
    """Every input shape the training networks ``names`` were described at, the one most share first (a tie: the
    shape of the first network by name, at ``[networks] input_shape`` where the networks stage made the others, whose
    names extend their network's: ``resnet18_l0`` before ``resnet18_l0_128x128``)."""
    shapes = Counter(tuple(descriptions[n].input_shape) for n in names)
    return [list(s) for s, _ in shapes.most_common()]


def input_shape_metadata(descriptions: dict[str, NetworkDescription], names: Iterable[str]) -> dict[str, Any]:
    """A fingerprint's ``input_shape`` (the one most training networks share: what a zoo name is described at for
    predict) and ``input_shapes`` (every one of them, that first)."""
    shapes = training_input_shapes(descriptions, names)
    return {"input_shape": shapes[0], "input_shapes": shapes}


def fit_inputs_sha256(rows: Any, descriptions: dict[str, NetworkDescription], device: str, fcfg: Any,
                      memory_limit_mb: float = 0.0, coverage: float = 0.9, nested: bool = True,
                      drift: dict[str, Any] | None = None, op_prices: dict[str, dict[int, float]] | None = None) -> str:
    """The hash of everything :func:`fit_fingerprint` reads from these arguments (``fit_inputs.inputs_sha256``),
    stored in its metadata: equal hashes, equal fingerprints."""
    recs = [r for r in records(rows) if str(r.get("device", device)) == device]
    trees = {k: v for k, v in vars(fcfg).items() if not k.startswith("gnn_") and k != "predictor"}  # not the GNN's
    settings = {"fingerprint": trees, "memory_limit_mb": float(memory_limit_mb), "coverage": coverage,
                "nested": nested, "drift": drift, "device": device}
    if op_prices:  # only where measured, so that the hashes of fits without prices stay as they were
        settings["op_prices"] = prices_table(prices_key(op_prices))
    return inputs_sha256("trees", recs, descriptions, settings, software_versions())


def fit_fingerprint(rows: Any, descriptions: dict[str, NetworkDescription], device: str,
                    out_dir: str | Path, fcfg: Any, memory_limit_mb: float = 0.0,
                    coverage: float = 0.9, nested: bool = True, drift: dict[str, Any] | None = None,
                    op_prices: dict[str, dict[int, float]] | None = None) -> dict[str, Any]:
    """Fit latency and memory models for ``device``, evaluate them, save to ``out_dir``.

    ``rows``: tidy measurement dicts or a DataFrame (other devices' rows are ignored);
    ``descriptions``: network name -> description; ``fcfg``: ``cfg.fingerprint``
    (model, n_estimators, min_samples_leaf, seed); ``memory_limit_mb``: the device's memory limit in MiB
    (0 = learn the capacity from ``oom`` rows); ``coverage``: the prediction interval's nominal coverage, a
    fraction; ``nested``: nest the accuracy table (``select.nested_cv``; False: the chosen form's own
    cross-validation, for callers that evaluate the fit themselves); ``drift``: the summary of a drift reference's
    correction of the rows' step times (``drift.normalise_step_times``), kept in the metadata; ``op_prices``: what the
    device charged per element for each kind of op between the convolutions (``priced_ops.check_prices``'s table of
    its profile's ``op_prices.json``; None: none measured, the ``priced_ops_ms`` term held at 0). Returns the metadata
    written to ``<out_dir>/metadata.json`` (accuracy under ``accuracy``).
    """
    model = str(getattr(fcfg, "model", "extra-trees"))
    if model not in MODELS:
        raise UserError(f"[fingerprint] model '{model}' is not one of {', '.join(MODELS)}")
    n_est, leaf, seed = int(fcfg.n_estimators), int(fcfg.min_samples_leaf), int(fcfg.seed)
    recs = [r for r in records(rows) if str(r.get("device", device)) == device]
    if not recs:
        raise UserError(f"fingerprint: no measurements for device '{device}'")
    mem_col = memory_column(recs)
    replay, runtime = memory_replay(recs), step_runtime(recs).with_op_prices(op_prices)
    missing = sorted({str(r["network"]) for r in recs if str(r["network"]) not in descriptions})
    usable = [r for r in recs if str(r["network"]) in descriptions]
    if not usable:
        raise UserError(f"fingerprint: no description found for any measured network of '{device}' "
                        f"(e.g. {', '.join(missing[:3])})")
    feats: dict[str, NetworkFeatures] = {}
    for name in sorted({str(r["network"]) for r in usable}):
        nf = network_features(descriptions[name], runtime)
        if nf.unsupported:
            raise UserError(f"fingerprint: network '{name}' has ops without a cost formula: "
                            f"{', '.join(nf.unsupported)}")
        if fcfg.simulate_memory:  # caching-allocator replay (features/alloc_trace.py)
            from perf4sight.features.alloc_trace import attach_simulation
            attach_simulation(nf, descriptions[name], replay)
        feats[name] = nf

    def matrix(rs: list[dict[str, Any]]) -> np.ndarray:
        if not rs:
            return np.zeros((0, len(FEATURE_NAMES)))
        return hold_native_conv(feature_matrix([feats[str(r["network"])] for r in rs], [batch_size_of(r) for r in rs]),
                                runtime)

    models: dict[str, Model] = {}
    accuracy: dict[str, Any] = {}
    intervals: dict[str, list[float]] = {}
    intervals_seen: dict[str, list[float] | None] = {}  # for a query of a training family (network split)
    training_structures: dict[str, set[str]] = {}  # family -> the layer structures of its training networks
    counts: dict[str, int] = {}
    held_out: dict[str, tuple[list[str], list[int], np.ndarray, np.ndarray]] = {}
    saturates = any(r.get("status") == "oom" for r in usable)  # some row reached the device's ceiling
    for target, col in (("latency", LATENCY_COLUMN), ("memory", mem_col)):
        rs = [r for r in usable if r.get("status") == "ok" and (number(r.get(col)) or 0) > 0]
        if len(rs) < 3:
            raise UserError(f"fingerprint: only {plural(len(rs), 'ok row')} with '{col}' for device '{device}' "
                            "(need >= 3)")
        F, y = matrix(rs), np.array([number(r[col]) for r in rs])
        fams = np.array([row_family(r, feats[str(r["network"])].family) for r in rs])
        nets = np.array([str(r["network"]) for r in rs])
        if len(set(nets.tolist())) < 2:  # nothing to hold out: no accuracy, and a zero-width interval
            raise UserError(f"fingerprint: device '{device}' has ok rows with '{col}' of one network only "
                            f"({nets[0]}); a fingerprint needs 2 or more, as its accuracy and intervals are "
                            "measured on networks held out of the fit: profile more networks")
        groups, grouping = choose_groups(fams, nets)
        kind, prefer = choice_rule(target, mem_col)
        cand, cv, scores = select_candidate(target, F, y, groups, grouping, model, n_est, leaf, seed, prefer=prefer,
                                            kind=kind, saturates=saturates)
        # a mean form's trees apply to a query of these families (the name a query's description gives)
        families = np.array([feats[n].family for n in nets.tolist()])
        structure_of = {n: feats[n].structure for n in set(nets.tolist())}  # a hash of the graph: once per network
        structures = np.array([structure_of[n] for n in nets.tolist()])
        models[target] = fit_form(target, cand, F, y, model, n_est, leaf, seed, families)
        log_ratio = np.log(y / cv.predictions)  # out-of-fold residuals: the band and its held-out check
        intervals[target] = group_conformal(log_ratio, groups, coverage)
        # the table: the form chosen again without each held-out group (nested), where that is affordable
        table, forms = cv, {}
        if nested and can_nest(groups):
            table, forms = nested_cv(target, F, y, groups, grouping, model, n_est, leaf, seed, prefer=prefer,
                                     kind=kind, saturates=saturates)
        split = network_split(target, cand, F, y, nets, families, structures, model, n_est, leaf, seed)
        intervals_seen[target], seen_coverage = seen_family_band(y, split, nets, coverage)
        for family, keys in structures_by_family(families, structures).items():
            training_structures.setdefault(family, set()).update(keys)
        accuracy[target] = {"column": col, "grouping": grouping, "overall": table.overall,
                            "per_group": table.per_group, "nested": bool(forms), "forms_per_fold": forms,
                            "random_split": random_split_metrics(target, cand, F, y, model, n_est, leaf, seed),
                            "network_split": split.metrics,
                            # of those, the networks whose family had another network in training
                            "network_split_seen": metrics(y[split.seen], split.predictions[split.seen]),
                            "selection": describe_choice(cand, scores, prefer),
                            "interval_coverage_held_out": held_out_coverage(log_ratio, groups, coverage),
                            "interval_seen_coverage_held_out": seen_coverage,
                            "note": "" if grouping == "family"
                            else "only one network family: folds hold out one network variant"}
        counts[target] = len(rs)
        held_out[target] = ([str(r["network"]) for r in rs], [batch_size_of(r) for r in rs], y,
                            table.predictions)
    oom_rows = [r for r in usable if r.get("status") == "oom"]
    ok_rows = [r for r in usable if r.get("status") == "ok"]
    F_ok = matrix(ok_rows)  # the capacity threshold and the training domain
    # the demand (the analytic sum, before a saturating form's ceiling) keeps growing where measured memory
    # levels off near the device limit (unified memory swaps), so a learnt threshold is on it: see ``capacity_basis``
    capacity, cap_source = memory_capacity(memory_limit_mb, len(oom_rows), lambda: (
        models["memory"].demand(F_ok), models["memory"].demand(matrix(oom_rows))))
    meta: dict[str, Any] = {
        "device": device,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "versions": software_versions(),
        "feature_set": FEATURE_SET,
        "feature_names": list(FEATURE_NAMES),
        "linear_terms": {k: list(m.terms) for k, m in models.items()},
        "tree_features": list(TREE_FEATURES),
        "tree_features_by_target": {t: list(tree_features(t)) for t in models},
        "model": {"model": model, "n_estimators": n_est, "min_samples_leaf": leaf, "seed": seed,
                  "form": "analytic(nnls, relative loss) * exp(trees on log residual); "
                          "terms/correction/leaf chosen per target by grouped CV (accuracy.<target>.selection)"},
        "targets": {"latency": {"column": LATENCY_COLUMN, "unit": "ms"}, "memory": {"column": mem_col, "unit": "MiB"}},
        "memory_target": mem_col,
        "memory_replay": replay,
        **runtime.metadata(),  # the rules of the rows' torch (step_runtime.py: its _METADATA_KEYS)
        "training_rows": counts,
        "drift_reference": drift,
        "oom_rows": len(oom_rows),
        "networks": sorted(feats),
        # the families of the training rows (a description's ``network``) and the layer structures of each: a query
        # of one with one of its structures gets the seen band (families.py)
        "training_families": sorted(training_structures),
        "training_structures": {f: sorted(keys) for f, keys in sorted(training_structures.items())},
        "structure_version": STRUCTURE_VERSION,
        **input_shape_metadata(descriptions, feats),
        # what the training rows covered: predict notes queries outside it (domain.py)
        "training_domain": training_domain(F_ok, [feats[n].description for n in sorted({str(r["network"])
                                                                                        for r in ok_rows})]),
        "networks_without_description": missing,
        "training_data_sha256": training_data_sha256(usable, device, descriptions, mem_col),
        INPUTS_KEY: fit_inputs_sha256(recs, descriptions, device, fcfg, memory_limit_mb, coverage, nested, drift,
                                      op_prices),
        "accuracy": accuracy,
        "interval": {"coverage": coverage, "log_ratio_quantiles": intervals,
                     "method": "group-conformal: widest of the pooled and per-group central quantiles of "
                               "out-of-fold log(measured/predicted)",
                     # a query of a training family: its own band, from the network split (select.seen_family_band)
                     "log_ratio_quantiles_seen": {t: b for t, b in intervals_seen.items() if b is not None},
                     "method_seen": "central quantiles of the out-of-fold log(measured/predicted) of networks "
                                    "held out (5 folds) whose family had another network in training, pooled, at "
                                    "the lowest level >= coverage that covers a held-out network's rows at coverage"},
        "capacity_mb": capacity,
        "capacity_source": cap_source,
        "capacity_basis": capacity_basis(capacity, memory_limit_mb, models["memory"]),
    }
    save_models(out_dir, models, meta, held_out)
    return meta
