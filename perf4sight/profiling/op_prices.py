"""What a device charges for the ops between the convolutions: ``python -m perf4sight.profiling.op_prices OUT
[--threads N]``.

A CPU's step time is not its convolutions' alone: batch norm, activations, additions, pooling and concatenation
take 25-60% of it, at prices per element up to fifty times apart by kind of op (a ReLU about 1 ns per element
forward and backward on this project's CPU, a batch norm 5, a 3x3 max pool 50 per output element) that grow as the
map shrinks (a batch norm on 2x2 maps costs twice what it does on 32x32). A fit over a few network families cannot
tell those prices apart, as the families mix the kinds in similar shares (docs/accuracy-notes.md, "CPU: the ops
between the convolutions priced on the device"). So a profile can measure them (``[profile] op_prices``): each kind
alone, forward and backward, on maps of side 1 to 32 (:data:`SIDES`), at :data:`CHANNELS` channels and
:data:`PIXELS` pixels (batch x height x width) per call, and writes the price of one element in nanoseconds: of the
output for most kinds, of the input for a global pool, of the output times the window for a pool with a window
(:data:`PER`). ``features/priced_ops.py`` sums a network's prices.

Measured in the process that writes them, with the plan's thread count; the sum that backs the output (``.sum()``
and its backward) is timed alone and taken off. Imports only torch and the standard library (Python >= 3.6).
"""
import argparse
import json
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from perf4sight.files import write_atomically

__all__ = ["PRICED_OPS", "SIDES", "CHANNELS", "PIXELS", "PER", "POOL_WINDOW", "FORMAT_VERSION", "measure_prices",
           "main"]

#: The description ops priced (``ir.schema`` op names).
PRICED_OPS = ("batchnorm2d", "layernorm", "relu", "relu6", "gelu", "silu", "sigmoid", "hardswish", "hardsigmoid",
              "tanh", "add", "mul", "cat", "dropout", "maxpool2d", "avgpool2d", "adaptiveavgpool2d",
              "adaptivemaxpool2d")
#: Map sides measured (a node's map is priced at the nearest one).
SIDES = (1, 2, 4, 8, 16, 32)
CHANNELS = 64
PIXELS = 4096
#: What one priced element is, where it is not an output element.
PER = {"adaptiveavgpool2d": "input", "adaptivemaxpool2d": "input", "maxpool2d": "output x window",
       "avgpool2d": "output x window"}
#: The window of the pools measured (kernel 3, stride 2, padding 1, as ResNet's stem pool).
POOL_WINDOW = 3
FORMAT_VERSION = 1
_REPEATS, _WARMUP = 3, 1


def _median_s(run: Callable[[], None]) -> float:
    for _ in range(_WARMUP):
        run()
    times = []
    for _ in range(_REPEATS):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return sorted(times)[_REPEATS // 2]


def _call(op: str, side: int) -> "tuple":
    """(a function running ``op`` forward and backward on maps of ``side``, the elements it is priced by, the
    elements of its output)."""
    import torch
    import torch.nn as nn

    batch = max(1, PIXELS // (side * side))
    shape = (batch, CHANNELS, side, side)

    def leaf(*dims: int) -> Any:
        return torch.randn(*dims, requires_grad=True)

    if op in ("maxpool2d", "avgpool2d"):
        x = leaf(batch, CHANNELS, 2 * side, 2 * side)  # stride 2: an output map of ``side``
        pool = (nn.MaxPool2d if op == "maxpool2d" else nn.AvgPool2d)(POOL_WINDOW, 2, POOL_WINDOW // 2)
        out = batch * CHANNELS * side * side
        return (lambda: pool(x).sum().backward()), out * POOL_WINDOW ** 2, out
    if op in ("add", "mul", "cat"):
        a, b = leaf(*shape), leaf(*shape)
        run = {"add": lambda: (a + b).sum().backward(), "mul": lambda: (a * b).sum().backward(),
               "cat": lambda: torch.cat([a, b], 1).sum().backward()}[op]
        out = a.numel() * (2 if op == "cat" else 1)
        return run, out, out
    x = leaf(*shape)
    modules = {"batchnorm2d": lambda: nn.BatchNorm2d(CHANNELS), "relu": nn.ReLU, "relu6": nn.ReLU6, "gelu": nn.GELU,
               "silu": nn.SiLU, "sigmoid": nn.Sigmoid, "hardswish": nn.Hardswish, "hardsigmoid": nn.Hardsigmoid,
               "tanh": nn.Tanh, "dropout": lambda: nn.Dropout(0.2),
               "adaptiveavgpool2d": lambda: nn.AdaptiveAvgPool2d(1),
               "adaptivemaxpool2d": lambda: nn.AdaptiveMaxPool2d(1)}
    if op == "layernorm":  # over the channels, as a ConvNeXt block's (channels last)
        x = leaf(batch, side, side, CHANNELS)
        module = nn.LayerNorm(CHANNELS)
    else:
        module = modules[op]()
    out = batch * CHANNELS if op.startswith("adaptive") else x.numel()
    return (lambda: module(x).sum().backward()), x.numel(), out


def _sum_only(elements: int, cache: Dict[int, float]) -> float:
    """Seconds a ``.sum()`` of ``elements`` and its backward take: what every measured call adds to its op."""
    import torch

    if elements not in cache:
        z = torch.randn(elements, requires_grad=True)
        cache[elements] = _median_s(lambda: z.sum().backward())
    return cache[elements]


def measure_prices(threads: int = 0, ops: Optional[List[str]] = None) -> Dict[str, Any]:
    """The prices (module docstring) of ``ops`` (default :data:`PRICED_OPS`) on this machine's CPU with ``threads``
    torch threads (0: torch's default): ``{"ops": {op: {side: ns per element}}, ...}``, JSON-able."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    prices = {}  # type: Dict[str, Dict[str, float]]
    sums = {}  # type: Dict[int, float]
    for op in ops or PRICED_OPS:
        prices[op] = {}
        for side in SIDES:
            run, elements, out_elements = _call(op, side)
            seconds = max(_median_s(run) - _sum_only(out_elements, sums), 0.0)
            prices[op][str(side)] = round(seconds / elements * 1e9, 4)
    return {"format_version": FORMAT_VERSION, "unit": "ns per element, forward and backward",
            "per": PER, "channels": CHANNELS, "pixels": PIXELS, "pool_window": POOL_WINDOW,
            "threads": torch.get_num_threads(), "torch_version": torch.__version__, "ops": prices}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("output", help="the JSON file to write")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args(argv)
    data = measure_prices(args.threads)
    write_atomically(Path(args.output), (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
