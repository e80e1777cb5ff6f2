"""The allocation model's loss and backward pass: a cross entropy's (:func:`_loss`) or an MSE's or L1's
(:func:`_regression_loss`) allocations and autograd nodes, the bytes of what the loss compares the output with
(:func:`_target_bytes`), and the backward (:func:`_backward`): the autograd nodes run in reverse creation order, each
allocating its gradients (:func:`_gradients_of`) or handing the incoming one on (:func:`_handoff`), the engine's sums
into filled buffers (their strides: :func:`_summed_strides`), and each parameter's gradient accumulated once all of
its have arrived (:func:`_param_gradient`).
"""
from __future__ import annotations

from math import prod

from perf4sight.features.alloc_strides import _dense, _iterated, _normal, _ordered, _strides, _view
from perf4sight.features.alloc_values import ACCUMULATED, FLOAT, INT64, NotCovered, _edge, _GradFn, _Memory, _Value
from perf4sight.ir.schema import NetworkDescription
from perf4sight.profiling.plan import DEFAULT_LOSS


def _loss(out: _Value, positions: int, mem: _Memory, fns: list[_GradFn]) -> tuple[int, int, int]:
    """Cross entropy of the logits ``out``: a classifier's (``positions`` 0: reshaped to [N, -1], a view) or a class
    score per pixel (2 positions: [N, C, H, W], NLL's 2-D kernels); (logits storage, loss storage, NLL node)."""
    if out.fn is None:
        raise NotCovered("the network's output needs no gradient")
    if positions not in (0, 2):
        raise NotCovered(f"a loss over {positions} positions per class score")
    nll, edge = "nll_loss" if positions == 0 else "nll_loss2d", _edge(out)
    if positions == 0:  # the reshape to [N, -1]
        fns.append(_GradFn([], [edge], [out.nbytes], [None], [0], [None], "view"))
        edge = ("fn", len(fns) - 1)
    logsm = mem.new(out.nbytes, "aten._log_softmax.default", holders=0)
    fns.append(_GradFn([mem.hold(logsm)], [edge], [out.nbytes], ["aten._log_softmax_backward_data.default"], [0],
                       [None]))
    loss = mem.new(FLOAT, f"aten.{nll}_forward.default")
    total_weight = mem.new(FLOAT, f"aten.{nll}_forward.default", holders=0)
    fns.append(_GradFn([mem.hold(logsm), mem.hold(total_weight)], [("fn", len(fns) - 1)], [out.nbytes],
                       [f"aten.{nll}_backward.default"], [0], [None]))
    return out.sid, loss, len(fns) - 1


def _target_bytes(desc: NetworkDescription, b: int, loss_name: str) -> int:
    """Bytes of what the loss compares the output with at batch size ``b``: a cross entropy's int64 labels (one per
    image, or per position), an MSE's or an L1 loss's float32 target of the output's shape."""
    if loss_name == DEFAULT_LOSS:
        return b * prod(desc.label_shape) * INT64
    return b * prod(desc.node(desc.output).output_shape) * FLOAT


def _regression_loss(out: _Value, loss_name: str, mem: _Memory, fns: list[_GradFn]) -> tuple[int, int, int]:
    """An MSE or L1 loss (mean reduction) of the output ``out`` against a float target of its shape, which the caller
    holds; (output storage, loss storage, the loss's root node). MSE is one kernel each way: a 4-byte loss (it keeps
    the output and the target), and the output's gradient. L1 is composite: ``sub`` (kept by ``abs``), ``abs`` (freed
    after the ``mean``), ``mean``; backward, the mean's gradient (``div`` of the seed expanded), ``abs``'s (``sgn`` of
    the kept difference, then ``mul``, the ``sgn`` freed), handed on through the ``sub`` to the output."""
    if out.fn is None:
        raise NotCovered("the network's output needs no gradient")
    edge = _edge(out)
    if loss_name == "mse":
        loss = mem.new(FLOAT, "aten.mse_loss.default")
        fns.append(_GradFn([mem.hold(out.sid)], [edge], [out.nbytes], ["aten.mse_loss_backward.default"], [0],
                           [None]))
        return out.sid, loss, len(fns) - 1
    diff = mem.new(out.nbytes, "aten.sub.Tensor", holders=0)
    fns.append(_GradFn([], [edge], [out.nbytes], [None], [0], [None]))  # sub: the gradient handed on as it is
    fns.append(_GradFn([mem.hold(diff)], [("fn", len(fns) - 1)], [out.nbytes], ["aten.sgn.default"], [0],
                       [out.nbytes], then="aten.mul.Tensor"))
    magnitude = mem.new(out.nbytes, "aten.abs.default")
    loss = mem.new(FLOAT, "aten.mean.default")
    mem.drop(magnitude)
    fns.append(_GradFn([], [("fn", len(fns) - 1)], [out.nbytes], ["aten.div.Scalar"], [0], [None]))
    return out.sid, loss, len(fns) - 1


