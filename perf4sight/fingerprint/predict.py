"""Load a fingerprint and predict training-step latency (ms) and memory (MiB) for networks.

Prediction needs only the description: pure numpy features and array trees take a few
milliseconds per network, and many queries in one call share a single vectorised pass. When the
memory model uses the caching-allocator replay (``simulate_memory``), a network not seen before is
first traced on the meta device (about 0.5-2 s at 224x224, cached per description) and every
(network, batch size) is one replay (a few ms). ``fits``
compares the predicted memory with the device capacity stored in the fingerprint (a configured
limit, compared with the prediction; or learnt from ``oom`` rows, compared with the memory model's
analytic part, the demand, as a configured limit is too where the memory form saturates:
``capacity_basis``); when the capacity is unknown ``fits`` is None (null in JSON): not known.
"""
from __future__ import annotations

import copy
import math
import numbers
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from perf4sight.errors import UserError
from perf4sight.features.aggregate import (FEATURE_NAMES, BeyondReplay, NetworkFeatures, feature_matrix,
                                          network_features)
from perf4sight.features.alloc_trace import ensure_simulation  # here, not at the first prediction (~9 ms)
from perf4sight.features.allocator import REPLAY_PROTOCOLS, STEP_MEAN
from perf4sight.features.frozen import frozen_of
from perf4sight.features.optimizers import DEFAULT_OPTIMIZER
from perf4sight.features.step_runtime import StepRuntime
from perf4sight.fingerprint.families import known_families
from perf4sight.fingerprint.select import RULE_KEPT
from perf4sight.fingerprint.storage import (FEATURE_SET, HeldOut, check_metadata, damaged, load_held_out, load_models,
                                            reading)
from perf4sight.fingerprint.trees import MeanModel, Model
from perf4sight.ir.schema import (FROZEN_LAYERS, FROZEN_PARAMETERS, STRUCTURE_VERSION, NetworkDescription,
                                  load_description)
from perf4sight.ir.shapes import shape_text
from perf4sight.profiling.plan import MAX_BATCH_SIZE
from perf4sight.wording import named, plural

__all__ = ["Fingerprint", "load_fingerprint", "PREDICTION_KEYS", "accuracy_lines", "for_optimizer",
           "for_loss"]

PREDICTION_KEYS = ("network", "batch_size", "latency_ms", "latency_ms_low", "latency_ms_high",
                   "memory_mb", "memory_mb_low", "memory_mb_high", "fits")


def _batch_size(v: Any) -> int:
    """One batch size as an int: an int or numpy integer, or a whole float (``8.0`` -> 8);
    ``UserError`` for a string, a bool, a fraction or anything else (the check for >= 1 is the caller's)."""
    if isinstance(v, np.ndarray) and v.ndim == 0:
        v = v.item()
    if isinstance(v, (bool, np.bool_)):
        raise UserError(f"predict: batch size {v!r} is a bool, not an integer")
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        if not np.isfinite(v) or v != int(v):
            raise UserError(f"predict: batch size {float(v)!r} is not a whole number")
        return int(v)
    if isinstance(v, (str, bytes)):
        raise UserError(f"predict: batch size {v!r} is a string; give an int or a list of ints (e.g. 16 or [8, 16])")
    raise UserError(f"predict: batch size {v!r} ({type(v).__name__}) is not an integer")


#: how far :meth:`Fingerprint.max_batch_size` searches unless told (predict's ``--max-batch-size`` default, compare's)
BATCH_SEARCH_LIMIT = 1024
#: the batch sizes a search without an allocator replay predicts one by one (far above any training row's), and how
#: many at a time
EXACT_SCAN, SCAN_CHUNK = 1 << 16, 1 << 13


def batch_list(batch_sizes: int | Sequence[int]) -> list[int]:
    """``batch_sizes`` (an int, or an iterable of ints; numpy integers and whole floats too) as a list of
    ints; ``UserError`` for strings, bools, fractions, values below 1 or no batch size at all."""
    if isinstance(batch_sizes, Mapping):
        raise UserError(f"predict: batch sizes as a {type(batch_sizes).__name__}; give an int or a list of ints "
                        "(e.g. 16 or [8, 16])")
    if isinstance(batch_sizes, (str, bytes)) or not np.iterable(batch_sizes):
        bss = [_batch_size(batch_sizes)]
    else:
        bss = [_batch_size(b) for b in batch_sizes]
    if not bss:
        raise UserError("predict: no batch sizes given; give an int or a list of ints (e.g. 16 or [8, 16])")
    if any(b < 1 for b in bss):
        raise UserError(f"predict: batch sizes must be positive integers, got {bss}")
    if max(bss) > MAX_BATCH_SIZE:
        raise UserError(f"predict: batch size {max(bss)} is above {MAX_BATCH_SIZE:,} (sizes in bytes would overflow)")
    return bss


