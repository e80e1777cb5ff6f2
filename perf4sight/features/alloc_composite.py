"""The allocation model's composite ops: a layer that runs several torch ops, each with its autograd node as torch
makes it (:class:`_Composite`: views, copies where a reshape cannot be a view, fresh kernels, matrix products and
linear layers of N-D tensors): a Swin window attention (:func:`_window_attention`: pads, rolls, windows, V2's cosine
scores and bias MLP, a shifted window's mask), a patch merge (:func:`_patch_merge`), an L2 normalisation
(:func:`_l2_normalize`) and a MaxViT group attention (:func:`_group_attention`).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

from perf4sight.features.alloc_forward import _linear_folded, _matmul_folded, _matrix_product
from perf4sight.features.alloc_strides import _iterated, _normal, _strides, _view
from perf4sight.features.alloc_values import (FLOAT, NotCovered, _edge, _fn_edge, _OpContext, _params, _Value,
                                              _window_parameters)
from perf4sight.ir.schema import Node
from perf4sight.ir.shapes import window_pair, windows_of


@dataclass(slots=True)
class _Tensor:
    """A tensor inside a composite op (a window attention, a patch merge): its value (one reference to its storage,
    dropped with :meth:`_Composite.drop` where the Python local dies) and its shape with the batch."""
    value: _Value
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor (float32)."""
        return prod(self.shape) * FLOAT


