"""Record the tensor allocations and frees of a training step without a GPU (meta device).

The network is rebuilt from its description on the ``meta`` device (shapes and dtypes, no
data, no compute) and put through the profiler's training loop: per step ``zero_grad`` (by default the
grads kept and zeroed, the PyTorch 1.x default perf4sight's profiler ran; ``set_to_none``: freed, as this tool's
profiler does), forward, cross-entropy, backward, and by default an SGD step with momentum and weight decay
(single-tensor loop; other settings and optimisers as :func:`record_events` says). A ``TorchDispatchMode`` sees
every aten op: an
output whose storage was not seen before is an allocation (its bytes); a weak reference on the
storage reports its free. Weights, buffers and the input batch are allocated first. The meta
kernels of batch norm and of same-shape elementwise ops are Python decompositions that cost most
of a trace; they are replaced by empty outputs of the same shapes (:func:`_shape_only_kernels`),
which records the same events about five times faster.

The SGD step's own events (per parameter: the weight-decay sum, on the first step the momentum
buffer, then the sum's free; with ``foreach`` and a decay, every sum at once) are written down directly instead of
dispatched, as are Adam's and AdamW's (on the
first step both moments of every parameter; then, in the ``foreach`` update a CUDA build runs, a square root of
every second moment, freed together after the update, or in the single-tensor update a CPU runs, per parameter a
square root and its quotient, the root freed at once and the quotient once the next one is made), and ``zero_grad``
(in place, no events) is skipped. Only the first step is dispatched: a later step repeats its
events under new ids, except that each parameter gradient is freed where it is accumulated (a
hook marks the spot) instead of becoming the ``.grad``. Both shortcuts are checked against the
real optimizer and every step run, in the tests.

Two steps are traced: the first creates the gradients and momentum buffers; the second is the
steady state. Activations scale with the batch size and weights do not, so the run is traced once
at a prime batch size (:data:`PROBE_BATCH`): an event whose bytes that prime divides is taken as
``per_sample * batch``, any other as a constant (a weight-sized tensor would need a dimension that
is a multiple of 65521 to be mistaken). Tracing at two batch sizes and solving every size as
``const + per_sample * batch`` gives the same :class:`AllocTrace` at twice the cost (checked in the
tests); either way a trace serves every batch size through the replay.

Where :mod:`~perf4sight.features.alloc_model` covers every op of a description (the default
``method="auto"``), the first step's events are written down from the description instead of
recorded, 15-20 times faster; the later steps, the SGD events and the split into per-sample and
constant sizes are shared. Dropout, attention and mish's backward run as a CUDA build runs them
(:func:`_fused_dropout`, :func:`_fused_attention`, :func:`_fused_mish`).
"""
from __future__ import annotations

import hashlib
import json
import threading
import weakref
from operator import itemgetter
from typing import Any, Callable, Iterator

import numpy as np

from perf4sight.errors import UserError
from perf4sight.features.alloc_model import ACCUMULATED, Event, NotCovered, step_events
from perf4sight.features.allocator import ALLOC, FREE, RUN_PEAK, STEP, AllocTrace, TracedUpdate, collector_paused
from perf4sight.features.optimizers import PERF4SIGHT_MOMENTUM, PERF4SIGHT_WEIGHT_DECAY, adds_decay, optimizer_cost
from perf4sight.ir.schema import FROZEN_LAYERS, FROZEN_PARAMETERS, NetworkDescription
from perf4sight.profiling.child import loss_function
from perf4sight.profiling.plan import DEFAULT_LOSS

__all__ = ["record_events", "record_runs", "simulate", "attach_simulation", "ensure_simulation", "PROBE_BATCH",
           "clear_cache", "BLAS_KERNELS", "with_blas_workspaces"]

#: The batch size of the single traced run: a prime, so that it divides exactly the batch-scaled sizes.
PROBE_BATCH = 65521
_CACHE: dict[str, AllocTrace] = {}
#: The kernels of an event that run on cuBLAS on a GPU (a linear layer's ``addmm`` or ``mm``, a batched product's
#: ``bmm``), and of those the one that runs on cuBLASLt (``addmm`` with its bias: ``gemm_and_bias``).
BLAS_KERNELS = frozenset({"aten.addmm.default", "aten.mm.default", "aten.bmm.default", "aten.baddbmm.default"})
_LT_KERNELS = frozenset({"aten.addmm.default"})
#: The backward's seed: the events after it run on autograd's device thread, which takes a cuBLAS handle of its own.
_BACKWARD_SEED = "aten.ones_like.default"
_LOCK = threading.Lock()


def clear_cache() -> None:
    """Forget every simulated network (the per-description cache)."""
    _CACHE.clear()


