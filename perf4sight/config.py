"""TOML configuration -> validated, typed objects.

Every error is a ``UserError`` whose message names the file and the key, e.g.
``config.toml: [profile] unknown key 'batch_size' (known: batch_sizes, ...)``.
Paths in the config are relative to the config file's folder.
"""
from __future__ import annotations

import codecs
import dataclasses
import difflib
import os
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from perf4sight.errors import UserError
from perf4sight.ir.shapes import image_size_problem
from perf4sight.networks.design_space import DEFAULT_STYLES
from perf4sight.profiling.plan import MAX_BATCH_SIZE
from perf4sight.wording import device_table

__all__ = ["Config", "DeviceConfig", "load_config", "BACKENDS", "checked_network_names", "expand_home"]

BACKENDS = ("cpu", "nvml", "jetson")
PRUNING_STRATEGIES = ("l1-norm", "random", "random-weighted")  # perf4sight.networks.pruning
TREE_MODELS = ("extra-trees", "gradient-boosting", "random-forest")  # perf4sight.fingerprint.trees
PREDICTORS = ("trees", "gnn", "ensemble")  # the fingerprint predictors (perf4sight.fingerprint.gnn)
GNN_ARCHS = ("sage", "seernet")


@dataclass
class ProjectConfig:
    """Where outputs go (relative to the config file) and the seed of the compare report's feature sensitivity."""
    models_dir: str = "models"
    profiling_dir: str = "profiling_csvs"
    fingerprint_dir: str = "fingerprinting"
    reports_dir: str = "reports"
    seed: int = 0


@dataclass
class PruningConfig:
    """Structured pruning: ``levels`` are percentages of parameters removed (0-99)."""
    strategy: str = "l1-norm"
    levels: list[float] = field(default_factory=lambda: [0.0])
    min_channels: int = 4
    seed: int = 0


@dataclass
class GeneratorConfig:
    """Random networks from the multi-style design space (0 = none)."""
    count: int = 0
    seed: int = 0
    styles: list[str] = field(default_factory=lambda: list(DEFAULT_STYLES))
    min_mflops: float = 0.0
    max_mflops: float = 1e9
    min_params: int = 0
    max_params: int = 10**12
    cover_styles: bool = False  # each style leads (takes the first two stages of) the networks in turn


@dataclass
class NetworksConfig:
    """Which networks the dataset contains and at what input size."""
    zoo: list[str] = field(default_factory=lambda: ["resnet18"])
    factories: list[str] = field(default_factory=list)  # "models/imagenet/file.py:function"
    description_files: list[str] = field(default_factory=list)
    input_shape: list[int] = field(default_factory=lambda: [3, 224, 224])
    # more shapes to make every network at too (each variant described again there, named <name>_<H>x<W>)
    extra_input_shapes: list[list[int]] = field(default_factory=list)
    num_classes: int = 1000
    segmentation_classes: int = 21  # a segmentation zoo network's classes per pixel (Pascal VOC's, torchvision's)
    pruning: PruningConfig = field(default_factory=PruningConfig)
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)

    def classes_of(self, name: str) -> int:
        """The class count zoo or factory network ``name`` is built with: ``segmentation_classes`` for a segmentation
        network of the zoo, else ``num_classes``."""
        from perf4sight.networks.zoo import SEGMENTATION_NAMES

        return self.segmentation_classes if name in SEGMENTATION_NAMES else self.num_classes


@dataclass
class ProfileConfig:
    """The test plan: batch sizes (ascending), steps and per-measurement timeout (seconds)."""
    batch_sizes: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    warmup_steps: int = 2
    timed_steps: int = 5
    min_timed_s: float = 0.0  # keep timing steps until they add up to this many seconds
    repeats: int = 1  # fresh processes per (network, batch size); the median one is kept
    timeout_s: float = 600.0
    max_swap_in_mb: float = 100.0  # more swapped back in during a measurement = thrashing: recorded as oom
    devices: list[str] = field(default_factory=list)  # empty = every device
    learning_rate: float = 0.01
    momentum: float = 0.9
    weight_decay: float | None = None  # the optimiser's; unset: torch's default (AdamW 0.01, SGD and Adam 0)
    optimizer: str = "sgd"  # sgd | adam | adamw (profiling.plan.OPTIMIZERS): the measured step's optimiser
    loss: str = "cross_entropy"  # cross_entropy | mse | l1 (profiling.plan.LOSSES): the measured step's loss
    # a drift reference: one configuration measured again after every `reference_every` measurements (0 = none)
    reference_every: int = 0
    reference_network: str = ""  # a network name of the plan; "" = its first network
    reference_batch_size: int = 0  # 0 = the smallest of batch_sizes
    retry_errors: bool = False  # measure `error` rows (a crash, a timeout) again; --retry-errors sets it for a run
    op_prices: bool = False  # a cpu device also prices the ops between the convolutions (op_prices.json), once