class _Composite:
    """The torch ops a composite op runs, one by one, each with its autograd node as torch makes it (views, copies
    where a reshape cannot be a view, fresh kernels), on the op's memory and nodes (``ctx``)."""

    def __init__(self, ctx: _OpContext) -> None:
        self.ctx, self.mem = ctx, ctx.mem

    def drop(self, *tensors: _Tensor) -> None:
        """The Python locals of ``tensors`` die: one reference each dropped."""
        for t in tensors:
            self.mem.drop(t.value.sid)

    def node(self, saved: list[int], edges: list, sizes: list[int], kernels: list[str | None], out_shape: tuple,
             shapes: list[tuple], **kw) -> int | None:
        """An autograd node (:meth:`_OpContext.grad_fn`) of output ``out_shape`` and inputs of ``shapes``."""
        return self.ctx.grad_fn(saved, edges, sizes, kernels, out_shape=out_shape, shapes=shapes, **kw)

    def fresh(self, t: _Tensor, kernel: str, shape: tuple[int, ...], backward: str | None, keep: bool = False,
              any_strides: bool = False) -> _Tensor:
        """A one-input kernel ``aten.<kernel>`` that allocates a contiguous output of ``shape``; its backward's
        ``backward`` allocates the input's gradient (None: hands the incoming one on); ``keep``: it keeps its
        result."""
        sid = self.mem.new(prod(shape) * FLOAT, "aten." + kernel)
        fn = self.node([sid] if keep else [], [_edge(t.value)], [t.nbytes], [backward], shape, [t.shape],
                       any_strides=any_strides)
        return _Tensor(_Value(sid, prod(shape) * FLOAT, fn), shape)

    def view(self, t: _Tensor, shape: tuple[int, ...]) -> _Tensor:
        """``reshape``: a view where the strides allow one, else a contiguous copy (``clone``) viewed."""
        v = t.value
        viewable, strides = _view(t.shape, v.strides, shape)
        if viewable:
            fn = self.node([], [_edge(v)], [t.nbytes], [None], shape, [t.shape], handoff="view")
            return _Tensor(_Value(self.mem.hold(v.sid), t.nbytes, fn, view=True, strides=strides), shape)
        sid = self.mem.new(t.nbytes, "aten.clone.default")
        copied = self.node([], [_edge(v)], [t.nbytes], [None], t.shape, [t.shape])
        fn = self.node([], [_fn_edge(copied)], [t.nbytes], [None], shape, [t.shape], handoff="view")
        return _Tensor(_Value(sid, t.nbytes, fn), shape)

    def contiguous(self, t: _Tensor) -> _Tensor:
        """``.contiguous()``: the tensor itself (a new reference) where it is contiguous, else a ``clone``."""
        if t.value.strides is None:
            return _Tensor(_Value(self.mem.hold(t.value.sid), t.nbytes, t.value.fn, view=t.value.view), t.shape)
        sid = self.mem.new(t.nbytes, "aten.clone.default")
        return _Tensor(_Value(sid, t.nbytes, self.node([], [_edge(t.value)], [t.nbytes], [None], t.shape,
                                                       [t.shape])), t.shape)

    def permute(self, t: _Tensor, dims: tuple[int, ...]) -> _Tensor:
        """A permute: a view; its backward permutes the gradient back."""
        strides = t.value.strides or _strides(t.shape)
        shape = tuple(t.shape[d] for d in dims)
        fn = self.node([], [_edge(t.value)], [t.nbytes], [None], shape, [t.shape], handoff="permute", perm=dims)
        return _Tensor(_Value(self.mem.hold(t.value.sid), t.nbytes, fn, view=True,
                              strides=_normal(shape, tuple(strides[d] for d in dims))), shape)

    def transpose(self, t: _Tensor, d0: int, d1: int) -> _Tensor:
        """A transpose of two dimensions: a view."""
        dims = list(range(len(t.shape)))
        dims[d0], dims[d1] = dims[d1], dims[d0]
        strides = t.value.strides or _strides(t.shape)
        shape = tuple(t.shape[d] for d in dims)
        fn = self.node([], [_edge(t.value)], [t.nbytes], [None], shape, [t.shape], handoff="transpose", dims=(d0, d1))
        return _Tensor(_Value(self.mem.hold(t.value.sid), t.nbytes, fn, view=True,
                              strides=_normal(shape, tuple(strides[d] for d in dims))), shape)

    def select(self, t: _Tensor, dim: int) -> _Tensor:
        """One index of dimension ``dim``: a view; its backward writes the gradient into zeros of the input's
        shape (``select_backward``, contiguous whatever the gradient's strides)."""
        strides = list(t.value.strides or _strides(t.shape))
        del strides[dim]
        shape = t.shape[:dim] + t.shape[dim + 1:]
        fn = self.node([], [_edge(t.value)], [t.nbytes], ["aten.select_backward.default"], shape, [t.shape],
                       any_strides=True)
        return _Tensor(_Value(self.mem.hold(t.value.sid), prod(shape) * FLOAT, fn, view=True,
                              strides=_normal(shape, tuple(strides))), shape)

    def narrow(self, t: _Tensor, dim: int, length: int) -> _Tensor:
        """The first ``length`` of dimension ``dim`` (a slice; none where it is the whole dimension): a view; its
        backward writes the gradient into zeros of the input's shape (``slice_backward``)."""
        if length == t.shape[dim]:
            return _Tensor(_Value(self.mem.hold(t.value.sid), t.nbytes, t.value.fn, view=True,
                                  strides=t.value.strides), t.shape)
        strides = t.value.strides or _strides(t.shape)
        shape = t.shape[:dim] + (length,) + t.shape[dim + 1:]
        fn = self.node([], [_edge(t.value)], [t.nbytes], ["aten.slice_backward.default"], shape, [t.shape],
                       any_strides=True)
        return _Tensor(_Value(self.mem.hold(t.value.sid), prod(shape) * FLOAT, fn, view=True,
                              strides=_normal(shape, strides)), shape)

    def every_other(self, t: _Tensor, dim: int, start: int) -> _Tensor:
        """``start::2`` of dimension ``dim`` (a strided slice): a view; its backward writes the gradient into zeros
        of the input's shape (``slice_backward``)."""
        strides = list(t.value.strides or _strides(t.shape))
        strides[dim] *= 2
        shape = t.shape[:dim] + ((t.shape[dim] - start + 1) // 2,) + t.shape[dim + 1:]
        fn = self.node([], [_edge(t.value)], [t.nbytes], ["aten.slice_backward.default"], shape, [t.shape],
                       any_strides=True)
        return _Tensor(_Value(self.mem.hold(t.value.sid), prod(shape) * FLOAT, fn, view=True,
                              strides=_normal(shape, tuple(strides))), shape)

    def scaled(self, t: _Tensor) -> _Tensor:
        """The tensor times a Python number (``mul.Tensor``, laid out as TensorIterator lays out its input); its
        backward scales the incoming gradient (laid out as that)."""
        sid = self.mem.new(t.nbytes, "aten.mul.Tensor")
        fn = self.node([], [_edge(t.value)], [t.nbytes], ["aten.mul.Tensor"], t.shape, [t.shape],
                       layouts=[("iterated", [])], any_strides=True)
        return _Tensor(_Value(sid, t.nbytes, fn, strides=_iterated(t.shape, [t.value.strides])), t.shape)

    def add(self, a: _Tensor, b: _Tensor) -> _Tensor:
        """``a + b`` (contiguous; ``b`` broadcast to ``a``'s shape): the incoming gradient handed on to ``a``, and
        summed down to ``b``'s shape (where ``b`` needs one)."""
        if a.value.strides is not None or b.value.strides is not None:
            raise NotCovered("an add of strided tensors in a composite op")
        sid = self.mem.new(a.nbytes, "aten.add.Tensor")
        full = [None, a.nbytes if b.shape != a.shape else None]
        fn = self.node([], [_edge(a.value), _edge(b.value)], [a.nbytes, b.nbytes], [None, None], a.shape,
                       [a.shape, b.shape], full=full)
        return _Tensor(_Value(sid, a.nbytes, fn), a.shape)

    def matmul(self, a: _Tensor, b: _Tensor) -> _Tensor:
        """``a.matmul(b)`` of two tensors of the same leading dimensions, as the ``matmul`` op runs it
        (:func:`_matrix_product`: each input viewed as 3-D, or copied where no view can, ``bmm``, the result viewed
        back; its backward the second's gradient, then the first's)."""
        shape = (*a.shape[:-1], b.shape[-1])
        name = self.ctx.node.name
        node = Node(name, "matmul", [f"{name}.a", f"{name}.b"], {}, list(shape[1:]))
        sub = _OpContext(node, [a.value, b.value], [list(a.shape[1:]), list(b.shape[1:])], a.shape[0], self.mem,
                         self.ctx.fns, self.ctx.first_param, a.value, prod(shape) * FLOAT, a.shape, shape,
                         self.ctx.relu6_clone, frozen=self.ctx.frozen)
        return _Tensor(_matrix_product(sub), shape)

    def linear(self, t: _Tensor, out_features: int, bias: bool, p0: int,
               bias_edge: tuple[str, int] | None = None) -> _Tensor:
        """``F.linear`` of a contiguous tensor of three or more dimensions (parameters ``p0``, and ``p0 + 1`` the bias
        unless ``bias_edge`` says where its gradient goes): :func:`_linear_folded`, :func:`_matmul_folded`."""
        shape = (*t.shape[:-1], out_features)
        node = Node(self.ctx.node.name, "linear", [self.ctx.node.name],
                    {"in_features": t.shape[-1], "out_features": out_features, "bias": bias}, list(shape[1:]))
        sub = _OpContext(node, [t.value], [list(t.shape[1:])], t.shape[0], self.mem, self.ctx.fns, p0, t.value,
                         prod(shape) * FLOAT, t.shape, shape, self.ctx.relu6_clone, frozen=self.ctx.frozen)
        pbytes, _ = _params(node)
        pedges = [("param", p0 + k) for k in range(len(pbytes))]
        if bias_edge is not None:
            pedges[1] = bias_edge
        folded = _linear_folded if bias else _matmul_folded
        return _Tensor(folded(sub, pedges, pbytes), shape)


def _window_attention(ctx: _OpContext) -> _Value:
    """A Swin window attention as ``to_torch.WindowAttention`` runs it, op by op (:class:`_Composite`): the map
    padded (a copy, even of no padding), rolled where shifted, cut into windows (a copy), the packed projection
    (``addmm`` of the rows), the scores (:func:`_scores`, :func:`_cosine_scores`), each head's bias per relative
    position (:func:`_biased`) and, where shifted, the mask between rolled regions added, a softmax, the values
    weighted (``bmm``), the projection, the windows put back (a copy), rolled back and cropped. Parameters
    (:func:`_window_parameters`): the bias table or Swin V2's logit scale, the packed projection's weight and bias, the
    output projection's, V2's bias MLP's. Dropouts are not covered."""
    a = ctx.node.attrs
    if not a["bias"] or float(a.get("dropout", 0)) or float(a.get("attention_dropout", 0)) or \
            ctx.x.strides is not None:
        raise NotCovered("a window attention with a dropout, without a bias or of a strided input")
    g, p = _Composite(ctx), _window_parameters(ctx.node, ctx.first_param)
    batch, height, width, e = ctx.full_in
    ph, pw, (wh, ww), shift = windows_of(height, width, a["window_size"], a["shift_size"])
    heads, tokens, windows = int(a["num_heads"]), wh * ww, (ph // wh) * (pw // ww)
    rows = batch * windows
    x = g.fresh(_Tensor(ctx.x, ctx.full_in), "constant_pad_nd.default", (batch, ph, pw, e),
                "aten.constant_pad_nd.default")
    if sum(shift) > 0:
        x = _rolled(g, x)
    x = _windows(g, x, (batch, ph // wh, wh, pw // ww, ww, e), (rows, tokens, e))
    bias = _keys_unbiased(g, p["qkv"] + 1, e) if a.get("cosine") else None
    qkv = g.linear(x, 3 * e, True, p["qkv"], None if bias is None else _fn_edge(bias[1]))
    split = g.view(qkv, (rows, tokens, 3, heads, e // heads))
    g.drop(qkv)
    qkv = g.permute(split, (2, 0, 3, 1, 4))
    g.drop(split)
    attn = _cosine_scores(g, qkv, p["logit_scale"]) if a.get("cosine") else _scores(g, qkv)
    v = g.select(qkv, 0)
    attn = _biased(g, attn, p, heads, tokens, (wh, ww), int(a.get("position_bias_mlp", 0)))
    if sum(shift) > 0:
        attn = _masked(g, attn, (batch, windows, heads, tokens, tokens), (ph, pw), (wh, ww))
    weights = g.fresh(attn, "_softmax.default", attn.shape, "aten._softmax_backward_data.default", keep=True)
    g.drop(attn)
    out = g.matmul(weights, v)
    moved = g.transpose(out, 1, 2)
    g.drop(out)
    merged = g.view(moved, (rows, tokens, e))
    g.drop(moved, x)
    projected = g.linear(merged, e, True, p["proj"])
    g.drop(merged)
    y = _windows(g, projected, (batch, ph // wh, pw // ww, wh, ww, e), (batch, ph, pw, e))
    if sum(shift) > 0:
        y = _rolled(g, y)
    cropped = g.narrow(y, 1, height)
    g.drop(y)
    y = g.narrow(cropped, 2, width)
    g.drop(cropped)
    out = g.contiguous(y)
    g.drop(y, qkv, v, weights)
    if bias is not None:
        g.mem.drop(bias[0])
    return out.value


def _group_attention(ctx: _OpContext) -> _Value:
    """A MaxViT attention within groups as ``to_torch.GroupAttention`` runs it, op by op (:class:`_Composite`): the
    packed projection (``addmm`` of the rows) chunked in three (one split node: its backward gathers the three
    gradients into a ``cat``), each part reshaped into heads and permuted (views), the scores
    ``einsum(q, k * scale)`` (the keys scaled, a new tensor laid out as they are; then as a ``matmul``: ``bmm`` of
    copies), the bias per relative position (:func:`_position_bias`) added, a softmax, ``einsum(weights, v)``, the
    heads put back (a copy) and the merging projection. The scores, the bias, the weighted values and the projection
    are freed at the return. Parameters: the bias table (the module's own), the packed projection's weight and bias,
    the merging one's."""
    a = ctx.node.attrs
    if not a.get("bias", True) or ctx.x.strides is not None:
        raise NotCovered("a group attention without a bias or of a strided input")
    g = _Composite(ctx)
    n, groups, tokens, e = ctx.full_in
    heads = int(a["num_heads"])
    wh, ww = window_pair(a["window_size"])
    if wh * ww != tokens:
        raise NotCovered("a group attention whose window is not its groups' tokens")
    qkv = g.linear(_Tensor(ctx.x, ctx.full_in), 3 * e, True, ctx.first_param + 1)
    q, k, v = _chunked(g, qkv, 3)
    g.drop(qkv)
    q, k, v = (_heads_first(g, t, heads) for t in (q, k, v))
    scaled = g.scaled(k)
    keys = g.transpose(scaled, 3, 4)
    scores = g.matmul(q, keys)
    g.drop(keys, scaled)
    bias = _position_bias(g, ("param", ctx.first_param), (2 * wh - 1) * (2 * ww - 1), heads, tokens)
    summed = g.add(scores, bias)
    weights = g.fresh(summed, "_softmax.default", summed.shape, "aten._softmax_backward_data.default", keep=True)
    g.drop(summed)
    out = g.matmul(weights, v)
    moved = g.permute(out, (0, 1, 3, 2, 4))
    merged = g.view(moved, ctx.full_in)
    g.drop(moved)
    projected = g.linear(merged, e, True, ctx.first_param + 3)
    g.drop(merged, q, k, v, scores, bias, weights, out)
    return projected.value


def _chunked(g: _Composite, t: _Tensor, parts: int) -> list[_Tensor]:
    """``torch.chunk(t, parts, dim=-1)``: views of equal parts of the last dimension, of one split node (each part's
    gradient reaches it through a node of its own; :attr:`_GradFn.gathers`), whose backward allocates the input's
    gradient (``cat``)."""
    size = t.shape[-1] // parts
    shape, strides = t.shape[:-1] + (size,), t.value.strides or _strides(t.shape)
    split = g.node([], [_edge(t.value)], [t.nbytes], ["aten.cat.default"], t.shape, [t.shape], any_strides=True,
                   gathers=parts)
    out = []
    for _ in range(parts):
        fn = g.node([], [_fn_edge(split)], [prod(shape) * FLOAT], [None], shape, [shape])
        out.append(_Tensor(_Value(g.mem.hold(t.value.sid), prod(shape) * FLOAT, fn, view=True,
                                  strides=_normal(shape, strides)), shape))
    return out


def _heads_first(g: _Composite, t: _Tensor, heads: int) -> _Tensor:
    """``t.reshape(n, groups, tokens, heads, e / heads).permute(0, 1, 3, 2, 4)`` (the local ``t`` rebound)."""
    n, groups, tokens, e = t.shape
    split = g.view(t, (n, groups, tokens, heads, e // heads))
    g.drop(t)
    out = g.permute(split, (0, 1, 3, 2, 4))
    g.drop(split)
    return out


def _keys_unbiased(g: _Composite, bias: int, e: int) -> tuple[int, int | None]:
    """V2's ``qkv_bias = bias.clone(); qkv_bias[e:2e].zero_()``: a copy of the packed bias (parameter ``bias``), the
    keys' third zeroed in place through a slice, which torch rebases: the copy's node becomes a ``CopySlices`` (its
    backward: ``new_empty_strided`` of the bias, a ``clone`` of the slice's gradient and ``zeros_like`` of it, both
    freed). (The copy's storage, the ``CopySlices`` node.)"""
    sid = g.mem.new(3 * e * FLOAT, "aten.clone.default")
    copied = g.node([], [("param", bias)], [3 * e * FLOAT], [None], (3 * e,), [(3 * e,)])
    rebased = g.node([], [_fn_edge(copied)], [3 * e * FLOAT], ["aten.new_empty_strided.default"], (3 * e,),
                     [(3 * e,)], scratch=[(e * FLOAT, "aten.clone.default"), (e * FLOAT, "aten.zeros_like.default")])
    return sid, rebased


def _normalized(g: _Composite, t: _Tensor, dim: int = -1) -> _Tensor:
    """``F.normalize(t, dim=dim)`` (the last by default): the norm per row along ``dim`` (``linalg_vector_norm``,
    keeping ``t`` and itself; backward ``t / norm`` and ``norm == 0`` freed after ``grad * that``), clamped below
    (``clamp_min``, keeping its input; backward ``scalar_tensor``, ``gt`` and ``where``), expanded (a view; backward
    summed down) and divided by (``div.Tensor``, laid out as ``t``; backward as :func:`_quotient`'s). The gradients'
    strides are not followed past the division (their readers, a select's backward and the engine's sums, take
    any)."""
    axis = dim % len(t.shape)
    mem, rows = g.mem, t.shape[:axis] + (1,) + t.shape[axis + 1:]
    nbytes, count = prod(rows) * FLOAT, prod(rows)
    norm = mem.new(nbytes, "aten.linalg_vector_norm.default")
    norm_fn = g.node([t.value.sid, norm], [_edge(t.value)], [t.nbytes], ["aten.mul.Tensor"], rows, [t.shape],
                     before=[(t.nbytes, "aten.div.Tensor"), (count, "aten.eq.Scalar")], any_strides=True)
    clamped = mem.new(nbytes, "aten.clamp_min.default")
    clamp_fn = g.node([norm], [_fn_edge(norm_fn)], [nbytes], ["aten.where.self"], rows, [rows],
                      before=[(FLOAT, "aten.scalar_tensor.default"), (count, "aten.gt.Scalar")], any_strides=True)
    mem.drop(norm)
    expanded = g.node([], [_fn_edge(clamp_fn)], [nbytes], ["aten.sum.dim_IntList"], t.shape, [rows],
                      any_strides=True)
    sid = mem.new(t.nbytes, "aten.div.Tensor")
    before = [(t.nbytes, "aten.div.Tensor"), (t.nbytes, "aten.div.Tensor"), (t.nbytes, "aten.neg.default")]
    fn = g.node([t.value.sid, clamped], [_edge(t.value), _fn_edge(expanded)], [t.nbytes, t.nbytes],
                ["aten.div.Tensor", "aten.mul.Tensor"], t.shape, [t.shape, t.shape], order=[1, 0], before=before,
                any_strides=True)
    mem.drop(clamped)
    return _Tensor(_Value(sid, t.nbytes, fn, strides=_iterated(t.shape, [t.value.strides])), t.shape)


def _l2_normalize(ctx: _OpContext) -> _Value:
    """The op normalize (torch's F.normalize of p 2) along its dim: :func:`_normalized` of its input."""
    return _normalized(_Composite(ctx), _Tensor(ctx.x, ctx.full_in), int(ctx.node.attrs["dim"])).value


def _cosine_scores(g: _Composite, qkv: _Tensor, logit_scale: int) -> _Tensor:
    """V2's scores: ``normalize(q).matmul(normalize(k).transpose(-2, -1))`` times ``clamp(logit_scale,
    max=log 100).exp()`` (parameter ``logit_scale``, one per head: ``clamp``, freed after the ``exp``, which keeps its
    result; the product keeps both its inputs, its scale's gradient summed down)."""
    mem, heads = g.mem, qkv.shape[2]
    q = g.select(qkv, 0)
    queries = _normalized(g, q)
    k = g.select(qkv, 0)
    keys = _normalized(g, k)
    moved = g.transpose(keys, 2, 3)
    scores = g.matmul(queries, moved)
    g.drop(q, queries, k, keys, moved)
    clamped = mem.new(heads * FLOAT, "aten.clamp.default")
    clamp_fn = g.node([], [("param", logit_scale)], [heads * FLOAT], ["aten.where.self"], (heads, 1, 1),
                      [(heads, 1, 1)], before=[(FLOAT, "aten.scalar_tensor.default"), (heads, "aten.lt.Scalar")])
    scale = mem.new(heads * FLOAT, "aten.exp.default")
    exp_fn = g.node([scale], [_fn_edge(clamp_fn)], [heads * FLOAT], ["aten.mul.Tensor"], (heads, 1, 1),
                    [(heads, 1, 1)])
    mem.drop(clamped)
    sid = mem.new(scores.nbytes, "aten.mul.Tensor")
    fn = g.node([scores.value.sid, scale], [_edge(scores.value), _fn_edge(exp_fn)], [scores.nbytes, heads * FLOAT],
                ["aten.mul.Tensor"] * 2, scores.shape, [scores.shape, (heads, 1, 1)], order=[1, 0],
                full=[None, scores.nbytes])
    mem.drop(scale)
    g.drop(scores)
    return _Tensor(_Value(sid, scores.nbytes, fn), scores.shape)


def _patch_merge(ctx: _OpContext) -> _Value:
    """A Swin patch merge as ``to_torch.PatchMerge`` runs it: the map padded to even sides (a copy, even of no
    padding), each 2 x 2 patch's pixels taken by two strided slices each (views; backward: ``slice_backward`` into
    zeros of the slice's input, then of the map, the four summed by the engine), put side by side (``cat``)."""
    g = _Composite(ctx)
    batch, height, width, c = ctx.full_in
    padded = g.fresh(_Tensor(ctx.x, ctx.full_in), "constant_pad_nd.default",
                     (batch, height + height % 2, width + width % 2, c), "aten.constant_pad_nd.default")
    parts = []
    for row, column in ((0, 0), (1, 0), (0, 1), (1, 1)):
        rows = g.every_other(padded, 1, row)
        parts.append(g.every_other(rows, 2, column))
        g.drop(rows)
    sid = g.mem.new(ctx.nbytes, "aten.cat.default")
    fn = g.node([], [_edge(p.value) for p in parts], [p.nbytes for p in parts], [None] * 4, ctx.full_out,
                [p.shape for p in parts], handoff="slices")
    g.drop(*parts, padded)
    return _Value(sid, ctx.nbytes, fn)


def _rolled(g: _Composite, x: _Tensor) -> _Tensor:
    """``torch.roll`` of ``x`` (the local rebound): a new tensor; its backward rolls the gradient back (a new
    contiguous one, whatever the gradient's strides)."""
    out = g.fresh(x, "roll.default", x.shape, "aten.roll.default", any_strides=True)
    g.drop(x)
    return out


def _windows(g: _Composite, x: _Tensor, split: tuple[int, ...], shape: tuple[int, ...]) -> _Tensor:
    """``x.view(split).permute(0, 1, 3, 2, 4, 5).reshape(shape)`` (the local ``x`` rebound): a map cut into windows,
    or windows put back into a map (a copy where no view can)."""
    viewed = g.view(x, split)
    g.drop(x)
    permuted = g.permute(viewed, (0, 1, 3, 2, 4, 5))
    g.drop(viewed)
    out = g.view(permuted, shape)
    g.drop(permuted)
    return out


def _scores(g: _Composite, qkv: _Tensor) -> _Tensor:
    """``(qkv[0] * scale).matmul(qkv[1].transpose(-2, -1))``: the queries scaled (a new tensor), the keys
    transposed (a view), the scores."""
    q = g.select(qkv, 0)
    scaled = g.scaled(q)
    k = g.select(qkv, 0)
    keys = g.transpose(k, 2, 3)
    scores = g.matmul(scaled, keys)
    g.drop(q, scaled, k, keys)
    return scores


def _biased(g: _Composite, attn: _Tensor, p: dict[str, int], heads: int, tokens: int, window: tuple[int, int],
            hidden: int) -> _Tensor:
    """``attn + bias`` (the old ``attn`` dropped), the bias each head's per pair of a window's positions
    (:func:`_position_bias`): V1's, or V2's with the table made by the bias MLP (:func:`_bias_mlp`) and ``16 sigmoid``
    of the result (the sigmoid keeps its result; both freed with the table after)."""
    positions = (2 * window[0] - 1) * (2 * window[1] - 1)
    table = _bias_mlp(g, p, positions, heads, hidden) if hidden else None
    batched = _position_bias(g, ("param", p["table"]) if table is None else _edge(table.value), positions, heads,
                             tokens)
    if table is not None:
        squashed = g.fresh(batched, "sigmoid.default", batched.shape, "aten.sigmoid_backward.default", keep=True)
        scaled = g.scaled(squashed)
        g.drop(squashed, table, batched)
        batched = scaled
    out = g.add(attn, batched)
    g.drop(attn, batched)
    return out


def _position_bias(g: _Composite, table: tuple[str, int] | None, positions: int, heads: int,
                   tokens: int) -> _Tensor:
    """``table[index].view(T, T, -1).permute(2, 0, 1).contiguous().unsqueeze(0)`` (the table's gradient goes to
    ``table``): the pick is ``index`` (backward: ``new_zeros`` of the table, ``index_put`` into it), made contiguous
    (a copy, the pick freed)."""
    picked_shape = (tokens * tokens, heads)
    sid = g.mem.new(prod(picked_shape) * FLOAT, "aten.index.Tensor")
    fn = g.node([], [table], [positions * heads * FLOAT], ["aten.index_put.default"], picked_shape,
                [(positions, heads)], before=[(positions * heads * FLOAT, "aten.new_zeros.default")], any_strides=True)
    picked = _Tensor(_Value(sid, prod(picked_shape) * FLOAT, fn), picked_shape)
    square = g.view(picked, (tokens, tokens, heads))
    g.drop(picked)
    permuted = g.permute(square, (2, 0, 1))
    g.drop(square)
    bias = g.contiguous(permuted)
    g.drop(permuted)
    batched = g.view(bias, (1, heads, tokens, tokens))
    g.drop(bias)
    return batched


def _bias_mlp(g: _Composite, p: dict[str, int], positions: int, heads: int, hidden: int) -> _Tensor:
    """V2's table of biases: ``cpb_mlp(relative_coords_table).view(-1, heads)``, the coordinates a buffer (no
    gradient): a linear layer (``addmm`` of the rows, viewed back), a ReLU in place on that view (torch rebases it:
    :func:`_rebased_view`), a linear layer without a bias (``mm``), the view."""
    coords = _Tensor(_Value(g.mem.new_id(), positions * 2 * FLOAT, None), (1, positions, 2))
    g.mem.holders[coords.value.sid] = 1  # a buffer of the setup's: never freed here
    hidden_out = g.linear(coords, hidden, True, p["mlp"])
    _rebased_view(g, hidden_out, "aten.threshold_backward.default")
    out = g.linear(hidden_out, heads, False, p["mlp_out"])
    g.drop(hidden_out)
    table = g.view(out, (positions, heads))
    g.drop(out)
    return table


def _rebased_view(g: _Composite, t: _Tensor, kernel: str) -> None:
    """An in-place activation (backward ``kernel``, which reads its result) on ``t``, a folded linear layer's view of
    its ``addmm`` that nothing has read yet, as :func:`_rebased` writes one down: the view's node replaced by a
    ``new_zeros`` one, the ``addmm``'s output's by a ``CopySlices`` that keeps the result."""
    fns = g.ctx.fns
    if t.value.fn != len(fns) - 1:
        raise NotCovered("an in-place activation on a view read before")
    base = fns.pop().edges[0]
    copy = g.node([t.value.sid], [base], [t.nbytes], ["aten.new_empty_strided.default"], t.shape, [t.shape],
                  scratch=[(t.nbytes, "aten.clone.default"), (t.nbytes, kernel)])
    t.value.fn = g.node([], [_fn_edge(copy)], [t.nbytes], ["aten.new_zeros.default"], t.shape, [t.shape])


def _masked(g: _Composite, attn: _Tensor, split: tuple[int, ...], padded: tuple[int, int],
            window: tuple[int, int]) -> _Tensor:
    """A shifted window's mask added: ``attn.view(N, windows, heads, T, T) + mask``, viewed back. The mask needs no
    gradient: zeros of the padded map (``new_zeros``), nine regions filled (a 4-byte ``scalar_tensor`` each, freed at
    once), cut into windows (a copy where no view can), the pairwise difference (``sub``), then ``masked_fill`` of
    ``ne`` and of ``eq`` (one-byte masks), all freed after the add."""
    mem, (ph, pw), (wh, ww) = g.mem, padded, window
    _, windows, heads, tokens, _ = split
    viewed = g.view(attn, split)
    g.drop(attn)
    zeros = mem.new(ph * pw * FLOAT, "aten.new_zeros.default")
    for _ in range(9):
        mem.drop(mem.new(FLOAT, "aten.scalar_tensor.default"))
    cut_shape = (ph // wh, pw // ww, wh, ww)  # the mask viewed as windows, permuted: (rows, columns, wh, ww)
    cut = _view(cut_shape, _normal(cut_shape, (wh * pw, ww, pw, 1)), (windows, tokens))[0]
    if not cut:
        mask = mem.new(ph * pw * FLOAT, "aten.clone.default")
        mem.drop(zeros)
    else:
        mask = zeros
    pairs = windows * tokens * tokens
    diff = mem.new(pairs * FLOAT, "aten.sub.Tensor")
    mem.drop(mask)
    differs = mem.new(pairs, "aten.ne.Scalar")
    first = mem.new(pairs * FLOAT, "aten.masked_fill.Scalar")
    mem.drop(differs)
    equal = mem.new(pairs, "aten.eq.Scalar")
    second = mem.new(pairs * FLOAT, "aten.masked_fill.Scalar")
    for sid in (equal, first, diff):
        mem.drop(sid)
    mask_value = _Tensor(_Value(second, pairs * FLOAT, None), (1, windows, 1, tokens, tokens))
    summed = g.add(viewed, mask_value)
    g.drop(mask_value, viewed)
    out = g.view(summed, (split[0] * windows, heads, tokens, tokens))
    g.drop(summed)
    return out
