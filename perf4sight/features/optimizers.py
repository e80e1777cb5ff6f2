"""What the optimiser of a training step costs, per optimiser the profiler can measure (``profiling.plan.OPTIMIZERS``).

Counted per parameter tensor of the single-tensor update (``foreach=False``, what torch runs on a CPU), kernel by
kernel as torch runs it:

- ``sgd`` (momentum): the momentum buffer's ``mul_`` and ``add_`` (the gradient into it) and the parameter's
  ``add_``: 3 kernels moving 8 parameter-sized tensors; 1 state buffer (the momentum). Without momentum (momentum
  0) no buffer and only the parameter's ``add_`` (of the gradient): 1 kernel, 3 tensors.
- ``adam``: the first moment's ``lerp_`` (reads the moment and the gradient, writes the moment), the second's
  ``mul_`` and ``addcmul_``, the denominator's ``sqrt``, ``div`` and ``add_`` (two new parameter-sized tensors)
  and the update's ``addcdiv_``: 7 kernels moving 18 parameter-sized tensors; 2 state buffers (the moments). Its
  step counter (a scalar ``add_`` and an ``item()``, on the host on a GPU too) moves no parameter-sized tensor and
  is not counted.
- ``adamw``: Adam's kernels and the decoupled weight decay's ``mul_`` on the parameter: 8 kernels, 20 tensors.
  With ``weight_decay=0`` torch skips that ``mul_``, in its single-tensor and its ``foreach`` update alike (7
  kernels, 18 tensors, as Adam's; torch 2.14's profiler): ``decoupled_decay`` false. A fingerprint stored before
  the rows' AdamW decay was read counts the ``mul_`` whatever the decay, as it was fitted.
- weight decay, for SGD and Adam: an L2 term added to the gradient first, 1 kernel more and 3 tensors (it reads
  the gradient and the parameter and writes their sum, a new parameter-sized tensor). AdamW's decoupled decay is
  in its own costs.
- gradients kept between steps (torch 1.x's ``zero_grad``, perf4sight's TX2 profiler): their ``zero_()``, 1 kernel
  writing 1 tensor. A ``zero_grad(set_to_none=True)`` (this tool's profiler, torch 2's default) runs none.

A GPU's ``foreach`` update (torch >= 2.0) runs each kernel over many tensors in one launch, yet its kernels stay
counted per tensor: the per-tensor work on the host (the optimiser's loops over its parameters, autograd's gradient
nodes) goes with them, and counting the launches alone read worse on the H100's rows (18.3% held-out step time
against 13.4; docs/accuracy-notes.md).

A fingerprint stored before this count (``as_run`` false) keeps the count it was fitted with: SGD's momentum update
as one kernel of 3 tensors, and a ``zero_()`` in SGD's count (3 kernels, 7 tensors; 2 and 4 without momentum)
whatever the step did.

Pure Python (no torch).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OptimizerCost", "OPTIMIZER_COSTS", "optimizer_cost", "DEFAULT_OPTIMIZER",
           "OPTIMIZER_LABELS", "L2_DECAY", "adds_decay", "PERF4SIGHT_MOMENTUM", "PERF4SIGHT_WEIGHT_DECAY"]

#: What a fingerprint without an ``optimizer`` in its metadata was measured with.
DEFAULT_OPTIMIZER = "sgd"
#: perf4sight's TX2 profiler's SGD, ``torch.optim.SGD(lr=0.1, momentum=0.9, weight_decay=5e-4)``
#: (``profiling/tx2/run_test.py`` in ICIdsl/perf4sight): what its imported rows ran, and the sizes the allocator
#: replay traces where a step has a momentum or a decay (a size changes no event, only whether there is one).
PERF4SIGHT_MOMENTUM = 0.9
PERF4SIGHT_WEIGHT_DECAY = 5e-4


@dataclass(frozen=True)
class OptimizerCost:
    """``state_copies``: parameter-sized buffers the optimiser keeps between steps; ``kernels_per_tensor``: kernels
    its step launches per parameter tensor; ``tensor_passes``: parameter-sized tensors its step reads or writes,
    in all (each 4 bytes an element)."""
    state_copies: int
    kernels_per_tensor: int
    tensor_passes: int


#: The costs without weight decay, SGD's with momentum, the gradients set to None; :func:`optimizer_cost` adjusts them
#: to the update's settings.
OPTIMIZER_COSTS: dict[str, OptimizerCost] = {
    "sgd": OptimizerCost(state_copies=1, kernels_per_tensor=3, tensor_passes=8),
    "adam": OptimizerCost(state_copies=2, kernels_per_tensor=7, tensor_passes=18),
    "adamw": OptimizerCost(state_copies=2, kernels_per_tensor=8, tensor_passes=20),
}


#: Optimisers whose weight decay is an L2 term added to the gradient (a new tensor), not a decoupled in-place one.
L2_DECAY = frozenset({"sgd", "adam"})
#: What the momentum update, the decay's add and the kept gradients' zero_() cost per parameter tensor: (kernels,
#: parameter-sized tensors).
_MOMENTUM_UPDATE = (2, 5)
_DECAY_ADD = (1, 3)
_ZERO_GRAD = (1, 1)
#: AdamW's decoupled decay: the parameter's ``mul_`` in place (read and written), which torch skips at weight decay 0.
_DECOUPLED_DECAY = (1, 2)
#: The count of fingerprints stored before it was done kernel by kernel (:func:`optimizer_cost`'s ``as_run`` false):
#: SGD's with a zero_() and a one-kernel momentum update.
_SGD_BEFORE = OptimizerCost(state_copies=1, kernels_per_tensor=3, tensor_passes=7)
_MOMENTUM_UPDATE_BEFORE = (1, 3)

#: Each optimiser in words, for what a stage prints.
OPTIMIZER_LABELS: dict[str, str] = {"sgd": "SGD with momentum", "adam": "Adam", "adamw": "AdamW"}


def adds_decay(optimizer: str, weight_decay: bool | None = None) -> bool:
    """Whether ``optimizer``'s update adds an L2 weight-decay term: ``weight_decay`` for SGD and Adam (None: the rule
    of before it was told, SGD's with one as perf4sight's recipe, Adam's without), never for AdamW (its decay is
    its own costs')."""
    if optimizer not in L2_DECAY:
        return False
    return optimizer == "sgd" if weight_decay is None else weight_decay