def _gradients_per_parameter(fns: list[_GradFn]) -> dict[int, int]:
    """Parameter index -> how many backward nodes compute a gradient of it (more than one for a layer called more
    than once: its ``AccumulateGrad`` waits for them all)."""
    counts: dict[int, int] = {}
    for fn in fns:
        for edge in fn.edges:
            if edge is not None and edge[0] == "param":
                counts[edge[1]] = counts.get(edge[1], 0) + 1
    return counts


def _param_gradient(p: int, sid: int, size: int, pending: dict[int, int], buffers: dict[int, int],
                    mem: _Memory) -> list[int]:
    """Deliver ``sid`` (``size`` bytes), a gradient of parameter ``p``, to the parameter's input buffer: the first
    one is kept as it is; a later one (a layer called again) is added to it out of place (the engine's sum, the
    buffer's old value dropped at once), and is returned: the node that computed it drops it with its other
    outputs, after all its gradients are delivered (as the meta trace shows)."""
    pending[p] -= 1
    if p not in buffers:
        buffers[p] = sid
        return []
    old = buffers[p]
    buffers[p] = mem.new(size, "aten.add.Tensor")
    mem.drop(old)
    return [sid]


def _backward(fns: list[_GradFn], root: int, mem: _Memory, freed: set[int] = frozenset()) -> dict[int, int]:
    """Run the backward pass from the loss's node ``root``; parameter index -> its gradient's storage.

    Gradients carry their strides (None: contiguous; :data:`_UNKNOWN` after a sum of two tensors of
    which one is permuted): a view op's backward reshapes its gradient, which copies it where no
    view has the strides; transpose and cat hand on views of it (transposed, sliced).
    One loop over thousands of nodes (a MaxViT's 1,400): the memory's methods bound once, and no list made for a
    node's temporaries, sums or gathered parts where it has none. ``freed``: a dead branch's nodes, freed in the
    forward (alloc_model._DeadBranch): passed over."""
    seed = mem.new(FLOAT, "aten.ones_like.default")
    buffers: dict[int, tuple[int, int, tuple[int, ...] | None]] = {root: (mem.hold(seed), FLOAT, None)}
    grads: dict[int, int] = {}
    pending = _gradients_per_parameter([fn for k, fn in enumerate(fns) if k not in freed])
    buffers_of_params: dict[int, int] = {}  # parameter index -> its gradient so far (a layer called more than once)
    gathered: dict[int, list[int]] = {}  # a split's node -> its parts' gradients after the first (``gathers``)
    new, drop = mem.new, mem.drop
    for k in range(len(fns) - 1, -1, -1):
        if k in freed:
            continue
        entry = buffers.pop(k, None)
        if entry is None:
            raise NotCovered("a node no gradient reaches")
        incoming, _, strides = entry
        fn = fns[k]
        if strides is not None and (strides == _UNKNOWN or (any(fn.kernels) and not fn.any_strides
                                                           and not _ordered(fn.out_shape, strides))):
            raise NotCovered("a gradient with permuted strides")
        edges = fn.edges
        if len(edges) == 1 and fn.kernels[0] is None and edges[0] is not None and edges[0][0] == "fn" and \
                fn.full[0] is None and not (fn.saved or fn.scratch or fn.before or fn.around or fn.gathers) and \
                k not in gathered:  # the incoming gradient handed on to one node (a view, a permute): as below
            sid, out_strides = _handoff(fn, 0, incoming, strides, mem)
            drop(incoming)
            target = edges[0][1]
            if target not in buffers:
                buffers[target] = (sid, fn.sizes[0], out_strides)
            elif fns[target].gathers:
                gathered.setdefault(target, []).append(sid)
            else:
                old, size, old_strides = buffers[target]
                buffers[target] = (new(size, "aten.add.Tensor"), size,
                                   _summed_strides(fn.shapes[0] if fn.shapes else (), old_strides, out_strides))
                drop(old)
                drop(sid)
            continue
        outs = _gradients_of(fn, incoming, strides, mem)
        if fn.scratch:
            temporaries = [new(size, kernel) for size, kernel in fn.scratch]
            for sid in temporaries:
                drop(sid)
        full = fn.full
        if full.count(None) != len(full):
            for j in sorted(outs):  # broadcast inputs: their gradients summed down to their shapes (input order)
                if full[j] is not None:
                    summed = new(fn.sizes[j], fn.then)
                    drop(outs[j][0])
                    outs[j] = (summed, None)
        drop(incoming)
        parts = gathered.pop(k, ())
        if len(parts) + 1 != max(fn.gathers, 1):
            raise NotCovered("a split whose parts' gradients do not all arrive")
        for sid in parts:
            drop(sid)
        for s in fn.saved:
            drop(s)
        accumulated, released = [], []
        for j, edge in enumerate(fn.edges):
            if edge is None:
                continue
            kind, target = edge
            sid, out_strides = outs[j]
            if kind == "param":
                restrided = bool(fn.restride and fn.restride[j])
                if restrided and pending[target] > 1:
                    raise NotCovered("a gradient of a shared parameter with other strides than the parameter's")
                released += _param_gradient(target, sid, fn.sizes[j], pending, buffers_of_params, mem)
                if pending[target] == 0:
                    accumulated.append((target, buffers_of_params.pop(target), restrided, fn.sizes[j]))
            elif target not in buffers:
                buffers[target] = (sid, fn.sizes[j], out_strides)
            elif fns[target].gathers:
                gathered.setdefault(target, []).append(sid)
            else:
                old, size, old_strides = buffers[target]
                shape = fn.shapes[j] if fn.shapes else ()
                buffers[target] = (new(size, "aten.add.Tensor"), size, _summed_strides(shape, old_strides,
                                                                                     out_strides))
                drop(old)
                released.append(sid)
        for sid in released:  # the node's gradients added into a buffer: its outputs, dropped when it is done
            drop(sid)
        for p, sid, restrided, size in accumulated:  # AccumulateGrad nodes run first (highest priority)
            if restrided:  # copied into a tensor of the parameter's strides, which becomes the .grad
                kept = new(size, "aten.new_empty_strided.default")
                drop(sid)
                sid = kept
            mem.events.append((ACCUMULATED, p, 0, ""))
            grads[p] = sid
    if buffers:
        raise NotCovered("gradients left undelivered")
    mem.drop(seed)
    return grads


