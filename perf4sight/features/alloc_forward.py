"""The allocation model's handlers of one op's forward (:mod:`perf4sight.features.alloc_model`'s ``_HANDLERS``, but
for the composite ops of :mod:`perf4sight.features.alloc_composite`): each takes a node's context
(:class:`~perf4sight.features.alloc_values._OpContext`), writes down the op's allocations and its autograd node as
torch makes them (what it keeps, the kernels its backward runs, the layout of its gradients), and gives its output
value: a convolution's or a linear layer's (and their folded forms), activations (in place or not), norms, pooling,
pads and shuffles, elementwise maths and their broadcast layouts, views and permutes, matrix products and ViT's
attention.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

from perf4sight.features.alloc_strides import (_broadcast_strides, _channels_last, _channels_last_like, _iterated,
                                               _iterated_full, _normal, _ordered, _strides, _view)
from perf4sight.features.alloc_values import (_ACTIVATIONS, _BACKWARD_OF, _VIEWS, FLOAT, INT64, NotCovered, _edge,
                                              _fn_edge, _full_strides, _OpContext, _params, _Value)
from perf4sight.features.formulas import sorted_shape
from perf4sight.features.step_runtime import CLONED_IN_PLACE
from perf4sight.ir.schema import SHARES, Node, split_group, unbind_group, where_condition_inputs
from perf4sight.ir.shapes import broadcast


#: Ops whose handlers lay out their outputs along every dimension (:attr:`_Value.raw`): fresh contiguous outputs
#: (a convolution's on the meta device, a layer norm's, a linear layer's, attention's), or the input's own layout.
_LAID_OUT = {"conv2d", "conv_transpose2d", "layernorm", "linear", "attention", "permute", "scale", "shift",
             "identity"}


def _lays_out(n: Node) -> bool:
    """Whether node ``n``'s handler follows its output's strides along dimensions of size 1 (:data:`_LAID_OUT`, an
    add of two tensors, an input handed back by a dropout of ``p`` 0)."""
    return n.op in _LAID_OUT or (n.op == "add" and n.attrs.get("scalar") is None) or \
        (n.op in ("dropout", "dropout2d") and float(n.attrs["p"]) == 0)


def _with_parameters(ctx: _OpContext) -> _Value:
    """conv2d, conv_transpose2d, batchnorm2d, groupnorm, rmsnorm, linear: the layers with parameters (each parameter's
    gradient: its bytes)."""
    n, x, nbytes = ctx.node, ctx.x, ctx.nbytes
    pbytes, _ = _params(n)
    pedges = [None if ctx.first_param + k in ctx.frozen else ("param", ctx.first_param + k)  # frozen: no gradient
              for k in range(len(pbytes))]
    normed = _weight_normed(ctx, pbytes) if n.attrs.get("weight_norm") else \
        _spectral_normed(ctx, pbytes) if n.attrs.get("spectral_norm") else None
    if normed is not None:  # the weight read is computed, kept by the layer's node; the bias its one parameter
        extra = 2 if n.attrs.get("weight_norm") else 1
        pbytes, pedges = [pbytes[-1]] + pbytes[:-extra], [("fn", normed[1])] + pedges[:-extra]
    if n.op in ("conv2d", "conv_transpose2d"):  # aten.convolution, transposed or not: keeps its input
        if "standardize_scale" in n.attrs:  # ScaledStdConv2d's gain, its last parameter: read by the batch norm alone
            pbytes, pedges = pbytes[:-1], pedges[:-1]
        standardised = _standardised_weight(ctx, pbytes[0]) if n.attrs.get("standardize") else normed
        if standardised is not None:  # the weight read is the standardised one, kept: its node the parameter's
            pedges[0] = ("fn", standardised[1])
        sid = ctx.alloc("convolution.default")
        grads = ["aten.convolution_backward.default"] * (1 + len(pbytes))
        layouts, restride = _convolution_layouts(ctx, len(pbytes))
        if normed is not None:  # the weight's gradient goes to weight_norm's node, not to a parameter: as it is made
            restride = [False] * (1 + len(pbytes))
        value = _Value(sid, nbytes, ctx.grad_fn([x.sid] + ([standardised[0]] if standardised else []),
                                                [_edge(x)] + pedges, [x.nbytes] + pbytes, grads,
                                                layouts=layouts, restride=restride, any_strides=True))
        if standardised is not None:  # the forward's own holds: the weight (autograd's kept), its locals'
            for sid in standardised[2]:
                ctx.mem.drop(sid)
        return value
    # the output, a mean and a 1/std; keeps the input and the two (a batch norm by its running statistics too: the
    # meta kernel gives it [C] floats each, where this CPU's gives empty ones)
    if n.op in ("batchnorm2d", "groupnorm"):
        kernel, stat = (("native_batch_norm", n.attrs["num_features"]) if n.op == "batchnorm2d"  # per channel
                        else ("native_group_norm", ctx.batch * n.attrs["num_groups"]))  # per sample and group
        sid = ctx.alloc(f"{kernel}.default")
        stats = [ctx.alloc(f"{kernel}.default", stat * FLOAT, holders=0) for _ in range(2)]
        grads = [f"aten.{kernel}_backward.default"] * (1 + len(pbytes))
        return _Value(sid, nbytes, ctx.grad_fn([x.sid] + stats, [_edge(x)] + pedges, [x.nbytes] + pbytes, grads))
    if n.op == "rmsnorm":  # CUDA's _fused_rms_norm: the output and a 1/rms per row; keeps the input and the latter
        rows = ctx.batch * prod(ctx.in_shapes[0][:len(ctx.in_shapes[0]) - len(n.attrs["normalized_shape"])])
        sid = ctx.alloc("_fused_rms_norm.default")
        rstd = ctx.alloc("_fused_rms_norm.default", rows * FLOAT, holders=0)
        grads = ["aten._fused_rms_norm_backward.default"] * (1 + len(pbytes))
        return _Value(sid, nbytes, ctx.grad_fn([x.sid, rstd], [_edge(x)] + pedges, [x.nbytes] + pbytes, grads))
    if n.op == "linear":
        computed = [normed[0]] if normed is not None else []  # a computed weight, kept by the product (w.t() a view)
        if len(ctx.in_shapes[0]) != 1 and not n.attrs["bias"]:
            return _matmul_folded(ctx, pedges, pbytes, tuple(computed))
        if len(ctx.in_shapes[0]) != 1:
            return _linear_folded(ctx, pedges, pbytes, tuple(computed))
        t = ctx.grad_fn([], [pedges[0]], [pbytes[0]], [None], handoff="view")  # weight.t()
        # addmm and mm keep x for the weight's gradient alone (none where the weight is frozen: saved-tensor hooks)
        kept = ([x.sid] if t is not None else []) + computed
        if n.attrs["bias"]:  # addmm(bias, x, weight.t()): the bias gradient is the incoming one summed down
            sid = ctx.alloc("addmm.default")
            fin, fout = n.attrs["in_features"], n.attrs["out_features"]  # each edge's shape: the bias's, x's, w.t()'s
            return _Value(sid, nbytes, ctx.grad_fn(kept, [pedges[1], _edge(x), _fn_edge(t)],
                                                   [pbytes[1], x.nbytes, pbytes[0]],
                                                   [None, "aten.mm.default", "aten.mm.default"], [0, 1, 2],
                                                   [nbytes, None, None],
                                                   shapes=[(fout,), tuple(ctx.full_in), (fin, fout)]))
        sid = ctx.alloc("mm.default")  # mm(x, weight.t()): the weight's gradient comes first
        grads = ["aten.mm.default", "aten.mm.default"]
        edges, sizes, order = [_edge(x), _fn_edge(t)], [x.nbytes, pbytes[0]], [1, 0]
        return _Value(sid, nbytes, ctx.grad_fn(kept, edges, sizes, grads, order))
    raise NotCovered(f"op '{n.op}'")


def _spectral_normed(ctx: _OpContext, pbytes: list[int]) -> tuple[int, int, list[int]]:
    """A conv2d's or linear's weight of spectral_norm's parametrization (``pbytes``: :func:`_params`' bias, original
    weight), as torch.nn.utils.parametrizations.spectral_norm runs it at a training forward: each power iteration
    (no gradient) ``mv`` and a norm for u, then for v, freed once written into the buffers; u and v cloned (each kept
    by the node that reads it); sigma ``vdot(u, mv(W, v))`` (the product freed after it; W the weight viewed
    [out, -1]); the weight over sigma, which keeps sigma. Backward as :func:`_by_moments`' division: sigma's gradient
    first (three temporaries of the weight's size, then summed down to a number), the weight's; vdot's (u times it),
    mv's (its outer product with v), added to the weight's by the engine. (The weight's storage, the division's node,
    nothing more to drop.)"""
    w = pbytes[-1]
    w_at = ctx.first_param + len(pbytes) - 1
    shape = tuple(_weight_shape(ctx.node)) if ctx.node.op == "conv2d" else \
        (ctx.node.attrs["out_features"], ctx.node.attrs["in_features"])
    out = shape[0]
    cols = w // (out * FLOAT)
    alloc, drop, grad_fn = ctx.alloc, ctx.mem.drop, ctx.grad_fn
    for _ in range(int(ctx.node.attrs.get("spectral_norm_iterations", 1))):
        for size in (out * FLOAT, cols * FLOAT):  # u = normalize(W v), then v = normalize(W^T u), in place
            product, norm = alloc("mv.default", size), alloc("linalg_vector_norm.default", FLOAT)
            drop(product)
            drop(norm)
    u = alloc("clone.default", out * FLOAT, holders=0)
    v = alloc("clone.default", cols * FLOAT, holders=0)
    matrix = ("param", w_at)
    if len(shape) != 2:  # a convolution's weight viewed [out, -1]
        matrix = ("fn", grad_fn([], [matrix], [w], [None], handoff="view", out_shape=(out, cols), shapes=[shape]))
    product = alloc("mv.default", out * FLOAT)
    mv = grad_fn([v], [matrix], [w], ["aten.mul.Tensor"], out_shape=(out,), shapes=[(out, cols)])
    sigma = alloc("vdot.default", FLOAT, holders=0)
    vdot = grad_fn([u], [("fn", mv)], [out * FLOAT], ["aten.mul.Tensor"], out_shape=(), shapes=[(out,)])
    drop(product)
    sid = alloc("div.Tensor", w, holders=0)
    fn = grad_fn([sigma], [("param", w_at), ("fn", vdot)], [w, FLOAT], ["aten.div.Tensor", "aten.mul.Tensor"], [1, 0],
                 [None, w], around=[[], [(w, "aten.div.Tensor"), (w, "aten.div.Tensor"), (w, "aten.neg.default")]],
                 out_shape=shape, shapes=[shape, ()], then="aten.sum.default")
    return sid, fn, []


def _weight_normed(ctx: _OpContext, pbytes: list[int]) -> tuple[int, int, list[int]]:
    """A conv2d's or linear's weight of weight_norm's parametrization (``pbytes``: :func:`_params`' bias, g, v), as
    torch.nn.utils.parametrizations.weight_norm runs it at each forward: ``_weight_norm_interface(v, g, 0)``, the
    weight and a norm an output channel, both held by no local after the layer's op (the layer's node keeps the
    weight, weight_norm's the norms), whose backward (``_weight_norm_interface_backward``) gives v's and g's
    gradients. (The weight's storage, the node, nothing more to drop: :func:`_standardised_weight`'s form.)"""
    g, v = pbytes[-2:]
    g_at = ctx.first_param + len(pbytes) - 2
    weight = ctx.alloc("_weight_norm_interface.default", v, holders=0)
    norms = ctx.alloc("_weight_norm_interface.default", g, holders=0)
    shape = tuple(_weight_shape(ctx.node)) if ctx.node.op == "conv2d" else \
        (ctx.node.attrs["out_features"], ctx.node.attrs["in_features"])
    per_channel = (shape[0],) + (1,) * (len(shape) - 1)
    fn = ctx.grad_fn([norms], [("param", g_at + 1), ("param", g_at)], [v, g],
                     ["aten._weight_norm_interface_backward.default"] * 2, out_shape=shape,
                     shapes=[shape, per_channel])
    return weight, fn, []


def _standardised_weight(ctx: _OpContext, nbytes: int) -> tuple[int, int, list[int]]:
    """A conv2d's weight (``nbytes``) standardised as ``standardize`` says, as ``to_torch.StandardizedConv2d`` runs it:
    (the standardised weight's storage, its autograd node, the storages the forward drops right after the convolution:
    that weight, then the locals it still holds). Every spelling's backward hands the parameter a gradient from each
    node that reads it (the engine adds them up out of place, :func:`~.alloc_backward._param_gradient`)."""
    form = ctx.node.attrs["standardize"]
    shape = tuple(_weight_shape(ctx.node))
    if form == "batch_norm":  # F.batch_norm of the weight viewed [1, out, -1]: torch's empty reserve, freed at once;
        # the standardised weight, a mean and a 1/std per output channel, both kept; backward native_batch_norm_backward
        gain = _scaled_gain(ctx, shape[0]) if "standardize_scale" in ctx.node.attrs else None
        reserve = ctx.alloc("empty.memory_format", 0)
        sid = ctx.alloc("native_batch_norm.default", nbytes)
        stats = [ctx.alloc("native_batch_norm.default", shape[0] * FLOAT, holders=0) for _ in range(2)]
        ctx.mem.drop(reserve)
        edges, sizes, shapes = [("param", ctx.first_param)], [nbytes], [shape]
        if gain is not None:  # the batch norm keeps its weight too, and hands it a gradient (the kernel's second)
            stats, edges, sizes, shapes = stats + [gain[0]], edges + [("fn", gain[1])], sizes + [shape[0] * FLOAT], \
                shapes + [(shape[0],)]
        fn = ctx.grad_fn(stats, edges, sizes, ["aten.native_batch_norm_backward.default"] * len(edges),
                         out_shape=shape, shapes=shapes)
        return sid, fn, [sid]
    if form == "layer_norm":  # F.layer_norm over each output channel: the output, a mean and a 1/std, both kept
        sid = ctx.alloc("native_layer_norm.default", nbytes)
        stats = [ctx.alloc("native_layer_norm.default", shape[0] * FLOAT, holders=0) for _ in range(2)]
        fn = ctx.grad_fn(stats, [("param", ctx.first_param)], [nbytes], ["aten.native_layer_norm_backward.default"],
                         out_shape=shape, shapes=[shape])
        if "standardize_scale" not in ctx.node.attrs:
            return sid, fn, [sid]
        product = ctx.alloc("mul.Tensor", nbytes)  # scale * that (timm's use_layernorm), then gain * (its local
        fn = ctx.grad_fn([], [("fn", fn)], [nbytes], ["aten.mul.Tensor"], out_shape=shape, shapes=[shape])  # freed
        gained, fn = _gained(ctx, product, fn, shape)  # after)
        ctx.mem.drop(sid)
        return gained, fn, [gained]
    return _by_moments(ctx, form, nbytes, shape)


def _scaled_gain(ctx: _OpContext, out: int) -> tuple[int, int]:
    """NFNets' ScaledStdConv2d's batch norm weight, ``(gain * scale).view(-1)`` (the conv2d's ``standardize_scale``;
    the gain its last parameter): the product's storage (a temporary the batch norm keeps) and the view's autograd
    node; backward the product's node allocates the gain's gradient (``aten.mul.Tensor``: the incoming one times the
    scale)."""
    gain = ("param", ctx.first_param + len(_params(ctx.node)[0]) - 1)
    sid = ctx.alloc("mul.Tensor", out * FLOAT, holders=0)
    product = ctx.grad_fn([], [gain], [out * FLOAT], ["aten.mul.Tensor"], out_shape=(out, 1, 1, 1),
                          shapes=[(out, 1, 1, 1)])
    view = ctx.grad_fn([], [("fn", product)], [out * FLOAT], [None], handoff="view", out_shape=(out,),
                       shapes=[(out, 1, 1, 1)])
    return sid, view


def _by_moments(ctx: _OpContext, form: str, nbytes: int, shape: tuple) -> tuple[int, int, list[int]]:
    """:func:`_standardised_weight` of the moments' spellings, ``(w - mean) / spread`` (std, var, var_mean,
    std_rows, std_mean), each op its own autograd node as torch makes it. The mean's node (var_mean's or std_mean's,
    whose two outputs' gradients it gathers), the subtraction (the parameter's gradient handed on as it is, the
    mean's the incoming one negated and summed down), the spread (std plus eps, ``sqrt`` of var plus eps) and the
    division, which keeps the centred weight and the spread; backward its spread's gradient first (``-grad * ((w /
    s) / s)``: three temporaries of the weight's size). A std keeps its result and a var does not; their backward
    (``var_backward``: the weight less its mean, times ``2 / dof`` times the incoming gradient; a std's the incoming
    one over twice its result first, masked where that is 0) is one gradient of the weight's size. mmcv's rows read
    the weight as ``[out, -1]`` (one view node for both statistics, which sums their gradients) and view their
    statistics back."""
    out = shape[0]
    stat, param = out * FLOAT, ("param", ctx.first_param)
    rows = form == "std_rows"
    flat, chan = ((out, nbytes // (out * FLOAT)), (out, 1)) if rows else (shape, (out, 1, 1, 1))
    per_channel = (out, 1, 1, 1)
    grad_fn, alloc, drop = ctx.grad_fn, ctx.alloc, ctx.mem.drop
    to_stats = param
    if rows:  # w.view(out, -1): the view's node, which both statistics' gradients reach
        to_stats = ("fn", grad_fn([], [param], [nbytes], [None], handoff="view", out_shape=flat, shapes=[shape]))
    var_backward = [(stat, "aten.mean.dim"), (nbytes, "aten.sub.Tensor"), (stat, "aten.mul.Scalar")]
    # a std's: grad / (result * 2) (the product freed after the mask of result == 0, a byte a channel), then as a var's
    std_backward = [(stat, "aten.mul.Scalar", 2), (stat, "aten.div.Tensor"), (out, "aten.eq.Scalar", 2)] + var_backward

    def statistic(kernel: str, grad: str, saved: bool = False, around: list | None = None,
                  holders: int = 1) -> tuple[int, int | None]:
        """A statistic over the weight (read as ``flat``): its storage, its node (and a view node back to
        ``per_channel`` for mmcv's rows)."""
        sid = alloc(kernel, stat, holders=holders)
        fn = grad_fn([sid] if saved else [], [to_stats], [nbytes], [grad], around=[around] if around else None,
                     out_shape=chan, shapes=[flat])
        if rows:
            fn = grad_fn([], [("fn", fn)], [stat], [None], handoff="view", out_shape=per_channel, shapes=[chan])
        return sid, fn

    if form == "var_mean":  # torch.var_mean: two outputs (the locals v and m), one node; its backward the var's
        # (its temporaries freed after its product) plus the mean's (div.Scalar), the two freed after the add
        v = alloc("var_mean.correction", stat)
        m = alloc("var_mean.correction", stat)
        summands = [(size, kernel, 3) for size, kernel in var_backward] + [(nbytes, "aten.mul.Tensor"),
                                                                         (nbytes, "aten.div.Scalar")]
        moments = grad_fn([], [param], [nbytes], ["aten.add.Tensor"], gathers=2, out_shape=per_channel,
                          shapes=[shape], around=[summands])
        mean, mean_fn, after = m, moments, [v, m]
    elif form == "std_mean":  # torch.std_mean likewise, its node keeping the std: its backward the std's (its
        # product and mask freed after the mask, the rest after its last product) plus the mean's, then the add
        s = alloc("std_mean.correction", stat)
        m = alloc("std_mean.correction", stat)
        summands = [(size, kernel, 2 if rest else 6) for size, kernel, *rest in std_backward] + [
            (nbytes, "aten.mul.Tensor"), (nbytes, "aten.div.Scalar")]
        moments = grad_fn([s], [param], [nbytes], ["aten.add.Tensor"], gathers=2, out_shape=per_channel,
                          shapes=[shape], around=[summands])
        mean, mean_fn, after = m, moments, [s, m]
    else:  # mmcv's mean is a local, held to the end; the others' a temporary of the expression
        mean, mean_fn = statistic("mean.dim", "aten.div.Scalar")
        after = [mean] if rows else []
    std_fn = moments if form == "std_mean" else None
    if rows:  # mmcv's std is taken before the subtraction (the std kept by its node)
        _, std_fn = statistic("std.correction", "aten.mul.Tensor", saved=True, around=std_backward, holders=0)
    scaled = "standardize_scale" in ctx.node.attrs  # timm's older ScaledStdConv2d: scale * (w - m), then gain *
    centred = alloc("sub.Tensor", nbytes, holders=1 if scaled else 0)
    summed = [None, nbytes if nbytes != stat else None]  # a statistic's gradient summed down (none of a 1 x 1 kernel
    # over one input channel a group: the weight is [out, 1, 1, 1] too)
    sub = grad_fn([], [param, ("fn", mean_fn)], [nbytes, stat], [None, "aten.neg.default"], full=summed,
                  out_shape=shape, shapes=[shape, per_channel])
    if scaled:  # the centred weight times the scale, a temporary it frees; its backward the incoming one times it
        product = alloc("mul.Tensor", nbytes, holders=0)
        sub = grad_fn([], [("fn", sub)], [nbytes], ["aten.mul.Tensor"], out_shape=shape, shapes=[shape])
        drop(centred)
        centred = product
    if form in ("std", "var"):
        drop(mean)
    if form in ("std", "std_rows", "std_mean"):  # (w - mean) / (std + eps)
        if std_fn is None:
            _, std_fn = statistic("std.correction", "aten.mul.Tensor", saved=True, around=std_backward, holders=0)
        spread = alloc("add.Tensor", stat, holders=0)
        spread_fn = grad_fn([], [("fn", std_fn)], [stat], [None], out_shape=per_channel, shapes=[per_channel])
    else:  # (w - mean) / sqrt(var + eps)
        if form == "var":
            var, var_fn = statistic("var.correction", "aten.mul.Tensor", around=var_backward)
        else:
            var, var_fn = v, moments
        plus = alloc("add.Tensor", stat)
        plus_fn = grad_fn([], [("fn", var_fn)], [stat], [None], out_shape=per_channel, shapes=[per_channel])
        if form == "var":
            drop(var)
        spread = alloc("sqrt.default", stat, holders=0)  # keeps its result: grad / (2 * result)
        spread_fn = grad_fn([spread], [("fn", plus_fn)], [stat], ["aten.div.Tensor"],
                            before=[(stat, "aten.mul.Scalar")], out_shape=per_channel, shapes=[per_channel])
        drop(plus)
    sid = alloc("div.Tensor", nbytes)
    fn = grad_fn([centred, spread], [("fn", sub), ("fn", spread_fn)], [nbytes, stat],
                 ["aten.div.Tensor", "aten.mul.Tensor"], [1, 0], summed,
                 around=[[], [(nbytes, "aten.div.Tensor"), (nbytes, "aten.div.Tensor"), (nbytes, "aten.neg.default")]],
                 out_shape=shape, shapes=[shape, per_channel])
    if scaled:
        sid, fn = _gained(ctx, sid, fn, shape)
    return sid, fn, [sid] + after


def _gained(ctx: _OpContext, sid: int, fn: int, shape: tuple) -> tuple[int, int]:
    """ScaledStdConv2d's ``gain * weight`` (timm's older spellings; the gain its last parameter) of the standardised
    weight ``sid`` (its node ``fn``): the product and its node, which keeps ``sid`` (whose local it drops); back the
    weight's gradient, then the gain's, summed down to ``[out, 1, 1, 1]``."""
    nbytes, per_channel = prod(shape) * FLOAT, (shape[0], 1, 1, 1)
    gain = ("param", ctx.first_param + len(_params(ctx.node)[0]) - 1)
    gained = ctx.alloc("mul.Tensor", nbytes)
    fn = ctx.grad_fn([sid], [gain, ("fn", fn)], [shape[0] * FLOAT, nbytes], ["aten.mul.Tensor"] * 2, [1, 0],
                     [nbytes, None], out_shape=shape, shapes=[per_channel, shape])
    ctx.mem.drop(sid)
    return gained, fn


def _convolution_layouts(ctx: _OpContext, params: int) -> tuple[list, list[bool]]:
    """The strides of a convolution's gradients (input, weight, bias) as the meta kernel lays them out, and which
    of them AccumulateGrad copies to its parameter's strides. The forward's output is contiguous whatever the input;
    the backward's input and weight gradients are channels-last where the input (or the weight) suggests it, the
    bias's contiguous; a channels-last gradient of a weight whose channels-last strides are not its own (a kernel
    wider than 1 x 1 over more than one input channel per group) is copied. ``params``: how many parameters the
    convolution has (:func:`_params`')."""
    weight = _weight_shape(ctx.node)
    if not (ctx.channels_last(ctx.x) or _channels_last_like(weight, None)):
        return [None] * (1 + params), [False] * (1 + params)
    if ctx.node.attrs.get("fixed"):  # its filter a buffer: the input's gradient alone
        return [("fixed", _normal(ctx.full_in, _channels_last(ctx.full_in)))], [False]
    layouts = [("fixed", _normal(ctx.full_in, _channels_last(ctx.full_in))),
               ("fixed", _normal(weight, _channels_last(weight)))]
    restride = [False, layouts[1][1] is not None]
    if ctx.node.attrs["bias"]:
        layouts.append(None)
        restride.append(False)
    return layouts, restride


def _weight_shape(node: Node) -> tuple[int, int, int, int]:
    """A convolution's weight shape: [Cout, Cin / groups, kh, kw] ([Cin, Cout / groups, kh, kw] transposed)."""
    a = node.attrs
    kh, kw = a["kernel_size"]
    if node.op == "conv_transpose2d":
        return a["in_channels"], a["out_channels"] // a["groups"], kh, kw
    return a["out_channels"], a["in_channels"] // a["groups"], kh, kw


def _matmul_folded(ctx: _OpContext, pedges: list, pbytes: list[int], kept: tuple[int, ...] = ()) -> _Value:
    """A linear layer without a bias on a contiguous tensor of more than two dimensions: torch's ``matmul(x,
    weight.t())``, the weight transposed first (a view), the input folded into rows (a view), ``mm`` (it keeps the
    rows), the result viewed back. Backward: the output's view reshapes the incoming gradient into rows (a copy where
    it is permuted), then ``mm``'s: the weight's gradient first, then the input's. A strided input not covered.
    ``kept``: storages ``mm``'s node keeps too (a weight computed by weight_norm)."""
    x, nbytes = ctx.x, ctx.nbytes
    if x.strides is not None:
        raise NotCovered("linear without a bias on a strided tensor of more than two dimensions")
    rows = prod(ctx.full_in[:-1])
    folded_in, folded_out = (rows, ctx.full_in[-1]), (rows, ctx.full_out[-1])
    t = ctx.grad_fn([], [pedges[0]], [pbytes[0]], [None], handoff="view")  # weight.t()
    viewed = ctx.grad_fn([], [_edge(x)], [x.nbytes], [None], handoff="view", out_shape=folded_in)
    sid = ctx.alloc("mm.default")
    saved = ([x.sid] if t is not None else []) + list(kept)  # mm keeps the rows for the weight's gradient alone
    mm = ctx.grad_fn(saved, [_fn_edge(viewed), _fn_edge(t)], [x.nbytes, pbytes[0]], ["aten.mm.default"] * 2, [1, 0],
                     out_shape=folded_out, shapes=[folded_in, folded_in[1:] + folded_out[1:]], any_strides=True)
    out = ctx.grad_fn([], [_fn_edge(mm)], [nbytes], [None], handoff="view", shapes=[folded_out])
    return _Value(sid, nbytes, out, view=True)


def _linear_folded(ctx: _OpContext, pedges: list, pbytes: list[int], kept: tuple[int, ...] = ()) -> _Value:
    """A linear layer on a tensor of more than two dimensions, as torch folds it where the input is contiguous and
    there is a bias: the input viewed as [rows, in_features], ``addmm``, the result viewed back. Backward: the
    output's view reshapes the incoming gradient to [rows, out_features] (a copy where no view can: a permuted one,
    but at a batch of 1), then ``addmm``'s as a 2-D linear layer's (its products read any strides). Without a bias:
    :func:`_matmul_folded`; a strided input not covered. ``kept``: as :func:`_matmul_folded`'s."""
    x, nbytes = ctx.x, ctx.nbytes
    if x.strides is not None:
        raise NotCovered("linear on a strided tensor of more than two dimensions")
    rows = prod(ctx.full_in[:-1])
    folded_in, folded_out = (rows, ctx.full_in[-1]), (rows, ctx.full_out[-1])
    viewed = ctx.grad_fn([], [_edge(x)], [x.nbytes], [None], handoff="view", out_shape=folded_in)
    t = ctx.grad_fn([], [pedges[0]], [pbytes[0]], [None], handoff="view")  # weight.t()
    sid = ctx.alloc("addmm.default")
    edge = None if viewed is None else ("fn", viewed)
    saved = ([x.sid] if t is not None else []) + list(kept)  # addmm keeps the rows for the weight's gradient alone
    addmm = ctx.grad_fn(saved, [pedges[1], edge, _fn_edge(t)], [pbytes[1], x.nbytes, pbytes[0]],
                        [None, "aten.mm.default", "aten.mm.default"], [0, 1, 2], [nbytes, None, None],
                        out_shape=folded_out, shapes=[folded_out[1:], folded_in, folded_in[1:] + folded_out[1:]],
                        any_strides=True)
    out = ctx.grad_fn([], [("fn", addmm)], [nbytes], [None], handoff="view", shapes=[folded_out])
    return _Value(sid, nbytes, out, view=True)


def _activation(ctx: _OpContext) -> _Value:
    """relu and relu6 (in place), any activation of :data:`_INPLACE_BACKWARD` in place where its node says so (a
    leaky relu, an elu, a mish, a SiLU, a hardswish, ``y.sigmoid_()``; the input's later readers then read its
    result), the out-of-place activations (:data:`_ACTIVATIONS`), dropout."""
    n, x, nbytes, op = ctx.node, ctx.x, ctx.nbytes, ctx.node.op
    if n.attrs.get("on_copy"):
        return _on_copy(ctx)
    if op in ("relu", "relu6") or op in _INPLACE_BACKWARD and n.attrs.get("inplace"):
        # in place, keeps its result (or a clone of its input: a mish's, a threshold's, a SiLU's, a hardswish's, a
        # hardsigmoid's, ``relu6_clone``'s of ReLU6 and hardtanh)
        rebased = x.view and x.base_fn is not None and x.fn == len(ctx.fns) - 1  # nothing has read the view yet
        if x.fn is None and not x.view and x.sid not in ctx.mem.saved:  # needs no gradient (a frozen stem's map):
            return _Value(ctx.mem.hold(x.sid), x.nbytes, None)  # written in place, no autograd node, nothing kept
        if x.fn is None or (x.view and not rebased) or x.sid in ctx.mem.saved:
            raise NotCovered(f"in-place {op} on '{n.inputs[0]}'")
        kernel = _INPLACE_BACKWARD[op]
        clone = op in CLONED_IN_PLACE or op in ("relu6", "hardtanh") and ctx.relu6_clone
        kept = ctx.alloc("clone.default", x.nbytes, holders=0) if clone else x.sid
        if rebased:
            return _rebased(ctx, kernel, kept)
        x.fn = ctx.unary_grad_fn(kernel, [kept])  # the input's later readers read the result (``y + y.relu()``)
        return _Value(ctx.mem.hold(x.sid), x.nbytes, x.fn)
    if op in _ACTIVATIONS:
        name, keeps = _ACTIVATIONS[op]
        sid = ctx.alloc(name + ".default")
        return _Value(sid, nbytes, ctx.unary_grad_fn(f"aten.{_BACKWARD_OF.get(name, name)}_backward.default",
                                                     [x.sid if keeps == "input" else sid]))
    if op == "dropout":  # the fused CUDA kernel: the output, then a one-byte mask (kept)
        if float(n.attrs["p"]) == 0:
            return _handed_back(ctx)
        if not 0 < float(n.attrs["p"]) < 1:
            raise NotCovered("dropout with p 1")
        sid = ctx.alloc("native_dropout.default")
        mask = ctx.alloc("native_dropout.default", nbytes // FLOAT, holders=0)
        return _Value(sid, nbytes, ctx.unary_grad_fn("aten.native_dropout_backward.default", [mask]))
    raise NotCovered(f"op '{op}'")


def _on_copy(ctx: _OpContext) -> _Value:
    """An activation in place on a copy of its input (``on_copy``: ``y.clone().leaky_relu_()``): the copy
    (``clone``, whose backward hands the gradient on), then the activation written into it, keeping the copy, or a
    clone of it (a mish's, a threshold's, ``relu6_clone``'s hardtanh's) made before it runs; an rrelu keeps the copy
    and its noise (``empty_like``, allocated before it runs). Of an input that needs no gradient (the network's),
    nothing is kept: a threshold's and a hardtanh's clone is not made, a mish's (its kernel's) and an rrelu's noise
    are, freed once it has run."""
    op = ctx.node.op
    copy = ctx.alloc("clone.default")
    copied = ctx.unary_grad_fn(None, [])
    if op == "rrelu":
        noise = ctx.alloc("empty_like.default", holders=0)
        fn = ctx.grad_fn([copy, noise], [_fn_edge(copied)], [ctx.nbytes], ["aten.rrelu_with_noise_backward.default"])
        return _Value(copy, ctx.nbytes, fn)
    clone = op == "mish" or copied is not None and (op == "threshold" or op == "hardtanh" and ctx.relu6_clone)
    kept = ctx.alloc("clone.default", holders=0) if clone else copy
    fn = ctx.grad_fn([kept], [_fn_edge(copied)], [ctx.nbytes], [_INPLACE_BACKWARD[op]])
    return _Value(copy, ctx.nbytes, fn)


#: Elementwise maths of one tensor (op, or pow's exponent) -> (its aten op, what its backward keeps: the "input" or
#: the "result", the aten ops of the temporaries it allocates before the gradient and frees once that is made, the
#: aten op of the gradient).
_MATHS_KERNELS = {
    "exp": ("exp.default", "result", (), "aten.mul.Tensor"),  # grad * result
    "abs": ("abs.default", "input", ("aten.sgn.default",), "aten.mul.Tensor"),  # grad * sgn(x)
    "log": ("log.default", "input", (), "aten.div.Tensor"),  # grad / x
    0.5: ("sqrt.default", "result", ("aten.mul.Scalar",), "aten.div.Tensor"),  # grad / (2 * result)
    -1.0: ("reciprocal.default", "result", ("aten.mul.Tensor", "aten.neg.default"), "aten.mul.Tensor"),  # -grad *
    # result ** 2
    -0.5: ("rsqrt.default", "result", ("aten.pow.Tensor_Scalar", "aten.mul.Scalar"), "aten.mul.Tensor"),  # (-0.5 *
    # grad) * result ** 3
    "pow": ("pow.Tensor_Scalar", "input", ("aten.pow.Tensor_Scalar", "aten.mul.Scalar"), "aten.mul.Tensor"),  # grad *
    # (p * x ** (p - 1))
}


def _maths(ctx: _OpContext) -> _Value:
    """A power (sqrt, rsqrt and reciprocal: their own kernels), exp, abs or log of a tensor (:data:`_MATHS_KERNELS`)."""
    n, x = ctx.node, ctx.x
    key: str | float = n.op
    if n.op == "pow":
        exponent = float(n.attrs["exponent"])
        if exponent == 0:  # torch's backward is zeros of the input's shape
            raise NotCovered("pow of exponent 0")
        key = exponent if exponent in (0.5, -0.5, -1.0) else "pow"
    kernel, keeps, before, grad = _MATHS_KERNELS[key]
    sid = ctx.alloc(kernel)
    fn = ctx.grad_fn([x.sid if keeps == "input" else sid], [_edge(x)], [x.nbytes], [grad],
                     before=[(ctx.nbytes, k) for k in before])
    return _Value(sid, ctx.nbytes, fn)


#: An in-place activation -> the aten op its backward allocates the input's gradient with.
_INPLACE_BACKWARD = {"relu": "aten.threshold_backward.default", "relu6": "aten.hardtanh_backward.default",
                     "leaky_relu": "aten.leaky_relu_backward.default", "elu": "aten.elu_backward.default",
                     "mish": "aten.mish_backward.default", "hardtanh": "aten.hardtanh_backward.default",
                     "selu": "aten.elu_backward.default", "celu": "aten.elu_backward.default",
                     "sigmoid": "aten.sigmoid_backward.default", "tanh": "aten.tanh_backward.default",
                     "threshold": "aten.threshold_backward.default",
                     "silu": "aten.silu_backward.default", "hardswish": "aten.hardswish_backward.default",
                     "hardsigmoid": "aten.hardsigmoid_backward.default"}


def _rebased(ctx: _OpContext, kernel: str, kept: int) -> _Value:
    """An in-place activation on an instance norm's output, a view of its batch norm's (``kernel``: the activation's
    backward; ``kept``: the storage that backward reads). Torch rebases the view's history: the batch norm's output
    gets a ``CopySlices`` node wrapping the activation's backward, and the view a regenerated ``AsStridedBackward``;
    the view's own node is reached no more. Backward (bytes of the output each): the view's node writes its gradient
    into ``new_zeros`` of the base's shape; ``CopySlices`` allocates the base's gradient (``new_empty_strided``),
    copies the incoming one in, runs the activation's backward on a ``clone`` of the view's part and copies the
    result back, freeing the clone and the result; it keeps what the activation keeps (the base's geometry alone)."""
    x = ctx.x
    ctx.fns.pop()  # the view's node (the last made: nothing has read the view)
    copy = ctx.grad_fn([kept], [("fn", x.base_fn)], [x.nbytes], ["aten.new_empty_strided.default"],
                       scratch=[(x.nbytes, "aten.clone.default"), (x.nbytes, kernel)])
    x.fn = ctx.grad_fn([], [("fn", copy)], [x.nbytes], ["aten.new_zeros.default"])  # later readers of the view too
    x.base_fn = None
    return _Value(ctx.mem.hold(x.sid), x.nbytes, x.fn, view=True)


def _rrelu(ctx: _OpContext) -> _Value:
    """RReLU as torch runs it (aten.rrelu, on any device): a noise of the input's size (``empty_like``; the kernel
    writes each element's slope into it), then its output, or in place its input; it keeps the noise, and its input
    or, in place, its result. Backward ``rrelu_with_noise_backward``: the input's gradient. In place on a view, or
    on a tensor that needs no gradient or that another node keeps, not covered. On a copy: :func:`_on_copy`."""
    n, x = ctx.node, ctx.x
    if n.attrs.get("on_copy"):
        return _on_copy(ctx)
    inplace = bool(n.attrs.get("inplace"))
    if inplace and (x.fn is None or x.view or x.sid in ctx.mem.saved):
        raise NotCovered(f"in-place rrelu on '{n.inputs[0]}'")
    noise = ctx.alloc("empty_like.default", x.nbytes, holders=0)
    sid = ctx.mem.hold(x.sid) if inplace else ctx.alloc("rrelu_with_noise.default")
    return _Value(sid, ctx.nbytes, ctx.unary_grad_fn("aten.rrelu_with_noise_backward.default", [x.sid, noise]))


def _softmax(ctx: _OpContext) -> _Value:
    """A softmax or a log-softmax along a dim (out of place): its output, which its backward keeps."""
    kernel = "_" + ctx.node.op
    sid = ctx.alloc(kernel + ".default")
    return _Value(sid, ctx.nbytes, ctx.unary_grad_fn(f"aten.{kernel}_backward_data.default", [sid]))


def _glu(ctx: _OpContext) -> _Value:
    """A GLU: its output (half its input, ``aten.glu``); it keeps its input, from which its backward
    (``aten.glu_backward``, measured on torch 2.14 on the CPU and 2.11 on CUDA) writes the input's gradient."""
    sid = ctx.alloc("glu.default")
    return _Value(sid, ctx.nbytes, ctx.unary_grad_fn("aten.glu_backward.default", [ctx.x.sid]))


def _prelu(ctx: _OpContext) -> _Value:
    """PReLU: its output; it keeps its input (and its slopes viewed as [1, C, 1, ...], a parameter's storage). Its
    backward allocates the input's gradient, then the slopes' gradient per element, which the engine sums down to
    the slopes' view (the full one freed) and hands on through the view to the parameter. On a tensor that needs no
    gradient (torch still computes both, then frees the input's) not covered."""
    x = ctx.x
    if x.fn is None:
        raise NotCovered("prelu on a tensor that needs no gradient")
    slopes = ctx.node.attrs["num_parameters"] * FLOAT
    viewed = ctx.grad_fn([], [("param", ctx.first_param)], [slopes], [None], handoff="view")  # weight.view(...)
    sid = ctx.alloc("_prelu_kernel.default")
    kernel = "aten._prelu_kernel_backward.default"
    return _Value(sid, ctx.nbytes, ctx.grad_fn([x.sid], [_edge(x), ("fn", viewed)], [x.nbytes, slopes],
                                               [kernel, kernel], full=[None, x.nbytes]))


def _dropout2d(ctx: _OpContext) -> _Value:
    """Dropout of whole channels, as torch runs it on any device: a noise of one float per sample and channel
    (``new_empty``, then drawn and scaled in place), then the input times it, which allocates the output; the
    backward keeps the noise and multiplies the incoming gradient by it (a new tensor). Of ``p`` 0 torch hands the
    input back (:func:`_handed_back`); of ``p`` 1 (a multiply by a zero) not covered."""
    if float(ctx.node.attrs["p"]) == 0:
        return _handed_back(ctx)
    if not 0 < float(ctx.node.attrs["p"]) < 1:
        raise NotCovered("dropout2d with p 1")
    noise = ctx.alloc("new_empty.default", ctx.full_in[0] * ctx.full_in[1] * FLOAT, holders=0)
    sid = ctx.alloc("mul.Tensor")
    return _Value(sid, ctx.nbytes, ctx.unary_grad_fn("aten.mul.Tensor", [noise]))


def _alpha_dropout(ctx: _OpContext) -> _Value:
    """Alpha dropout (of elements, or of whole channels: feature) as torch runs it on any device (no kernel of its
    own): a noise (of the input's size, ``empty_like``; of a float per sample and channel, ``new_empty``) drawn in
    place, a shift made of it (``add.Scalar``: the b of a x + b), both scaled in place, the input times the noise (the
    output) and the shift added to it in place, the shift then freed. It keeps the noise, by which its backward
    multiplies the incoming gradient (a new tensor). Of ``p`` 0 torch hands the input back (:func:`_handed_back`); of
    ``p`` 1 (the input times a zero), or in place, not covered."""
    n = ctx.node
    if float(n.attrs["p"]) == 0:
        return _handed_back(ctx)
    if float(n.attrs["p"]) == 1 or n.attrs.get("inplace"):
        raise NotCovered("alpha_dropout of p 1 or in place")
    feature = bool(n.attrs.get("feature"))
    size = ctx.full_in[0] * ctx.full_in[1] * FLOAT if feature else ctx.x.nbytes
    noise = ctx.alloc("new_empty.default" if feature else "empty_like.default", size, holders=0)
    shift = ctx.alloc("add.Scalar", size)
    sid = ctx.alloc("mul.Tensor")
    ctx.mem.drop(shift)
    return _Value(sid, ctx.nbytes, ctx.unary_grad_fn("aten.mul.Tensor", [noise]))


def _summed(ctx: _OpContext, param: int, size: int, rows: int) -> tuple[str, int]:
    """The edge an instance norm's gradient of its repeated weight or bias (``rows`` bytes, one vector per sample)
    takes to parameter ``param`` (``size`` bytes): through a sum down to ``size`` bytes, or, at a batch of 1 (the
    repeat's backward sums over no repeated dimension), straight to the parameter."""
    if ctx.batch == 1:
        return "param", param
    return "fn", ctx.grad_fn([], [("param", param)], [size], ["aten.sum.dim_IntList"], out_shape=(rows,))


def _instance_norm(ctx: _OpContext) -> _Value:
    """An instance norm as torch runs it: a batch norm of the input viewed as [1, N x C, H, W]. Where affine, the
    weight and the bias are first repeated once per sample (N x C floats each; the bias's repeat is freed after the
    norm, the weight's kept); then the output, a mean and a 1/std per sample and channel, which it keeps with the
    input (and the repeated weight); the output is a view of the norm's. Backward: the input's gradient, the
    repeated weight's and bias's, each of these two then summed down to C floats (the bias's first) and accumulated;
    at a batch of 1 (a repeat once) torch sums nothing, the norm's gradients are the parameters' own (:func:`_summed`).
    Tracking running statistics, it repeats the running mean and variance too (after the weight and bias), which the
    norm keeps, and once it has run makes the mean over the batch of each (C floats), copied into the buffer and
    freed. Bytes at ``ctx.batch``."""
    n, x, nbytes = ctx.node, ctx.x, ctx.nbytes
    pbytes, buffers = _params(n)
    rows = ctx.batch * n.attrs["num_features"] * FLOAT  # bytes of a vector per sample and channel
    repeats = [ctx.alloc("repeat.default", rows) for _ in pbytes]
    running = [ctx.alloc("repeat.default", rows) for _ in buffers[:2]]  # the running mean's and variance's
    summed = [_summed(ctx, ctx.first_param + k, size, rows) for k, size in enumerate(pbytes)]
    viewed = ctx.grad_fn([], [_edge(x)], [x.nbytes], [None], handoff="view")
    sid = ctx.alloc("native_batch_norm.default")
    stats = [ctx.alloc("native_batch_norm.default", rows, holders=0) for _ in range(2)]
    edges = [None if viewed is None else ("fn", viewed)] + summed
    norm = ctx.grad_fn([x.sid] + repeats[:1] + running + stats, edges, [x.nbytes] + [rows] * len(pbytes),
                       ["aten.native_batch_norm_backward.default"] * len(edges))
    for size in buffers[:2]:  # the mean over the batch of a running statistic, copied into the buffer
        ctx.mem.drop(ctx.alloc("mean.dim", size))
    for r in repeats + running:
        ctx.mem.drop(r)  # those the norm keeps live on
    # the output's backward reshapes its gradient to the batch norm's [1, N x C, H, W]: a copy where it is strided
    rows_shape = (1, ctx.full_in[0] * ctx.full_in[1], *ctx.full_in[2:])  # (a slice of a cat's gradient)
    out = ctx.grad_fn([], [None if norm is None else ("fn", norm)], [nbytes], [None], handoff="view",
                      shapes=[rows_shape])
    return _Value(sid, nbytes, out, view=True, base_fn=norm)


def _pooling(ctx: _OpContext) -> _Value:
    """maxpool2d, adaptivemaxpool2d, fractional_maxpool2d, avgpool2d, adaptiveavgpool2d, mean (over H and W)."""
    n, x, nbytes, op = ctx.node, ctx.x, ctx.nbytes, ctx.node.op
    if op in ("maxpool2d", "adaptivemaxpool2d"):  # the output and int64 indices, both kept with the input
        kernel = "max_pool2d_with_indices" if op == "maxpool2d" else "adaptive_max_pool2d"
        sid = ctx.alloc(kernel + ".default")
        indices = ctx.alloc(kernel + ".default", nbytes // FLOAT * INT64, holders=0)
        return _Value(sid, nbytes, ctx.unary_grad_fn(f"aten.{kernel}_backward.default", [x.sid, indices]))
    if op == "fractional_maxpool2d":  # F.fractional_max_pool2d draws its windows' places: [N, C, 2] uniform samples
        samples = ctx.alloc("rand.default", ctx.full_in[0] * ctx.full_in[1] * 2 * FLOAT)
        sid = ctx.alloc("fractional_max_pool2d.default")
        indices = ctx.alloc("fractional_max_pool2d.default", nbytes // FLOAT * INT64, holders=0)
        ctx.mem.drop(samples)  # freed once the pool has read them; the output and indices kept with the input
        return _Value(sid, nbytes, ctx.unary_grad_fn("aten.fractional_max_pool2d_backward.default", [x.sid, indices]))
    if op == "avgpool2d":
        return _Value(ctx.alloc("avg_pool2d.default"), nbytes,
                      ctx.unary_grad_fn("aten.avg_pool2d_backward.default", [x.sid]))
    if op == "adaptiveavgpool2d" and n.attrs["output_size"] not in (1, [1, 1], (1, 1)):
        return _Value(ctx.alloc("_adaptive_avg_pool2d.default"), nbytes,
                      ctx.unary_grad_fn("aten._adaptive_avg_pool2d_backward.default", [x.sid]))
    if op in ("adaptiveavgpool2d", "mean"):  # a mean over H and W: keeps nothing, its backward divides
        sid, mean = ctx.alloc("mean.dim"), ctx.unary_grad_fn("aten.div.Scalar", [])
        if op == "mean" or not ctx.channels_last(x):
            return _Value(sid, nbytes, mean)
        # torch restrides the mean of a channels-last input in place (as_strided_): its backward writes the incoming
        # gradient into new zeros of the output's size, which the mean's then reads
        restrided = ctx.grad_fn([], [None if mean is None else ("fn", mean)], [nbytes], ["aten.new_zeros.default"],
                                any_strides=True)
        n, c = ctx.full_in[:2]
        return _Value(sid, nbytes, restrided, raw=(c, 1, c, c) if 1 in ctx.full_out else None)
    raise NotCovered(f"op '{op}'")


def _interpolate(ctx: _OpContext) -> _Value:
    """A resize: keeps nothing (its backward needs the sizes alone) and writes the input's gradient anew."""
    n = ctx.node
    kernel = "upsample_bilinear2d" if n.attrs["mode"] == "bilinear" else "upsample_nearest2d"
    return _Value(ctx.alloc(kernel + ".default"), ctx.nbytes, ctx.unary_grad_fn(f"aten.{kernel}_backward.default", []))


#: A pad's mode -> (its aten kernel, its backward's kernel, whether it keeps its input), as torch 2 runs them.
_PAD_KERNELS = {"constant": ("constant_pad_nd", "constant_pad_nd", False),
                "reflect": ("reflection_pad2d", "reflection_pad2d_backward", True),
                "replicate": ("replication_pad2d", "replication_pad2d_backward", True)}
#: A pixel shuffle's kernel -> its backward's: the inverse rearrangement.
_SHUFFLE_BACKWARD = {"pixel_shuffle": "pixel_unshuffle", "pixel_unshuffle": "pixel_shuffle"}


def _rearrange(ctx: _OpContext) -> _Value:
    """pad, pixel_shuffle, pixel_unshuffle: a new output; the backward writes the input's gradient anew."""
    n, x, op = ctx.node, ctx.x, ctx.node.op
    if op == "pad" and n.attrs["mode"] == "circular":
        # torch's _pad_circular: copies into slices of an empty output, whose backward is a chain of autograd's
        # in-place-copy and slice nodes (clones, zeros and adds of the output's size per side), left to the trace
        raise NotCovered("a circular pad")
    if op == "pad":
        kernel, backward, keeps_input = _PAD_KERNELS[n.attrs["mode"]]
    else:
        kernel, backward, keeps_input = op, _SHUFFLE_BACKWARD[op], False
    sid = ctx.alloc(kernel + ".default")
    return _Value(sid, ctx.nbytes, ctx.unary_grad_fn(f"aten.{backward}.default", [x.sid] if keeps_input else []))


def _tiling(ctx: _OpContext) -> _Value:
    """A repeat (torch's aten.repeat: a copy, nothing kept). Backward torch views the gradient as (count, size)
    pairs and sums over the counts (aten.sum.dim_IntList: the input's gradient); of counts all 1 it hands the
    gradient on (a view of the same shape)."""
    tiles = any(int(r) > 1 for r in ctx.node.attrs["repeats"])
    sid = ctx.alloc("repeat.default")
    return _Value(sid, ctx.nbytes, ctx.unary_grad_fn("aten.sum.dim_IntList" if tiles else None, []))


def _reordered_copy(ctx: _OpContext) -> _Value:
    """A flip or a roll (torch's aten.flip, aten.roll: a copy in another order, nothing kept). Backward the incoming
    gradient flipped or rolled back, a new tensor of the input's size (the same kernel)."""
    kernel = f"{ctx.node.op}.default"
    sid = ctx.alloc(kernel)
    return _Value(sid, ctx.nbytes, ctx.unary_grad_fn("aten." + kernel, []))


def _im2col(ctx: _OpContext) -> _Value:
    """An unfold (torch's aten.im2col: the windows' values copied into columns, nothing kept) or a fold (aten.col2im:
    the columns added back onto their windows). Backward the other kernel, a new tensor of the input's size."""
    kernel, backward = ("im2col", "col2im") if ctx.node.op == "unfold" else ("col2im", "im2col")
    sid = ctx.alloc(f"{kernel}.default")
    return _Value(sid, ctx.nbytes, ctx.unary_grad_fn(f"aten.{backward}.default", []))


def _logsumexp(ctx: _OpContext) -> _Value:
    """A logsumexp over dims (aten.logsumexp: its output alone, its temporaries below the dispatcher), keeping its
    input and its result. Backward grad * exp(x - result): ``sub`` and ``exp`` (the input's size) before the
    gradient (``mul``), freed once it is made. The largest hidden temporary, ``x - max`` of the input's size, is left
    out: the meta trace this is checked against does not show it, and in real CPU steps (torch 2.14's profiler memory
    events, four networks at batches 4 and 32) it never set the peak, the backward's two of that size outweighing
    it."""
    x = ctx.x
    sid = ctx.alloc("logsumexp.default")
    fn = ctx.grad_fn([x.sid, sid], [_edge(x)], [x.nbytes], ["aten.mul.Tensor"],
                     before=[(x.nbytes, "aten.sub.Tensor"), (x.nbytes, "aten.exp.default")])
    return _Value(sid, ctx.nbytes, fn)


def _linspace(ctx: _OpContext) -> _Value:
    """CoordConv's coordinate channel: torch.linspace's row or column of floats (aten.linspace), the batch's channel
    a view of it; no gradient (its input's shape alone read). One ``made`` by arange: :func:`_arange_coordinates`."""
    if ctx.node.attrs.get("made") == "arange":
        return _arange_coordinates(ctx)
    if ctx.node.attrs.get("made") == "arange_grid":
        return _arange_grid(ctx)
    nbytes = int(ctx.in_shapes[0][int(ctx.node.attrs["dim"]) - 1]) * FLOAT
    return _Value(ctx.alloc("linspace.default", nbytes), nbytes, None)


def _arange_grid(ctx: _OpContext) -> _Value:
    """A coordinate channel of a meshgrid of aranges (``to_torch._coordinates``): the arange (int64 steps), its grid
    cast to float (freed after the division) and divided, from -1 the product and the difference (the division and
    the product freed after it, with the arange); the batch's channel a view of the last. No gradient."""
    a, (_, h, w) = ctx.node.attrs, ctx.in_shapes[0]
    hw, drop = h * w * FLOAT, ctx.mem.drop
    line = ctx.alloc("arange.default", (h if int(a["dim"]) == 2 else w) * INT64)
    floated = ctx.alloc("_to_copy.default", hw)
    scaled = ctx.alloc("div.Tensor", hw)
    drop(floated)
    if float(a["start"]) == -1:
        doubled = ctx.alloc("mul.Tensor", hw)
        shifted = ctx.alloc("sub.Tensor", hw)
        drop(scaled)
        drop(doubled)
        scaled = shifted
    drop(line)
    return _Value(scaled, hw, None)


def _arange_coordinates(ctx: _OpContext) -> _Value:
    """A coordinate channel made as CoordConv's PyTorch port writes it (``to_torch._coordinates``): the arange (int64
    steps), its copy over the map (repeat), freed with the scaled map once the copy over the batch is made; the cast
    to float and the division (the cast freed after it) and, from -1, the product and the difference (the division
    and the product freed after it); then the batch's copy, the output. No gradient."""
    a, (_, h, w) = ctx.node.attrs, ctx.in_shapes[0]
    hw, drop = h * w, ctx.mem.drop
    line = ctx.alloc("arange.default", (h if int(a["dim"]) == 2 else w) * INT64)
    counted = ctx.alloc("repeat.default", hw * INT64)
    drop(line)
    floated = ctx.alloc("_to_copy.default", hw * FLOAT)
    scaled = ctx.alloc("div.Tensor", hw * FLOAT)
    drop(floated)
    if float(a["start"]) == -1:
        doubled = ctx.alloc("mul.Tensor", hw * FLOAT)
        shifted = ctx.alloc("sub.Tensor", hw * FLOAT)
        drop(scaled)
        drop(doubled)
        scaled = shifted
    sid = ctx.alloc("repeat.default")
    drop(counted)
    drop(scaled)
    return _Value(sid, ctx.nbytes, None)


def _cumsum(ctx: _OpContext) -> _Value:
    """A running sum along a dim (aten.cumsum), keeping nothing. Backward the gradient flipped, summed and flipped
    back: the first two (the input's size) before the gradient (``flip``), freed once it is made."""
    sid = ctx.alloc("cumsum.default")
    fn = ctx.grad_fn([], [_edge(ctx.x)], [ctx.x.nbytes], ["aten.flip.default"],
                     before=[(ctx.x.nbytes, "aten.flip.default"), (ctx.x.nbytes, "aten.cumsum.default")])
    return _Value(sid, ctx.nbytes, fn)


def _where(ctx: _OpContext) -> _Value:
    """torch.where(x <compare> threshold, a, b) (:func:`to_torch._where`): the condition (``aten.<compare>.Scalar``,
    a byte an element of x), a number branch wrapped (``scalar_tensor``, 4 bytes, freed after), the output
    (``where.self``); it keeps the condition. Backward, per tensor branch, the false one's first, its gradient
    ``where.self`` of the output's size (a zero wrapped first, ``scalar_tensor``, freed after), one of a broadcast
    branch then summed down to its shape. A condition of a value that needs a gradient and is not a branch too is
    not covered: the node that made it may be reached by no gradient (``y.mean(1) > 0``: autograd frees it with the
    value, which the model does not follow)."""
    n, batch = ctx.node, ctx.batch
    k = where_condition_inputs(n.attrs)  # a > b: two tensors compared (``aten.<compare>.Tensor``)
    for name, value in zip(n.inputs[:k], ctx.inputs):
        if value.fn is not None and name not in n.inputs[k:]:
            raise NotCovered(f"a where's condition of '{name}', a value needing a gradient")
    if k == 0:  # a fixed boolean mask: a buffer (:func:`_params`), no compare
        mask = None
    else:
        shape = ctx.in_shapes[0] if k == 1 else broadcast(list(ctx.in_shapes[0]), list(ctx.in_shapes[1]))
        mask = ctx.mem.new(batch * prod(shape), f"aten.{n.attrs['compare']}.{'Tensor' if k == 2 else 'Scalar'}")
    if n.attrs.get("inplace"):
        return _masked_fill_in_place(ctx, mask)
    if n.attrs.get("multiply"):
        return _where_of_multiply(ctx, mask, batch * prod(shape))
    number = "if_true" in n.attrs or "if_false" in n.attrs
    scalar = ctx.alloc("scalar_tensor.default", FLOAT) if number else None
    sid = ctx.alloc("where.self")
    if scalar is not None:
        ctx.mem.drop(scalar)
    branches = list(zip(ctx.inputs, ctx.in_shapes))[k:]
    edges = [None] * k + [_edge(b) for b, _ in branches]
    sizes = [v.nbytes for v in ctx.inputs[:k]] + [b.nbytes for b, _ in branches]
    full = [None] * k + [ctx.nbytes if list(shape) != list(n.output_shape) else None for _, shape in branches]
    around = [[]] * k + [[(FLOAT, "aten.scalar_tensor.default")] for _ in branches]
    fn = ctx.grad_fn([] if mask is None else [mask], edges, sizes, [None] * k + ["aten.where.self"] * len(branches),
                     list(range(k)) + list(range(k + len(branches) - 1, k - 1, -1)), full, around=around)
    if mask is not None:
        ctx.mem.drop(mask)
    return _Value(sid, ctx.nbytes, fn)


def _where_of_multiply(ctx: _OpContext, mask: int, elements: int) -> _Value:
    """``b * condition`` (a where of ``multiply``: x * (x > 0)) once its condition (of ``elements``) is allocated: the
    output (``mul.Tensor``, no number wrapped), the condition kept; backward b's gradient ``mul.Tensor`` of the
    output's size (summed down to a broadcast b's shape). A mask cast to float32 first (``float_mask``:
    x * (x > 0).float()): the float mask (``_to_copy``, 4 bytes an element) made and the boolean one freed before the
    output; the float one kept."""
    n, k = ctx.node, where_condition_inputs(ctx.node.attrs)
    if n.attrs.get("float_mask"):
        cast = ctx.mem.new(FLOAT * elements, "aten._to_copy.default")
        ctx.mem.drop(mask)
        mask = cast
    sid = ctx.alloc("mul.Tensor")
    b, shape = ctx.inputs[k], ctx.in_shapes[k]
    fn = ctx.grad_fn([mask], [None] * k + [_edge(b)], [v.nbytes for v in ctx.inputs],
                     [None] * k + ["aten.mul.Tensor"], None,
                     [None] * k + [ctx.nbytes if list(shape) != list(n.output_shape) else None])
    ctx.mem.drop(mask)
    return _Value(sid, ctx.nbytes, fn)


def _masked_fill_in_place(ctx: _OpContext, mask: int | None) -> _Value:
    """``b.masked_fill_(condition, value)`` (a where of ``inplace``) once its condition is allocated: the number
    written into b (no allocation), the condition kept; backward b's gradient ``masked_fill.Scalar``. b's later
    readers read the result (:func:`_activation`'s in-place rule). In place on a view, or on a tensor that needs no
    gradient or that another node keeps, not covered."""
    b = ctx.inputs[-1]
    if b.fn is None or b.view or b.sid in ctx.mem.saved:
        raise NotCovered(f"a masked_fill_ of '{ctx.node.inputs[-1]}'")
    edges = [None] * (len(ctx.inputs) - 1) + [_edge(b)]
    b.fn = ctx.grad_fn([] if mask is None else [mask], edges, [v.nbytes for v in ctx.inputs],
                       [None] * len(edges[1:]) + ["aten.masked_fill.Scalar"])
    if mask is not None:  # a fixed mask (None) is a buffer
        ctx.mem.drop(mask)
    return _Value(ctx.mem.hold(b.sid), b.nbytes, b.fn)


def _affine_grid(ctx: _OpContext) -> _Value:
    """An affine grid (aten.affine_grid_generator: its [H, W, 2] grid, nothing kept). Its backward builds the base
    grid anew, an ``empty`` of [N, H, W, 3], then per side (the width's first) a ``linspace`` and, without
    align_corners, its ``mul`` and ``div`` (the side's floats, not the batch's), freed once copied in, then the
    gradient (``bmm``: theta's, laid out transposed), the incoming gradient and the base freed last. Written down as
    three autograd nodes run back to back, as torch's one runs its work: the first hands the incoming gradient on and
    allocates the base (its scratch the width's temporaries), the second hands the base on (the height's), the last
    gathers both (no sum) and computes theta's gradient."""
    x = ctx.x
    sid = ctx.alloc("affine_grid_generator.default")
    if x.fn is None:
        return _Value(sid, ctx.nbytes, None)
    height, width = (int(s) for s in ctx.node.attrs["size"])
    base = ctx.batch * height * width * 3 * FLOAT
    kernels = ["aten.linspace.default"] + ([] if ctx.node.attrs["align_corners"] else
                                           ["aten.mul.Scalar", "aten.div.Scalar"])
    theta = (ctx.batch, 2, 3)
    gradient = ctx.grad_fn([], [_edge(x)], [x.nbytes], ["aten.bmm.default"], out_shape=theta, gathers=2,
                           layouts=[("fixed", _normal(theta, (6, 1, 2)))])
    rows = ctx.grad_fn([], [("fn", gradient)], [base], [None], scratch=[(height * FLOAT, k) for k in kernels])
    fn = ctx.grad_fn([], [("fn", gradient), ("fn", rows)], [ctx.nbytes, base], [None, "aten.empty.memory_format"],
                     scratch=[(width * FLOAT, k) for k in kernels])
    return _Value(sid, ctx.nbytes, fn)


def _grid_sample(ctx: _OpContext) -> _Value:
    """A map sampled at a grid (aten.grid_sampler_2d: its output), keeping both. Backward one op,
    ``grid_sampler_2d_backward``: the map's gradient, then the grid's (of those that need one)."""
    x, grid = ctx.inputs
    sid = ctx.alloc("grid_sampler_2d.default")
    fn = ctx.grad_fn([x.sid, grid.sid], [_edge(x), _edge(grid)], [x.nbytes, grid.nbytes],
                     ["aten.grid_sampler_2d_backward.default"] * 2)
    return _Value(sid, ctx.nbytes, fn)


def _sorted(ctx: _OpContext) -> _Value:
    """A sort's or a topk's values (aten.sort, aten.topk: the values, then their int64 indices, which it keeps).
    Backward the gradient scattered (``scatter.src``, the input's size) into zeros (``new_zeros``, freed once it is
    made)."""
    kernel = f"{ctx.node.op}.default"
    if SHARES in ctx.node.attrs:  # the indices an earlier node made, held by both gathers: left to the trace
        raise NotCovered(f"a {ctx.node.op}'s indices read by a second gather")
    if ctx.node.attrs.get("gather"):
        return _sorted_gather(ctx, kernel)
    sid = ctx.alloc(kernel)
    indices = ctx.alloc(kernel, ctx.nbytes // FLOAT * INT64, holders=0)
    fn = ctx.grad_fn([indices], [_edge(ctx.x)], [ctx.x.nbytes], ["aten.scatter.src"],
                     before=[(ctx.x.nbytes, "aten.new_zeros.default")])
    return _Value(sid, ctx.nbytes, fn)


def _sorted_gather(ctx: _OpContext, kernel: str) -> _Value:
    """A tensor y gathered at a sort's or topk's indices of x (``gather``): the sort's values and int64 indices, the
    values freed (not read), then the output (``gather.default``); it keeps the indices and y. Backward y's gradient
    ``scatter_add`` into zeros (``new_zeros``, y's size, freed once it is made); x takes none."""
    x, y = ctx.inputs
    picked = ctx.batch * prod(sorted_shape(ctx.node, ctx.in_shapes[0]))
    values = ctx.alloc(kernel, picked * FLOAT)
    indices = ctx.alloc(kernel, picked * INT64, holders=0)
    ctx.mem.drop(values)
    ctx.mem.hold(indices)
    sid = ctx.alloc("gather.default")
    fn = ctx.grad_fn([indices, y.sid], [None, _edge(y)], [x.nbytes, y.nbytes], [None, "aten.scatter_add.default"],
                     before=[(y.nbytes, "aten.new_zeros.default")])
    ctx.mem.drop(indices)
    return _Value(sid, ctx.nbytes, fn)


def _combine(ctx: _OpContext) -> _Value:
    """add, mul (of two tensors, or of a tensor and a scalar), cat."""
    n, ins, nbytes, op = ctx.node, ctx.inputs, ctx.nbytes, ctx.node.op
    if op in ("add", "mul") and n.attrs.get("scalar") is not None:  # keeps nothing; mul's backward scales
        sid = ctx.alloc("add.Tensor" if op == "add" else "mul.Tensor")
        return _Value(sid, nbytes, ctx.unary_grad_fn(None if op == "add" else "aten.mul.Tensor", []))
    if len(set(n.inputs)) != len(n.inputs) or (op != "cat" and len(ins) != 2):
        raise NotCovered(f"{op} of a value with itself")
    full = [nbytes if shape != n.output_shape and op != "cat" else None for shape in ctx.in_shapes]  # broadcast
    sid = ctx.alloc({"add": "add.Tensor", "mul": "mul.Tensor", "cat": "cat.default"}[op])
    edges, sizes = [_edge(i) for i in ins], [i.nbytes for i in ins]
    if op != "mul":  # the incoming gradient handed on (cat: views of it)
        layout = _sum_layout(ctx) if op == "add" else {}
        return _Value(sid, nbytes, ctx.grad_fn([], edges, sizes, [None] * len(ins), None, full,
                                               "slices" if op == "cat" and len(ins) > 1 else ""), **layout)
    # each input's gradient is the incoming one times the other input (kept when that input needs it);
    # the second input's is computed first
    saved = [ins[0].sid] if ins[1].fn is not None else []
    saved += [ins[1].sid] if ins[0].fn is not None else []
    return _Value(sid, nbytes, ctx.grad_fn(saved, edges, sizes, ["aten.mul.Tensor"] * 2, [1, 0], full))


def _sum_layout(ctx: _OpContext) -> dict:
    """The layout of an add's output (``_Value`` fields): contiguous where its inputs lie in their own order, else
    (dense inputs of the same shape: channels-last ones, permuted ones) as torch's TensorIterator lays them out."""
    followed = any(i.raw is not None or i.loose for i in ctx.inputs)
    if not followed and all(_ordered(ctx.full_out, i.strides) for i in ctx.inputs):
        return {}
    if any(list(shape) != list(ctx.node.output_shape) for shape in ctx.in_shapes):
        raise NotCovered("add of a strided tensor broadcast")
    return _iterated_layout(ctx.full_out, [_full_strides(i, ctx.full_out) for i in ctx.inputs],
                            [i.strides for i in ctx.inputs])


def _iterated_layout(shape: tuple[int, ...], full: list[tuple[int, ...] | None],
                     strides: list[tuple[int, ...] | None]) -> dict:
    """The layout (``_Value`` fields: ``strides``, and ``raw`` or ``loose``) of an elementwise kernel's output over
    operands of torch's strides ``full`` (None: not followed along dimensions of size 1) and the model's
    ``strides``."""
    if all(f is not None for f in full):
        raw = _iterated_full(shape, full)
        return {"strides": _normal(shape, raw), "raw": raw if 1 in shape else None}
    return {"strides": _iterated(shape, strides), "loose": 1 in shape}


def _permute(ctx: _OpContext) -> _Value:
    """A permute: a view of the input's storage with its strides permuted; its backward permutes the gradient back
    (a view)."""
    x, dims = ctx.x, tuple(int(d) for d in ctx.node.attrs["dims"])
    strides, full = x.strides or _strides(ctx.full_in), _full_strides(x, ctx.full_in)
    fn = ctx.grad_fn([], [_edge(x)], [x.nbytes], [None], handoff="permute", perm=dims)
    raw = None if full is None else tuple(full[d] for d in dims)
    return _Value(ctx.mem.hold(x.sid), x.nbytes, fn, view=True,
                  strides=_normal(ctx.full_out, tuple(strides[d] for d in dims)),
                  raw=raw if 1 in ctx.full_out else None, loose=raw is None and 1 in ctx.full_out)


def _layer_norm(ctx: _OpContext) -> _Value:
    """A layer norm over the last dims (``native_layer_norm``): its output (contiguous, whatever the input's strides),
    a mean and a 1/std per row (the dims before the normalised ones); it keeps its input as it is and the two.
    Backward: the input's gradient (laid out as the incoming one, as the meta kernel lays it out; where that is
    strided and has a dimension of size 1, whose strides the meta kernel's layout turns on, not covered), then the
    weight's and the bias's."""
    n, x, nbytes = ctx.node, ctx.x, ctx.nbytes
    pbytes, _ = _params(n)
    rows = prod(ctx.full_in[:len(ctx.full_in) - len(n.attrs["normalized_shape"])]) * FLOAT
    sid = ctx.alloc("native_layer_norm.default")
    stats = [ctx.alloc("native_layer_norm.default", rows, holders=0) for _ in range(2)]
    pedges = [("param", ctx.first_param + k) for k in range(len(pbytes))]
    grads = ["aten.native_layer_norm_backward.default"] * (1 + len(pbytes))
    layouts = [("like", [])] + [None] * len(pbytes)  # the input's gradient laid out as the incoming one
    return _Value(sid, nbytes, ctx.grad_fn([x.sid] + stats, [_edge(x)] + pedges, [x.nbytes] + pbytes, grads,
                                           any_strides=True, layouts=layouts))


def _scale(ctx: _OpContext) -> _Value:
    """The input times a learnt tensor, broadcast (``mul.Tensor``; its output laid out as TensorIterator lays it
    out): it keeps the input. Backward, as a multiply of two tensors: the weight's gradient first (the incoming one
    times the input, full size, summed down to the weight's shape after), then the input's (the incoming one times
    the weight, laid out as the incoming one)."""
    x, nbytes, shape = ctx.x, ctx.nbytes, tuple(int(s) for s in ctx.node.attrs["shape"])
    if ctx.full_in != ctx.full_out:
        raise NotCovered("a scale that broadcasts its input")
    weight = _broadcast_strides(shape, ctx.full_out)
    sid = ctx.alloc("mul.Tensor")
    layout = _iterated_layout(ctx.full_out, [_full_strides(x, ctx.full_in), weight], [x.strides, weight])
    kept = [] if ctx.first_param in ctx.frozen else [x.sid]  # mul keeps x for the weight's gradient alone
    fn = ctx.grad_fn(kept, [_edge(x), ("param", ctx.first_param)], [x.nbytes, prod(shape) * FLOAT],
                     ["aten.mul.Tensor"] * 2, [1, 0], [None, nbytes], layouts=[("iterated", [weight]), None],
                     any_strides=True)
    return _Value(sid, nbytes, fn, **layout)


def _shift(ctx: _OpContext) -> _Value:
    """The input plus a learnt tensor, broadcast (a position embedding): ``add.Tensor``, laid out as the input; it
    keeps nothing. Backward: the incoming gradient handed on, and summed down to the weight's shape (a ``fixed``
    one's, a buffer, takes none)."""
    x, nbytes, shape = ctx.x, ctx.nbytes, tuple(int(s) for s in ctx.node.attrs["shape"])
    if ctx.full_in != ctx.full_out:
        raise NotCovered("a shift that broadcasts its input")
    sid = ctx.alloc("add.Tensor")
    weight = _broadcast_strides(shape, ctx.full_out)
    layout = _iterated_layout(ctx.full_out, [_full_strides(x, ctx.full_in), weight], [x.strides, weight])
    if ctx.node.attrs.get("fixed"):  # a buffer: the incoming gradient handed on alone
        return _Value(sid, nbytes, ctx.grad_fn([], [_edge(x)], [x.nbytes], [None], shapes=[ctx.full_in]), **layout)
    fn = ctx.grad_fn([], [_edge(x), ("param", ctx.first_param)], [x.nbytes, prod(shape) * FLOAT], [None, None],
                     full=[None, nbytes], shapes=[ctx.full_in, shape])
    return _Value(sid, nbytes, fn, **layout)


def _frozen_batch_norm(ctx: _OpContext) -> _Value:
    """A frozen batch norm as torchvision's FrozenBatchNorm2d runs it: its [C] scale, ``weight * (running_var +
    eps).rsqrt()``, and shift, ``bias - running_mean * scale`` (five [C] tensors, each freed once read, but for the
    two), then ``x * scale`` and ``+ shift`` on the map (the product freed once added). It keeps the scale (the
    ``mul``'s other operand; its buffers need no gradient), freed with the shift once the forward leaves it.
    Backward (``add`` hands the gradient on): the incoming gradient times the scale, the input's."""
    c = ctx.node.attrs["num_features"] * FLOAT
    shifted = ctx.alloc("add.Tensor", c)  # running_var + eps
    root = ctx.alloc("rsqrt.default", c)
    ctx.mem.drop(shifted)
    scale = ctx.alloc("mul.Tensor", c)
    ctx.mem.drop(root)
    product = ctx.alloc("mul.Tensor", c)  # running_mean * scale
    shift = ctx.alloc("sub.Tensor", c)
    ctx.mem.drop(product)
    scaled = ctx.alloc("mul.Tensor")
    sid = ctx.alloc("add.Tensor")
    fn = ctx.unary_grad_fn("aten.mul.Tensor", [scale])
    for temporary in (scaled, shift, scale):
        ctx.mem.drop(temporary)
    return _Value(sid, ctx.nbytes, fn)


def _token(ctx: _OpContext) -> _Value:
    """A learnt tensor put before the input along a dim (a class token): the weight expanded to the batch (a view),
    then ``cat``. Backward: the cat hands on slices of its gradient; the expand's sums the token's down to the
    weight (``sum.dim_IntList``). At a batch of 1 (no sum: the slice itself reaches the weight) not covered."""
    x, nbytes, n = ctx.x, ctx.nbytes, ctx.node
    if ctx.batch == 1:
        raise NotCovered("a class token at batch 1")
    shape = (ctx.batch, *(int(s) for s in n.attrs["shape"]))
    token = prod(n.attrs["shape"]) * FLOAT
    expanded = ctx.grad_fn([], [("param", ctx.first_param)], [token], ["aten.sum.dim_IntList"], out_shape=shape)
    sid = ctx.alloc("cat.default")
    fn = ctx.grad_fn([], [_fn_edge(expanded), _edge(x)], [ctx.batch * token, x.nbytes], [None, None],
                     handoff="slices", shapes=[shape, ctx.full_in])
    return _Value(sid, nbytes, fn)


def _quotient(ctx: _OpContext) -> _Value:
    """x / y of two tensors, broadcast: its output; it keeps y, and x where y needs a gradient. Backward, y's gradient
    first (torch's -grad * ((x / y) / y): x / y, over y, -grad, their product), then x's (grad / y); a broadcast
    input's summed down to its shape."""
    n, ins, nbytes = ctx.node, ctx.inputs, ctx.nbytes
    if len(set(n.inputs)) != len(n.inputs):
        raise NotCovered("div of a value with itself")
    x, y = ins
    sid = ctx.alloc("div.Tensor")
    full = [nbytes if shape != n.output_shape else None for shape in ctx.in_shapes]
    before = [(nbytes, "aten.div.Tensor"), (nbytes, "aten.div.Tensor"), (nbytes, "aten.neg.default")] \
        if y.fn is not None else []
    saved = ([x.sid] if y.fn is not None else []) + [y.sid]
    return _Value(sid, nbytes, ctx.grad_fn(saved, [_edge(x), _edge(y)], [x.nbytes, y.nbytes],
                                           ["aten.div.Tensor", "aten.mul.Tensor"], [1, 0], full, before=before))


def _extreme(ctx: _OpContext) -> _Value:
    """maximum / minimum of two tensors, broadcast (aten.maximum, aten.minimum): its output; it keeps both inputs.
    Backward (torch 2's, the meta trace's), the second input's gradient first: a compare of the two (a bool an
    element), the incoming gradient halved (for ties), an equality compare, a where, then the gradient, a
    masked_fill of the where (the temporaries freed after it, last first); then the first input's, alike; a broadcast
    input's summed down to its shape. A value with itself is not covered."""
    n, nbytes = ctx.node, ctx.nbytes
    if len(set(n.inputs)) != len(n.inputs):
        raise NotCovered(f"{n.op} of a value with itself")
    x, y = ctx.inputs
    sid = ctx.alloc(f"{n.op}.default")
    full = [nbytes if shape != n.output_shape else None for shape in ctx.in_shapes]
    masks = nbytes // FLOAT  # a bool an output element
    # maximum: x's gradient masked where x < y, y's where x > y; minimum the other way round
    compares = ("lt", "gt") if n.op == "maximum" else ("gt", "lt")
    around = [[(masks, f"aten.{compare}.Tensor"), (nbytes, "aten.div.Scalar"), (masks, "aten.eq.Tensor"),
               (nbytes, "aten.where.self")] for compare in compares]
    return _Value(sid, nbytes, ctx.grad_fn([x.sid, y.sid], [_edge(x), _edge(y)], [x.nbytes, y.nbytes],
                                           ["aten.masked_fill.Scalar"] * 2, [1, 0], full, around=around))


def _fusion_weights(ctx: _OpContext) -> tuple[int, int]:
    """A weighted sum's weights from its ``[n]`` parameter, as EfficientDet computes them: relu(w) / (sum(relu(w)) +
    eps) (a relu, a sum, the add of eps, freeing the sum, a division; the relu keeps its result, the division it and
    the sum plus eps) or softmax(w) (it keeps its result). Backward, in the reverse order of their nodes: the
    division's two gradients (the sum's first: w / s, over s, -grad, their product, then the weights' grad / s; the
    sum's summed down to a scalar), the add and the sum handing theirs on (an expand), added to the division's, then
    the relu's threshold_backward into the parameter's gradient; a softmax's _softmax_backward_data. (the weights'
    storage, their autograd node)."""
    count = int(ctx.node.attrs["num_inputs"])
    weights, vector = count * FLOAT, (count,)
    param = [("param", ctx.first_param)]
    if ctx.node.attrs["normalize"] == "softmax":
        soft = ctx.alloc("_softmax.default", weights)
        return soft, ctx.grad_fn([soft], param, [weights], ["aten._softmax_backward_data.default"],
                                 out_shape=vector, shapes=[vector])
    relu = ctx.alloc("relu.default", weights)
    relu_fn = ctx.grad_fn([relu], param, [weights], ["aten.threshold_backward.default"], out_shape=vector,
                          shapes=[vector])
    total = ctx.alloc("sum.dim_IntList", FLOAT)
    total_fn = ctx.grad_fn([], [("fn", relu_fn)], [weights], [None], out_shape=(), shapes=[vector])
    shifted = ctx.alloc("add.Tensor", FLOAT)
    shifted_fn = ctx.grad_fn([], [("fn", total_fn)], [FLOAT], [None], out_shape=(), shapes=[()])
    ctx.mem.drop(total)
    quotient = ctx.alloc("div.Tensor", weights)
    before = [(weights, "aten.div.Tensor"), (weights, "aten.div.Tensor"), (weights, "aten.neg.default")]
    quotient_fn = ctx.grad_fn([relu, shifted], [("fn", relu_fn), ("fn", shifted_fn)], [weights, FLOAT],
                              ["aten.div.Tensor", "aten.mul.Tensor"], [1, 0], [None, weights], out_shape=vector,
                              shapes=[vector, ()], before=before, then="aten.sum.default")
    ctx.mem.drop(shifted)
    ctx.mem.drop(relu)
    return quotient, quotient_fn


def _weighted_sum(ctx: _OpContext) -> _Value:
    """EfficientDet's BiFPN fusion of n maps (:class:`to_torch.WeightedSum`): its weights (:func:`_fusion_weights`),
    then per map a pick of its weight (a view; backward a select_backward of the n weights, added into the weights'
    gradient), its product with the map (it keeps the weights' storage and the map), and from the second on the add
    of it to the sum so far, the product and the old sum freed. Backward per product, the map's gradient first
    (grad times the weight), then the weight's (grad times the map, summed down to a scalar). The meta trace's
    events. A map fused twice is not covered."""
    n, nbytes = ctx.node, ctx.nbytes
    if len(set(n.inputs)) != len(n.inputs):
        raise NotCovered("weighted_sum of a value with itself")
    count = int(n.attrs["num_inputs"])
    weights, weights_fn = _fusion_weights(ctx)
    total: _Value | None = None
    for x, shape in zip(ctx.inputs, ctx.in_shapes):
        pick_fn = ctx.grad_fn([], [("fn", weights_fn)], [count * FLOAT], ["aten.select_backward.default"],
                              out_shape=(), shapes=[(count,)])
        saved = ([weights] if x.fn is not None else []) + [x.sid]
        product = _Value(ctx.alloc("mul.Tensor"), nbytes,
                         ctx.grad_fn(saved, [("fn", pick_fn), _edge(x)], [FLOAT, x.nbytes], ["aten.mul.Tensor"] * 2,
                                     [1, 0], [nbytes, None], shapes=[(), tuple([ctx.batch] + list(shape))],
                                     then="aten.sum.default"))
        if total is None:
            total = product
            continue
        summed = _Value(ctx.alloc("add.Tensor"), nbytes,
                        ctx.grad_fn([], [_edge(total), _edge(product)], [nbytes, nbytes], [None, None]))
        ctx.mem.drop(product.sid)
        ctx.mem.drop(total.sid)
        total = summed
    ctx.mem.drop(weights)
    return total


def _matrix_product(ctx: _OpContext) -> _Value:
    """a @ b of [..., M, K] and [..., K, N] matrices, as torch runs it: each input expanded to the output's leading
    dims and viewed as [B, M, K] and [B, K, N] (B the batch times those dims), copied first (aten.clone, in input
    order) where its leading dims do not merge into one (a permuted input: a hand-written attention's heads; a
    broadcast one, copied at its expanded size), then aten.bmm of the output (viewed back); it keeps each input, or
    its copy, whose other input needs a gradient (a copy no one keeps is freed after the product). Backward, the
    incoming gradient viewed as [B, M, N] (copied, aten.clone, where its leading dims do not view as one: a product
    of heads transposed after), then b's gradient a^T @ grad, then a's grad @ b^T (aten.bmm each, contiguous, of
    the expanded sizes), a broadcast input's then summed down to its shape (aten.sum, torch's expand's backward).
    Not covered: an input not copied whose matrices no GEMM reads as they lie (every other element), a broadcast one
    strided at all, a value times itself."""
    n, ins = ctx.node, ctx.inputs
    if len(set(n.inputs)) != len(n.inputs):
        raise NotCovered("matmul of a value with itself")
    operands = [_matmul_operand(ctx, shape, value) for shape, value in zip(ctx.in_shapes, ins)]
    a, b = ins
    sid = ctx.alloc("bmm.default")
    kept = [storage for storage, _, _ in operands]
    saved = ([kept[0]] if b.fn is not None else []) + ([kept[1]] if a.fn is not None else [])
    stacked = (ctx.batch * prod(n.output_shape[:-2]), *n.output_shape[-2:])
    fn = ctx.grad_fn(saved, [edge for _, edge, _ in operands], [size for _, _, size in operands],
                     ["aten.bmm.default"] * 2, [1, 0], out_shape=stacked, any_strides=True)
    for copy, value in zip(kept, ins):
        if copy != value.sid:  # the copy's own hold: autograd's, where it keeps it, is the last
            ctx.mem.drop(copy)
    if fn is not None and len(n.output_shape) > 2:  # the output viewed back from [B, M, N]: its gradient viewed so
        fn = ctx.grad_fn([], [("fn", fn)], [ctx.nbytes], [None], handoff="view", shapes=[stacked])
    return _Value(sid, ctx.nbytes, fn)


def _matmul_operand(ctx: _OpContext, shape: list[int], value: _Value) -> tuple[int, tuple[str, int] | None, int]:
    """What torch's matmul multiplies of ``value`` (per-sample ``shape``), as (storage, the edge its gradient takes,
    its gradient's bytes): its own storage, where it is contiguous or a transposed view (or a broadcast whose
    expanded leading dims still merge), or where its leading dims merge and a GEMM reads its matrices as they lie
    (a narrowed input; a pick of packed heads at a batch of 1, its batch's dimension of size 1 strided unsure, which
    no check reads); a contiguous copy of it (aten.clone) of its expanded size, where its leading
    dims do not merge into one. A broadcast input's gradient goes through an autograd node of its own that sums it
    down (aten.sum.dim_IntList), run right after the product's."""
    full = (ctx.batch, *shape)
    lead = ctx.node.output_shape[:-2]
    if list(shape[:-2]) != list(lead):
        if value.raw is not None or value.loose or value.strides is not None:
            raise NotCovered("matmul of a strided broadcast input")
        expanded = (ctx.batch, *lead, *shape[-2:])
        strides = tuple(0 if size == 1 and wide != 1 else stride
                        for size, wide, stride in zip(full, expanded, _strides(full)))
        nbytes = value.nbytes * prod(expanded) // prod(full)
        summed = ctx.grad_fn([], [_edge(value)], [value.nbytes], ["aten.sum.dim_IntList"], out_shape=expanded,
                             shapes=[full])
        storage = value.sid if _leading_dims_merge(expanded, strides) else ctx.mem.new(nbytes, "aten.clone.default")
        return storage, None if summed is None else ("fn", summed), nbytes
    if value.raw is None and not value.loose and value.strides in (None, _transposed_strides(full)):
        return value.sid, _edge(value), value.nbytes
    strides = _full_strides(value, full)
    if strides is None and value.raw is None and value.loose and min(full[-2:]) > 1:
        strides = value.strides or _strides(full)  # only its dims of size 1 strided unsure, which no check reads
    if strides is not None and _leading_dims_merge(full, strides) and _blas_strides(full, strides):
        return value.sid, _edge(value), value.nbytes  # read as it lies (a pick of packed heads at a batch of 1)
    if strides is None or _leading_dims_merge(full, strides):
        raise NotCovered("matmul of an input strided other than transposed")
    return ctx.mem.new(value.nbytes, "aten.clone.default"), _edge(value), value.nbytes


def _blas_strides(full: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether each matrix of ``full`` (strides ``strides``, elements) is one a GEMM reads as it lies: its rows
    (or its columns) of consecutive elements, each at least a row (a column) apart."""
    rows, cols = full[-2:]
    return (strides[-1] == 1 and strides[-2] >= max(cols, 1)) or (strides[-2] == 1 and strides[-1] >= max(rows, 1))


def _transposed_strides(full: tuple[int, ...]) -> tuple[int, ...]:
    """The strides (elements) of a contiguous [..., K, M] tensor viewed as [..., M, K] (``full``)."""
    swapped = _strides(full[:-2] + (full[-1], full[-2]))
    return swapped[:-2] + (swapped[-1], swapped[-2])


def _leading_dims_merge(full: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether the dims of ``full`` before its last two (strides ``strides``, elements) view as one: each dim's stride
    its next one's times that one's size (dims of size 1 aside)."""
    dims = [(size, stride) for size, stride in zip(full[:-2], strides[:-2]) if size != 1]
    return all(outer[1] == inner[1] * inner[0] for outer, inner in zip(dims, dims[1:]))


def _variance(ctx: _OpContext) -> _Value:
    """A variance over dims: its (reduced) output; it keeps its input. Backward, torch's 2 / (n - correction) * grad *
    (x - x.mean(dims)): the mean, the deviation and the scaled gradient allocated before the product."""
    x, nbytes = ctx.x, ctx.nbytes
    sid = ctx.alloc("var.correction")
    before = [(nbytes, "aten.mean.dim"), (x.nbytes, "aten.sub.Tensor"), (nbytes, "aten.mul.Scalar")]
    return _Value(sid, nbytes, ctx.grad_fn([x.sid], [_edge(x)], [x.nbytes], ["aten.mul.Tensor"], before=before))


def _view_op(ctx: _OpContext) -> _Value:
    """reshape, flatten, squeeze, unsqueeze, transpose, select, narrow, identity: views of the input's
    storage (a reshape no view can express: a contiguous copy)."""
    n, x, nbytes, op = ctx.node, ctx.x, ctx.nbytes, ctx.node.op
    full_in, full_out = ctx.full_in, ctx.full_out
    if op in _VIEWS:
        viewable, strides = _view(full_in, x.strides, full_out)
        if viewable:
            shared = ctx.mem.hold(x.sid)
            fn = ctx.grad_fn([], [_edge(x)], [x.nbytes], [None], handoff="view")
            return _Value(shared, x.nbytes, fn, view=True, strides=strides)
        # no view has these strides: a contiguous copy, then a view of it (clone + _unsafe_view)
        sid = ctx.alloc("clone.default")
        copied = ctx.grad_fn([], [_edge(x)], [x.nbytes], [None], out_shape=full_in)
        edge = None if copied is None else ("fn", copied)
        return _Value(sid, x.nbytes, ctx.grad_fn([], [edge], [x.nbytes], [None], handoff="view"))
    if op == "transpose":
        d0, d1 = (d % len(full_in) for d in (n.attrs["dim0"], n.attrs["dim1"]))
        strides = list(x.strides or _strides(full_in))
        strides[d0], strides[d1] = strides[d1], strides[d0]
        return _Value(ctx.mem.hold(x.sid), x.nbytes,
                      ctx.grad_fn([], [_edge(x)], [x.nbytes], [None], handoff="transpose", dims=(d0, d1)),
                      view=True, strides=_normal(full_out, tuple(strides)))
    if op == "select":  # one index of a dimension: its backward writes into zeros of the input's shape
        d = n.attrs["dim"] % len(full_in)
        strides = list(x.strides or _strides(full_in))
        del strides[d]
        if ctx.splits is not None and unbind_group(n) is not None:  # a piece of one unbind: its stack gathers it
            fn = _gathered_by(ctx, ("unbind", *unbind_group(n)), "aten.stack.default", full_in[d],
                              int(n.attrs["index"]) % full_in[d])
        else:
            fn = ctx.grad_fn([], [_edge(x)], [x.nbytes], ["aten.select_backward.default"], any_strides=True)
        return _Value(ctx.mem.hold(x.sid), nbytes, fn, view=True, strides=_normal(full_out, tuple(strides)))
    if op == "narrow" and ctx.splits is not None and split_group(n) is not None:
        return _split_piece(ctx, split_group(n))
    if op == "narrow":  # a slice: its backward writes the gradient into zeros of the input's shape
        strides = x.strides or _strides(full_in)
        return _Value(ctx.mem.hold(x.sid), nbytes, ctx.unary_grad_fn("aten.slice_backward.default", []), view=True,
                      strides=_normal(full_out, strides))
    if op == "identity":
        return _handed_back(ctx)
    raise NotCovered(f"op '{op}'")


def _split_piece(ctx: _OpContext, group: tuple) -> _Value:
    """A piece of a torch.split or torch.chunk (a narrow of ``split_sizes``, rebuilt as one split call): a view of
    the input whose gradient is handed on to the split's one autograd node (made at its first piece, ``ctx.splits``),
    which gathers every piece's gradient (:attr:`_GradFn.gathers`) into the input's (``cat``), as
    ``alloc_composite._chunked``'s."""
    x = ctx.x
    fn = _gathered_by(ctx, group, "aten.cat.default", len(group[2]), int(ctx.node.attrs["start"]))
    strides = x.strides or _strides(ctx.full_in)
    return _Value(ctx.mem.hold(x.sid), ctx.nbytes, fn, view=True, strides=_normal(ctx.full_out, strides))


def _gathered_by(ctx: _OpContext, group: tuple, kernel: str, pieces: int, place: int) -> int:
    """The autograd node of a piece of the call ``group`` (a split's, or an unbind's: a select of ``unbind``, rebuilt
    as one unbind call), whose gradient is handed on to the call's one node (made at its first piece,
    ``ctx.splits``), which gathers its ``pieces`` pieces' gradients into the input's (``kernel``: a ``cat``, a
    ``stack``). ``place``: where the piece starts along the dim; a second node of one piece (``p[0]`` read twice, or
    as ``p[-8]``: one tensor, whose gradients torch adds up before the gather) is left to the trace."""
    x = ctx.x
    if (group, place) in ctx.splits:
        raise NotCovered("a piece of a split or unbind taken twice")
    ctx.splits[(group, place)] = True
    if group not in ctx.splits:
        ctx.splits[group] = ctx.grad_fn([], [_edge(x)], [x.nbytes], [kernel], out_shape=ctx.full_in,
                                        shapes=[ctx.full_in], any_strides=True, gathers=pieces)
    return ctx.grad_fn([], [_fn_edge(ctx.splits[group])], [ctx.nbytes], [None], shapes=[ctx.full_out])


#: The fused attention kernel's aten op (its outputs: the result, a log-sum-exp, a seed and an offset).
_EFFICIENT = "_scaled_dot_product_efficient_attention.default"


def _attention(ctx: _OpContext) -> _Value:
    """Self-attention of a contiguous [N, L, E] input as ``nn.MultiheadAttention`` runs it (batch first, bias, no
    dropout) with a CUDA build's memory-efficient kernel (``alloc_trace._fused_attention``). Forward: the input
    transposed to [L, N, E] and copied for the packed projection's ``mm`` (the copy kept), the bias added (the
    product freed), the [3, L, N, E] query, key and value made contiguous (the sum freed; kept by the kernel), the
    kernel's result (kept), a log-sum-exp per head and token (tokens padded to 32; kept), an 8-byte seed and offset
    (kept), the result's heads made contiguous (kept by the output projection), the output projection's ``addmm``,
    viewed back and transposed to [N, L, E]. Backward: the output projection's,
    the kernel's three gradients, each copied twice as its views are reshaped back, each written into zeros of
    [3, L, N, E] and summed, copied again as the projection's reshape, the bias's summed down, then the packed
    projection's weight's and input's."""
    n, x, xb = ctx.node, ctx.x, ctx.nbytes
    e, heads = int(n.attrs["embed_dim"]), int(n.attrs["num_heads"])
    frozen = all(ctx.first_param + k in ctx.frozen for k in range(4))  # frozen whole
    if x.strides is not None or x.fn is None and not frozen or not n.attrs["bias"] or \
            float(n.attrs.get("dropout", 0)) != 0:
        raise NotCovered("attention of a strided input, without a bias or with a dropout")
    batch, tokens = ctx.full_in[0], ctx.full_in[1]
    shape = _AttentionShape(batch, tokens, e, heads)
    p = ctx.first_param
    transposed = ctx.grad_fn([], [_edge(x)], [xb], [None], handoff="transpose", dims=(0, 1),
                             out_shape=shape.seq, shapes=[ctx.full_in])
    weight_t = ctx.grad_fn([], [("param", p)], [3 * e * e * FLOAT], [None], handoff="view")
    if weight_t is None:  # a frozen weight: torch's matmul folds no strided input it would copy (should_fold), but
        # multiplies it by the weight expanded (bmm), which keeps nothing; backward bmm's gradient of the input
        product = ctx.alloc("bmm.default", 3 * xb)
        packed = ctx.grad_fn([], [("fn", transposed)], [xb], ["aten.bmm.default"], out_shape=shape.packed,
                             shapes=[shape.seq])
    else:
        copied = ctx.alloc("clone.default")
        copy_fn = ctx.grad_fn([], [("fn", transposed)], [xb], [None], out_shape=shape.seq, shapes=[shape.seq])
        rows = ctx.grad_fn([], [("fn", copy_fn)], [xb], [None], handoff="view", out_shape=(tokens * batch, e),
                           shapes=[shape.seq])
        product = ctx.alloc("mm.default", 3 * xb)
        mm = ctx.grad_fn([copied], [("fn", rows), ("fn", weight_t)], [xb, 3 * e * e * FLOAT], ["aten.mm.default"] * 2,
                         [1, 0], out_shape=(tokens * batch, 3 * e), shapes=[(tokens * batch, e), (e, 3 * e)])
        ctx.mem.drop(copied)
        packed = ctx.grad_fn([], [("fn", mm)], [3 * xb], [None], handoff="view", out_shape=shape.packed,
                             shapes=[(tokens * batch, 3 * e)])
    biased = ctx.alloc("add.Tensor", 3 * xb)
    ctx.mem.drop(product)
    add = ctx.grad_fn([], [("fn", packed), ("param", p + 1)], [3 * xb, 3 * e * FLOAT], [None, None],
                      full=[None, 3 * xb], out_shape=shape.packed, shapes=[shape.packed, (3 * e,)])
    qkv, selected = _attention_qkv(ctx, shape, add, biased)
    return _attention_output(ctx, shape, *_attention_kernel(ctx, shape, qkv, selected))


@dataclass(frozen=True)
class _AttentionShape:
    """The shapes of a self-attention's tensors (N samples of L tokens of E features, ``heads`` heads)."""
    batch: int
    tokens: int
    embed: int
    heads: int

    @property
    def seq(self) -> tuple[int, int, int]:
        """[L, N, E]: the input as ``nn.MultiheadAttention`` reads it."""
        return self.tokens, self.batch, self.embed

    @property
    def packed(self) -> tuple[int, int, int]:
        """[L, N, 3E]: the packed projection's result."""
        return self.tokens, self.batch, 3 * self.embed

    @property
    def split(self) -> tuple[int, int, int, int]:
        """[N, heads, L, E / heads]: a query, key or value as the kernel reads it."""
        return self.batch, self.heads, self.tokens, self.embed // self.heads


def _attention_qkv(ctx: _OpContext, shape: _AttentionShape, add: int | None, biased: int) -> tuple[int, list]:
    """The packed projection unflattened to [L, N, 3, E], permuted to [3, L, N, E] (views) and made contiguous (the
    projection freed); the query, key and value selected, viewed as [L, N x heads, E / heads], transposed and viewed
    as [N, heads, L, E / heads]: (the contiguous copy's storage, the three views' autograd nodes)."""
    xb, (batch, heads, tokens, dim) = ctx.nbytes, shape.split
    stacked = (3, *shape.seq)
    unflattened = ctx.grad_fn([], [_fn_edge(add)], [3 * xb], [None], handoff="view",
                              out_shape=(*shape.seq[:2], 3, shape.embed), shapes=[shape.packed])
    permuted = ctx.grad_fn([], [_fn_edge(unflattened)], [3 * xb], [None], handoff="permute", perm=(2, 0, 1, 3),
                           out_shape=stacked, shapes=[(*shape.seq[:2], 3, shape.embed)])
    qkv = ctx.alloc("clone.default", 3 * xb)
    ctx.mem.drop(biased)
    copy_fn = ctx.grad_fn([], [_fn_edge(permuted)], [3 * xb], [None], out_shape=stacked, shapes=[stacked])
    picked = [ctx.grad_fn([], [_fn_edge(copy_fn)], [3 * xb], ["aten.select_backward.default"], out_shape=shape.seq,
                          shapes=[stacked]) for _ in range(3)]
    transposed = []
    for sel in picked:
        viewed = ctx.grad_fn([], [_fn_edge(sel)], [xb], [None], handoff="view", out_shape=(tokens, batch * heads, dim),
                             shapes=[shape.seq])
        transposed.append(ctx.grad_fn([], [_fn_edge(viewed)], [xb], [None], handoff="transpose", dims=(0, 1),
                                      out_shape=(batch * heads, tokens, dim), shapes=[(tokens, batch * heads, dim)]))
    split = [ctx.grad_fn([], [_fn_edge(t)], [xb], [None], handoff="view", out_shape=shape.split,
                         shapes=[(batch * heads, tokens, dim)]) for t in transposed]
    return qkv, split


def _attention_kernel(ctx: _OpContext, shape: _AttentionShape, qkv: int,
                      split: list) -> tuple[int | None, int | None]:
    """The memory-efficient kernel: its result (laid out as [N, L, heads, E / heads]), a log-sum-exp per head and
    token (the tokens padded to 32), a seed and an offset (8 bytes each), all kept with the query, key and value (in
    the order its node frees them); backward, a gradient of each laid out as the result: (its autograd node, None),
    or where nothing needs a gradient (None, the result's storage)."""
    xb, (batch, heads, tokens, dim) = ctx.nbytes, shape.split
    if all(f is None for f in split):  # nothing needs a gradient (a frozen attention on a map that needs none): no
        # log-sum-exp (0 bytes); the offset, seed, it and the query, key and value freed at once; the result once copied
        out, none = ctx.alloc(_EFFICIENT, xb), ctx.alloc(_EFFICIENT, 0)
        for sid in [ctx.alloc(_EFFICIENT, INT64) for _ in range(2)][::-1] + [none, qkv]:
            ctx.mem.drop(sid)
        return None, out
    out = ctx.alloc(_EFFICIENT, xb, holders=0)
    lse = ctx.alloc(_EFFICIENT, batch * heads * -(-tokens // 32) * 32 * FLOAT, holders=0)
    seed, offset = (ctx.alloc(_EFFICIENT, INT64, holders=0) for _ in range(2))
    laid_out = ("fixed", (tokens * heads * dim, dim, heads * dim, 1))
    kernel = ctx.grad_fn([qkv, lse, out, offset, seed], [_fn_edge(f) for f in split], [xb] * 3,
                         [f"aten.{_EFFICIENT.replace('.default', '_backward.default')}"] * 3,
                         out_shape=shape.split, shapes=[shape.split] * 3, layouts=[laid_out] * 3, any_strides=True)
    ctx.mem.drop(qkv)  # the query, key and value: views the kernel's node keeps
    return kernel, None


def _attention_output(ctx: _OpContext, shape: _AttentionShape, kernel: int | None, result: int | None) -> _Value:
    """The kernel's result permuted to [L, N, heads, E / heads] and made contiguous (kept by the projection), viewed
    as rows for the output projection (``addmm``), viewed back as [L, N, E] and transposed to [N, L, E]; ``result``:
    the result's storage where no node keeps it (freed once copied)."""
    xb, p, e = ctx.nbytes, ctx.first_param, shape.embed
    heads_first = (shape.tokens, shape.batch, shape.heads, e // shape.heads)
    permuted = ctx.grad_fn([], [_fn_edge(kernel)], [xb], [None], handoff="permute", perm=(2, 0, 1, 3),
                           out_shape=heads_first, shapes=[shape.split])
    copied = ctx.alloc("clone.default")
    if result is not None:
        ctx.mem.drop(result)
    copy_fn = ctx.grad_fn([], [_fn_edge(permuted)], [xb], [None], out_shape=heads_first, shapes=[heads_first])
    rows = ctx.grad_fn([], [_fn_edge(copy_fn)], [xb], [None], handoff="view", out_shape=(shape.tokens * shape.batch, e),
                       shapes=[heads_first])
    weight_t = ctx.grad_fn([], [("param", p + 2)], [e * e * FLOAT], [None], handoff="view")
    sid = ctx.alloc("addmm.default")
    flat = (shape.tokens * shape.batch, e)
    kept = [copied] if weight_t is not None else []  # addmm keeps its input for the weight's gradient alone
    addmm = ctx.grad_fn(kept, [("param", p + 3), _fn_edge(rows), _fn_edge(weight_t)], [e * FLOAT, xb, e * e * FLOAT],
                        [None, "aten.mm.default", "aten.mm.default"], [0, 1, 2], [xb, None, None],
                        out_shape=flat, shapes=[(e,), flat, (e, e)])
    ctx.mem.drop(copied)
    viewed = ctx.grad_fn([], [_fn_edge(addmm)], [xb], [None], handoff="view", out_shape=shape.seq,
                         shapes=[(shape.tokens * shape.batch, e)])
    fn = ctx.grad_fn([], [_fn_edge(viewed)], [xb], [None], handoff="transpose", dims=(0, 1), shapes=[shape.seq])
    raw = (e, shape.batch * e, 1)
    return _Value(sid, xb, fn, view=True, strides=_normal(ctx.full_out, raw), raw=raw if 1 in ctx.full_out else None)


def _handed_back(ctx: _OpContext) -> _Value:
    """identity, and a dropout of ``p`` 0 (torch hands the input back: no kernel, no autograd node): the input."""
    x = ctx.x
    return _Value(ctx.mem.hold(x.sid), x.nbytes, x.fn, x.view, x.strides, raw=x.raw, loose=x.loose)
