"""A network's ops between the convolutions at the prices its device charges: milliseconds per sample.

The profile measures, on a CPU, what one element of each kind of op costs forward and backward, by the side of
its map (``profiling/op_prices.py``; ``op_prices.json`` beside the device's measurements). Here a description's
nodes of those kinds are priced: an op's elements (its output's; a global pool's or a mean's input; a windowed pool's
output times its window) times the price at the measured side nearest its map's (sqrt of height x width; a token layout
``[tokens, width]`` by its tokens, a flat vector as side 1); a pad at its mode's price; an op the table has no price
of (one the profile does not measure, or measured since the table was) at another op's (:data:`_PRICED_AS`). Ops of
other kinds (convolutions, linear layers, attention, views) cost nothing here: the step-time forms' other terms
carry them. An op that runs no backward (a dead branch's, ``y = self.b(x)`` never used) is priced as a live one, on
purpose: torch runs its forward alone, yet on this project's 2-core CPU (one thread, batch norms, ReLUs, sigmoids, max
pools and branches of them, sides 16-32, batches 2-32, steps of a conv and a head with and without the op, dead or
live) a dead op added 0.6-1.1 of what the same op added live (median about 0.9), where the profile's calls put its
forward at 0.1-0.35 of its price (0.8 for a max pool): a forward share would underprice it three times over.
Pure Python (no torch).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

from perf4sight.errors import UserError
from perf4sight.features.formulas import numel
from perf4sight.ir.schema import NetworkDescription, Node

__all__ = ["priced_ms_per_sample", "priced_as", "check_prices", "load_op_prices", "prices_key", "prices_table"]

#: Ops whose price is per element of their input (a global pool, a mean or a variance over dims; a GLU, which reads
#: two elements an output element: silu's price an input element, 2.4-3.1 ns an output element against silu's 1.6 on
#: this 2-core CPU, forward and backward), and those per output element times the window.
_PER_INPUT = frozenset({"adaptiveavgpool2d", "adaptivemaxpool2d", "glu",
                        "logsumexp",
                        "mean", "var"})
_PER_WINDOW = frozenset({"maxpool2d", "avgpool2d", "fractional_maxpool2d"})
#: Ops priced as another op where the table has no price of their own: those the profile does not measure
#: (leaky_relu and hardtanh: the same kernels as relu and relu6; prelu, dropout2d and log_softmax, below), and those
#: measured from 2026-11-29 (``op_prices.PRICED_OPS``), which a table measured before lacks: priced as then (a
#: reflect or replicate pad as a constant pad where the table has one: a copy forward and one back).
_PRICED_AS = {"leaky_relu": "relu", "hardtanh": "relu6",
              "elu": "sigmoid", "softplus": "sigmoid", "mish": "silu", "softmax": "sigmoid",
              "groupnorm": "batchnorm2d", "instancenorm": "batchnorm2d",
              "pad_reflect": "pad", "pad_replicate": "pad", "pad": "relu", "pixel_shuffle": "relu",
              "pixel_unshuffle": "relu",
              # a circular pad, measured on a 2-core CPU forward and backward at sides 8-32: 4-8 ns an element against
              # a reflection's 1.5-4.3 and a constant pad's 0.8-3.4 (its backward clones and adds output-sized
              # gradients per side): priced as a reflection where the table lacks it
              "pad_circular": "pad_reflect",
              # measured on a 2-core CPU, forward and backward at sides 8-32 (ns an element): PReLU 6.0-7.4 (its
              # backward writes the slopes' gradient per element, then sums it) against batch norm's 4.7, relu's 0.5,
              # dropout's 8.3-8.9; Dropout2d, a multiply by a noise per channel, 1.05-1.19 against mul's 0.85-1.23;
              # a log-softmax 1.5-2.1 against silu's 1.27 and sigmoid's 0.84-0.89
              "prelu": "batchnorm2d", "dropout2d": "mul", "log_softmax": "silu",
              # torch runs them as its elu kernel of a scale or an input scale: an elu's price
              "selu": "elu", "celu": "elu",
              # not measured: a norm of seven kernels forward and fifteen back, priced as a batch norm
              "local_response_norm": "batchnorm2d",
              # one elementwise kernel forward, two or three back, as a sigmoid's (one, one)
              "pow": "sigmoid", "exp": "sigmoid", "abs": "sigmoid", "div": "mul",
              "log": "sigmoid",  # not measured: one kernel each way, as exp's
              # not measured: a norm along one dimension, then a division (14 kernels back), as a layer norm's
              "normalize": "layernorm",
              # not measured: a copy of the windows into columns (backward added back), priced as a pad's
              "unfold": "pad",
              "fold": "pad",  # not measured: the columns added onto their windows, as an unfold's copy
              "var": "batchnorm2d",  # a variance: a statistics pass, as a batch norm's first
              # a mean over dims: what torch runs for a global average pool (an adaptive one to 1x1), priced as one
              "mean": "adaptiveavgpool2d",
              # not measured by the profile; timed here once (2-core CPU, one thread, forward and backward, ns an
              # element at sides 16 and 32): a GLU, a half of its input times the sigmoid of the other, silu's work
              # an input element (:data:`_PER_INPUT`); hardshrink 0.6-1.3, softshrink 0.6-1.1 and threshold 0.6-1.2
              # against relu's 0.6-0.9 (one kernel of compares and a select each way); a log-sigmoid, -softplus(-x),
              # 30-34 against softplus's 31-37
              "glu": "silu", "hardshrink": "relu", "softshrink": "relu", "threshold": "relu",
              "log_sigmoid": "softplus",
              # not measured: a fused norm over the last dims, a statistics pass then a normalising one (a layer
              # norm's without the mean), priced as a layer norm
              "rmsnorm": "layernorm",
              # not measured: a copy into the output (a concatenation's of its input with itself), backward a sum
              "repeat": "cat",
              # not measured: one elementwise kernel of two inputs forward (ten back), priced as a product's
              "maximum": "mul", "minimum": "mul",
              # not measured: a copy in another order each way, priced as a pad's
              "flip": "pad", "roll": "pad",
              # not measured: a BiFPN fusion, products and adds of its maps, priced as a product's
              "weighted_sum": "mul",
              # not measured: a random draw per element and a noise tensor written, as a dropout's
              "rrelu": "dropout",
              # not measured: a noise drawn, then a multiply and an add, as a dropout's
              "alpha_dropout": "dropout",
              # not measured: a max pool's compares an output element times the window (:data:`_PER_WINDOW`)
              "fractional_maxpool2d": "maxpool2d",
              # not measured: a multiply and an add of [C] constants broadcast, one multiply back, as a mul's
              "frozen_batchnorm2d": "mul",
              # measured from 2026-11-30: a batch norm by its running statistics (a scale and a shift in one kernel
              # each way, no statistics pass); a table measured before prices it as a mul, its nearest in price
              # (3-5 ns an element at sides 8-32 against a mul's 2.7-3.5 and a batch norm's 5-12 in training)
              "batchnorm2d_eval": "mul",
              # not measured: a max, an exp and a sum along dims an input element (:data:`_PER_INPUT`), as a softmax's
              "logsumexp": "softmax",
              # not measured: a running sum (an add an element) forward, its reverse back, as a flip's copies
              "cumsum": "flip",
              # not measured: a compare, then a value kept or replaced (one kernel each way a branch), as a relu's
              "where": "relu"}


def check_prices(data: Any, where: str) -> dict[str, dict[int, float]]:
    """The ``ops`` table of an ``op_prices.json`` (``{op: {side: ns}}``, sides as ints of 1 or more); ``ValueError``
    naming ``where`` for anything else."""
    ops = data.get("ops") if isinstance(data, dict) else None
    if not isinstance(ops, dict) or not ops:
        raise ValueError(f"{where}: no 'ops' table of prices")
    table: dict[str, dict[int, float]] = {}
    for op, by_side in ops.items():
        try:
            table[str(op)] = {int(s): float(v) for s, v in dict(by_side).items()}
        except (TypeError, ValueError):
            raise ValueError(f"{where}: the prices of '{op}' are not a table of map side -> ns") from None
        if not table[str(op)] or any(not math.isfinite(v) or v < 0 for v in table[str(op)].values()):
            raise ValueError(f"{where}: the prices of '{op}' must be finite and >= 0 ns")
        if any(side < 1 for side in table[str(op)]):  # a price is looked up by the log of the side
            raise ValueError(f"{where}: the prices of '{op}' must be at map sides of 1 or more")
    return table


def load_op_prices(path: Path) -> dict[str, dict[int, float]] | None:
    """The prices table of a device's ``op_prices.json`` at ``path`` (:func:`check_prices`); None where there is no
    such file; ``UserError`` naming the file for one that is not a table of prices."""
    if not path.is_file():
        return None
    try:
        return check_prices(json.loads(path.read_text()), str(path))
    except (OSError, ValueError) as exc:
        raise UserError(f"{exc if str(path) in str(exc) else f'{path}: {exc}'}; delete it and profile the device "
                        "again to measure the prices anew") from None


def prices_key(table: Mapping[str, Mapping[int, float]] | None) -> tuple:
    """``table`` as a hashable, ordered tuple (``StepRuntime.op_prices``); () for none."""
    if not table:
        return ()
    return tuple((op, tuple(sorted((int(s), float(v)) for s, v in table[op].items()))) for op in sorted(table))


def prices_table(op_prices: tuple) -> dict[str, dict[str, float]] | None:
    """:func:`prices_key`'s tuple as ``op_prices.json`` writes its ``ops`` (``{op: {side: ns}}``, sides as text);
    None for none."""
    return {op: {str(s): v for s, v in by_side} for op, by_side in op_prices} if op_prices else None


def _side(node: Node, shape: list[int]) -> float:
    """The side of ``shape``'s map: sqrt(height x width) of ``[C, H, W]`` (a layer norm's ``[H, W, C]``: channels
    last), sqrt(tokens) of ``[tokens, width]``, 1 for a flat vector."""
    if len(shape) == 3:
        return math.sqrt(numel(shape[:-1]) if node.op in ("layernorm", "rmsnorm") else numel(shape[1:]))
    if len(shape) == 2:
        return math.sqrt(shape[0])
    return 1.0


def _price(by_side: tuple[tuple[int, float], ...], side: float) -> float:
    """The price (ns) at the measured side nearest ``side`` on a log scale."""
    return min(by_side, key=lambda sv: abs(math.log2(sv[0]) - math.log2(max(side, 1.0))))[1]


def priced_as(node: Node, table: Mapping[str, Any]) -> str | None:
    """The op of ``table`` whose price ``node``'s elements take: its own (a pad's by its mode: ``pad``,
    ``pad_reflect``, ``pad_replicate``, ``pad_circular``; a batch norm by its running statistics, ``training``
    false: ``batchnorm2d_eval``), else :data:`_PRICED_AS`'s (in turn); None for an op priced at nothing."""
    op = node.op
    if op == "pad" and node.attrs.get("mode", "constant") != "constant":
        op = f"pad_{node.attrs['mode']}"
    if op == "batchnorm2d" and node.attrs.get("training") is False:
        op = "batchnorm2d_eval"
    while op not in table and op in _PRICED_AS:
        op = _PRICED_AS[op]
    return op if op in table else None


def _elements(node: Node, shapes: dict[str, list[int]]) -> tuple[float, list[int]]:
    """(elements priced, the shape whose map sets the price) of ``node``."""
    if node.op in _PER_INPUT:
        shape = shapes[node.inputs[0]]
        return float(numel(shape)), shape
    if node.op in _PER_WINDOW:
        kh, kw = node.attrs.get("kernel_size", [1, 1])
        return float(numel(node.output_shape) * kh * kw), node.output_shape
    return float(numel(node.output_shape)), node.output_shape


def priced_ms_per_sample(desc: NetworkDescription, op_prices: tuple) -> float:
    """Milliseconds per sample of ``desc``'s priced ops (module docstring) at ``op_prices``
    (:func:`prices_key` of a device's table); 0 without prices."""
    if not op_prices:
        return 0.0
    table = dict(op_prices)
    shapes = {n.name: n.output_shape for n in desc.nodes}
    ns = 0.0
    for node in desc.nodes:
        op = priced_as(node, table)
        if op is None:
            continue
        elements, shape = _elements(node, shapes)
        ns += elements * _price(table[op], _side(node, shape))
    return ns * 1e-6
