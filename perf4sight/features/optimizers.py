"""What the optimiser of a training step costs, per optimiser the profiler can measure (``profiling.plan.OPTIMIZERS``).

Counted per parameter tensor of the single-tensor update (``foreach=False``, what torch runs on a CPU):

- ``sgd`` (momentum): weight-decay add, momentum update, parameter update and the ``zero_grad`` of older
  torch: 4 kernels moving about 10 parameter-sized tensors; 1 state buffer (the momentum).
- ``adam``: the first moment's ``lerp_`` (reads the moment and the gradient, writes the moment), the second's
  ``mul_`` and ``addcmul_``, the denominator's ``sqrt``, ``div`` and ``add_`` (two new parameter-sized tensors)
  and the update's ``addcdiv_``: 7 kernels moving 18 parameter-sized tensors; 2 state buffers (the moments).
- ``adamw``: Adam's kernels and the decoupled weight decay's ``mul_`` on the parameter: 8 kernels, 20 tensors.

Pure Python (no torch).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OptimizerCost", "OPTIMIZER_COSTS", "optimizer_cost", "DEFAULT_OPTIMIZER", "OPTIMIZER_LABELS"]

#: What a fingerprint without an ``optimizer`` in its metadata was measured with.
DEFAULT_OPTIMIZER = "sgd"


@dataclass(frozen=True)
class OptimizerCost:
    """``state_copies``: parameter-sized buffers the optimiser keeps between steps; ``kernels_per_tensor``: kernels
    its step launches per parameter tensor; ``tensor_passes``: parameter-sized tensors its step reads or writes,
    in all (each 4 bytes an element)."""
    state_copies: int
    kernels_per_tensor: int
    tensor_passes: int


OPTIMIZER_COSTS: dict[str, OptimizerCost] = {
    "sgd": OptimizerCost(state_copies=1, kernels_per_tensor=4, tensor_passes=10),
    "adam": OptimizerCost(state_copies=2, kernels_per_tensor=7, tensor_passes=18),
    "adamw": OptimizerCost(state_copies=2, kernels_per_tensor=8, tensor_passes=20),
}


#: Each optimiser in words, for what a stage prints.
OPTIMIZER_LABELS: dict[str, str] = {"sgd": "SGD with momentum", "adam": "Adam", "adamw": "AdamW"}


def optimizer_cost(optimizer: str) -> OptimizerCost:
    """The costs of ``optimizer``; ``ValueError`` naming the known ones for any other."""
    try:
        return OPTIMIZER_COSTS[optimizer]
    except KeyError:
        raise ValueError(f"unknown optimizer {optimizer!r} (known: {', '.join(OPTIMIZER_COSTS)})") from None
