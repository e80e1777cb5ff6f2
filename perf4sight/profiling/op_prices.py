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
(:data:`PER`). A pad is priced by its mode, named in the op (``pad``: a constant pad, ``pad_reflect``,
``pad_replicate``), as a reflection costs several times a constant pad; a batch norm by its running statistics
(``batchnorm2d_eval``, a module in evaluation) apart from one in training. ``features/priced_ops.py`` sums a
network's prices.

Measured in the process that writes them, with the plan's thread count; the sum that backs the output (``.sum()``
and its backward) is timed alone and taken off. Imports only torch and the standard library (Python >= 3.6).
"""
import argparse
import json
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from perf4sight.files import write_atomically

__all__ = ["PRICED_OPS", "SIDES", "MIN_SIDE", "CHANNELS", "PIXELS", "PER", "GROUPS", "SHUFFLE_FACTOR", "PAD",
           "POOL_WINDOW", "FORMAT_VERSION", "measure_prices", "main"]

#: The description ops priced (``ir.schema`` op names; a pad by its mode: ``pad``, ``pad_reflect``, ``pad_replicate``,
#: ``pad_circular``; a batchnorm2d of ``training`` false: ``batchnorm2d_eval``).
PRICED_OPS = ("batchnorm2d", "layernorm", "relu", "relu6", "gelu", "silu", "sigmoid", "hardswish", "hardsigmoid",
              "tanh", "add", "mul", "cat", "dropout", "maxpool2d", "avgpool2d", "adaptiveavgpool2d",
              "adaptivemaxpool2d",
              # measured from 2026-11-29: each cost 2-15 times the op it was priced as before, on this project's
              # CPU (elu and softplus 10 ns an element against sigmoid's 0.7, mish 9 against silu's 1, a pixel
              # shuffle 4.4 and a reflect or replicate pad 2-5 against relu's 0.3-0.5, a softmax over the channels
              # 1.3-11 against sigmoid's, an instance or group norm 13-30 on maps of side 1-2 against a batch norm's
              # 5-9); a table measured before lacks them and prices them as that op (features/priced_ops.py)
              "elu", "softplus", "mish", "softmax", "instancenorm", "groupnorm", "pad", "pad_reflect",
              "pad_replicate", "pixel_shuffle", "pixel_unshuffle",
              # from 2026-11-30: a circular pad, 4-8 ns an element against a reflection's 1.5-4.3; a batch norm by its
              # running statistics (``training`` false: frozen in a training model), one kernel each way and no
              # statistics pass, 3-5 ns an element at sides 8-32 against a batch norm's 5-12 in training
              "pad_circular", "batchnorm2d_eval")
#: Map sides measured (a node's map is priced at the nearest one). An op is not measured at a side below its
#: :data:`MIN_SIDE`: its table starts at the next side.
SIDES = (1, 2, 4, 8, 16, 32)
#: The smallest output side of the ops that cannot run on smaller maps: an instance norm's statistics need two
#: pixels; a pad (of 1 on each side of an input two pixels smaller) an input of 2, as a reflection's pad must be
#: smaller than its input's side; a pixel shuffle by 2 makes sides of 2 and more.
MIN_SIDE = {"instancenorm": 2, "pad": 4, "pad_reflect": 4, "pad_replicate": 4, "pad_circular": 4, "pixel_shuffle": 2}
CHANNELS = 64
PIXELS = 4096
#: What one priced element is, where it is not an output element.
PER = {"adaptiveavgpool2d": "input", "adaptivemaxpool2d": "input", "maxpool2d": "output x window",
       "avgpool2d": "output x window"}
#: The groups of the group norm measured (32, the group norm paper's and torchvision's heads'), the factor of the
#: pixel shuffles (2, each side), the pads' width (1, each side); a pad's mode is its name's end ("pad": constant).
GROUPS, SHUFFLE_FACTOR, PAD = 32, 2, 1
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
    import torch.nn.functional as F

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
    if op.startswith("pad"):  # an output map of ``side``
        x = leaf(batch, CHANNELS, side - 2 * PAD, side - 2 * PAD)
        mode, out = op[len("pad_"):] or "constant", batch * CHANNELS * side * side
        return (lambda: F.pad(x, [PAD] * 4, mode=mode).sum().backward()), out, out
    if op in ("pixel_shuffle", "pixel_unshuffle"):  # an output of CHANNELS channels and ``side``
        r = SHUFFLE_FACTOR
        if op == "pixel_shuffle":
            x, fn = leaf(batch, CHANNELS * r * r, side // r, side // r), F.pixel_shuffle
        else:
            x, fn = leaf(batch, CHANNELS // (r * r), side * r, side * r), F.pixel_unshuffle
        return (lambda: fn(x, r).sum().backward()), x.numel(), x.numel()
    x = leaf(*shape)
    # (the module's name in torch.nn, its arguments): looked up here, so that a torch without one fails its op alone
    modules = {"batchnorm2d": ("BatchNorm2d", CHANNELS), "relu": ("ReLU",), "relu6": ("ReLU6",), "gelu": ("GELU",),
               "silu": ("SiLU",), "sigmoid": ("Sigmoid",), "hardswish": ("Hardswish",),
               "hardsigmoid": ("Hardsigmoid",), "tanh": ("Tanh",), "dropout": ("Dropout", 0.2),
               "adaptiveavgpool2d": ("AdaptiveAvgPool2d", 1), "adaptivemaxpool2d": ("AdaptiveMaxPool2d", 1),
               "elu": ("ELU",), "softplus": ("Softplus",), "mish": ("Mish",),
               "softmax": ("Softmax", 1),  # over the channels
               "instancenorm": ("InstanceNorm2d", CHANNELS), "groupnorm": ("GroupNorm", GROUPS, CHANNELS)}
    if op == "layernorm":  # over the channels, as a ConvNeXt block's (channels last)
        x = leaf(batch, side, side, CHANNELS)
        module = nn.LayerNorm(CHANNELS)
    elif op == "batchnorm2d_eval":  # by its running statistics; its weight and bias trained
        module = nn.BatchNorm2d(CHANNELS).eval()
    else:
        name, args = modules[op][0], modules[op][1:]
        module = getattr(nn, name)(*args)
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
    torch threads (0: torch's default): ``{"ops": {op: {side: ns per element}}, "unmeasured": [op, ...], ...}``,
    JSON-able. An op this torch lacks (``nn.Mish`` before 1.9, ``F.pixel_unshuffle`` before 1.8) is ``unmeasured``
    (priced as another op, as in a table measured before it was measured), not an error."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    prices = {}  # type: Dict[str, Dict[str, float]]
    unmeasured = []  # type: List[str]
    sums = {}  # type: Dict[int, float]
    for op in ops or PRICED_OPS:
        by_side = {}  # type: Dict[str, float]
        try:
            for side in SIDES:
                if side < MIN_SIDE.get(op, 1):
                    continue
                run, elements, out_elements = _call(op, side)
                seconds = max(_median_s(run) - _sum_only(out_elements, sums), 0.0)
                by_side[str(side)] = round(seconds / elements * 1e9, 4)
        except AttributeError:  # torch has no such module or function
            unmeasured.append(op)
            continue
        prices[op] = by_side
    return {"format_version": FORMAT_VERSION, "unit": "ns per element, forward and backward",
            "per": PER, "channels": CHANNELS, "pixels": PIXELS, "pool_window": POOL_WINDOW, "groups": GROUPS,
            "shuffle_factor": SHUFFLE_FACTOR, "pad": PAD, "threads": torch.get_num_threads(),
            "torch_version": torch.__version__, "ops": prices, "unmeasured": unmeasured}


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
