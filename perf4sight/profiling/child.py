"""One measurement in a fresh process: \
``python -m perf4sight.profiling.child PLAN --network I --batch-size B --result OUT``.

Rebuilds network ``I`` of the plan from its description, trains it on random data for the
plan's warm-up and timed steps (the plan's loss and optimiser) and writes one JSON object
to ``OUT``: the measurement columns (see ``results.COLUMNS``; the optimiser's update is also timed on its own,
inside each step, ``update_ms_median``) plus ``status`` (``ok``, ``oom``
or ``error``), ``message`` and ``stage`` (``setup``, ``build`` or ``step``: where it stopped). A result that cannot be
written ends it with :data:`RESULT_NOT_WRITTEN` (:data:`DISK_FULL` for lack of space) and the reason on stderr, where
that can be written.
Peak RSS is not measured here: the runner reads it with ``os.wait4`` when this process ends.

Imports only torch, the standard library, ``perf4sight.ir.schema``/``to_torch``, ``perf4sight.files`` and
``perf4sight.profiling``. Times in milliseconds, memory in MiB.
"""
import argparse
import contextlib
import errno
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from perf4sight.files import write_atomically
from perf4sight.profiling.plan import load_plan
from perf4sight.profiling.procfs import status_mb

__all__ = ["measure", "one_line", "failure_message", "make_optimizer", "make_target", "loss_function", "main",
           "RESULT_NOT_WRITTEN", "DISK_FULL", "NO_SPACE"]

MESSAGE_CHARS = 300
#: the exit status of a child whose result file could not be written
RESULT_NOT_WRITTEN = 3
#: the exit status of a child whose result file could not be written for lack of space: the runner stops there
DISK_FULL = 4
#: the errnos of a write that found no space left: a full disk, or a quota used up
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def one_line(exc: BaseException, cause: str = "") -> str:
    """``Type: [cause: ]message`` on one line, at most ``MESSAGE_CHARS`` characters."""
    text = " ".join(f"{type(exc).__name__}: {cause + ': ' if cause else ''}{exc}".split())
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."


#: what PyTorch says when batch norm trains on a single value per channel (a 1x1 map of one image)
_ONE_VALUE_PER_CHANNEL = "Expected more than 1 value per channel when training"
#: what PyTorch says of backward where no parameter needs a gradient (every layer frozen: a description's frozen_layers)
_NOTHING_TRAINS = "does not require grad and does not have a grad_fn"


def failure_message(exc: BaseException, batch_size: int) -> str:
    """:func:`one_line` of ``exc``, after a plain-words cause where PyTorch's own message leaves it to guess."""
    if _ONE_VALUE_PER_CHANNEL in str(exc):
        return one_line(exc, f"batch norm over a 1x1 map cannot train on a batch of {batch_size} (give a larger "
                             "input_shape or larger batch sizes)")
    if _NOTHING_TRAINS in str(exc):
        return one_line(exc, "no parameter of the network trains (none, or every one frozen: its description's "
                             "frozen_layers), so a training step has no backward")
    return one_line(exc)


