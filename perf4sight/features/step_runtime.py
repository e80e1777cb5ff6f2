"""How the torch that measured a device's rows ran the training step: the rules that change what the step keeps for
backward, allocates and dispatches, gathered in one object that the features, the allocator replay and a stored
fingerprint share.

Each rule is a fact about a torch version or a device, not a fitted figure:

- ``optimizer``: the step's optimiser (``optimizers.py``): its state copies and its update's kernels.
- ``momentum``: SGD kept a momentum buffer (momentum > 0). ``weight_decay``: SGD's or Adam's update added an L2
  decay term (a new parameter-sized tensor per parameter; None: the old rule, SGD's with one as perf4sight's TX2
  recipe ran it, Adam's without). Both change the update's kernels and what it keeps or allocates.
  ``decoupled_decay``: AdamW's in-place decay ran (weight decay > 0; torch skips its kernel at 0): its kernels.
- ``loss``: the step's loss (``profiling.plan.LOSSES``): a cross entropy against int64 labels, or an MSE or L1 loss
  against a float target of the output's shape (``formulas.output_loss``): its passes, what it keeps and allocates.
- ``relu6_clone``: torch 1.10 and newer keep a ReLU6's input for backward (a clone of it when the ReLU6 is in
  place; pytorch/pytorch#95432), where older torch (the TX2's) kept the result of an in-place one.
- ``foreach``: the optimiser updated every parameter at once (torch's default for parameters on a GPU) or one at a
  time (on a CPU); the allocator replay's Adam scratch depends on it.
- ``dropout_mask_bytes``: the bytes per element a dropout keeps for backward: 1 where CUDA's fused kernel keeps a
  bool mask, 4 where the CPU keeps the float noise it multiplied by.
- ``grads_to_none``: each step began with ``zero_grad(set_to_none=True)``, which frees the gradients until the
  backward makes them again (torch 2.0's default; this tool's profiler always did), where perf4sight's torch 1.x
  zeroed them in place and kept them all step; the allocator replay's peak depends on it.
- ``update_as_run``: the update's kernels are counted as torch runs them (``optimizers.optimizer_cost``: SGD's
  momentum update as two kernels, a ``zero_()`` only where the gradients are kept); false in a fingerprint stored
  before that count, which keeps the count it was fitted with.
- ``native_conv``: the rows ran where torch sends small-batch 1x1 convolutions outside oneDNN (the cpu backend on
  one thread), so the ``native_conv_macs`` term is theirs.
- ``blas_workspace``: the bytes of the workspace torch allocates through its caching allocator for each cuBLAS
  handle it uses (the forward's thread and autograd's), and of cuBLASLt's, kept for good from the first step on a GPU
  (``fingerprint.fit.blas_workspace``); (0, 0) on a CPU, on torch < 2.0 (cuBLAS kept its own) and for imported rows.
- ``op_prices``: what the device charged per element for each kind of op between the convolutions, by map side,
  measured by its profile (``profiling/op_prices.py``; ``features/priced_ops.py`` sums them into the
  ``priced_ops_ms`` term); () where none were measured (a GPU, imported rows, a profile before 2026-11-26).

The shared walk over a description (``walk.py``) hands every consumer the costs under one set of rules
(:meth:`StepRuntime.applied`). Which rules a set of rows ran under is read from the rows
(``fingerprint.fit.step_runtime``); a stored fingerprint keeps them in its metadata (:meth:`StepRuntime.metadata`),
and one stored before a rule existed reads that rule's old default (:meth:`StepRuntime.from_metadata`). Pure
Python (no torch).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from perf4sight.features.formulas import OpCost, changed
from perf4sight.features.optimizers import (DEFAULT_OPTIMIZER, OPTIMIZER_LABELS, PERF4SIGHT_MOMENTUM,
                                           PERF4SIGHT_WEIGHT_DECAY, OptimizerCost, adds_decay, optimizer_cost)
from perf4sight.features.priced_ops import check_prices, prices_key, prices_table
from perf4sight.profiling.plan import DEFAULT_LOSS, LOSSES

__all__ = ["StepRuntime", "CUDA_MASK_BYTES", "CPU_MASK_BYTES", "LOSS_LABELS", "CLONED_IN_PLACE"]

#: Each loss in words, as a step's label names it.
LOSS_LABELS = {"cross_entropy": "cross-entropy loss", "mse": "MSE loss", "l1": "L1 loss"}

#: Bytes per element a dropout keeps: CUDA's fused kernel (a bool mask) and the CPU's (the float noise).
CUDA_MASK_BYTES = 1
CPU_MASK_BYTES = 4

#: Activations that, run in place, clone their input first and keep that clone for backward (torch's clone, then
#: ``mish_``, ``threshold_``, ``silu_``, ``hardswish_``, ``hardsigmoid_``), on any torch (measured on torch 2.14).
CLONED_IN_PLACE = ("mish", "threshold", "silu", "hardswish", "hardsigmoid")

#: metadata key -> (field, value of a fingerprint stored before the key existed)
_METADATA_KEYS: dict[str, tuple[str, Any]] = {
    "optimizer": ("optimizer", DEFAULT_OPTIMIZER),  # before 2026-11-25: all SGD's
    "relu6_clone": ("relu6_clone", False),
    "optimizer_foreach": ("foreach", True),  # replayed as a GPU's
    "dropout_mask_bytes": ("dropout_mask_bytes", CUDA_MASK_BYTES),  # before 2026-11-26: counted as CUDA's
    "native_conv_dispatch": ("native_conv", False),
    "sgd_momentum": ("momentum", True),  # before 2026-11-26: every SGD's had momentum
    "weight_decay": ("weight_decay", None),  # before 2026-11-26: SGD's with, the others' without
    "zero_grad_set_to_none": ("grads_to_none", False),  # before 2026-11-26: replayed with the gradients kept
    "update_counted_as_run": ("update_as_run", False),  # before 2026-11-26 (evening): momentum one kernel
    "op_prices": ("op_prices", ()),  # before 2026-11-26 (night): none measured
    "loss": ("loss", DEFAULT_LOSS),  # before 2026-11-29: every row's a cross entropy
    "adamw_decay": ("decoupled_decay", True),  # before 2026-12-01: AdamW's decay counted whatever it was
    "blas_workspace_bytes": ("blas_workspace", (0, 0)),  # before 2026-12-01: none replayed
}


@dataclass(frozen=True)
class StepRuntime:
    """The rules of one torch on one device for a training step (module docstring). The defaults are the old
    rules of a GPU: SGD with momentum and weight decay, an older torch's ReLU6, a ``foreach`` update, a one-byte
    dropout mask, the gradients kept between steps, the update's count of before it went kernel by kernel."""
    optimizer: str = DEFAULT_OPTIMIZER
    relu6_clone: bool = False
    foreach: bool = True
    dropout_mask_bytes: int = CUDA_MASK_BYTES
    native_conv: bool = False
    momentum: bool = True
    weight_decay: bool | None = None
    grads_to_none: bool = False
    update_as_run: bool = False
    op_prices: tuple = ()  # priced_ops.prices_key of the device's table
    loss: str = DEFAULT_LOSS
    decoupled_decay: bool = True
    blas_workspace: tuple = (0, 0)  # bytes: cuBLAS's per handle, cuBLASLt's

    def __post_init__(self) -> None:
        optimizer_cost(self.optimizer)  # a ValueError naming the known ones
        ws = self.blas_workspace
        if not (isinstance(ws, tuple) and len(ws) == 2 and all(type(n) is int and n >= 0 for n in ws)):
            raise ValueError(f"blas_workspace must be two byte counts (cuBLAS's, cuBLASLt's), not {ws!r}")
        if self.loss not in LOSSES:
            raise ValueError(f"unknown loss {self.loss!r}: one of {', '.join(LOSSES)}")
        if self.dropout_mask_bytes not in (CUDA_MASK_BYTES, CPU_MASK_BYTES):
            raise ValueError(f"dropout_mask_bytes must be {CUDA_MASK_BYTES} or {CPU_MASK_BYTES}, "
                             f"not {self.dropout_mask_bytes!r}")

    def with_optimizer(self, optimizer: str) -> "StepRuntime":
        """The same rules for a step with another optimiser (``ValueError`` for an unknown one)."""
        return replace(self, optimizer=optimizer)

    def with_loss(self, loss: str) -> "StepRuntime":
        """The same rules for a step with another loss (``ValueError`` for an unknown one)."""
        return replace(self, loss=loss)

    @property
    def decays(self) -> bool:
        """Whether the update adds an L2 weight-decay term (``optimizers.adds_decay``)."""
        return adds_decay(self.optimizer, self.weight_decay)

    def update_cost(self) -> OptimizerCost:
        """What the optimiser's update costs under these rules (``optimizers.optimizer_cost``)."""
        return optimizer_cost(self.optimizer, self.momentum, self.weight_decay, grads_kept=not self.grads_to_none,
                              as_run=self.update_as_run, decoupled_decay=self.decoupled_decay)

    def label(self) -> str:
        """The step's optimiser in words, with its momentum (SGD) and an L2 weight decay where the rows recorded one,
        then its loss where that is no cross entropy."""
        return self._optimizer_label() + ("" if self.loss == DEFAULT_LOSS else f", {LOSS_LABELS[self.loss]}")

    def _optimizer_label(self) -> str:
        """The step's optimiser in words (:meth:`label` without the loss)."""
        text = OPTIMIZER_LABELS[self.optimizer]
        if self.optimizer == "sgd" and not self.momentum:
            return "SGD with weight decay, no momentum" if self.decays else "SGD without momentum"
        if self.optimizer == "adamw" and not self.decoupled_decay:
            return "AdamW without weight decay"
        return text + (" and weight decay" if self.weight_decay and self.decays else "")

    def traced_update(self) -> dict[str, Any]:
        """The allocator replay's optimiser settings (``alloc_trace.simulate``'s keywords) for this step's update;
        empty for the old rules' SGD (perf4sight's single-tensor loop with momentum and decay), so that its traces keep
        their cache keys."""
        if self.optimizer == "sgd" and self.momentum and self.weight_decay is None and not self.grads_to_none:
            return {}
        return {"optimizer": self.optimizer, "foreach": self.foreach, "momentum": PERF4SIGHT_MOMENTUM * self.momentum,
                "weight_decay": PERF4SIGHT_WEIGHT_DECAY * self.decays, "set_to_none": self.grads_to_none}

    def applied(self, op: str, cost: OpCost, on_copy: bool = False) -> OpCost:
        """``cost``, an op of kind ``op`` as its formula counts it (``formulas.HANDLERS``: the older torch's ReLU6, a
        one-byte dropout mask), with what it keeps for backward under these rules: a ReLU6's or a hardtanh's
        input (``saved`` [0]) on torch >= 1.10 (run in place on a copy of its input, ``on_copy``: a clone of the
        copy, a tensor of its own: its output's bytes in ``extra_saved_bytes``), a dropout's mask at
        :attr:`dropout_mask_bytes` an element (``extra_saved_bytes``), and on a CPU (its four-byte mask) a
        log-sigmoid's buffer, of its output's bytes, which CUDA leaves empty."""
        if op in ("relu6", "hardtanh") and self.relu6_clone and on_copy:
            return changed(cost, saved=[], extra_saved_bytes=cost.extra_saved_bytes + cost.bytes_written)
        if op in ("relu6", "hardtanh") and self.relu6_clone:  # hardtanh_ is ReLU6's kernel
            return changed(cost, saved=[0])
        if op == "dropout" and self.dropout_mask_bytes != CUDA_MASK_BYTES:
            return changed(cost, extra_saved_bytes=cost.extra_saved_bytes * self.dropout_mask_bytes)
        if op == "log_sigmoid" and self.dropout_mask_bytes == CPU_MASK_BYTES:  # a CPU's: its buffer, output-sized
            return changed(cost, extra_saved_bytes=cost.extra_saved_bytes + cost.bytes_written)
        return cost

    def clones_input(self, op: str, in_place: bool) -> bool:
        """Whether ``op`` run in place (on its input, or on a copy of it: ``in_place``) first clones its input, the
        clone it keeps for backward (an aten.clone kernel: the input read and written): a mish's, a threshold's, a
        SiLU's, a hardswish's and a hardsigmoid's always, a ReLU6's and a hardtanh's on torch >= 1.10
        (``relu6_clone``); measured on torch 2.14."""
        return in_place and (op in CLONED_IN_PLACE or op in ("relu6", "hardtanh") and self.relu6_clone)

    def with_op_prices(self, table: dict[str, dict[int, float]] | None) -> "StepRuntime":
        """The same rules with a device's measured op prices (``priced_ops.check_prices``'s table; None: none)."""
        return replace(self, op_prices=prices_key(table))

    def metadata(self) -> dict[str, Any]:
        """The rules as a stored fingerprint's metadata keeps them (the op prices as ``{op: {side: ns}}``, or null)."""
        meta = {key: getattr(self, name) for key, (name, _) in _METADATA_KEYS.items()}
        meta["op_prices"] = prices_table(self.op_prices)
        meta["blas_workspace_bytes"] = list(self.blas_workspace)
        return meta

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any]) -> "StepRuntime":
        """The rules a stored fingerprint was fitted under; a key it lacks reads the value of before the key."""
        kw = {name: metadata.get(key, old) for key, (name, old) in _METADATA_KEYS.items()}
        for name in ("relu6_clone", "foreach", "native_conv", "momentum", "grads_to_none", "update_as_run",
                     "decoupled_decay"):
            if not isinstance(kw[name], bool):
                raise ValueError(f"{name} is not true or false")
        if kw["weight_decay"] is not None and not isinstance(kw["weight_decay"], bool):
            raise ValueError("weight_decay is not true, false or null")
        prices = kw.pop("op_prices")
        kw["op_prices"] = prices_key(check_prices({"ops": prices}, "op_prices")) if prices else ()
        if not isinstance(kw["loss"], str):
            raise ValueError("loss is not a name")
        ws = kw["blas_workspace"]
        if not (isinstance(ws, (list, tuple)) and len(ws) == 2 and all(type(n) is int and n >= 0 for n in ws)):
            raise ValueError("blas_workspace_bytes is not two byte counts")
        kw["blas_workspace"] = tuple(ws)
        return cls(optimizer=str(kw.pop("optimizer")), dropout_mask_bytes=int(kw.pop("dropout_mask_bytes")), **kw)