def _gradients_of(fn: _GradFn, incoming: int, strides: tuple[int, ...] | None,
                  mem: _Memory) -> dict[int, tuple[int, tuple[int, ...] | None]]:
    """The gradients node ``fn`` computes from ``incoming`` (of ``strides``), in its order: input index -> (storage,
    its strides); its temporaries allocated and freed around them (``before``: until the first gradient; ``around``:
    each gradient's own, :func:`_temporaries`)."""
    new, drop = mem.new, mem.drop
    outs: dict[int, tuple[int, tuple[int, ...] | None]] = {}
    ahead = [new(size, kernel) for size, kernel in fn.before] if fn.before else None
    edges, kernels, around = fn.edges, fn.kernels, fn.around
    for j in fn.order:
        if edges[j] is None:
            continue
        temporaries = _temporaries(around[j], new, drop) if around else None
        if kernels[j]:
            outs[j] = (new(fn.full[j] or fn.sizes[j], kernels[j]), _laid_out(fn, j, strides) if fn.layouts else None)
        else:
            outs[j] = _handoff(fn, j, incoming, strides, mem)
        if temporaries:
            for sid in reversed(temporaries):
                drop(sid)
        if ahead:
            for sid in ahead:
                drop(sid)
            ahead = None
    return outs


def _temporaries(spec: list[tuple], new, drop) -> list[int]:
    """The temporaries of one gradient (:attr:`_GradFn.around`'s entries: ``(bytes, aten op)``, or ``(bytes, aten op,
    at)``: freed right after the ``at``-th of them is allocated, counted from 0, where the frees of one point run last
    first) allocated in order; back come those left, which its kernel outlives."""
    alive: list[tuple[int, int | None]] = []
    for i, entry in enumerate(spec):
        alive.append((new(entry[0], entry[1]), entry[2] if len(entry) > 2 else None))
        if any(at == i for _, at in alive):
            for sid, at in reversed(alive):
                if at == i:
                    drop(sid)
            alive = [t for t in alive if t[1] != i]
    return [sid for sid, _ in alive]