def as_descriptions(descs: Any, kinds: tuple[type, ...] = (NetworkDescription, NetworkFeatures),
                    caller: str = "predict") -> list[Any]:
    """``descs`` as a list of ``kinds``: one description (or a list of them); a ``str`` or ``Path`` is read
    as a description file (:func:`~perf4sight.ir.schema.load_description`). ``UserError`` naming the type
    of anything else, or when no network is given. ``caller``: the method asked (its name begins a module's error
    line, which says how to give it one: predict_module, or a description made with ``describe``)."""
    torch = sys.modules.get("torch")  # a module is not a description (nn.Sequential is even iterable)
    if torch is not None and isinstance(descs, torch.nn.Module):
        if caller != "predict":  # predict_module predicts; it answers neither a largest batch nor the domain's notes
            raise UserError(f"{caller}: got a torch module ({type(descs).__name__}); give its description: "
                            "perf4sight.ir.from_torch.describe(module, input_shape, name)")
        raise UserError(f"predict: got a torch module ({type(descs).__name__}); use "
                        "predict_module(module, input_shape, batch_sizes)")
    one = isinstance(descs, (*kinds, str, Path, Mapping)) or not np.iterable(descs)
    items = [descs] if one else list(descs)
    if not items:
        raise UserError("predict: no networks given")
    out = []
    for i, d in enumerate(items):
        if isinstance(d, (str, Path)):
            if isinstance(d, str) and d.isidentifier() and not Path(d).exists():  # 'resnet18': a zoo name?
                from perf4sight.networks.zoo import ZOO_NAMES  # torchvision's builders, named without torch

                import_name = f"torchvision.models.{d}()" if d in ZOO_NAMES else "the network's module"
                raise UserError(f"predict: '{d}' is not a description file; give the description .json file, or "
                                f"the module to predict_module({import_name}, input_shape, batch_sizes)")
            if isinstance(d, str) and d.rpartition(":")[0].endswith(".py"):  # the command line's FILE.py:FUNCTION
                raise UserError(f"predict: '{d}' names a function in a Python file, which the command line reads; "
                                "here call it and give the module to predict_module(module, input_shape, batch_sizes)")
            d = load_description(d)
        if not isinstance(d, kinds):
            where = "" if one else f" (item {i})"
            raise UserError(f"predict: expected a {' or '.join(k.__name__ for k in kinds)}, a description file path "
                            f"(str or Path) or a list of them, got {type(d).__name__}{where}")
        if isinstance(d, NetworkDescription) and d.params == 0:  # backward has nothing to compute gradients of
            raise UserError(f"{d.name}: has no parameters, so no training step to predict (nothing to learn)")
        out.append(d)
    return out


def one_description(desc: Any) -> Any:
    """One network as :func:`as_descriptions` reads it; ``UserError`` for a list of several."""
    out = as_descriptions(desc, caller="max_batch_size")
    if len(out) != 1:
        raise UserError(f"max_batch_size: give one network, got {len(out)}")
    return out[0]


def search_limit(limit: Any) -> int:
    """``max_batch_size``'s ``limit`` as an int >= 1; ``UserError`` naming the argument otherwise."""
    try:
        (value,) = batch_list(limit)
    except (UserError, ValueError):
        if isinstance(limit, numbers.Real) and float(limit).is_integer() and limit > MAX_BATCH_SIZE:  # too large
            raise UserError(f"max_batch_size: limit {limit!r} is above {MAX_BATCH_SIZE:,}, the largest batch size "
                            "predicted (sizes in bytes would overflow)") from None
        raise UserError(f"max_batch_size: limit must be one positive integer (the largest batch size to try), "
                        f"got {limit!r}") from None
    return value


def largest_fitting(over: Callable[[int], bool], limit: int,
                    over_many: Callable[[np.ndarray], np.ndarray] | None = None) -> int:
    """Largest b <= ``limit`` with ``over(b)`` false for every batch size 1..b; 0 when ``over(1)``. Found by
    bisection, ``over`` taken as growing with b, then checked one by one over the sizes just below the boundary
    found (:func:`settle_window`), where it need not: an allocator replay's reserved memory steps up and down as
    the batch grows (squeezenet_50 on the TX2 data: fits at 204 and 206, not at 205 or 207). Each call of ``over``
    is one prediction: about log2(limit) of them, and the window's (one call of ``over_many``, ``over`` of an array
    of sizes, where given). A batch size whose step is beyond the allocator replay (:class:`BeyondReplay`, more than
    256 TiB) is over."""
    asked: dict[int, bool] = {}

    def beyond(b: int) -> bool:
        if b not in asked:
            try:
                asked[b] = bool(over(b))
            except BeyondReplay:
                asked[b] = True
        return asked[b]

    if not beyond(limit):
        top = int(limit)
    else:
        lo, hi = 1, limit  # first batch size predicted not to fit
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if beyond(mid) else (mid + 1, hi)
        top = int(lo - 1)
    while top >= 1:  # a size below the boundary that does not fit moves it down, and its window is checked again
        window = settle_window(top)
        first = -1 if over_many is None else _first_over(over_many, window)
        if first == -1:  # no over_many, or a size of the window beyond the allocator replay: one by one
            first = next((b for b in window if beyond(b)), None)
        if first is None:
            return top
        top = first - 1
    return 0


