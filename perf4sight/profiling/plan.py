"""The test plan: one JSON file that tells a device what to measure and where to write it.

The same file drives the runner locally and on a remote device, so it is self-contained:
network description files and the output CSV are given relative to the plan's folder
(or absolute). Standard library only: this module runs on the devices.

Example (times in seconds, memory in MiB)::

    {"device": "tx2", "backend": "jetson", "networks": ["nets/resnet18_l0.json"],
     "batch_sizes": [1, 2, 4, 8], "warmup_steps": 2, "timed_steps": 5, "timeout_s": 300,
     "memory_limit_mb": 0, "threads": 0, "gpu_index": 0, "learning_rate": 0.01,
     "optimizer": "sgd", "momentum": 0.9, "weight_decay": 0.0, "loss": "cross_entropy",
     "output": "measurements.csv"}
"""
import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Type, Union

from perf4sight.errors import UserError, read_json_object
from perf4sight.files import write_atomically
from perf4sight.profiling.results import REFERENCES_CSV

__all__ = ["TestPlan", "load_plan", "save_plan", "check_measurement_settings", "PLAN_VERSION", "OPTIMIZERS", "LOSSES",
           "DEFAULT_LOSS",
           "MAX_BATCH_SIZE", "MAX_TIMEOUT_S",
           "training_phase", "phase_optimizer", "update_columns", "recorded_update", "effective_weight_decay"]

PLAN_VERSION = 1

#: The optimisers a measured training step can use (torch.optim.SGD, Adam, AdamW).
OPTIMIZERS = ("sgd", "adam", "adamw")
#: The losses a measured training step can compute (torch.nn.functional's cross_entropy, mse_loss, l1_loss): cross
#: entropy against int64 labels, the other two against a float target of the output's shape.
LOSSES = ("cross_entropy", "mse", "l1")
#: The loss of every row measured before the loss could be chosen, and of every imported row.
DEFAULT_LOSS = "cross_entropy"

#: The largest batch size any stage takes: larger ones overflow the byte counts (int64) of the allocator replay.
MAX_BATCH_SIZE = 10**9
#: The longest ``timeout_s`` (about 11.6 days): the waits it bounds take no more (a longer one, or ``inf``, was an
#: OverflowError in the runner).
MAX_TIMEOUT_S = 1_000_000.0


def training_phase(optimizer: str) -> str:
    """The ``phase`` column of a training step with ``optimizer``: ``train`` for SGD (the rows measured before the
    optimiser could be chosen say so), ``train_<optimizer>`` for the others. Part of a row's key, so a device
    measured with another optimiser is measured again beside its earlier rows."""
    return "train" if optimizer == "sgd" else "train_" + optimizer


def phase_optimizer(phase: str) -> Optional[str]:
    """The optimiser of a training ``phase`` (an empty phase is ``train``, SGD); None for any other phase."""
    for name in OPTIMIZERS:
        if (phase or "train") == training_phase(name):
            return name
    return None


#: torch's weight decay of each optimiser when none is given.
_TORCH_WEIGHT_DECAY = {"sgd": 0.0, "adam": 0.0, "adamw": 0.01}


def effective_weight_decay(optimizer: str, weight_decay: Optional[float]) -> float:
    """The weight decay ``optimizer`` runs with given ``weight_decay`` (None: torch's default, AdamW's 0.01, the
    others' 0)."""
    return float(_TORCH_WEIGHT_DECAY[optimizer] if weight_decay is None else weight_decay)


def update_columns(optimizer: str, momentum: float, weight_decay: Optional[float]) -> Dict[str, str]:
    """The ``momentum`` and ``weight_decay`` cells of a row whose step updated with these settings: SGD's momentum
    (empty for the others, which have none), and the weight decay the optimiser ran with
    (:func:`effective_weight_decay`)."""
    return {"momentum": repr(float(momentum)) if optimizer == "sgd" else "",
            "weight_decay": repr(effective_weight_decay(optimizer, weight_decay))}


def recorded_update(row: Dict[str, Any], optimizer: str) -> Dict[str, str]:
    """:func:`update_columns` of a measurement row of ``optimizer``'s step; an empty cell (a row from before they
    were recorded) reads the profiler's default then: momentum 0.9, torch's weight decay."""
    def cell(name: str) -> Optional[float]:
        value = row.get(name)
        return None if value in ("", None) else float(value)

    momentum = cell("momentum")
    return update_columns(optimizer, 0.9 if momentum is None else momentum, cell("weight_decay"))