#: The strides of a gradient summed from a permuted one: not followed (a view of it is not covered).
_UNKNOWN: tuple[int, ...] = ()


def _summed_strides(shape: tuple[int, ...], old: tuple[int, ...] | None,
                    new: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """The strides of the engine's sum ``old + new`` of two gradients of ``shape``: contiguous where both lie in
    their own order, as TensorIterator lays out two dense ones, else :data:`_UNKNOWN`."""
    if _ordered(shape, old) and _ordered(shape, new):
        return None
    if _UNKNOWN in (old, new) or not (_dense(shape, old) and _dense(shape, new)):
        return _UNKNOWN
    return _iterated(shape, [old, new])


def _laid_out(fn: _GradFn, j: int, incoming: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """The strides of gradient ``j`` that ``fn``'s kernel allocates (:attr:`_GradFn.layouts`), the incoming gradient's
    strides being ``incoming``."""
    layout = fn.layouts[j] if fn.layouts else None
    if layout is None:
        return None
    kind, strides = layout
    if kind == "fixed":
        return strides
    if kind == "like" and incoming is not None and 1 in fn.out_shape:
        raise NotCovered("a layer norm's gradient laid out by strides along dimensions of size 1")
    if not _dense(fn.out_shape, incoming):
        raise NotCovered("an elementwise kernel of a gradient that is not dense")
    return _iterated(fn.out_shape, [incoming] + list(strides))


def _handoff(fn: _GradFn, j: int, incoming: int, strides: tuple[int, ...] | None,
             mem: _Memory) -> tuple[int, tuple[int, ...] | None]:
    """Gradient ``j`` of a node without kernels: the incoming one (``strides``) or a view of it, or a
    copy where a view op's reshape cannot be a view; (storage, its strides)."""
    if fn.handoff == "" or (fn.handoff == "view" and strides is None):  # as it is, or a view of it
        return mem.hold(incoming), strides
    if strides is not None and not fn.shapes:
        raise NotCovered("a strided gradient through the loss")
    if fn.handoff == "slices":
        return mem.hold(incoming), strides or _strides(fn.out_shape)
    if fn.handoff == "permute":  # permuted back: dimension perm[i] of the input is dimension i of the output
        back = [0] * len(fn.perm)
        for i, d in enumerate(fn.perm):
            back[d] = (strides or _strides(fn.out_shape))[i]
        return mem.hold(incoming), _normal(fn.shapes[j], tuple(back))
    if fn.handoff == "transpose":
        d0, d1 = fn.dims
        swapped = list(strides or _strides(fn.out_shape))
        swapped[d0], swapped[d1] = swapped[d1], swapped[d0]
        return mem.hold(incoming), _normal(fn.shapes[j], tuple(swapped))
    viewable, out = _view(fn.out_shape, strides, fn.shapes[j])
    if viewable:
        return mem.hold(incoming), out
    return mem.new(fn.sizes[j], "aten.clone.default"), None