def _first_over(over_many: Callable[[np.ndarray], np.ndarray], window: range) -> int | None:
    """The first size of ``window`` that ``over_many`` (``over`` of an array of sizes) finds over, asked a few
    thousand sizes a call (:data:`SCAN_CHUNK`: a GNN's graphs, a feature matrix's rows); None where none is, -1 where
    a size is beyond the allocator replay (:class:`BeyondReplay`)."""
    for start in range(window.start, window.stop, SCAN_CHUNK):
        try:
            flags = np.asarray(over_many(np.arange(start, min(start + SCAN_CHUNK, window.stop))), dtype=bool)
        except BeyondReplay:
            return -1
        if flags.any():
            return int(start + np.argmax(flags))
    return None


def settle_window(top: int) -> range:
    """The batch sizes just below ``top`` (and ``top``) that :func:`largest_fitting` checks one by one: the last
    6%, at least 8."""
    return range(max(1, top - max(8, top // 16)), top + 1)


def prediction_rows(names: Sequence[str], bss: Sequence[int], lat: np.ndarray, mem: np.ndarray,
                    bands: dict[str, Sequence[float]], fits: Sequence[bool | None],
                    seen_bands: dict[str, Sequence[float]] | None = None,
                    seen: Sequence[bool] | None = None) -> list[dict[str, Any]]:
    """One :data:`PREDICTION_KEYS` dict per (network, batch size), network-major: ``lat`` (ms) and
    ``mem`` (MiB) with their bands (``[low, high]`` of log(measured / predicted) per target); ``fits`` is
    None where the device's capacity is unknown. ``seen_bands``: the bands for the rows ``seen`` marks (a
    query of a family the training rows had), per target where there is one."""
    out: list[dict[str, Any]] = []
    for i, (name, b) in enumerate((n, b) for n in names for b in bss):
        own = seen_bands if seen is not None and seen[i] and seen_bands else {}
        (llo, lhi), (mlo, mhi) = (own.get(t) or bands.get(t, (0.0, 0.0)) for t in ("latency", "memory"))
        out.append({"network": name, "batch_size": int(b),
                    "latency_ms": float(lat[i]), "latency_ms_low": float(lat[i] * np.exp(llo)),
                    "latency_ms_high": float(lat[i] * np.exp(lhi)),
                    "memory_mb": float(mem[i]), "memory_mb_low": float(mem[i] * np.exp(mlo)),
                    "memory_mb_high": float(mem[i] * np.exp(mhi)),
                    "fits": None if fits[i] is None else bool(fits[i])})
        _check_finite(out[-1])
    return out


def _check_finite(row: dict[str, Any]) -> None:
    """``UserError`` where a prediction's figure is not a finite number, which --json printed as ``Infinity`` or
    ``NaN`` (not JSON): a predictor whose stored numbers were edited (coefficients of 1e308), or an interval band
    wider than a float holds (a GNN fitted on a handful of rows, whose out-of-fold errors had no bound)."""
    bad = [k for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        raise UserError(f"predict: {row['network']} at batch size {row['batch_size']}: the predictor gave "
                        f"{', '.join(f'{k} {row[k]}' for k in bad)}, not finite numbers: its fingerprint's files "
                        "were edited or damaged, or its interval is unbounded (a fit on too few rows); run the "
                        "fingerprint stage again, on more rows, or use another --predictor")


def parameter_notes(descs: Sequence[NetworkDescription]) -> list[str]:
    """A line for the descriptions whose module held parameters that no layer of its forward reads (``describe``
    counts them as ``unused_params``): left out of the description and so of the prediction, though their weights
    sit on the device; and one for those that held frozen ones (``frozen_params``): the prediction leaves those its
    description names (``frozen_layers``, ``frozen_parameters``) untrained, from a fingerprint fitted on networks
    trained whole (an extrapolation), and trains those of an older description that names none."""
    lines = []
    unused = _counted(descs, "unused_params", lambda n: f" ({n * 4 / 2 ** 20:.0f} MiB as fp32)")
    if unused:
        lines.append(f"parameters that no layer of the forward reads are left out of the description, and so of the "
                     f"prediction: {named(unused)}; their weights still take device memory (without gradients or "
                     "optimiser state)")
    named_frozen = [d for d in descs if d.extra.get(FROZEN_LAYERS) or d.extra.get(FROZEN_PARAMETERS)]
    frozen = _counted(named_frozen, "frozen_params")
    older = [d for d in descs if all(d is not n for n in named_frozen)]
    if frozen:
        lines.append(f"frozen parameters (requires_grad False): {named(frozen)}; the prediction trains the others "
                     "alone (no gradients, optimiser state or weight-gradient work for these, no backward below the "
                     "first trained layer; its step time of the forms that count the step's kernels), but the "
                     "fingerprint learnt from networks trained whole: expect larger errors")
    unnamed = _counted(older, "frozen_params")
    if unnamed:
        lines.append(f"frozen parameters (requires_grad False): {named(unnamed)}; the description names none of them "
                     "(frozen_layers, frozen_parameters: written before), so the prediction is of a step that trains "
                     "them too (their gradients, optimiser state and backward work included)")
    return lines


def _counted(descs: Sequence[NetworkDescription], key: str, more: Callable[[int], str] = lambda n: "") -> list[str]:
    """"name 1.23 M" ("name 224" under ten thousand), and ``more``, for each description whose extra ``key`` is a count
    above 0 (a description file may hold anything there)."""
    counts = {d.name: d.extra.get(key) for d in descs}
    return [f"{name} {f'{n / 1e6:.2f} M' if n >= 10_000 else f'{n:,}'}{more(n)}" for name, n in counts.items()
            if isinstance(n, int) and not isinstance(n, bool) and n > 0]


class ModuleQueries:
    """``predict_module`` and ``max_batch_size`` for any predictor that has ``predict(descriptions,
    batch_sizes)``, ``input_shape`` (the ``[C, H, W]`` it was trained at, or None) and ``capacity_mb``."""

    input_shape: list[int] | None = None
    capacity_mb: float | None = None
    # the rules of the step the queries' features are of: the training rows' torch, with their optimiser or another
    # (for_optimizer)
    runtime: StepRuntime = StepRuntime()

    @property
    def optimizer(self) -> str:
        """The optimiser whose step the queries' features are of (``fitted_optimizer``, or another's)."""
        return self.runtime.optimizer

    @property
    def loss(self) -> str:
        """The loss whose step the queries' features are of (``fitted_loss``, or another's: :func:`for_loss`)."""
        return self.runtime.loss

    @property
    def input_shapes(self) -> list[list[int]]:
        """Every ``[C, H, W]`` its training networks were described at, ``input_shape`` first; [] when unknown (a
        fingerprint stored before 2026-11-26 names ``input_shape`` alone)."""
        stored = getattr(self, "metadata", {}).get("input_shapes")
        return [list(s) for s in stored] if stored else ([list(self.input_shape)] if self.input_shape else [])

    def at_training_shape(self, net: NetworkDescription | NetworkFeatures) -> bool:
        """Whether ``net`` (a description, or its features) is described at one of :attr:`input_shapes` (True where
        either is unknown)."""
        shape = getattr(net.description if isinstance(net, NetworkFeatures) else net, "input_shape", None)
        return not self.input_shapes or shape is None or list(shape) in self.input_shapes

    def shape_line(self, descs: Sequence[NetworkDescription | NetworkFeatures]) -> str:
        """One line naming the networks of ``descs`` (descriptions or their features; the first 5, sorted) described at
        none of :attr:`input_shapes`, e.g. ``mine described at another input shape than this fingerprint's training
        networks (3x224x224)``; '' where every one is at a training shape. ``--stage predict`` notes it (with
        "expect larger errors"); :meth:`outside_training` returns it among its lines."""
        other = sorted({d.name for d in descs if not self.at_training_shape(d)})
        if not other:
            return ""
        return (f"{', '.join(other[:5])}{' ...' if len(other) > 5 else ''} described at another input shape than this "
                f"fingerprint's training networks ({' or '.join(map(shape_text, self.input_shapes))})")

    def predict_module(self, module: Any, input_shape: Sequence[int], batch_sizes: int | Sequence[int],
                       name: str | None = None) -> list[dict[str, Any]]:
        """Predict for a torch ``nn.Module`` at ``input_shape`` (``[C, H, W]`` of one image, no batch),
        traced with :func:`perf4sight.ir.from_torch.describe`; ``name`` is the ``network`` of the returned
        dicts (default: the module's class name). Warns (``UserWarning``) when ``input_shape`` is not the one the
        predictor was trained at."""
        from perf4sight.ir.from_torch import describe
        bss = batch_list(batch_sizes)  # checked before describing (up to seconds)
        if name is not None and not isinstance(name, str):  # the ``network`` of each row: text, as a file's name
            raise UserError(f"predict_module: name {name!r} ({type(name).__name__}) is not a str; give a str, or "
                            "None for the module's class name")
        desc = describe(module, input_shape=input_shape, name=name or type(module).__name__)
        if not self.at_training_shape(desc):  # its predictions are extrapolations
            shape, train = shape_text(desc.input_shape), " or ".join(shape_text(s) for s in self.input_shapes)
            warnings.warn(f"{desc.name}: described at input shape {shape}, but this fingerprint's training networks "
                          f"were {train}: expect larger errors", UserWarning, stacklevel=2)
        for line in parameter_notes([desc]):  # what --stage predict notes of such a module
            warnings.warn(line, UserWarning, stacklevel=2)
        if 1 in bss and desc.untrainable_at_batch_one:  # as --stage predict notes it: 'fits' answers memory alone
            warnings.warn(f"{desc.name}: a training step at batch 1 fails, whatever the memory: a batch norm over a "
                          "1x1 map has one value per channel (torch refuses it in training); its batch 1 prediction is "
                          "of a step that cannot run", UserWarning, stacklevel=2)
        return self.predict(desc, bss)

    def max_batch_size(self, desc: Any, limit: int = BATCH_SEARCH_LIMIT) -> int | None:
        """Largest batch size b <= ``limit`` with every batch size 1..b predicted to fit (``fits`` of
        :meth:`predict`); 0 if none fits; None when the device capacity is unknown. Predicted memory is
        taken as growing with the batch size, and checked one by one just below the boundary found
        (:func:`largest_fitting`)."""
        d, limit = one_description(desc), search_limit(limit)
        if self.capacity_mb is None:
            return None
        return largest_fitting(lambda b: not self.predict(d, [b])[0]["fits"], limit,  # the window in one call
                               lambda sizes: np.array([not p["fits"] for p in self.predict(d, sizes.tolist())]))


class Fingerprint(ModuleQueries):
    """A device's fitted latency and memory models plus their metadata."""

    def __init__(self, models: dict[str, Model], metadata: dict[str, Any], held_out: HeldOut | None = None):
        self.models = models
        self.metadata = metadata
        # target -> (network, batch size, measured) -> out-of-fold prediction of the fingerprint stage
        self.held_out: HeldOut = held_out or {}
        self.device: str = metadata.get("device", "")
        self.input_shape: list[int] | None = metadata.get("input_shape")  # [C, H, W] it was trained at
        cap = metadata.get("capacity_mb")
        self.capacity_mb: float | None = None if cap is None else float(cap)
        # what ``capacity_mb`` is compared with: the full prediction, or the memory model's analytic part
        # (a learnt capacity: the demand that keeps growing where measured memory saturates)
        self.capacity_basis: str = str(metadata.get("capacity_basis", "prediction"))
        # how the allocator replay reads memory: as the training rows' profiler did (older fingerprints: step_mean)
        self.memory_replay: str = str(metadata.get("memory_replay", STEP_MEAN))
        # the rules of the training rows' torch (older fingerprints: the rules of before, step_runtime.py); the
        # queries' features are of its step (another optimiser's: for_optimizer)
        self.runtime = StepRuntime.from_metadata(metadata)
        self.fitted_optimizer: str = self.runtime.optimizer
        self.fitted_loss: str = self.runtime.loss
        q = metadata.get("interval", {}).get("log_ratio_quantiles", {})
        self._bands = {t: (float(q.get(t, [0, 0])[0]), float(q.get(t, [0, 0])[1])) for t in ("latency", "memory")}
        # a query of a training family: its own band (fingerprints since 2026-11-25; none: the band above)
        seen = metadata.get("interval", {}).get("log_ratio_quantiles_seen", {})
        self._seen_bands = {t: (float(seen[t][0]), float(seen[t][1])) for t in ("latency", "memory") if t in seen}
        self.training_families: frozenset[str] = frozenset(str(f) for f in metadata.get("training_families", []))
        # the layer structures of each training family, where keyed by today's recipe (fingerprints since
        # 2026-11-25; none: by the name alone)
        self._training_structures: dict[str, list[str]] | None = (
            metadata.get("training_structures") if metadata.get("structure_version") == STRUCTURE_VERSION else None)

    def _features(self, desc: NetworkDescription | NetworkFeatures) -> NetworkFeatures:
        """``desc``'s features for a step run under :attr:`runtime` (the training rows' own rules, with another
        optimiser by :func:`for_optimizer`); features of another step are computed again from their description."""
        if isinstance(desc, NetworkFeatures) and desc.runtime != self.runtime and desc.description is not None:
            desc = desc.description
        nf = desc if isinstance(desc, NetworkFeatures) else network_features(desc, self.runtime)
        if nf.runtime != self.runtime:
            raise UserError(f"predict: the features of '{nf.name}' are for a step with {nf.runtime}, the predictions "
                            f"for one with {self.runtime}, and carry no description to compute them again")
        if nf.unsupported:
            raise UserError(f"predict: network '{nf.name}' has ops without a cost formula: {', '.join(nf.unsupported)}")
        return nf

    def features(self, descs: NetworkDescription | str | Path | Sequence[NetworkDescription | str | Path]
                 ) -> list[NetworkFeatures]:
        """Each network's features for a step under :attr:`runtime`, which :meth:`predict`, :meth:`outside_training`
        and :meth:`max_batch_size` take in place of its description: a caller asking several of them computes them
        once (a large network's take 10-20 ms; ``--stage predict`` computed them twice)."""
        return [self._features(d) for d in as_descriptions(descs)]

    def _simulate_if_needed(self, nfs: list[NetworkFeatures]) -> None:
        """Attach the allocator replay (traced once per network, cached) when the memory model uses it."""
        ensure_simulation(nfs, self.models["memory"].terms, self.memory_replay)

    def _demand(self, F: np.ndarray, families: list[str], mem: np.ndarray | None = None) -> np.ndarray:
        """Memory figure (MiB) compared with ``capacity_mb`` for feature rows ``F`` of networks of ``families``
        (``training_family_of``, one per row): the analytic part, or the memory :meth:`predict` gives (``mem``, where
        it was computed already)."""
        model = self.models["memory"]
        if self.capacity_basis == "analytic":
            return model.demand(F)
        return model.predict(F, model.trees_for(families)) if mem is None else mem

    def predict(self, descs: NetworkDescription | str | Path | Sequence[NetworkDescription | str | Path],
                batch_sizes: int | Sequence[int]) -> list[dict[str, Any]]:
        """One dict per (network, batch size) with keys :data:`PREDICTION_KEYS` (ms, MiB, bool). ``descs``:
        descriptions (or their features), description file paths, or one of them; ``batch_sizes``: an int
        or a list of ints."""
        bss = batch_list(batch_sizes)
        nfs = [self._features(d) for d in as_descriptions(descs)]
        self._simulate_if_needed(nfs)
        F = feature_matrix([nf for nf in nfs for _ in bss], [b for _ in nfs for b in bss])  # one pass for all queries
        families = [f for f in self.training_family_of(nfs) for _ in bss]
        frozen = np.array([bool(nf.description is not None and frozen_of(nf.description)) for nf in nfs for _ in bss])
        latency, memory = self.models["latency"], self.models["memory"]
        frozen_rows = (frozen,) if isinstance(latency, MeanModel) else ()  # of the forms that see its backward
        lat = latency.predict(F, latency.trees_for(families), *frozen_rows)
        mem = memory.predict(F, memory.trees_for(families))
        demand = self._demand(F, families, mem)
        fits = [None if self.capacity_mb is None else d <= self.capacity_mb for d in demand]
        # the narrower band of a family seen holds at the shapes it was seen at; at another, the band of a family never
        # seen (the queries are extrapolations either way; the trees of a family seen still apply)
        shaped = [s for s in map(self.at_training_shape, nfs) for _ in bss]
        seen = [f != "" and s for f, s in zip(families, shaped)]
        return prediction_rows([nf.name for nf in nfs], bss, lat, mem, self._bands, fits, self._seen_bands, seen)

    @property
    def seen_band_targets(self) -> tuple[str, ...]:
        """The targets (``latency``, ``memory``) for which the fit stored a band of a family seen: a query of a
        training family gets it at a shape of its rows; a target without one gets a family never seen's band
        (``select.seen_family_band`` stores none where no level held its coverage)."""
        return tuple(t for t in ("latency", "memory") if t in self._seen_bands)

    def training_family_of(self, descs: Sequence[NetworkDescription | NetworkFeatures]) -> list[str]:
        """Each network's family where it is one this fingerprint was trained on, else "": its name among the
        training families and its layer structure one of that family's training networks' (:mod:`families`).
        ``descs``: descriptions or their features (each has a family and a structure)."""
        families = [d.family for d in descs]
        if self._training_structures is None:
            return [f if f in self.training_families else "" for f in families]
        known = self._training_structures  # a structure (every layer as JSON, hashed) read for a known family alone
        return known_families(families, [d.structure if f in known else "" for d, f in zip(descs, families)], known)

    def outside_training(self, descs: NetworkDescription | str | Path | Sequence[NetworkDescription | str | Path],
                         batch_sizes: int | Sequence[int]) -> list[str]:
        """One line per way these queries leave what the training rows covered (an input shape none of them was
        described at, :meth:`shape_line`; a batch size or a size outside their range, a kind of layer none of them
        had or all of them had): those predictions are extrapolations. Only the input shape's line for a
        fingerprint fitted before the domain was stored."""
        from perf4sight.fingerprint.domain import query_notes
        bss = batch_list(batch_sizes)
        nets = [self._features(d) for d in as_descriptions(descs, caller="outside_training")]
        return list(filter(None, [self.shape_line(nets)])) + query_notes(self.metadata.get("training_domain"), nets,
                                                                         bss)

    def max_batch_size(self, desc: NetworkDescription | NetworkFeatures | str | Path,
                       limit: int = BATCH_SEARCH_LIMIT) -> int | None:
        """Largest batch size b <= ``limit`` with every batch size 1..b predicted to fit; 0 if none
        fits; None when the device capacity is unknown. Predicted memory (the analytic part for a
        learnt capacity) is taken as growing with the batch size, and checked one by one just below the
        boundary found where an allocator replay makes it (:func:`largest_fitting`)."""
        d, limit = one_description(desc), search_limit(limit)
        if self.capacity_mb is None:
            return None
        nf = self._features(d)  # once: predict below takes them too
        found = self._largest_fitting(nf, limit)
        self.predict(nf, [found or 1])  # the figures there checked as predict's are: an edited fingerprint's inf
        return found                    # (or NaN) compared with the capacity read as "none fits" (or as all)

    def _largest_fitting(self, nf: NetworkFeatures, limit: int) -> int:
        """:meth:`max_batch_size` of ``nf`` up to ``limit`` under a known capacity, its figures unchecked. Without an
        allocator replay every batch size up to :data:`EXACT_SCAN` is predicted, :data:`SCAN_CHUNK` at a time
        (all of 1..limit at once took 1.4 GiB and 10 s at a limit of a million, and ended in a MemoryError at ten
        million); above it, far past any training row's batch, the trees are flat in the batch size and the
        prediction grows with it: bisected there as a replay's is."""
        self._simulate_if_needed([nf])
        family = self.training_family_of([nf])  # the memory predict() gives: a family seen gets its trees

        def over(sizes: Any) -> np.ndarray:
            return self._demand(feature_matrix(nf, sizes), family * len(sizes)) > self.capacity_mb

        if nf.sim is not None:  # each batch size is an allocator replay: bisect instead of scanning 1..limit
            return largest_fitting(lambda b: bool(over([b])[0]), limit)
        for start in range(1, min(limit, EXACT_SCAN) + 1, SCAN_CHUNK):
            sizes = np.arange(start, min(start + SCAN_CHUNK - 1, limit, EXACT_SCAN) + 1)
            above = np.nonzero(over(sizes))[0]
            if above.size:
                return int(sizes[above[0]] - 1)
        if limit <= EXACT_SCAN:
            return int(limit)
        return EXACT_SCAN + largest_fitting(lambda k: bool(over([EXACT_SCAN + k])[0]), limit - EXACT_SCAN,
                                            lambda ks: over(EXACT_SCAN + ks))


def for_optimizer(predictor: Any, optimizer: str) -> Any:
    """A shallow copy of ``predictor`` (a trees fingerprint, a GNN or their ensemble) whose queries get the
    features of a training step with ``optimizer`` (``features.optimizers``): its models, fitted on another
    optimiser's rows, read that step's state and update passes. An estimate no row measured (bench_optimizers.py
    measures how far it goes); ``fitted_optimizer`` keeps the rows' own."""
    return _for_step(predictor, "for_optimizer", lambda runtime: runtime.with_optimizer(
        optimizer.lower() if isinstance(optimizer, str) else optimizer))


def for_loss(predictor: Any, loss: str) -> Any:
    """A shallow copy of ``predictor`` (a trees fingerprint, a GNN or their ensemble) whose queries get the features
    of a training step with ``loss`` (``profiling.plan.LOSSES``; ``formulas.output_loss``): its models, fitted on
    another loss's rows, read that step's loss passes and bytes. An estimate no row measured; ``fitted_loss`` keeps
    the rows' own."""
    return _for_step(predictor, "for_loss", lambda runtime: runtime.with_loss(
        loss.lower() if isinstance(loss, str) else loss))


def _for_step(predictor: Any, caller: str, change: Any) -> Any:
    """A shallow copy of ``predictor`` whose ``runtime`` is ``change(runtime)``, and so each of an ensemble's
    predictors; a ``ValueError`` of ``change`` (an unknown optimiser or loss, naming the known ones) is a
    ``UserError`` of ``caller``."""
    new = copy.copy(predictor)
    try:
        new.runtime = change(predictor.runtime)
    except ValueError as exc:
        raise UserError(f"{caller}: {exc}") from None
    for part in ("trees", "gnn"):  # an ensemble's predictors
        if getattr(new, part, None) is not None:
            setattr(new, part, _for_step(getattr(new, part), caller, change))
    return new


def load_fingerprint(folder: str | Path) -> Fingerprint:
    """Load ``<fingerprint_dir>/<device>/`` (JSON + npz, no pickle)."""
    with reading(folder):  # not between a fit's renames
        models, meta = load_models(folder)
        held_out = load_held_out(folder)
    for t in ("latency", "memory"):
        if t not in models:
            raise UserError(f"{folder}: fingerprint lacks the {t} model")
    try:
        check_metadata(meta, FEATURE_SET)
        fp = Fingerprint(models, meta, held_out)
        for t in ("latency", "memory"):  # terms this version computes, one coefficient each
            models[t].analytic(np.ones((1, len(FEATURE_NAMES))))
    except (TypeError, ValueError, AttributeError, IndexError) as exc:
        raise damaged(folder, exc) from None
    return fp


#: The accuracy table's row for ``random_split`` (``select.random_split_metrics``).
RANDOM_SPLIT = "random 5-fold split"
#: The accuracy table's row for ``network_split`` (``select.network_split``).
NETWORK_SPLIT = "networks held out, 5 folds"
#: ... and its part ``network_split_seen``: the held-out networks whose family had another network in training.
NETWORK_SPLIT_SEEN = "  of a family in training"


def _why_chosen(sel: dict[str, Any]) -> str:
    """Why grouped CV chose ``sel["chosen"]`` (a model selection of the metadata), in brackets: the device kind's
    preferred form kept within one standard error (or whatever the scores, as its ``rule`` says), or its CV score
    beside the runner-up's ('' without scores)."""
    scores, chosen = sel.get("cv_mean_group_mape", {}), sel["chosen"]
    if sel.get("preferred") == chosen and scores and scores.get(chosen, 0) > min(scores.values()):
        best = min(scores, key=scores.get)
        why = "whatever the scores" if sel.get("rule") == RULE_KEPT else "within one standard error"
        return (f" (this device kind's preferred form: {scores[chosen]:.1f}% against {best}'s "
                f"{scores[best]:.1f}%, kept {why})")
    if chosen in scores and len(scores) > 1:  # a near tie is a choice the trees' seed can flip
        runner_up = min((n for n in scores if n != chosen), key=scores.get)
        return f" (CV {scores[chosen]:.1f}%; runner-up {runner_up} {scores[runner_up]:.1f}%)"
    return ""


def accuracy_lines(metadata: dict[str, Any]) -> list[str]:
    """Human-readable accuracy table of a fingerprint's metadata (for the stage to print), after the training
    step it is of."""
    try:
        step = StepRuntime.from_metadata(metadata).label()
    except ValueError:  # metadata check_metadata refuses; only the Python API gets here with it
        step = str(metadata.get("optimizer", DEFAULT_OPTIMIZER))
    lines = [f"training step: {step} (the optimiser of its rows)"]
    for target, acc in metadata.get("accuracy", {}).items():
        head = f"{target} ({acc['column']}), leave-one-{acc['grouping']}-out"
        if acc.get("nested"):
            head += f", model form chosen without the held-out {acc['grouping']}"
        elif acc.get("nested") is False and len(acc.get("per_group", {})) > 2:  # too many groups to nest
            head += ", model form chosen on these same folds (a little optimistic)"
        if acc.get("note"):
            head += f" [{acc['note']}]"
        lines.append(head)
        rows = list(acc["per_group"].items()) + [("all", acc["overall"])]
        if acc.get("random_split") and acc["random_split"].get("n"):
            rows.append((RANDOM_SPLIT, acc["random_split"]))
        if acc.get("network_split") and acc["network_split"].get("n"):  # fingerprints since 2026-11-25
            rows.append((NETWORK_SPLIT, acc["network_split"]))
            if (acc.get("network_split_seen") or {}).get("n"):
                rows.append((NETWORK_SPLIT_SEEN, acc["network_split_seen"]))
        w = max([24] + [len(g) + 2 for g, _ in rows])  # generated families have long names
        lines.append(f"  {'held out':<{w}}{'n':>6}{'MAPE%':>8}{'RMSPE%':>8}{'±10%':>8}")
        for g, m in rows:
            lines.append(f"  {g:<{w}}{m['n']:>6}{m['mape']:>8.1f}{m['rmspe']:>8.1f}{m['within10']:>8.1f}")
        if acc.get("random_split") and not acc["random_split"].get("n"):
            lines.append(f"  {RANDOM_SPLIT:<{w}}  not run: fewer than 10 rows")
        sel = acc.get("selection")
        if sel:
            chosen, n_groups = sel["chosen"], len(acc.get("per_group", {}))
            if n_groups < 3:
                groups = plural(n_groups, acc["grouping"], "families" if acc["grouping"] == "family" else "")
                lines.append(f"  model form kept: {chosen} (with {groups} there is too little to choose a form by "
                             "grouped CV: it needs 3 or more)")
            else:
                lines.append(f"  model chosen by grouped CV: {chosen}{_why_chosen(sel)}")
            for g, form in acc.get("forms_per_fold", {}).items():
                if form != chosen:
                    lines.append(f"    without {g} the CV chose: {form}")
            if "sim_reserved_mb" in (sel.get("terms") or ()) and metadata.get("memory_replay") in REPLAY_PROTOCOLS:
                lines.append(f"  allocator replay: {REPLAY_PROTOCOLS[metadata['memory_replay']]}")
    iv = metadata.get("interval", {})
    for target, (lo, hi) in iv.get("log_ratio_quantiles", {}).items():
        acc = metadata.get("accuracy", {}).get(target, {})
        held = acc.get("interval_coverage_held_out")
        tested = (f"; covers {held:.0f}% of a held-out {acc.get('grouping', 'group')}'s rows" if held is not None
                  else f"; not tested on a held-out {acc['grouping']}: that needs 3 or more"
                  if acc.get("grouping") and len(acc.get("per_group", {})) < 3 else "")
        lines.append(f"{target} {100 * iv.get('coverage', 0.9):.0f}% interval: x{np.exp(lo):.2f} .. x{np.exp(hi):.2f} "
                     "of the prediction" + tested)
        held = acc.get("interval_seen_coverage_held_out")
        if target in iv.get("log_ratio_quantiles_seen", {}):
            slo, shi = iv["log_ratio_quantiles_seen"][target]
            lines.append(f"  for a network of a training family: x{np.exp(slo):.2f} .. x{np.exp(shi):.2f}"
                         + (f"; covers {held:.0f}% of a held-out network's rows" if held is not None else ""))
        elif held is not None:  # no band of its own held its coverage (select.seen_family_band)
            lines.append(f"  for a network of a training family: this band too (one of their own, at its widest, "
                         f"covered only {held:.0f}% of a held-out network's rows)")
    if metadata.get("drift_reference"):
        from perf4sight.fingerprint.drift import drift_line
        lines.append(drift_line(metadata["drift_reference"]))
    if metadata.get("training_domain"):
        from perf4sight.fingerprint.domain import domain_line
        lines.append(domain_line(metadata["training_domain"]))
    if "capacity_mb" in metadata:
        cap = metadata["capacity_mb"]
        scale = (" of the memory model's demand, a threshold, not the device's size"
                 if cap is not None and metadata.get("capacity_basis") == "analytic" else "")
        lines.append(f"memory capacity: {'unknown' if cap is None else f'{cap:.0f} MiB'}{scale} "
                     f"({metadata.get('capacity_source', '')})")
    return lines