def check_measurement_settings(s: Any, where: str, quote: str = "") -> None:
    """The rules of the settings a ``[profile]`` table hands on to its test plans, for both: batch sizes,
    step counts, ``timeout_s`` and ``min_timed_s`` (seconds), ``max_swap_in_mb`` (MiB), the optimiser.
    ``s``: a ``config.ProfileConfig`` or a :class:`TestPlan`; ``UserError`` ``where`` + the first rule broken,
    each key written between ``quote`` (``'timeout_s'`` in a plan, ``timeout_s`` in a config)."""
    def key(name: str) -> str:
        return f"{quote}{name}{quote}"

    bs = s.batch_sizes
    if not bs or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in bs) or sorted(set(bs)) != bs:
        raise UserError(f"{where}{key('batch_sizes')} must be positive integers in ascending order, got {bs}")
    if bs[-1] > MAX_BATCH_SIZE:
        raise UserError(f"{where}{key('batch_sizes')} must be at most {MAX_BATCH_SIZE:,}, got {bs[-1]:,}")
    for name, least in (("timed_steps", 1), ("warmup_steps", 0)):
        if getattr(s, name) < least:
            raise UserError(f"{where}{key(name)} must be >= {least}, got {getattr(s, name)}")
    if s.repeats < 1:
        raise UserError(f"{where}{key('repeats')} must be >= 1, got {s.repeats}")
    if not 0 < s.timeout_s <= MAX_TIMEOUT_S:  # NaN too: it read as "min_timed_s must lie in [0, timeout_s)"
        raise UserError(f"{where}{key('timeout_s')} must be > 0 seconds and at most {MAX_TIMEOUT_S:,.0f} "
                        f"(about 11 days), got {s.timeout_s}")
    if not 0 <= s.min_timed_s < s.timeout_s:
        raise UserError(f"{where}{key('min_timed_s')} must lie in [0, timeout_s), got {s.min_timed_s}")
    if not s.max_swap_in_mb >= 0:  # NaN too: it would turn the thrashing check off
        raise UserError(f"{where}{key('max_swap_in_mb')} must be >= 0, got {s.max_swap_in_mb}")
    if s.reference_every < 0 or s.reference_batch_size < 0:
        raise UserError(f"{where}{key('reference_every')} and {key('reference_batch_size')} must be >= 0, "
                        f"got {s.reference_every} and {s.reference_batch_size}")
    if s.optimizer not in OPTIMIZERS:
        raise UserError(f"{where}{key('optimizer')} must be one of {', '.join(OPTIMIZERS)}, got {s.optimizer!r}")
    if s.loss not in LOSSES:
        raise UserError(f"{where}{key('loss')} must be one of {', '.join(LOSSES)}, got {s.loss!r}")
    # an infinite learning rate turns every weight into inf/NaN after the first step: a measurement of no training
    if not (s.learning_rate > 0 and math.isfinite(s.learning_rate) and 0 <= s.momentum < 1):
        raise UserError(f"{where}{key('learning_rate')} must be a finite number > 0 and {key('momentum')} in [0, 1), "
                        f"got {s.learning_rate} and {s.momentum}")
    if s.weight_decay is not None and not 0 <= s.weight_decay < 1:
        raise UserError(f"{where}{key('weight_decay')} must lie in [0, 1), got {s.weight_decay}")