def optimizer_cost(optimizer: str, momentum: bool = True, weight_decay: bool | None = None, grads_kept: bool = False,
                   as_run: bool = True, decoupled_decay: bool = True) -> OptimizerCost:
    """The costs of ``optimizer``; ``ValueError`` naming the known ones for any other. ``momentum``: SGD keeps a
    momentum buffer (momentum > 0; other optimisers ignore it); ``weight_decay``: the update adds an L2 decay term
    (:func:`adds_decay`); ``grads_kept``: the gradients are kept between steps and zeroed in place; ``as_run``
    false: the count of a fingerprint stored before the kernel-by-kernel one (module docstring), which ignores
    ``grads_kept``; ``decoupled_decay`` false: AdamW's update ran without its decay (weight decay 0; the others
    ignore it)."""
    try:
        cost = OPTIMIZER_COSTS[optimizer]
    except KeyError:
        raise ValueError(f"unknown optimizer {optimizer!r} (known: {', '.join(OPTIMIZER_COSTS)})") from None
    if optimizer == "sgd" and not as_run:
        cost = _SGD_BEFORE
    state, kernels, passes = cost.state_copies, cost.kernels_per_tensor, cost.tensor_passes
    if optimizer == "sgd" and not momentum:
        k, p = _MOMENTUM_UPDATE if as_run else _MOMENTUM_UPDATE_BEFORE
        state, kernels, passes = state - 1, kernels - k, passes - p
    if adds_decay(optimizer, weight_decay):
        kernels, passes = kernels + _DECAY_ADD[0], passes + _DECAY_ADD[1]
    if optimizer == "adamw" and not decoupled_decay:
        kernels, passes = kernels - _DECOUPLED_DECAY[0], passes - _DECOUPLED_DECAY[1]
    if as_run and grads_kept:
        kernels, passes = kernels + _ZERO_GRAD[0], passes + _ZERO_GRAD[1]
    return OptimizerCost(state, kernels, passes)