def _key(desc: NetworkDescription) -> str:
    """The cache key of ``desc``'s simulation: its content, attributes in any order, and its frozen parameters, as JSON
    (a description holds no cycle: the encoder's check for one, a third of the encoding's time, is left out; the text
    is the same)."""
    nodes = [[n.name, n.op, n.inputs, n.attrs, n.output_shape] for n in desc.nodes]
    parts = [desc.input_shape, desc.num_classes, desc.output, nodes]
    frozen = [desc.extra.get(k) for k in (FROZEN_LAYERS, FROZEN_PARAMETERS)]
    if any(frozen):  # its frozen parameters: no gradients, no optimiser state (a key of its own)
        parts.append(frozen)
    blob = json.dumps(parts, sort_keys=True, default=str, check_circular=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def record_events(desc: NetworkDescription, batch_size: int, steps: int = 2, lr: float = 0.1,
                  momentum: float = PERF4SIGHT_MOMENTUM, weight_decay: float | None = None, inplace_relu: bool = True,
                  fast: bool = True, method: str = "auto", relu6_clone: bool = False,
                  optimizer: str = "sgd", foreach: bool | None = None,
                  set_to_none: bool = False, loss: str = DEFAULT_LOSS) -> list[Event]:
    """Allocation events (kind, storage id, bytes, aten op) of ``steps`` training steps at ``batch_size``.

    ``inplace_relu``: run ReLU/ReLU6 in place as torchvision models do (falls back to out-of-place
    where autograd forbids it). ``fast``: skip the meta kernels of :func:`_shape_only_kernels`, skip
    ``zero_grad`` and write the SGD step's events down instead of running it (same events, several
    times faster). ``method``: "trace" runs the step on the meta device; "model" writes the events
    down from the description (:mod:`~perf4sight.features.alloc_model`, same events, no torch);
    "auto" uses the model where it covers every op (with ``fast`` and ``inplace_relu``), else the
    trace. ``relu6_clone``: an in-place ReLU6 keeps a clone of its input, as PyTorch >= 1.10 does (False:
    its result, as PyTorch <= 1.9 did; see :func:`_inplace_activations`). ``optimizer``: ``sgd`` (with ``lr``,
    ``momentum`` and ``weight_decay``), or ``adam`` (with ``weight_decay``) / ``adamw`` (torch's defaults),
    ``foreach`` (a GPU's update) or not (a CPU's; None: SGD's single-tensor loop, as perf4sight's torch ran it, and
    the others' ``foreach``); ``weight_decay`` None: perf4sight's for SGD (``optimizers.PERF4SIGHT_WEIGHT_DECAY``),
    none for Adam. ``set_to_none``: each step starts with ``zero_grad(set_to_none=True)``, which frees the gradients
    (torch 2.0's default, this tool's profiler), where older torch zeroed them in place and kept them (perf4sight's).
    ``loss``: the step's loss (``profiling.plan.LOSSES``): a cross entropy against int64 labels, or an MSE or L1 loss
    against a float target of the output's shape.
    Raises :class:`UserError` if an op cannot run on the meta device.
    """
    return record_runs(desc, (batch_size,), steps, lr, momentum, weight_decay, inplace_relu, fast, method,
                       relu6_clone, optimizer, foreach, set_to_none, loss)[0]


def record_runs(desc: NetworkDescription, batch_sizes: tuple[int, ...], steps: int = 2, lr: float = 0.1,
                momentum: float = PERF4SIGHT_MOMENTUM, weight_decay: float | None = None, inplace_relu: bool = True,
                fast: bool = True, method: str = "auto", relu6_clone: bool = False,
                optimizer: str = "sgd", foreach: bool | None = None,
                set_to_none: bool = False, loss: str = DEFAULT_LOSS, *,
                model_only: bool = False) -> list[list[Event]] | None:
    """:func:`record_events` at each of ``batch_sizes``, one fresh run each (no gradients, no momentum)
    on one model built once. ``model_only``: None where the allocation model does not write the step down (``method``
    "trace", or a pattern it does not cover), in place of the trace's events: :func:`simulate` keeps the collector
    paused from the model's events until they are arrays, and traces with the collector as its caller has it."""
    if method not in ("auto", "trace", "model"):
        raise ValueError(f"record_runs: method must be auto, trace or model, not {method!r}")
    optimizer_cost(optimizer)  # a ValueError naming the known ones
    step = _OptimizerStep(optimizer, lr, momentum, weight_decay, foreach, set_to_none)
    if method != "trace" and fast and inplace_relu:
        try:
            with collector_paused():
                return [_modelled(desc, b, steps, step, relu6_clone, loss) for b in batch_sizes]
        except NotCovered as exc:
            if method == "model":
                raise UserError(f"{desc.name}: the allocation model does not cover {exc}") from None
    elif method == "model":
        raise UserError("the allocation model needs fast=True and inplace_relu=True")
    if model_only:
        return None
    from perf4sight.ir.from_torch import stderr_kept_on_success

    try:
        with stderr_kept_on_success():  # fx's GraphModule prints the traceback of a failing call
            return _record(desc, batch_sizes, steps, step, inplace_relu, fast, relu6_clone, loss)
    except RuntimeError as exc:
        if inplace_relu and "inplace" in str(exc).lower():
            return _record(desc, batch_sizes, steps, step, False, fast, relu6_clone, loss)
        message = (f"{desc.name}: its training step at input shape {list(desc.input_shape)} cannot be traced on the "
                   f"meta device at batch size {', '.join(map(str, batch_sizes))} ({exc})")
        raise UserError(message.splitlines()[0]) from None


def _modelled(desc: NetworkDescription, batch_size: int, steps: int, step: "_OptimizerStep",
              relu6_clone: bool = False, loss: str = DEFAULT_LOSS) -> list[Event]:
    """:func:`record_events` with the first step written down by the allocation model (raises NotCovered)."""
    st = step_events(desc, batch_size, relu6_clone, loss)
    sizes = [n if p in st.grads else None for p, n in enumerate(st.param_bytes)]  # a dead branch's: no gradient
    return _assemble_steps(st.setup, st.body, st.tail, dict(st.grads), sizes, steps, st.new_id, step)


def _record(desc: NetworkDescription, batch_sizes: tuple[int, ...], steps: int, step: "_OptimizerStep",
            inplace_relu: bool, fast: bool, relu6_clone: bool = False,
            loss: str = DEFAULT_LOSS) -> list[list[Event]]:
    from perf4sight.ir.to_torch import build_module

    model = build_module(desc, device="meta")
    # torch.nn.utils.weight_norm's (and spectral_norm's) hook frees the weight it made a step before at the next
    # forward: a step derived from the first (which freed none: the one made at registration is on the host, or
    # the parameter's) would keep every one
    fast = fast and not any("hook" in (n.attrs.get("weight_norm"), n.attrs.get("spectral_norm")) for n in desc.nodes)
    _fused_dropout(model)
    _fused_attention(model)
    _fused_mish(model)
    _fused_rms_norm(model)
    if inplace_relu:
        _inplace_activations(model, relu6_clone)
    shortcuts = {**_cuda_outputs(), **(_shape_only_kernels() if fast else {})}
    runs = []
    for b in batch_sizes:
        for p in model.parameters():
            p.grad = None
        runs.append(_trace(model, desc, b, steps, step, shortcuts, fast, loss))
    return runs


def _trace(model: Any, desc: NetworkDescription, batch_size: int, steps: int, step: "_OptimizerStep",
           shortcuts: dict[Any, Any], fast: bool, loss_name: str = DEFAULT_LOSS) -> list[Event]:
    """One run of ``steps`` training steps of the meta ``model`` with a fresh optimizer and ``loss_name``; its
    events.

    ``fast``: only the first step runs; the later ones are derived from it (:func:`_later_steps`)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    events: list[Event] = []
    ids: dict[int, int] = {}  # StorageImpl address -> id while alive
    counter = [0]
    lock = threading.Lock()
    closed = [False]  # frees after the run (weights, grads dying later) are not part of it

    def record(event: Event) -> None:
        with lock:
            events.append(event)

    def new_id() -> int:
        with lock:
            counter[0] += 1
            return counter[0]

    def on_free(cdata: int) -> None:
        with lock:
            sid = ids.pop(cdata, None)
            if closed[0]:
                return
            if sid is not None:
                events.append((FREE, sid, 0, ""))

    def see(t: Any, op: str) -> None:
        if t.device.type != "meta":  # an optimiser's step counters live on the host, not on the device
            return
        st = t.untyped_storage()
        cdata = st._cdata
        with lock:
            if cdata in ids:
                return
            counter[0] += 1
            ids[cdata] = counter[0]
            events.append((ALLOC, counter[0], int(st.nbytes()), op))
        weakref.finalize(st, on_free, cdata)

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            short = shortcuts.get(func)
            out = short(*args, **(kwargs or {})) if short is not None else None
            if out is None:
                out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    see(t, str(func))
            return out

    for t in _moved_tensors(model):
        see(t, "setup")
    x = torch.empty(batch_size, *desc.input_shape, device="meta")
    y = _target(desc, batch_size, loss_name)
    see(x, "input")
    see(y, "labels")
    params = list(model.parameters())

    if not fast:  # the reference: every step run, the real optimizer
        opt = step.make(params)
        with Recorder():
            for _ in range(steps):
                record((STEP, 0, 0, "step"))
                opt.zero_grad(set_to_none=step.set_to_none)
                out = model(x)
                loss = _loss(out, y, loss_name)
                loss.backward()
                opt.step()
                del out, loss
        with lock:
            closed[0] = True
            return list(events)

    # fast: the first step, with a mark wherever a parameter's gradient is accumulated (a frozen one, which a
    # description's frozen_layers or frozen_parameters rebuild, gets none: torch refuses it a hook)
    hooks = [p.register_post_accumulate_grad_hook(lambda _p, i=i: record((ACCUMULATED, i, 0, "")))
             for i, p in enumerate(params) if p.requires_grad]
    with Recorder():
        begin = len(events)
        out = model(x)
        loss = _loss(out, y, loss_name)
        loss.backward()
        for h in hooks:
            h.remove()
        grads = {i: ids.get(p.grad.untyped_storage()._cdata) for i, p in enumerate(params) if p.grad is not None}
        with lock:
            backward_end = len(events)
        del out, loss
    with lock:
        closed[0] = True
        first = list(events)
    param_bytes = [p.numel() * p.element_size() if p.grad is not None else None for p in params]
    return _assemble_steps(first[:begin], first[begin:backward_end], first[backward_end:], grads, param_bytes, steps,
                           new_id, step)


def _moved_tensors(module: Any) -> Iterator[Any]:
    """``module``'s parameters and buffers in the order ``module.to(device)`` allocates them on the device, as the
    profiler moves the model it built on the host (``Module._apply``: each submodule's first, then the module's own
    parameters, then its own buffers), where ``parameters()`` lists a module's own before its submodules' and
    ``buffers()`` every buffer after every parameter. A tensor met again (a shared layer's) allocates nothing."""
    for child in module.children():
        yield from _moved_tensors(child)
    yield from (p for p in module._parameters.values() if p is not None)
    yield from (b for b in module._buffers.values() if b is not None)


def _target(desc: NetworkDescription, batch_size: int, loss_name: str) -> Any:
    """What the child's loss compares the output with, on the meta device: int64 labels for a cross entropy (one per
    image, or per position), a float target of the output's shape for an MSE or L1 loss."""
    import torch

    if loss_name == DEFAULT_LOSS:
        return torch.zeros([batch_size] + desc.label_shape, dtype=torch.long, device="meta")
    return torch.empty([batch_size] + list(desc.node(desc.output).output_shape), device="meta")


def _loss(out: Any, y: Any, loss_name: str = DEFAULT_LOSS) -> Any:
    """The step's loss as the profiler's child computes it (``profiling.child.loss_function``): cross entropy of a
    classifier's scores (read as ``[N, -1]``: a view, as the modelled events have it) or, with labels per position,
    of each position's scores; an MSE or L1 loss (mean reduction) of the output against its float target."""
    if loss_name == DEFAULT_LOSS and y.dim() == 1:
        out = out.reshape(out.shape[0], -1)
    return loss_function(loss_name)(out, y)


class _OptimizerStep:
    """What ``opt.step()`` allocates and frees on the device, per optimiser: :meth:`events` writes them down,
    :meth:`make` builds the real one (the reference the tests compare them with). SGD runs one parameter at a time
    unless it has weight decay and ``foreach`` (without decay both updates allocate the same: the first step's
    momentum buffers); weight decay is an L2 term for SGD and Adam (a new tensor per parameter), AdamW's own in-place
    one for AdamW."""

    def __init__(self, optimizer: str, lr: float, momentum: float, weight_decay: float | None,
                 foreach: bool | None = None, set_to_none: bool = False):
        if weight_decay is None:  # the rule of before the rows recorded it (optimizers.adds_decay)
            weight_decay = PERF4SIGHT_WEIGHT_DECAY if adds_decay(optimizer) else 0.0
        self.optimizer, self.lr, self.momentum, self.weight_decay = optimizer, lr, momentum, weight_decay
        self.foreach = optimizer != "sgd" if foreach is None else foreach
        self.set_to_none = set_to_none  # zero_grad frees the gradients (a property of the loop, kept with the update)

    @classmethod
    def of(cls, kw: dict[str, Any]) -> "_OptimizerStep":
        """The step :func:`simulate` traces with keywords ``kw`` (``StepRuntime.traced_update``'s)."""
        return cls(kw.get("optimizer", "sgd"), 0.1, kw.get("momentum", PERF4SIGHT_MOMENTUM), kw.get("weight_decay"),
                   kw.get("foreach"), kw.get("set_to_none", False))

    @property
    def decays(self) -> bool:
        """Whether the update adds an L2 weight-decay term (``optimizers.adds_decay``)."""
        return adds_decay(self.optimizer, bool(self.weight_decay))

    def settings(self) -> TracedUpdate:
        """What of these settings changes the events, each None where it changes nothing (SGD's foreach without
        weight decay, momentum other than SGD's)."""
        sgd = self.optimizer == "sgd"
        return TracedUpdate(self.optimizer, None if sgd and not self.weight_decay else self.foreach,
                            bool(self.momentum) if sgd else None, self.decays, self.set_to_none)

    def make(self, params: list[Any]) -> Any:
        """The real optimiser with these settings (AdamW with torch's default weight decay)."""
        import torch
        if self.optimizer == "sgd":
            return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay,
                                   foreach=self.foreach and bool(self.weight_decay))
        if self.optimizer == "adam":
            return torch.optim.Adam(params, lr=self.lr, weight_decay=self.weight_decay, foreach=self.foreach)
        return torch.optim.AdamW(params, lr=self.lr, foreach=self.foreach)

    def events(self, param_bytes: list[int | None], first: bool, new_id: Callable[[], int]) -> list[Event]:
        """The step's events; ``param_bytes``: per parameter, None where it has no gradient; ``first``: the first
        step, which makes the optimiser's state."""
        sizes = [n for n in param_bytes if n is not None]
        decay = self.decays
        if self.optimizer == "sgd":
            return self._sgd_events(sizes, first, decay, new_id)
        out: list[Event] = []
        if first:  # Adam, AdamW: both moments, then the square roots of the second ones
            out += [(ALLOC, new_id(), n, "aten.zeros_like.default") for n in sizes for _ in range(2)]
        if self.foreach:  # all at once: the decayed gradients, freed after the moments' update; the roots after it
            decayed = [new_id() for _ in sizes] if decay else []
            out += [(ALLOC, i, n, "aten._foreach_add.List") for i, n in zip(decayed, sizes)]
            out += [(FREE, i, 0, "") for i in decayed]
            roots = [new_id() for _ in sizes]
            out += [(ALLOC, i, n, "aten._foreach_sqrt.default") for i, n in zip(roots, sizes)]
            return out + [(FREE, i, 0, "") for i in reversed(roots)]
        kept = held = 0  # one parameter at a time: its decayed gradient and its denominator held until the next
        for n in sizes:
            if held:
                out.append((FREE, held, 0, ""))
            held = new_id() if decay else 0
            if decay:
                out.append((ALLOC, held, n, "aten.add.Tensor"))  # grad + weight_decay * param
            root, quotient = new_id(), new_id()
            out += [(ALLOC, root, n, "aten.sqrt.default"), (ALLOC, quotient, n, "aten.div.Tensor"),
                    (FREE, root, 0, "")] + ([(FREE, kept, 0, "")] if kept else [])
            kept = quotient
        return out + [(FREE, i, 0, "") for i in (kept, held) if i]

    def _sgd_events(self, sizes: list[int], first: bool, decay: bool, new_id: Callable[[], int]) -> list[Event]:
        out: list[Event] = []
        buffers = self.momentum and first
        if decay and self.foreach:  # every decayed gradient at once; the first step's buffers are clones of them
            decayed = [new_id() for _ in sizes]
            out += [(ALLOC, i, n, "aten._foreach_add.List") for i, n in zip(decayed, sizes)]
            out += [(ALLOC, new_id(), n, "aten.clone.default") for n in sizes] if buffers else []
            return out + [(FREE, i, 0, "") for i in decayed]
        for nbytes in sizes:  # single-tensor loop
            held = new_id() if decay else 0
            if decay:
                out.append((ALLOC, held, nbytes, "aten.add.Tensor"))  # grad + weight_decay * param
            if buffers:
                out.append((ALLOC, new_id(), nbytes, "aten.clone.default"))  # the momentum buffer
            if decay:
                out.append((FREE, held, 0, ""))
        return out


def _assemble_steps(setup: list[Event], body: list[Event], tail: list[Event], grads: dict[int, int | None],
                    param_bytes: list[int | None], steps: int, new_id: Callable[[], int],
                    step: _OptimizerStep) -> list[Event]:
    """The events of a run of ``steps`` steps from its first step: ``setup`` (weights, buffers, batch),
    the first step's forward and backward (``body``, with :data:`ACCUMULATED` marks), what followed its
    optimizer step (``tail``); ``grads``: parameter -> id of its ``.grad``; ``param_bytes``: per
    parameter, None where it has no gradient. The optimiser's own events are written down (``step``)."""
    first = setup + [(STEP, 0, 0, "step")] + body + step.events(param_bytes, True, new_id) + tail
    later = _later_steps(body, tail, grads, steps - 1, new_id, lambda: step.events(param_bytes, False, new_id),
                         step.set_to_none)
    return [e for e in first if e[0] != ACCUMULATED] + later


#: The op by which AccumulateGrad copies a gradient into a tensor of its parameter's strides (the ``.grad``).
_RESTRIDED = "aten.new_empty_strided.default"


def _later_steps(body: list[Event], tail: list[Event], grads: dict[int, int | None], count: int,
                 new_id: Any, optimizer: Any, set_to_none: bool = False) -> list[Event]:
    """The events of ``count`` steps after the first, derived from the first step's forward and backward
    (``body``, with :data:`ACCUMULATED` marks) and what followed its optimizer (``tail``).

    A later step allocates and frees the same tensors in the same order (new ids), except that each
    parameter gradient it computes is added into the existing ``.grad`` and freed right there (at
    the mark), where the first step kept it as the ``.grad`` (``grads``: parameter -> its id); and
    its optimizer makes no momentum buffers (``optimizer()`` gives those events). A gradient whose strides were not
    its parameter's was copied into a new tensor of the parameter's strides (``new_empty_strided``, a ConvNeXt
    weight's) to become the ``.grad``; a later step adds it into the ``.grad`` instead: no copy, the gradient freed
    where the first step freed it. With ``set_to_none`` the step starts by freeing every ``.grad``
    (``zero_grad(set_to_none=True)``) and keeps the gradients it computes, as the first step did. Checked against
    running every step in ``tests/test_allocator.py``."""
    out: list[Event] = []
    first = [g for g in grads.values() if g is not None]  # each parameter's .grad, as the first step made it
    copies = set() if set_to_none else {t for kind, t, _, op in body
                                        if kind == ALLOC and op == _RESTRIDED and t in set(first)}
    held = first  # the .grads a step starts with
    for _ in range(count):
        out.append((STEP, 0, 0, "step"))
        renamed: dict[int, int] = {}
        if set_to_none:
            out.extend((FREE, g, 0, "") for g in held)

        def copy(events: list[Event]) -> None:
            for kind, t, size, op in events:
                if t in copies and kind != ACCUMULATED:
                    continue  # no copy: the gradient is added into the .grad, and freed where the first step freed it
                if kind == ALLOC:
                    renamed[t] = new_id()
                    out.append((ALLOC, renamed[t], size, op))
                elif kind == FREE:
                    out.append((FREE, renamed.get(t, t), 0, ""))
                elif kind == ACCUMULATED and grads.get(t) is not None and not set_to_none and grads[t] not in copies:
                    g = grads[t]
                    out.append((FREE, renamed.get(g, g), 0, ""))

        copy(body)
        out.extend(optimizer())
        copy(tail)
        held = [renamed.get(g, g) for g in first]  # this step's gradients (kept as the .grads only with set_to_none)
    return out


def _shape_only_kernels() -> dict[Any, Any]:
    """Stand-ins for the meta kernels that cost most of a trace (Python decompositions of batch norm,
    in-place clamps, same-shape elementwise ops): each returns empty outputs with the shapes, dtypes
    and strides the meta kernel would give, or None to run the meta kernel. On the meta device
    there are no values, and the recorder sees only an op's outputs, so the events are the same
    (checked against the full kernels in tests/test_allocator.py)."""
    import torch
    aten = torch.ops.aten

    def dense(x):  # noqa: ANN001, ANN202 - every element once, in the standard or channels-last order
        return x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last)

    def like(x, dtype=None):  # noqa: ANN001, ANN202 - empty_like of a dense tensor (empty_like is slow on meta)
        return torch.empty_strided(x.shape, x.stride(), dtype=dtype or x.dtype, device=x.device)

    def vector(x, n):  # noqa: ANN001, ANN202
        return torch.empty((n,), dtype=x.dtype, device=x.device)

    def bn_forward(x, weight, bias, running_mean, running_var, training, momentum, eps):  # noqa: ANN001, ANN202
        if not training or x.dim() < 2 or not dense(x):
            return None
        return like(x), vector(x, x.shape[1]), vector(x, x.shape[1])

    def bn_backward(grad, x, weight, running_mean, running_var,  # noqa: ANN001, ANN202
                    save_mean, save_invstd, train, eps, mask):  # noqa: ANN001
        if not train or x.dim() < 2 or grad.shape != x.shape or grad.stride() != x.stride() or not dense(x):
            return None
        c = x.shape[1]
        return like(x) if mask[0] else None, vector(x, c) if mask[1] else None, vector(x, c) if mask[2] else None

    def in_place(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        others = [a for a in args if isinstance(a, torch.Tensor)]
        if any(a.shape != self.shape or a.dtype != self.dtype for a in others):
            return None  # broadcasting or type checks: leave them to the meta kernel
        return self

    def same_shape(dtype: Any = None):  # noqa: ANN202
        def kernel(a, b, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            if not isinstance(a, torch.Tensor) or not dense(a):
                return None
            if isinstance(b, torch.Tensor) and (b.shape != a.shape or b.dtype != a.dtype or b.stride() != a.stride()):
                return None
            return like(a, dtype)
        return kernel

    return {aten.native_batch_norm.default: bn_forward, aten.native_batch_norm_backward.default: bn_backward,
            aten.clamp_.default: in_place, aten.add_.Tensor: in_place, aten.mul_.Tensor: in_place,
            aten.add.Tensor: same_shape(), aten.mul.Tensor: same_shape(), aten.bitwise_and.Tensor: same_shape(),
            aten.threshold_backward.default: same_shape(), aten.hardtanh_backward.default: same_shape(),
            aten.mish_backward.default: same_shape(),
            aten.gt.Scalar: same_shape(torch.bool), aten.lt.Scalar: same_shape(torch.bool)}


def _cuda_outputs() -> dict[Any, Any]:
    """Kernels whose outputs on CUDA differ from the meta kernel's (applied in every trace, as
    :func:`_shape_only_kernels`'s stand-ins are): ``log_sigmoid_forward``'s buffer, which its backward keeps, is
    empty on CUDA (measured on torch 2.11), of the input's size on the CPU and the meta device."""
    import torch

    def log_sigmoid_forward(x):  # noqa: ANN001, ANN202
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device), x.new_empty((0,))

    return {torch.ops.aten.log_sigmoid_forward.default: log_sigmoid_forward}


def _replace_modules(model: Any, replacement: Callable[[Any], Any]) -> None:
    """Each submodule of ``model`` (the root aside) for which ``replacement`` gives a module, replaced by that one
    (None: kept as it is)."""
    for name, m in list(model.named_modules()):
        new = replacement(m) if name else None
        if new is not None:
            model.set_submodule(name, new)


def _fused_dropout(model: Any) -> None:
    """Dropout as a CUDA build runs it: one fused kernel making the output and a one-byte mask, which
    its backward keeps (on the CPU and the meta device PyTorch instead multiplies by a float noise
    tensor, four bytes per element)."""
    import torch
    from torch import nn

    class _FusedDropout(nn.Module):
        def __init__(self, p: float):
            super().__init__()
            self.p = p

        def forward(self, x):  # noqa: ANN001, ANN202
            return torch.native_dropout(x, self.p, self.training)[0]

    _replace_modules(model, lambda m: _FusedDropout(m.p) if isinstance(m, nn.Dropout) and 0 < m.p < 1 else None)


def _fused_attention(model: Any) -> None:
    """Self-attention as a CUDA build of torch >= 2 runs it in 32-bit floats: ``scaled_dot_product_attention`` picks
    the memory-efficient kernel (flash attention takes 16-bit floats only), which keeps a log-sum-exp per head and
    token (the tokens padded to 32) for its backward instead of the heads' ``tokens x tokens`` weights. On the meta
    device torch takes the math path, so each attention layer's ``nn.MultiheadAttention`` calls that kernel
    instead while it runs (the analytic estimate keeps the same tensors: ``formulas.py``)."""
    import torch
    from torch import nn
    from torch.nn import functional

    from perf4sight.ir.to_torch import SelfAttention

    def efficient(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,  # noqa: ANN001, ANN202
                  scale=None, enable_gqa=False):  # noqa: ANN001
        keep = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        return torch.ops.aten._scaled_dot_product_efficient_attention(query, key, value, attn_mask, keep, dropout_p,
                                                                       is_causal, scale=scale)[0]

    class _FusedSelfAttention(nn.Module):
        def __init__(self, inner: SelfAttention):
            super().__init__()
            self.inner = inner

        def forward(self, x):  # noqa: ANN001, ANN202
            plain = functional.scaled_dot_product_attention
            functional.scaled_dot_product_attention = efficient  # what multi_head_attention_forward calls
            try:
                return self.inner(x)
            finally:
                functional.scaled_dot_product_attention = plain

    _replace_modules(model, lambda m: _FusedSelfAttention(m) if isinstance(m, SelfAttention) else None)


def _fused_mish(model: Any) -> None:
    """Mish as a CUDA build runs it: its backward keeps the input (in place, a clone of the input made first, as
    ``mish_`` does) and runs one ``mish_backward`` kernel, one output. On the meta device that op has no kernel of
    its own: torch runs its decomposition (softplus, tanh, sigmoid, ...), whose temporaries the trace would record;
    called below autograd, the recorder sees the one op (and :func:`_shape_only_kernels` makes its output)."""
    import torch
    from torch import nn

    class _Mish(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, inplace):  # noqa: ANN001, ANN205
            if not inplace:
                ctx.save_for_backward(x)
                return torch.ops.aten.mish(x)
            ctx.save_for_backward(x.clone())
            ctx.mark_dirty(x)
            return torch.ops.aten.mish_(x)

        @staticmethod
        def backward(ctx, grad):  # noqa: ANN001, ANN205
            (x,) = ctx.saved_tensors
            with torch._C._AutoDispatchBelowAutograd():  # mish_backward itself, not its decomposition
                return torch.ops.aten.mish_backward(grad, x), None

    class _FusedMish(nn.Module):
        def __init__(self, inplace: bool):
            super().__init__()
            self.inplace = inplace

        def forward(self, x):  # noqa: ANN001, ANN202
            return _Mish.apply(x, self.inplace)

    _replace_modules(model, lambda m: _FusedMish(m.inplace) if isinstance(m, nn.Mish) else None)


def _fused_rms_norm(model: Any) -> None:
    """RMS norm as a CUDA build of torch >= 2.8 runs it: ``rms_norm`` calls the fused ``_fused_rms_norm`` kernel,
    whose outputs are the result and a 1/rms per normalised row and whose backward (``_fused_rms_norm_backward``, one
    op) keeps the input and that 1/rms and makes the input's and the weight's gradients. On the CPU and the meta
    device torch instead runs it op by op (a square, a mean, an add, an rsqrt and one or two multiplies), keeping the
    normalised tensor too where it has a weight; called below autograd, the recorder sees the one op. A CUDA build
    runs the norm of a channels-last map op by op too (rms_norm's fallback), which the stand-in leaves to torch."""
    import torch
    from torch import nn
    from torch._prims_common import suggest_memory_format

    class _RMSNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, shape, eps):  # noqa: ANN001, ANN205
            with torch._C._AutoDispatchBelowAutograd():
                out, rstd = torch.ops.aten._fused_rms_norm(x, shape, weight, eps)
            ctx.save_for_backward(x, rstd, weight)
            ctx.shape = shape
            return out

        @staticmethod
        def backward(ctx, grad):  # noqa: ANN001, ANN205
            x, rstd, weight = ctx.saved_tensors
            mask = [ctx.needs_input_grad[0], weight is not None and ctx.needs_input_grad[1]]
            with torch._C._AutoDispatchBelowAutograd():
                grad_x, grad_weight = torch.ops.aten._fused_rms_norm_backward(grad, x, ctx.shape, rstd, weight, mask)
            return grad_x, grad_weight, None, None

    class _FusedRMSNorm(nn.Module):
        def __init__(self, inner: nn.Module):
            super().__init__()
            self.inner = inner

        def forward(self, x):  # noqa: ANN001, ANN202
            if x.dim() in (4, 5) and suggest_memory_format(x) != torch.contiguous_format:
                return self.inner(x)
            return _RMSNorm.apply(x, self.inner.weight, list(self.inner.normalized_shape), self.inner.eps)

    _replace_modules(model, lambda m: _FusedRMSNorm(m) if isinstance(m, nn.RMSNorm) else None)