@dataclass
class DeviceConfig:
    """One target device. No ``host`` means the local machine. Memory in MiB."""
    backend: str = "cpu"
    host: str = ""
    port: int = 22
    user: str = ""
    key_file: str = ""
    known_hosts: str = ""
    accept_new_host_key: bool = False
    python: str = "python3"
    workdir: str = "~/perf4sight-work"
    gpu_index: int = 0
    memory_limit_mb: int = 0  # cpu backend: 0 = no limit
    threads: int = 0  # cpu backend: torch threads, 0 = torch's default
    reconnect_timeout_s: float = 300.0  # SSH: how long profile keeps reconnecting after a dropped connection
    name: str = ""  # filled in from the table name


@dataclass
class FingerprintConfig:
    """Fingerprints: which predictor (trees, gnn or both for the ensemble), the tree ensembles, the GNN."""
    model: str = "extra-trees"
    n_estimators: int = 200
    min_samples_leaf: int = 1
    seed: int = 0
    predictor: str = "trees"           # trees | gnn | ensemble (fits trees and GNN)
    simulate_memory: bool = True       # replay the traced step through the caching-allocator model
    drift_reference: bool = True       # divide step times by the device's drift reference, where it has one
    gnn_arch: str = "sage"             # sage | seernet
    gnn_hidden: int = 64
    gnn_layers: int = 3
    gnn_max_epochs: int = 300
    gnn_patience: int = 40             # epochs without a better validation loss before stopping


@dataclass
class PredictConfig:
    """Defaults for the predict stage."""
    networks: list[str] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=lambda: [8])


@dataclass
class CompareConfig:
    """Networks to draw predictions for in the compare report (zoo names or files); the pruning section's levels
    (% of parameters removed; empty: no section) and the batch size (images per step) it predicts at."""
    networks: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    pruning_levels: list[float] = field(default_factory=list)
    pruning_batch_size: int = 32