def make_optimizer(plan: Any, parameters: Any) -> Any:
    """The plan's optimiser over ``parameters``: SGD with its ``momentum``, or Adam / AdamW with torch's defaults
    (betas 0.9 and 0.999, eps 1e-8); ``learning_rate`` and ``weight_decay`` are each one's (None: torch's default,
    AdamW's 0.01, the others' 0)."""
    import torch

    decay = {} if plan.weight_decay is None else {"weight_decay": plan.weight_decay}
    if plan.optimizer == "sgd":
        return torch.optim.SGD(parameters, lr=plan.learning_rate, momentum=plan.momentum, **decay)
    return {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[plan.optimizer](parameters, lr=plan.learning_rate,
                                                                                   **decay)


def loss_function(loss: str) -> Any:
    """The ``torch.nn.functional`` function of a plan's ``loss`` (``plan.LOSSES``), each with its mean reduction."""
    import torch.nn.functional as F

    return {"cross_entropy": F.cross_entropy, "mse": F.mse_loss, "l1": F.l1_loss}[loss]


def output_shape(desc: Any, input_shape: List[int]) -> List[int]:
    """The shape of one sample's output (no batch) of the network ``desc`` at ``input_shape``: the description's
    where that is its own input shape, else what a forward pass of one image on the meta device gives (no memory)."""
    if list(input_shape) == list(desc.input_shape):
        return list(desc.node(desc.output).output_shape)
    import torch

    from perf4sight.ir.to_torch import build_module

    with torch.no_grad():
        out = build_module(desc, device="meta")(torch.empty([1] + list(input_shape), device="meta"))
    return list(out.shape[1:])


def make_target(plan: Any, desc: Any, input_shape: List[int], batch_size: int, device: Any) -> Any:
    """What the step's loss compares the output with, made once before the steps: for ``cross_entropy`` int64
    labels of the output's positions at ``input_shape`` (a class per image, or per pixel of an output ``[N, C, H,
    W]``) drawn below the plan's class count, or the output's class scores (its first dimension); for ``mse`` and
    ``l1`` a float32 target ``torch.randn`` of the output's shape, whatever that is: a classifier's target is then a
    float per class score (``[N, classes]``), as an image-to-image network's is a float per output pixel (``[N, C,
    H, W]``)."""
    import torch

    if plan.loss == "cross_entropy":  # a class per position of the output at input_shape (the plan's may differ)
        scores = output_shape(desc, input_shape)
        # below the output's class scores (a hand-edited num_classes above them failed every step)
        num_classes = int(plan.num_classes or (scores[0] if scores else desc.num_classes))
        return torch.randint(0, num_classes, [batch_size] + scores[1:], device=device)
    return torch.randn([batch_size] + output_shape(desc, input_shape), device=device)


def measure(plan_path: Union[str, Path], network_index: int, batch_size: int) -> Dict[str, Any]:
    """Run one (network, batch size) measurement in this process and return its result dict."""
    result: Dict[str, Any] = {"stage": "setup"}
    backend = None
    try:
        plan_path = Path(plan_path)
        plan = load_plan(plan_path)
        from perf4sight.profiling.backends.base import get_backend

        backend = get_backend(plan)
        backend.prepare()
        import torch

        from perf4sight.ir.schema import load_description
        from perf4sight.ir.to_torch import build_module

        result["stage"] = "build"
        desc = load_description(plan.resolve(plan_path.parent, plan.networks[network_index]))
        shape = list(plan.input_shape or desc.input_shape)
        torch.manual_seed(0)
        device = backend.device
        model = build_module(desc).to(device).train()
        optimizer = make_optimizer(plan, model.parameters())
        # after the optimiser: its constructor imports torch._dynamo (~1 s, tens of MiB), a constant
        result["baseline_rss_mb"] = round(status_mb("self", "VmRSS") or 0.0, 2)
        x = torch.randn(batch_size, *shape, device=device)
        y = make_target(plan, desc, shape, batch_size, device)
        loss_fn = loss_function(plan.loss)

        updates = []  # (start, end) marks of each step's optimiser update

        def step() -> None:
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            start = backend.mark()
            optimizer.step()
            updates.append((start, backend.mark()))

        result["stage"] = "step"
        result.update(backend.measure(step, plan.warmup_steps, plan.timed_steps, plan.min_timed_s))
        timed = updates[-int(result["timed_steps"]):]  # the timed steps come last
        result["update_ms_median"] = round(statistics.median(backend.span_ms(a, b) for a, b in timed), 4)
        result["status"] = "ok"
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a row, the sweep goes on
        if isinstance(exc, KeyboardInterrupt):
            raise
        oom = backend is not None and backend.is_oom(exc)
        result.update(status="oom" if oom else "error", message=failure_message(exc, batch_size))
    if backend is not None:
        try:
            result.update(backend.environment())
        except Exception as exc:  # noqa: BLE001 - a missing environment must not hide the measurement
            result.setdefault("message", f"environment unavailable: {one_line(exc)}")
    result["child_hwm_mb"] = round(status_mb("self", "VmHWM") or 0.0, 2)
    return result


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perf4sight.profiling.child",
                                     description=__doc__.splitlines()[0])  # first line: joined with a backslash
    parser.add_argument("plan", help="test plan JSON file")
    parser.add_argument("--network", type=int, required=True, help="index into the plan's networks")
    parser.add_argument("--batch-size", type=int, required=True, help="images per training step")
    parser.add_argument("--result", required=True, help="where to write the result JSON")
    args = parser.parse_args(argv)
    result = measure(args.plan, args.network, args.batch_size)
    try:
        write_atomically(args.result, json.dumps(result), unique=False)  # its runner's file alone
    except OSError as exc:  # e.g. a full disk: the runner reads why from stderr (a file beside it, which may fail too)
        with contextlib.suppress(OSError):
            print("cannot write the result file %s: %s" % (args.result, exc.strerror or exc), file=sys.stderr,
                  flush=True)
        return DISK_FULL if exc.errno in NO_SPACE else RESULT_NOT_WRITTEN
    return 0


if __name__ == "__main__":
    code = main()
    with contextlib.suppress(OSError):  # a full disk: what is left unflushed is lost, the exit status says why
        sys.stdout.flush()
        sys.stderr.flush()
    # Skip interpreter shutdown: tearing torch down pages in ~125 MiB more, which would
    # inflate the peak RSS that the runner reads with os.wait4.
    os._exit(code)