def _inplace_activations(model: Any, relu6_clone: bool = False) -> None:
    """ReLU in place; ReLU6 in place, and a hardtanh where it runs in place, with a backward that reads the *result*
    (one ``hardtanh_backward`` kernel, one output), as PyTorch 1.9 and older ran them (the TX2 runs did not pay for
    more), or with ``relu6_clone`` as this torch runs them: ``hardtanh_`` keeps a clone of its input (PyTorch >= 1.10,
    pytorch/pytorch#95432)."""
    import torch
    from torch import nn

    class _ClampInplace(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, low, high):  # noqa: ANN001, ANN205
            x.clamp_(low, high)
            ctx.mark_dirty(x)
            ctx.save_for_backward(x)
            ctx.bounds = (low, high)
            return x

        @staticmethod
        def backward(ctx, grad):  # noqa: ANN001, ANN205
            (res,) = ctx.saved_tensors
            return torch.ops.aten.hardtanh_backward(grad, res, *ctx.bounds), None, None

    class _HardtanhInplace(nn.Module):
        def __init__(self, low: float, high: float):
            super().__init__()
            self.low, self.high = low, high

        def forward(self, x):  # noqa: ANN001, ANN202
            return _ClampInplace.apply(x, self.low, self.high)

    for m in model.modules():
        if isinstance(m, nn.ReLU) or (isinstance(m, nn.ReLU6) and relu6_clone):  # torch's own in-place kernel
            m.inplace = True
    if not relu6_clone:  # ReLU6 (a Hardtanh of [0, 6]) always, any other hardtanh where it runs in place
        _replace_modules(model, lambda m: _HardtanhInplace(float(m.min_val), float(m.max_val))
                         if isinstance(m, nn.Hardtanh) and (isinstance(m, nn.ReLU6) or m.inplace) else None)