@dataclass
class Config:
    """The whole configuration; ``root`` is the folder of the config file."""
    project: ProjectConfig = field(default_factory=ProjectConfig)
    networks: NetworksConfig = field(default_factory=NetworksConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    devices: dict[str, DeviceConfig] = field(default_factory=dict)
    fingerprint: FingerprintConfig = field(default_factory=FingerprintConfig)
    predict: PredictConfig = field(default_factory=PredictConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)
    path: Path = Path("config.toml")
    root: Path = Path(".")

    def resolve(self, relative: str | Path) -> Path:
        """A path from the config, made absolute against the config file's folder (``~`` and ``~user`` expanded;
        ``UserError`` naming the file where that user has no home here)."""
        try:
            p = expand_home(relative)
        except UserError as exc:
            raise UserError(f"{self.path}: {exc}") from None
        return p if p.is_absolute() else self.root / p

    @property
    def models_dir(self) -> Path:
        """``[project] models_dir``, absolute (:meth:`resolve`)."""
        return self.resolve(self.project.models_dir)

    @property
    def profiling_dir(self) -> Path:
        """``[project] profiling_dir``, absolute (:meth:`resolve`)."""
        return self.resolve(self.project.profiling_dir)

    @property
    def fingerprint_dir(self) -> Path:
        """``[project] fingerprint_dir``, absolute (:meth:`resolve`)."""
        return self.resolve(self.project.fingerprint_dir)

    @property
    def reports_dir(self) -> Path:
        """``[project] reports_dir``, absolute (:meth:`resolve`)."""
        return self.resolve(self.project.reports_dir)

    def device(self, name: str) -> DeviceConfig:
        """The ``[devices.<name>]`` table; ``UserError`` naming the configured devices where there is none."""
        if name not in self.devices:
            raise UserError(f"{self.path}: unknown device '{name}' (devices: {', '.join(self.devices) or 'none'})")
        return self.devices[name]

    def devices_to_profile(self, names: Sequence[str] | None = None) -> list[str]:
        """The devices a profile takes: ``names`` where given (``--device``), else ``[profile] devices``, else every
        configured device."""
        return list(names or self.profile.devices or self.devices)


_INTERNAL = {"path", "root", "name"}


def expand_home(path: str | Path) -> Path:
    """``path`` with a leading ``~`` or ``~user`` expanded; ``UserError`` where ``~user`` names no user of this
    machine (``Path.expanduser``'s RuntimeError, a traceback, before)."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        home = str(path).split("/", 1)[0]
        raise UserError(f"'{path}': {home} is the home folder of no user of this machine: write the folder out "
                        "(or ~/ for your own home)") from None


#: what a value of each type is called in "'key' must be ...": the singular, and the items of a list
_TYPE_WORDS = {int: ("an integer", "integers"), float: ("a number", "numbers"), str: ("a string", "strings"),
               bool: ("true or false", "true/false values")}


def _type_name(tp: Any) -> str:
    """``tp`` as the end of "'key' must be ...": "an integer", "true or false", "a list of integers"."""
    origin = typing.get_origin(tp)
    if origin is list:
        item = typing.get_args(tp)[0]
        return f"a list of {_TYPE_WORDS[item][1] if item in _TYPE_WORDS else _type_name(item).split(' ', 1)[1] + 's'}"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    return _TYPE_WORDS[tp][0] if tp in _TYPE_WORDS else f"a {getattr(tp, '__name__', tp)}"


def _convert(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is list:
        if not isinstance(value, list):
            raise UserError(f"{where} must be {_type_name(tp)}, got {value!r}")
        (item,) = typing.get_args(tp)
        return [_convert(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        _, item = typing.get_args(tp)
        if not isinstance(value, dict):
            raise UserError(f"{where} must be a table, got {value!r}")
        return {k: _convert(v, item, f"{where}.{k}") for k, v in value.items()}
    if origin in (typing.Union, types.UnionType):  # TOML has no null: a value given is of the other type
        (given,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return _convert(value, given, where)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise UserError(f"{where} must be a table, got {value!r}")
        return _build(tp, value, where)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is bool and not isinstance(value, bool) or tp is not bool and isinstance(value, bool):
        raise UserError(f"{where} must be {_type_name(tp)}, got {value!r}")
    if not isinstance(value, tp):
        raise UserError(f"{where} must be {_type_name(tp)}, got {value!r}")
    return value


def _build(cls: type, table: dict[str, Any], where: str) -> Any:
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls) if f.name not in _INTERNAL]
    kwargs = {}
    for key, value in table.items():
        if key not in known:  # a slip of its name, or a key of another section
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
            homes = _sections_with_key(key)
            hint = (f" (did you mean '{close[0]}'?)" if close else
                    f" ('{key}' is a key of {', '.join(homes)})" if homes else "")
            raise UserError(f"{where} unknown key '{key}'{hint} (known: {', '.join(known)})")
        child = f"{where[:-1]}.{key}]" if dataclasses.is_dataclass(hints[key]) else f"{where} '{key}'"
        kwargs[key] = _convert(value, hints[key], child)
    return cls(**kwargs)


#: The most classes a network's output may have: a million (ImageNet-21k has 21,841); more is a typing slip, and its
#: last layer would not fit in memory to be described.
MAX_CLASSES = 1_000_000
#: The most trees an ensemble may have (default 200): more is a typing slip, whose fit would not end.
MAX_TREES = 100_000
#: The largest GNN settings (defaults: 64 wide, 3 deep, 300 epochs, patience 40): a typing slip beyond, e.g. a
#: width whose layers would not fit in memory.
GNN_LIMITS = {"gnn_hidden": 4096, "gnn_layers": 64, "gnn_max_epochs": 1_000_000, "gnn_patience": 1_000_000}
_FINGERPRINT_DEFAULTS = {f.name: f.default for f in dataclasses.fields(FingerprintConfig)}
#: The largest seed scikit-learn's trees take (``random_state``: 0..2**32 - 1).
MAX_TREE_SEED = 2**32 - 1


def _check(cfg: Config, importing: bool = False) -> None:
    """Values the types allow but the stages cannot use; ``UserError`` naming the file and key (``importing``: see
    :func:`load_config`)."""
    _check_paths(cfg, cfg.path)
    _check_devices(cfg, cfg.path)
    _check_profile(cfg, cfg.path)
    _check_fingerprint(cfg, cfg.path)
    _check_networks(cfg, cfg.path, importing)
    _check_generator(cfg, cfg.path)
    _check_seeds(cfg, cfg.path)
    _check_folders(cfg, cfg.path)


def _check_paths(cfg: Config, f: Path | None) -> None:
    """Every path the config gives can be expanded: a ``~user`` of no user of this machine is named with its key
    (the first stage to read the path stopped with a traceback)."""
    paths = [(f"[project] {key}", getattr(cfg.project, key))
             for key in ("models_dir", "profiling_dir", "fingerprint_dir", "reports_dir")]
    paths += [(f"{device_table(name)} {key}", getattr(dev, key))
              for name, dev in cfg.devices.items() for key in ("key_file", "known_hosts")]
    paths += [(f"[networks] {key}", name) for key in ("factories", "description_files")
              for name in getattr(cfg.networks, key)]
    paths += [(f"[{section}] networks", name) for section in ("predict", "compare")
              for name in getattr(cfg, section).networks]
    for where, path in paths:
        try:
            expand_home(path.rsplit(":", 1)[0] if ".py:" in path else path)  # a factory's file
        except UserError as exc:
            raise UserError(f"{f}: {where}: {exc}") from None


def _check_folders(cfg: Config, f: Path | None) -> None:
    """[project]'s folders: each a folder where it exists (the stages make the missing ones), and where it does not,
    under a folder, not under a file (the stage that wrote there stopped with an OSError naming no key, exit 1)."""
    for key in ("models_dir", "profiling_dir", "fingerprint_dir", "reports_dir"):
        path = getattr(cfg, key)
        if path.exists() and not path.is_dir():
            raise UserError(f"{f}: [project] {key} = {getattr(cfg.project, key)!r} is a file ({path}), not a folder")
        above = next((p for p in path.parents if p.exists()), None)
        if above is not None and not above.is_dir():
            raise UserError(f"{f}: [project] {key} = {getattr(cfg.project, key)!r} lies under a file ({above}), "
                            "not a folder")


#: the keys of a device reached over SSH alone: set to other than their defaults without a host, they are a sign of
#: a forgotten host (this machine is profiled instead, under the device's name)
SSH_ONLY = ("port", "user", "key_file", "known_hosts", "accept_new_host_key", "python", "workdir",
            "reconnect_timeout_s")
_DEVICE_DEFAULTS = {f.name: f.default for f in dataclasses.fields(DeviceConfig)}


def _check_host(host: str, where: str) -> None:
    """``UserError`` ``where`` + why, for a host that is no host name or address but has more in it: a user, a port
    or a scheme (which the SSH connection looked up as a name, to say "Name or service not known"), or spaces."""
    if any(c.isspace() for c in host):
        raise UserError(f"{where} has a space in it: give the device's host name or address alone")
    if "://" in host:
        raise UserError(f"{where} is a URL: give the device's host name or address alone (port and user have keys "
                        "of their own)")
    if "@" in host:
        user, _, rest = host.rpartition("@")
        raise UserError(f"{where} holds a user: give host = {rest!r} and user = {user!r}")
    if host.count(":") == 1:  # an IPv6 address has two or more
        address, _, port = host.partition(":")
        raise UserError(f"{where} holds a port: give host = {address!r} and port = {port}")


def _check_devices(cfg: Config, f: Path | None) -> None:
    """[devices.*] tables, and the devices [profile] names."""
    from perf4sight.ir.schema import is_file_stem  # stdlib only

    for name, dev in cfg.devices.items():
        dev.name = name
        if not is_file_stem(name):  # it names the device's folders under profiling_dir and fingerprint_dir
            raise UserError(f"{f}: device name {name!r} cannot name a folder (its measurements and fingerprint "
                            "go in a folder of that name: no path separators, no leading '.', no surrounding spaces)")
        if dev.backend not in BACKENDS:
            raise UserError(f"{f}: {device_table(name)} backend '{dev.backend}' is not one of {', '.join(BACKENDS)}")
        for key in ("memory_limit_mb", "threads", "gpu_index"):
            if getattr(dev, key) < 0:
                raise UserError(f"{f}: {device_table(name)} {key} must be >= 0, got {getattr(dev, key)}")
        if dev.backend == "nvml" and dev.memory_limit_mb:  # it bounds the process's RSS, not the GPU's memory
            raise UserError(f"{f}: {device_table(name)} memory_limit_mb bounds a process's resident memory (cpu, and a "
                            "Jetson's memory shared with its GPU); an nvml GPU's capacity is learnt from its oom "
                            "rows: drop the key")
        if not dev.reconnect_timeout_s > 0:
            raise UserError(f"{f}: {device_table(name)} reconnect_timeout_s must be > 0 (seconds), "
                            f"got {dev.reconnect_timeout_s}")
        if not 0 < dev.port < 65536:
            raise UserError(f"{f}: {device_table(name)} port must lie in 1..65535, got {dev.port}")
        if not dev.python.strip():  # check ran "" and profile python3: name one, or drop the key for python3
            raise UserError(f"{f}: {device_table(name)} python is empty: name the device's interpreter, or drop the "
                            "key for python3")
        if not dev.workdir.strip():  # check probed the login folder, profile expanded "" its own way
            raise UserError(f"{f}: {device_table(name)} workdir is empty: name the device's work folder, or drop the "
                            f"key for {_DEVICE_DEFAULTS['workdir']}")
        ssh_only = [k for k in SSH_ONLY if getattr(dev, k) != _DEVICE_DEFAULTS[k]]
        if not dev.host and ssh_only:  # a forgotten host would profile this machine under the device's name
            raise UserError(f"{f}: {device_table(name)} sets {', '.join(ssh_only)} but no host: without a host the "
                            "device is this machine; set host for an SSH device, or drop those keys")
        if dev.host:
            _check_host(dev.host, f"{f}: {device_table(name)} host {dev.host!r}")
    for d in cfg.profile.devices:
        if d not in cfg.devices:
            raise UserError(f"{f}: [profile] devices names unknown device '{d}' "
                            f"(devices: {', '.join(cfg.devices) or 'none'})")
    # [compare] devices may also name an imported device (no [devices] table), one to be imported too: the compare
    # stage checks that each has a fingerprint (and --stage all that each is known before its first stage)


def _check_profile(cfg: Config, f: Path | None) -> None:
    """[profile]: batch sizes, step counts, time limits, the optimiser: the rules its test plans are held to
    on the device too (``plan.check_measurement_settings``)."""
    from perf4sight.profiling.plan import check_measurement_settings  # standard library only

    check_measurement_settings(cfg.profile, f"{f}: [profile] ")
    given = [k for k in ("reference_network", "reference_batch_size") if getattr(cfg.profile, k)]
    if given and not cfg.profile.reference_every:  # the drift reference's settings, passed over without a word
        raise UserError(f"{f}: [profile] {' and '.join(given)} {'is' if len(given) == 1 else 'are'} the drift "
                        "reference's, but reference_every is 0, so none is measured: set reference_every (e.g. 6, one "
                        f"reference every 6 measurements), or drop {'it' if len(given) == 1 else 'them'}")


def _check_fingerprint(cfg: Config, f: Path | None) -> None:
    """[fingerprint]: model, sizes, predictor, GNN settings."""
    fp = cfg.fingerprint
    if fp.model not in TREE_MODELS:
        raise UserError(f"{f}: [fingerprint] model '{fp.model}' is not one of {', '.join(TREE_MODELS)}")
    if fp.n_estimators < 1 or fp.min_samples_leaf < 1:
        raise UserError(f"{f}: [fingerprint] n_estimators and min_samples_leaf must be >= 1, "
                        f"got {fp.n_estimators} and {fp.min_samples_leaf}")
    if fp.n_estimators > MAX_TREES:
        raise UserError(f"{f}: [fingerprint] n_estimators must lie in 1..{MAX_TREES:,} (trees per ensemble; "
                        f"default 200), got {fp.n_estimators:,}")
    if fp.predictor not in PREDICTORS:
        raise UserError(f"{f}: [fingerprint] predictor '{fp.predictor}' is not one of {', '.join(PREDICTORS)}")
    if fp.gnn_arch not in GNN_ARCHS:
        raise UserError(f"{f}: [fingerprint] gnn_arch '{fp.gnn_arch}' is not one of {', '.join(GNN_ARCHS)}")
    for key, most in GNN_LIMITS.items():
        if getattr(fp, key) < 1:
            raise UserError(f"{f}: [fingerprint] {key} must be >= 1, got {getattr(fp, key)}")
        if getattr(fp, key) > most:  # gnn_hidden = 100000 asked torch for a 40 GB layer: a traceback
            raise UserError(f"{f}: [fingerprint] {key} must lie in 1..{most:,} (default "
                            f"{_FINGERPRINT_DEFAULTS[key]}), got {getattr(fp, key):,}")


def _check_networks(cfg: Config, f: Path | None, importing: bool = False) -> None:
    """[networks] and the networks [predict] and [compare] name (description files made config-relative; with
    ``importing``, a name of no known network passes: the import may bring it)."""
    for key in ("num_classes", "segmentation_classes"):
        if not 1 <= getattr(cfg.networks, key) <= MAX_CLASSES:
            raise UserError(f"{f}: [networks] {key} must lie in 1..{MAX_CLASSES:,}, got {getattr(cfg.networks, key)}")
    shape = cfg.networks.input_shape
    if len(shape) != 3 or any(s < 1 for s in shape):
        raise UserError(f"{f}: [networks] input_shape must be [channels, height, width], got {shape}")
    if image_size_problem(shape):
        raise UserError(f"{f}: [networks] input_shape: {image_size_problem(shape)}")
    for extra in cfg.networks.extra_input_shapes:
        if len(extra) != 3 or any(s < 1 for s in extra):
            raise UserError(f"{f}: [networks] extra_input_shapes: each must be [channels, height, width], got {extra}")
        if image_size_problem(extra):
            raise UserError(f"{f}: [networks] extra_input_shapes: {image_size_problem(extra)}")
        if extra[0] != shape[0]:
            raise UserError(f"{f}: [networks] extra_input_shapes: {extra} has {extra[0]} channels, input_shape "
                            f"{shape} has {shape[0]}: the networks take one channel count; give other heights and "
                            "widths")
    shapes = [tuple(shape)] + [tuple(s) for s in cfg.networks.extra_input_shapes]
    if len(set(shapes)) != len(shapes):
        raise UserError(f"{f}: [networks] extra_input_shapes names a shape twice, or input_shape again: "
                        f"{[list(s) for s in shapes]}")
    if cfg.networks.pruning.strategy not in PRUNING_STRATEGIES:
        raise UserError(f"{f}: [networks.pruning] strategy '{cfg.networks.pruning.strategy}' is not one of "
                        f"{', '.join(PRUNING_STRATEGIES)}")
    _check_zoo(cfg, f)
    for i, fname in enumerate(cfg.networks.description_files, 1):
        if not fname.strip():  # resolved, the config's own folder
            raise UserError(f"{f}: [networks] description_files: entry {i} is empty: give a description .json file")
        if cfg.resolve(fname).is_dir():  # not "file not found": it is there
            raise UserError(f"{f}: [networks] description_files: {fname} is a folder, not a description file: list "
                            "its .json files one by one")
        if not cfg.resolve(fname).is_file():
            raise UserError(f"{f}: [networks] description_files: file not found: {fname}")
    _check_named_networks(cfg, f, importing)
    if not cfg.predict.batch_sizes:
        raise UserError(f"{f}: [predict] batch_sizes is empty: give at least one (e.g. [8]), or leave the key out")
    if any(b < 1 for b in cfg.predict.batch_sizes):
        raise UserError(f"{f}: [predict] batch_sizes must be positive integers, got {cfg.predict.batch_sizes}")
    if max(cfg.predict.batch_sizes) > MAX_BATCH_SIZE:  # said by the predict stage, at the end of --stage all
        raise UserError(f"{f}: [predict] batch_sizes must be at most {MAX_BATCH_SIZE:,}, got "
                        f"{max(cfg.predict.batch_sizes):,}")
    for where, levels in (("[networks.pruning] levels", cfg.networks.pruning.levels),
                          ("[compare] pruning_levels", cfg.compare.pruning_levels)):
        if any(not 0 <= lvl <= 99 for lvl in levels):
            raise UserError(f"{f}: {where} must lie in 0..99, got {levels}")
        if len(set(levels)) != len(levels):
            raise UserError(f"{f}: {where} name a level twice: {levels}")
        # a variant is named after its level to 6 significant digits (networks.on_request.variant_name): two levels
        # of one name wrote one file twice and the manifest two rows of that network
        named = {}
        for lvl in levels:
            other = named.setdefault(f"{lvl:g}", lvl)
            if other != lvl:
                raise UserError(f"{f}: {where}: {other!r} and {lvl!r} give one variant name (_l{lvl:g}); "
                                "levels must differ in their first 6 significant digits")
    if cfg.compare.pruning_batch_size < 1:
        raise UserError(f"{f}: [compare] pruning_batch_size must be >= 1, got {cfg.compare.pruning_batch_size}")
    if cfg.compare.pruning_batch_size > MAX_BATCH_SIZE:  # said by the compare stage, at the end of --stage all
        raise UserError(f"{f}: [compare] pruning_batch_size must be at most {MAX_BATCH_SIZE:,}, got "
                        f"{cfg.compare.pruning_batch_size:,}")
    if cfg.networks.pruning.min_channels < 1:
        raise UserError(f"{f}: [networks.pruning] min_channels must be >= 1, got {cfg.networks.pruning.min_channels}")


def _check_zoo(cfg: Config, f: Path | None) -> None:
    """[networks] zoo: torchvision names only (the networks stage builds each with torchvision); a description
    file or a factory listed there is named, with the key that takes it."""
    from perf4sight.networks.zoo import ZOO_NAMES  # names only: no torch
    for name in cfg.networks.zoo:
        if name in ZOO_NAMES:
            continue
        if name.endswith(".json") or cfg.resolve(name).is_file():
            raise UserError(f"{f}: [networks] zoo: '{name}' is a file, not a zoo network: list description files "
                            "under [networks] description_files")
        if ":" in name and name.split(":", 1)[0].endswith(".py"):
            raise UserError(f"{f}: [networks] zoo: '{name}' is a factory, not a zoo network: list it under "
                            "[networks] factories")
        # a typo's closest names first: the 86 names after it fill a terminal's screen
        by_lower = {n.lower(): n for n in ZOO_NAMES}
        close = [by_lower[n] for n in difflib.get_close_matches(name.lower(), list(by_lower), n=3, cutoff=0.75)]
        guess = f" (did you mean {' or '.join(repr(n) for n in close)}?)" if close else ""
        raise UserError(f"{f}: [networks] zoo: '{name}' is not a zoo network{guess} (zoo networks: "
                        f"{', '.join(ZOO_NAMES)}; networks of your own: [networks] factories or description_files)")


#: The names the generator gives (``gen_0_3``); a pruned variant's (``resnet18_l30``) is ``on_request.VARIANT``.
_GENERATED_NAME = re.compile(r"gen_\d+_\d+")


def _check_named_networks(cfg: Config, f: Path | None, importing: bool = False) -> None:
    """[predict] and [compare] networks, as :func:`checked_network_names` takes them, their files made relative to
    the config file like every path of it (``importing``: a name of no known network passes)."""
    for key, section in (("predict", cfg.predict), ("compare", cfg.compare)):
        section.networks = checked_network_names(cfg, section.networks, f"{f}: [{key}] networks", cfg.resolve,
                                                 unknown_ok=importing)


def checked_network_names(cfg: Config, names: list[str], where: str, resolve: Callable[[str], Path],
                          unknown_ok: bool = False) -> list[str]:
    """``names`` as ``--network`` takes them: zoo names, description files and factories (``file.py:function``;
    their files made absolute by ``resolve``), the names of the networks ``[networks]`` names, or the names of the
    dataset's networks: one on disk (the networks stage's manifest, a device's imported graphs), or a name the
    networks stage gives (it may not have run yet); anything else is a typo, a ``UserError`` ``where`` + what is
    wrong, said at once rather than after a profile (``unknown_ok``: kept as it is, for an import to bring)."""
    from perf4sight.dataset import dataset_network_names, is_description_file, unknown_network
    from perf4sight.networks.factories import COMMAND_LINE_FACTORY  # no torch
    from perf4sight.networks.named import named_networks  # no torch
    from perf4sight.networks.zoo import ZOO_NAMES  # names only: no torch
    dataset: list[str] | None = None  # read at the first name that needs it

    def of_dataset(name: str) -> bool:
        nonlocal dataset
        dataset = dataset_network_names(cfg) if dataset is None else dataset
        return name in dataset

    out = []
    for name in names:
        if name in ZOO_NAMES or _made_name(cfg, name):
            out.append(name)
        elif COMMAND_LINE_FACTORY.fullmatch(name):
            file, function = name.rsplit(":", 1)
            if not resolve(file).is_file():
                raise UserError(f"{where}: '{name}': no such file ({resolve(file)})")
            out.append(f"{resolve(file)}:{function}")
        elif is_description_file(name, cfg, resolve):
            out.append(str(resolve(name)))  # a description file (the networks stage may write it), as stages read it
        elif "/" in name or "\\" in name:
            raise UserError(f"{where}: '{name}': no such file ({resolve(name)})")
        else:
            if not (unknown_ok or of_dataset(name) or name in (n.name for n in named_networks(cfg))):
                raise UserError(f"{where}: {unknown_network(cfg, name, dataset)}")
            out.append(name)
    return out


def _made_name(cfg: Config, name: str) -> bool:
    """Whether ``name`` is one the networks stage gives (it may not have run yet): a pruned variant (``resnet18_l30``),
    a generated network (``gen_0_3``), or one of them at a ``[networks] extra_input_shapes``
    (``resnet18_l30_96x64``)."""
    from perf4sight.networks.on_request import VARIANT  # no torch

    suffixes = [f"_{h}x{w}" for _, h, w in cfg.networks.extra_input_shapes]
    bases = [name] + [name[:-len(s)] for s in suffixes if name.endswith(s)]
    return any(VARIANT.fullmatch(b) or _GENERATED_NAME.fullmatch(b) for b in bases)


def _check_generator(cfg: Config, f: Path | None) -> None:
    """[networks.generator]: styles, count, the MFLOPs and parameter ranges, and an input shape it can build
    at (what the generator would otherwise refuse only after the pruning, or silently accept: a NaN bound)."""
    from perf4sight.networks.generator_settings import GeneratorSettings  # no numpy, no torch

    GeneratorSettings.from_config(cfg.networks.generator).check(f, cfg.networks.input_shape)


def _check_seeds(cfg: Config, f: Path | None) -> None:
    """Seeds of every section: numpy, scikit-learn and the generator need them >= 0 (the generator's count:
    :func:`_check_generator`)."""
    for where, value in (("[project] seed", cfg.project.seed), ("[networks.pruning] seed", cfg.networks.pruning.seed),
                         ("[networks.generator] seed", cfg.networks.generator.seed),
                         ("[fingerprint] seed", cfg.fingerprint.seed)):
        if value < 0:
            raise UserError(f"{f}: {where} must be >= 0, got {value}")
    if cfg.fingerprint.seed > MAX_TREE_SEED:
        raise UserError(f"{f}: [fingerprint] seed must lie in 0..{MAX_TREE_SEED} (scikit-learn's random_state), got "
                        f"{cfg.fingerprint.seed}")


#: the default configuration (the project's own ``config.toml``, shipped in the package for ``--stage init``)
DEFAULT_CONFIG = Path(__file__).with_name("default_config.toml")


def write_default_config(path: str | Path) -> Path:
    """Writes the default configuration (every stage on this machine's CPU) to ``path``; ``UserError`` where a
    file is there already (it is left as it is) or the folder does not exist."""
    p = Path(path)
    if p.is_dir() or str(path).endswith(("/", os.sep)):  # a folder given: say so, as load_config does
        raise UserError(f"{path}: is a folder, not a config file (give the file to write, e.g. {p / 'config.toml'})")
    if p.exists():
        raise UserError(f"{p}: is there already: left as it is (give --config with another file name to write one)")
    if not p.parent.is_dir():
        raise UserError(f"{p}: folder {p.parent} does not exist")
    with open(p, "x", encoding="utf-8") as fh:  # exclusive: never over a file made meanwhile
        fh.write(DEFAULT_CONFIG.read_text(encoding="utf-8"))
    return p


def _config_text(p: Path) -> str:
    """The text of config file ``p``: UTF-8, as TOML is, with or without the byte-order mark an editor may put
    first (Windows' Notepad: "Invalid statement (at line 1, column 1)" before); ``UserError`` for a file in another
    encoding, naming the line of its first byte that is not UTF-8."""
    data = p.read_bytes()
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):  # e.g. PowerShell 5's `>` and Out-File
        raise UserError(f"{p}: is UTF-16 text; TOML is UTF-8: save it as UTF-8")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise UserError(f"{p}: is not UTF-8 text (byte 0x{data[exc.start]:02x} on line {line}: another encoding, "
                        "such as Latin-1); TOML is UTF-8: save it as UTF-8") from None


def _sections_with_key(key: str) -> list[str]:
    """The section headings under which ``key`` is a key (``seed``: ``[project]``, ``[networks.pruning]``, ...)."""
    found = []

    def walk(cls: type, heading: str) -> None:
        for f in dataclasses.fields(cls):
            tp = typing.get_type_hints(cls)[f.name]
            if dataclasses.is_dataclass(tp):
                walk(tp, f"{heading}.{f.name}")
            elif f.name == key and f.name not in _INTERNAL:
                found.append(f"[{heading}]")

    for name, tp in typing.get_type_hints(Config).items():
        if dataclasses.is_dataclass(tp):
            walk(tp, name)
    if key in {f.name for f in dataclasses.fields(DeviceConfig)} - _INTERNAL:
        found.append("[devices.<name>]")
    return found


def load_config(path: str | Path, importing: bool = False) -> Config:
    """Read and validate a TOML config; raises ``UserError`` naming file and key. ``importing`` (the import stage):
    a ``[predict]`` or ``[compare]`` network of no known name is not refused, as the import may bring it (an imported
    graph's name: refused, the config could not import it, after its imported folder was deleted say)."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{p}: is a directory, not a config file (give the TOML file, e.g. {p / 'config.toml'})")
    if not p.is_file():
        where = "" if p.is_absolute() else f" (looked in {Path.cwd()})"
        raise UserError(f"{p}: config file not found{where}; --stage init writes the default one there")
    try:
        raw = tomllib.loads(_config_text(p))
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{p}: not valid TOML ({exc})") from None
    cfg = Config()
    hints = typing.get_type_hints(Config)
    for key, value in raw.items():
        if key not in hints or key in _INTERNAL:
            known = [k for k in hints if k not in _INTERNAL]
            if not isinstance(value, dict):  # a key written above the first section heading
                homes = _sections_with_key(key)
                where = f"'{key}' is a key of {', '.join(homes)}" if homes else f"known sections: {', '.join(known)}"
                raise UserError(f"{p}: key '{key}' is outside any section: keys go under a section heading ({where})")
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
            hint = f" (did you mean [{close[0]}]?)" if close else ""
            raise UserError(f"{p}: unknown section [{key}]{hint} (known: {', '.join(known)})")
        if key == "devices":
            if not isinstance(value, dict):
                raise UserError(f"{p}: [devices] must be a table of [devices.<name>] tables")
            cfg.devices = {n: _convert(v, DeviceConfig, f"{p}: {device_table(n)}") for n, v in value.items()}
        else:
            setattr(cfg, key, _convert(value, hints[key], f"{p}: [{key}]"))
    cfg.path = p
    cfg.root = p.resolve().parent
    _check(cfg, importing)
    return cfg
