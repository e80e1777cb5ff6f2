"""The fingerprint stage's entry points, in config terms: fit a device, load a device's fingerprint."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from perf4sight.config import Config
from perf4sight.dataset import current_rows, device_dataset, other_losses, other_phases, split_other_shapes
from perf4sight.errors import UserError
from perf4sight.features.priced_ops import load_op_prices
from perf4sight.fingerprint.drift import normalise_step_times
from perf4sight.fingerprint.fit import LATENCY_COLUMN, fit_fingerprint, fit_inputs_sha256, training_data_sha256
from perf4sight.fingerprint.fit_inputs import stored_if_current
from perf4sight.fingerprint.predict import Fingerprint, load_fingerprint
from perf4sight.fingerprint.storage import METADATA_FILE
from perf4sight.ir.schema import NetworkDescription
from perf4sight.profiling.plan import training_phase
from perf4sight.profiling.results import loss_of, op_prices_path, phase_of, read_rows, references_path, results_path
from perf4sight.wording import shell_word

__all__ = ["device_measurements", "drift_corrected", "fit_device", "fit_device_gnn", "load_device_fingerprint",
           "load_device_predictor", "fit_rows", "measurements_differ"]


def device_measurements(cfg: Config, device: str, shas: dict[str, str] | None = None, *,
                        rows: list[dict] | None = None) -> tuple[list[dict], float]:
    """``device``'s measured rows and its configured memory limit (MiB; 0 = none); ``UserError`` if none.
    Rows measured on an earlier version of a network's description are left out (``dataset.current_rows``;
    ``shas``: the device's ``dataset.description_shas`` when the caller has loaded them, else they are read).
    ``rows``: the device's current rows when the caller has read them (``dataset.device_dataset(...).rows``),
    else they are read; with none given or none current, the file is read to say why there are none."""
    if not rows:
        rows, stale = current_rows(cfg, device, shas)
        if stale and not rows:
            raise UserError(f"device '{device}': all {len(stale)} rows in {results_path(cfg.profiling_dir, device)} "
                            "were measured on earlier versions of their descriptions; profile them again")
        others = other_phases(cfg, device) if not rows else []
        if others:
            raise UserError(f"device '{device}' has no rows of a training step with {cfg.profile.optimizer} "
                            f"([profile] optimizer or --optimizer) in {results_path(cfg.profiling_dir, device)}, "
                            f"only with {' and '.join(others)}: set [profile] optimizer (or --optimizer) to fit those, "
                            "or profile it again")
        losses = other_losses(cfg, device) if not rows else []
        if losses:
            raise UserError(f"device '{device}' has no rows of a training step with loss {cfg.profile.loss} "
                            f"([profile] loss or --loss) in {results_path(cfg.profiling_dir, device)}, only with "
                            f"{' and '.join(losses)}: set [profile] loss (or --loss) to fit those, or profile it again")
        if not rows:
            raise UserError(f"no measurements for device '{device}' in {results_path(cfg.profiling_dir, device)}")
    limit = cfg.devices[device].memory_limit_mb if device in cfg.devices else 0
    return rows, float(limit or 0)


def fit_device(cfg: Config, device: str, descriptions: dict[str, NetworkDescription],
               shas: dict[str, str] | None = None, *, rows: list[dict] | None = None, refit: bool = True) -> dict:
    """Fit and store ``device``'s fingerprint from its measurements; returns the metadata. ``shas`` and
    ``rows``: as for :func:`device_measurements`. ``refit`` False: where the stored fingerprint was fitted from
    the same inputs (``fit_inputs``) and loads, return its metadata, marked ``"up_to_date": True``, instead."""
    rows, limit, drift = fit_rows(cfg, device, descriptions, shas, rows=rows)
    # a CPU's profile measures them where [profile] op_prices asks; the fit uses them under the same key
    prices = load_op_prices(op_prices_path(cfg.profiling_dir, device)) if cfg.profile.op_prices else None
    folder = cfg.fingerprint_dir / device
    if not refit:
        key = fit_inputs_sha256(rows, descriptions, device, cfg.fingerprint, limit, drift=drift, op_prices=prices)
        stored = stored_if_current(folder / METADATA_FILE, key)
        if stored is not None and _loads(folder):
            return stored | {"up_to_date": True}
    return fit_fingerprint(rows, descriptions, device, folder, cfg.fingerprint, memory_limit_mb=limit, drift=drift,
                           op_prices=prices)


def fit_rows(cfg: Config, device: str, descriptions: dict[str, NetworkDescription],
             shas: dict[str, str] | None = None, *, rows: list[dict] | None = None, optimizer: str | None = None,
             loss: str | None = None) -> tuple[list[dict], float, dict | None]:
    """The rows a trees fit of ``device`` reads (``device_measurements`` at their described shapes, drift
    corrected), its memory limit (MiB; 0 = none) and the drift correction's summary (None: none)."""
    rows, limit = device_measurements(cfg, device, shas, rows=rows)
    rows, drift = drift_corrected(cfg, device, _at_described_shapes(device, rows, descriptions), optimizer, loss)
    return rows, limit, drift