def simulate(desc: NetworkDescription, batches: tuple[int, ...] = (PROBE_BATCH,), relu6_clone: bool = False,
             **kw: Any) -> AllocTrace:
    """The training run's :class:`AllocTrace` (cached per description content). Units: bytes.
    ``relu6_clone``: as :func:`record_events`'s (PyTorch >= 1.10); the trace carries it.

    ``batches``: one prime batch size (the default, :data:`PROBE_BATCH`): each size is split into a
    constant or a per-sample part by divisibility; or two batch sizes: the events must match one to
    one (same ops, same order) and each size is solved exactly as ``const + per_sample * batch``.
    """
    key = _key(desc) + json.dumps([list(batches), relu6_clone, kw], sort_keys=True)
    with _LOCK:
        hit = _CACHE.get(key)
    if hit is not None:
        return hit
    traced = {k: v for k, v in kw.items() if k != "blas_workspace"}
    workspace = tuple(kw.get("blas_workspace", (0, 0)))
    with collector_paused():  # the model's events become arrays and are dropped before the collector runs again
        runs = record_runs(desc, tuple(batches), relu6_clone=relu6_clone, model_only=True, **traced)
        trace = None if runs is None else _trace_of(desc, with_blas_workspaces(runs, *workspace), tuple(batches),
                                                    relu6_clone, kw)
        del runs
    if trace is None:  # the meta trace's, run with the collector as the caller has it
        runs = record_runs(desc, tuple(batches), relu6_clone=relu6_clone, **{**traced, "method": "trace"})
        with collector_paused():
            trace = _trace_of(desc, with_blas_workspaces(runs, *workspace), tuple(batches), relu6_clone, kw)
            del runs
    with _LOCK:
        _CACHE[key] = trace
    return trace