@dataclass
class TestPlan:
    """What one device measures.

    ``networks``: description files (relative to the plan's folder or absolute).
    ``batch_sizes``: ascending; a network stops at its first ``oom``.
    ``timeout_s``: seconds allowed for one (network, batch size) child process.
    ``memory_limit_mb``: MiB of peak RSS above which the measurement is recorded as ``oom``
    (0 = no limit; the cpu backend enforces it by polling the child's RSS).
    ``threads``: torch intra-op threads (0 = torch's default).
    ``input_shape`` / ``num_classes``: override the description's own values (None = use them).
    ``output``: the measurement CSV (relative to the plan's folder or absolute).
    ``poll_interval_s``: how often the runner samples the child's memory (seconds).
    ``optimizer``: the training step's optimiser (:data:`OPTIMIZERS`): ``sgd`` with ``momentum``, or ``adam`` /
    ``adamw`` with torch's defaults; ``learning_rate`` and ``weight_decay`` are each one's (``weight_decay`` None:
    torch's default, AdamW's 0.01, the others' 0). It names the rows' ``phase`` (:func:`training_phase`); the rows
    record the momentum and weight decay (:func:`update_columns`).
    ``loss``: the training step's loss (:data:`LOSSES`): ``cross_entropy`` against int64 labels (a class per image,
    or per position of an output ``[N, C, H, W]``), or ``mse`` / ``l1`` (mean reduction) against a float target of
    the output's shape. The rows record it in their ``loss`` column, part of their key.
    ``max_swap_in_mb``: MiB the system may swap back in while one measurement runs; more means the
    step's memory did not fit and pages went out and came back (thrashing, e.g. a Jetson's zram): the
    row is recorded as ``oom``, its measured columns kept (0 = no check).
    ``repeats``: fresh processes that measure each (network, batch size) one after another; the row
    written is the one whose step-time median is the median of theirs (see the runner).
    ``reference_every``: a *drift reference*: the configuration ``reference_network`` (a network name of the
    plan; "" = its first network) at ``reference_batch_size`` (0 = the smallest of ``batch_sizes``; the profile stage's
    plan gives the next where the network cannot train at batch 1, :func:`local.make_plan`) is measured
    before the first new measurement, after every ``reference_every`` new ones and after the last, each time
    appended to ``reference_output``; the fingerprint divides the step times by it (0 = no reference).
    ``op_prices_output``: where a CPU device writes the prices of the ops between the convolutions
    (``op_prices.py``), measured once after the sweep (again when the plan's threads or the torch differ from
    the file's, or the file lacks an op measured now); "" = not measured.
    ``retry_errors``: measure again the configurations whose newest row is an ``error`` (a crash, a timeout);
    the new row is appended and counts from then on (``results.latest_rows``), the old one stays.
    """

    __test__ = False  # not a pytest test class, despite the name

    device: str
    backend: str = "cpu"
    networks: List[str] = field(default_factory=list)
    batch_sizes: List[int] = field(default_factory=lambda: [1])
    warmup_steps: int = 2
    timed_steps: int = 5
    min_timed_s: float = 0.0
    repeats: int = 1
    timeout_s: float = 600.0
    memory_limit_mb: int = 0
    max_swap_in_mb: float = 100.0
    threads: int = 0
    gpu_index: int = 0
    learning_rate: float = 0.01
    momentum: float = 0.9
    weight_decay: Optional[float] = None
    optimizer: str = "sgd"
    loss: str = DEFAULT_LOSS
    input_shape: Optional[List[int]] = None
    num_classes: Optional[int] = None
    output: str = "measurements.csv"
    reference_every: int = 0
    reference_network: str = ""
    reference_batch_size: int = 0
    reference_output: str = REFERENCES_CSV
    op_prices_output: str = ""
    retry_errors: bool = False
    poll_interval_s: float = 0.01
    version: int = PLAN_VERSION

    def resolve(self, plan_dir: Union[str, Path], relative: str) -> Path:
        """A path from the plan, made absolute against the plan's folder."""
        p = Path(relative).expanduser()
        return p if p.is_absolute() else Path(plan_dir) / p

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self, where: str = "plan") -> "TestPlan":
        """Raise ``UserError`` naming the first bad field; returns ``self``."""
        if not self.device:
            raise UserError(f"{where}: 'device' must be a non-empty name")
        check_measurement_settings(self, f"{where}: ", quote="'")
        if self.memory_limit_mb < 0 or self.threads < 0 or self.gpu_index < 0:
            raise UserError(f"{where}: 'memory_limit_mb', 'threads' and 'gpu_index' must be >= 0")
        if self.input_shape is not None and (len(self.input_shape) != 3 or any(s < 1 for s in self.input_shape)):
            raise UserError(f"{where}: 'input_shape' must be [channels, height, width], got {self.input_shape}")
        if self.num_classes is not None and self.num_classes < 1:
            raise UserError(f"{where}: 'num_classes' must be >= 1, got {self.num_classes}")
        if not 0 < self.poll_interval_s <= 1:
            raise UserError(f"{where}: 'poll_interval_s' must lie in (0, 1] seconds, got {self.poll_interval_s}")
        if self.version != PLAN_VERSION:
            raise UserError(f"{where}: plan version {self.version} is not supported (expected {PLAN_VERSION})")
        return self


_TYPES: Dict[str, Tuple[Type, ...]] = {
    "device": (str,), "backend": (str,), "networks": (list,), "batch_sizes": (list,),
    "warmup_steps": (int,), "timed_steps": (int,), "min_timed_s": (int, float), "repeats": (int,),
    "timeout_s": (int, float), "memory_limit_mb": (int,),
    "max_swap_in_mb": (int, float),
    "threads": (int,), "gpu_index": (int,), "learning_rate": (int, float), "momentum": (int, float),
    "weight_decay": (int, float, type(None)), "optimizer": (str,), "loss": (str,), "input_shape": (list, type(None)),
    "num_classes": (int, type(None)), "output": (str,),
    "reference_every": (int,), "reference_network": (str,), "reference_batch_size": (int,), "reference_output": (str,),
    "op_prices_output": (str,), "retry_errors": (bool,), "poll_interval_s": (int, float), "version": (int,),
}


def load_plan(path: Union[str, Path]) -> TestPlan:
    """Read and validate a plan file; any problem raises ``UserError`` naming the file and field."""
    p = Path(path)
    raw = read_json_object(p, "test plan")
    unknown = sorted(set(raw) - set(_TYPES))
    if unknown:
        raise UserError(f"{p}: unknown plan field(s) {unknown} (known: {', '.join(_TYPES)})")
    if "device" not in raw:
        raise UserError(f"{p}: plan lacks 'device'")
    for key, value in raw.items():
        if not isinstance(value, _TYPES[key]) or (isinstance(value, bool) and bool not in _TYPES[key]):
            raise UserError(f"{p}: plan field '{key}' has the wrong type ({value!r})")
    if not all(isinstance(n, str) for n in raw.get("networks", [])):
        raise UserError(f"{p}: plan field 'networks' must be a list of description file paths")
    return TestPlan(**raw).validate(str(p))


def save_plan(plan: TestPlan, path: Union[str, Path]) -> Path:
    """Write ``plan`` as indented JSON (atomic replace, through the fixed temporary name: its writers, the runner
    and the local profiler, hold the run's or the device's lock), creating parent folders."""
    plan.validate(str(path))
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    return write_atomically(p, json.dumps(plan.to_dict(), indent=1) + "\n", unique=False)