def measurements_differ(cfg: Config, device: str, metadata: dict[str, Any]) -> bool:
    """Whether ``device``'s measurements, read as its fit reads them (of the fingerprint's optimizer and loss),
    hash otherwise than the ``training_data_sha256`` of its fingerprint's ``metadata``: rows measured, imported or
    edited since the fit. True where the metadata holds no such hash or the rows cannot be read."""
    stored = metadata.get("training_data_sha256")
    memory_target = metadata.get("memory_target")
    if not isinstance(stored, str) or not isinstance(memory_target, str):
        return True
    optimizer, loss = metadata.get("optimizer"), metadata.get("loss")
    try:
        descriptions, shas, rows, _ = device_dataset(cfg, device, optimizer, loss)
        rows, _, _ = fit_rows(cfg, device, descriptions, shas, rows=rows, optimizer=optimizer, loss=loss)
    except (UserError, OSError, ValueError):
        return True
    return training_data_sha256(rows, device, descriptions, memory_target) != stored


def _at_described_shapes(device: str, rows: list[dict], descriptions: dict[str, NetworkDescription]) -> list[dict]:
    """``rows`` measured at their description's input shape (``dataset.split_other_shapes``); ``UserError`` where
    none is."""
    same, other = split_other_shapes(rows, descriptions)
    if other and not same:
        raise UserError(f"device '{device}': no measurements to fit: every row was measured at another input shape "
                        "than its network's description (a description is of one input shape)")
    return same


def _loads(folder: Path, load: Callable[[Path], Any] = load_fingerprint) -> bool:
    """Whether the trees fingerprint in ``folder`` loads (its arrays whole), or whatever ``load`` reads there."""
    try:
        load(folder)
    except (UserError, OSError, ValueError, KeyError):
        return False
    return True


def drift_corrected(cfg: Config, device: str, rows: list[dict], optimizer: str | None = None,
                    loss: str | None = None) -> tuple[list[dict], dict | None]:
    """``rows`` with their step times corrected by ``device``'s drift reference (``drift.normalise_step_times``)
    and the correction's summary; unchanged, and None, where the device has no ``references.csv`` or
    ``[fingerprint] drift_reference`` is off. The references of the rows' training step count (the phase of
    ``optimizer`` and ``loss``: default ``[profile]``'s; a fingerprint's own for its rows), as its rows do."""
    path = references_path(cfg.profiling_dir, device)
    if not cfg.fingerprint.drift_reference or not path.is_file():
        return rows, None
    phase, loss = training_phase(optimizer or cfg.profile.optimizer), loss or cfg.profile.loss
    references = [r for r in read_rows(path) if phase_of(r) == phase and loss_of(r) == loss]
    return normalise_step_times(rows, references, LATENCY_COLUMN)