def _trace_of(desc: NetworkDescription, runs: list[list[Event]], batches: tuple[int, ...], relu6_clone: bool,
              kw: dict[str, Any]) -> AllocTrace:
    """The :class:`AllocTrace` of the runs :func:`simulate` recorded at ``batches`` (its arguments, ``kw`` its
    keywords): their events as arrays, each size split into a constant and a per-sample part. Units: bytes. Made
    with the collector paused, and the events dropped before it runs again: else, in a process holding torch's
    objects, it ran a dozen young collections here. The allocation model's events are written down under the same
    pause (:func:`simulate`): the young collection that walked every one as the model's pause ended (~0.5 ms of a
    MaxViT's) is gone too. The kinds, tensors and sizes are read into arrays in a pass each (``fromiter``), the op
    names left alone (``zip(*first)`` took 0.9 ms of a MaxViT's 10,500 events, its arrays 0.5 ms more)."""
    first = runs[0]
    if any([(k, t, o) for k, t, _, o in first] != [(k, t, o) for k, t, _, o in e] for e in runs[1:]):
        raise UserError(f"{desc.name}: the traced training step differs between batch sizes {list(batches)}")
    kinds, tensors, s1 = (np.fromiter(map(itemgetter(i), first), dtype=dtype, count=len(first))
                          for i, dtype in ((0, np.int8), (1, np.int64), (2, np.int64)))
    if len(batches) == 1:
        b = batches[0]
        scaled = (s1 % b == 0) & (s1 > 0)
        per, const = np.where(scaled, s1 // b, 0).astype(float), np.where(scaled, 0, s1).astype(float)
    elif len(batches) == 2:
        b1, b2 = batches
        per = (np.fromiter(map(itemgetter(2), runs[1]), dtype=float, count=len(runs[1])) - s1) / (b2 - b1)
        const = s1 - per * b1
    else:
        raise ValueError(f"simulate: one or two batch sizes, got {list(batches)}")
    return AllocTrace(desc.name, kinds, tensors, const, per,
                      relu6_clone=relu6_clone, update=_OptimizerStep.of(kw).settings(),
                      loss=kw.get("loss", DEFAULT_LOSS), blas_workspace=tuple(kw.get("blas_workspace", (0, 0))))


def with_blas_workspaces(runs: list[list[Event]], cublas: int = 0, lt: int = 0) -> list[list[Event]]:
    """The runs' events with the workspaces a GPU's torch (>= 2.0) allocates through its caching allocator for cuBLAS
    and keeps for good: ``cublas`` bytes for each cuBLAS handle (one per thread: the forward's, and autograd's device
    thread in the backward), right after the first output of the first kernel of :data:`BLAS_KERNELS` each thread
    runs, and ``lt`` bytes for cuBLASLt after the first ``addmm``'s (its cuBLAS workspace first), in the first step
    only (``StepRuntime.blas_workspace``; measured in torch's allocation histories on an H200). The runs as they are
    where both are 0 or the step runs no such kernel."""
    if not (cublas or lt):
        return runs
    return [_blas_workspaced(events, cublas, lt) for events in runs]


def _blas_workspaced(events: list[Event], cublas: int, lt: int) -> list[Event]:
    """:func:`with_blas_workspaces` of one run's events."""
    steps = [i for i, e in enumerate(events) if e[0] == STEP]
    if not steps:
        return events
    start, end = steps[0], steps[1] if len(steps) > 1 else len(events)
    new_id = max((e[1] for e in events), default=0) + 1
    out, threads = list(events[:start + 1]), [set(), set()]  # per thread (forward, backward): workspaces made
    backward = False
    for e in events[start + 1:end]:
        out.append(e)
        backward = backward or e[3] == _BACKWARD_SEED
        if e[0] != ALLOC or e[3] not in BLAS_KERNELS:
            continue
        made = threads[backward]
        for kind, nbytes in (("cublas", cublas), ("lt", lt if e[3] in _LT_KERNELS else 0)):
            if nbytes and kind not in made:
                made.add(kind)
                out.append((ALLOC, new_id, nbytes, f"{kind} workspace"))
                new_id += 1
    return out + list(events[end:])


def attach_simulation(nf: Any, desc: NetworkDescription, protocol: str = RUN_PEAK) -> Any:
    """Give a :class:`~perf4sight.features.aggregate.NetworkFeatures` its allocation trace (``nf.sim``),
    replayed as a profiler with ``protocol`` reads memory (:data:`~perf4sight.features.allocator.REPLAY_PROTOCOLS`),
    of a step run under the features' rules (``nf.runtime``: its torch's ReLU6, its optimiser and whether that
    updated all parameters at once). The replay's dropout is CUDA's fused kernel whatever the rules say."""
    rt = nf.runtime
    nf.sim = simulate(desc, relu6_clone=rt.relu6_clone, **rt.traced_update(),
                      **_traced_rules(rt)).with_protocol(protocol)
    return nf


def _traced_rules(runtime: Any) -> dict[str, Any]:
    """:func:`simulate`'s ``loss`` and ``blas_workspace`` keywords for a step under ``runtime``'s rules, each given
    only where it is not simulate's default (a loss other than a cross entropy; a cuBLAS workspace the step allocates
    through the caching allocator), so that the traces of the defaults keep their cache keys."""
    workspace = tuple(runtime.blas_workspace)
    return {**({} if runtime.loss == DEFAULT_LOSS else {"loss": runtime.loss}),
            **({"blas_workspace": workspace} if any(workspace) else {})}


def _replays_runtime(sim: Any, runtime: Any) -> bool:
    """Whether the allocation trace ``sim`` was recorded under the rules of ``runtime`` (a StepRuntime)."""
    return (sim.relu6_clone == runtime.relu6_clone and sim.loss == runtime.loss
            and tuple(sim.blas_workspace) == tuple(runtime.blas_workspace)
            and sim.update == _OptimizerStep.of(runtime.traced_update()).settings())


def ensure_simulation(nfs: Any, terms: Any, protocol: str = RUN_PEAK) -> None:
    """Attach the allocation trace (replayed under ``protocol`` and each features' rules, as
    :func:`attach_simulation`'s) to each NetworkFeatures in ``nfs`` lacking one or carrying another, when ``terms``
    (a model's analytic terms) use a simulated feature; the features must carry their ``description``."""
    from perf4sight.features.aggregate import SIM_FEATURES
    if not set(SIM_FEATURES) & set(terms):
        return
    for nf in nfs:
        if nf.sim is not None and _replays_runtime(nf.sim, nf.runtime):
            nf.sim = nf.sim.with_protocol(protocol)  # itself when the protocol is the same
            continue
        if nf.description is None:
            raise UserError(f"network '{nf.name}': the memory model simulates the allocator "
                            "and needs the description")
        attach_simulation(nf, nf.description, protocol)