def fit_device_gnn(cfg: Config, device: str, descriptions: dict[str, NetworkDescription],
                   shas: dict[str, str] | None = None, *, rows: list[dict] | None = None, refit: bool = True) -> dict:
    """:func:`fit_gnn` in config terms: ``<profiling_dir>/<device>`` in, ``<fingerprint_dir>/<device>`` out,
    with the ``gnn_*`` settings and ``seed`` of ``[fingerprint]`` and the device's ``memory_limit_mb``.
    ``shas`` and ``rows``: as for :func:`device_measurements`; ``refit``: as for :func:`fit_device`."""
    from perf4sight.fingerprint.gnn import GNN_JSON, fit_gnn, gnn_inputs_sha256, load_gnn  # torch, PyG: only here

    rows, limit = device_measurements(cfg, device, shas, rows=rows)
    rows, drift = drift_corrected(cfg, device, _at_described_shapes(device, rows, descriptions))
    f, folder = cfg.fingerprint, cfg.fingerprint_dir / device
    args = (rows, descriptions, device, folder)
    # the device's op prices: the trees of its comparison table read them as fit_device's do
    prices = load_op_prices(op_prices_path(cfg.profiling_dir, device)) if cfg.profile.op_prices else None
    kwargs = dict(seed=f.seed, arch=f.gnn_arch, hidden=f.gnn_hidden, layers=f.gnn_layers, max_epochs=f.gnn_max_epochs,
                  patience=f.gnn_patience, memory_limit_mb=limit, trees_config=f, drift=drift, op_prices=prices)
    if not refit:
        stored = stored_if_current(folder / GNN_JSON, gnn_inputs_sha256(*args, **kwargs))
        if stored is not None and _loads(folder, load_gnn):  # as the trees': a GNN that does not load is fitted again
            return stored | {"up_to_date": True}
    return fit_gnn(*args, **kwargs)


def load_device_fingerprint(cfg: Config, device: str) -> Fingerprint:
    """``<fingerprint_dir>/<device>/`` loaded without executing code."""
    folder = cfg.fingerprint_dir / device
    if not (folder / "metadata.json").is_file():
        raise UserError(f"no fingerprint for device '{device}' in {folder} (run --stage fingerprint first)")
    return _owned_by(load_fingerprint(folder), device, folder)


def _owned_by(predictor: Any, device: str, folder: Path) -> Any:
    """``predictor`` if it was fitted on ``device``'s measurements; a folder copied or renamed from another
    device's would predict that device's figures under this one's name."""
    fitted = getattr(predictor, "device", "")
    if fitted and fitted != device:
        raise UserError(f"{folder} holds a fingerprint of device '{fitted}', not of '{device}': fit '{device}' "
                        f"with --stage fingerprint --device {shell_word(device)}, or predict with --device "
                        f"{shell_word(fitted)} (from a folder named {fitted})")
    return predictor


def load_device_predictor(cfg: Config, device: str, predictor: str = "trees"):
    """``device``'s predictor ``trees``, ``gnn`` or ``ensemble``; each has ``predict(descs, batch_sizes)``."""
    if predictor == "trees":
        return load_device_fingerprint(cfg, device)
    from perf4sight.fingerprint.gnn_predictors import load_predictor  # numpy: no torch to load or predict

    if predictor == "ensemble" and not (cfg.fingerprint_dir / device / "metadata.json").is_file():
        raise UserError(f"the ensemble needs the trees as well as the GNN: no trees for device '{device}' in "
                        f"{cfg.fingerprint_dir / device} (run --stage fingerprint --predictor trees or ensemble)")
    loaded = load_predictor(cfg.fingerprint_dir / device, predictor)
    for part in (getattr(loaded, "trees", None), getattr(loaded, "gnn", None), loaded):
        if part is not None:
            _owned_by(part, device, cfg.fingerprint_dir / device)
    return loaded
