"""A network described again at another input shape: what ``--stage predict --input-shape`` asks of a description
file or a dataset network (a zoo name is described at the asked shape directly), and how the networks stage makes
every network at ``[networks] extra_input_shapes`` (named :func:`shaped_name`).

The description is rebuilt as a module (the same layers and channels) and traced at the new shape, as the networks
stage does with a ``[networks] description_files`` entry described at another shape than ``[networks]
input_shape``. What a description fixes as numbers cannot follow the new shape: a reshape to a literal size (a
classifier fed a flattened map) fails in the trace, and a resize to a literal size (a segmentation network's output
brought back to its input's size) would run at the old size (one by a whole scale factor, a U-Net's or an FPN's
upsampling by 2, keeps its factor, and one to another map's size, an FPN's or a segmentation network's, names that
map: both follow the new shape); both are refused with one line, except for a pruned
variant of a zoo network or of one ``[networks]`` names (a ViT's, whose position embedding has one entry per patch),
which is pruned at the new shape instead, as the networks stage would prune it there. The same holds for what the
generator makes: its transformer stages' position embedding has one entry per pixel.
"""
from __future__ import annotations

from typing import Sequence

from perf4sight.config import Config
from perf4sight.errors import UserError
from perf4sight.ir.schema import NetworkDescription
from perf4sight.ir.shapes import shape_text

__all__ = ["described_at", "other_channels", "channels_refusal", "query_at", "shaped_name"]


def shaped_name(name: str, input_shape: Sequence[int]) -> str:
    """The name of network ``name`` made at another input shape by the networks stage (``[networks]
    extra_input_shapes``): ``resnet18_l30`` at ``[3, 128, 96]`` -> ``resnet18_l30_128x96``."""
    return f"{name}_{int(input_shape[1])}x{int(input_shape[2])}"


def other_channels(desc: NetworkDescription, input_shape: Sequence[int]) -> str:
    """The line refusing ``desc`` at ``input_shape`` (``[C, H, W]``) for its channels: a rebuild keeps its layers, and
    so the channels its first layer takes; "" where they are ``desc``'s. Needs no torch: predict says it before
    torch loads."""
    return channels_refusal(desc.name, int(desc.input_shape[0]), f"described at {shape_text(desc.input_shape)}",
                            input_shape)


def channels_refusal(name: str, channels: int, why: str, input_shape: Sequence[int]) -> str:
    """The line refusing network ``name``, whose first layer takes ``channels`` (``why``: where that is read), at
    ``input_shape`` (``[C, H, W]``); "" where it has those channels."""
    if int(input_shape[0]) == channels:
        return ""
    return (f"{name}: takes {channels}-channel images ({why}), not {input_shape[0]}-channel ones "
            f"({shape_text(input_shape)}): another input shape can change the height and width only")


def described_at(desc: NetworkDescription, input_shape: Sequence[int]) -> NetworkDescription:
    """``desc`` at ``input_shape`` (``[C, H, W]`` of one image): itself where it is already described at it, else
    its network rebuilt from the description and traced at that shape, keeping its name, pruning level and
    metadata. ``UserError`` (one line naming the network) where its layers cannot run at that shape, or where its
    output kept the input's size and would not at the new one (a resize to a fixed size)."""
    from perf4sight.ir.from_torch import check_input_shape, describe  # torch: imported here, not by shaped_name's
    from perf4sight.ir.to_torch import build_module                     # callers (predict)

    shape = check_input_shape(input_shape, desc.name)  # a string is refused whole, not read as its characters
    if list(desc.input_shape) == shape:
        return desc
    was, asked = shape_text(desc.input_shape), shape_text(shape)
    refused = other_channels(desc, shape)
    if refused:
        raise UserError(refused)
    _refuse_computed_pads(desc, was, asked)
    try:
        out = describe(build_module(desc, device="meta"), shape, desc.name, network=desc.network,
                       pruning_level=desc.pruning_level, **desc.extra)
    except UserError as exc:
        raise UserError(f"{exc} (described at {was}, rebuilt at {asked}: a description fixes some sizes as numbers, "
                        f"such as a reshape's{_fixed_resizes(desc)}; describe the network at that shape from its "
                        "module instead)") from None
    if _follows_input(desc) and not _follows_input(out):
        raise UserError(f"{desc.name}: described at {was}, its output has the input's size, but rebuilt at {asked} "
                        f"it keeps {shape_text(out.node(out.output).output_shape[1:])} (a resize to a fixed size): "
                        "describe the network at that shape from its module instead (a zoo name is)")
    return out


def _refuse_computed_pads(desc: NetworkDescription, was: str, asked: str) -> None:
    """``UserError`` naming ``desc``'s pads whose numbers its trace computed from the maps' sizes at ``was`` otherwise
    than a U-Net's split of a difference (``pads_computed``): rebuilt at ``asked`` they would pad as at ``was``."""
    names = [n.name for n in desc.nodes if n.op == "pad" and n.attrs.get("pads_computed")]
    if names:
        raise UserError(f"{desc.name}: {', '.join(names[:3])}{' and more' if len(names) > 3 else ''} pad"
                        f"{'' if len(names) > 1 else 's'} by numbers its trace computed from the maps' sizes at {was} "
                        "(other than a U-Net's split of a difference, d // 2 and d - d // 2, which a description "
                        f"follows): rebuilt at {asked} they would pad as there; describe the network at that shape "
                        "from its module instead")


def _fixed_resizes(desc: NetworkDescription, shown: int = 3) -> str:
    """A clause naming ``desc``'s resizes to a fixed size (interpolate nodes without a scale factor or another map
    whose size they take: a description of a U-Net written before those kept theirs), the first ``shown`` of them;
    "" where it has none."""
    names = [n.name for n in desc.nodes
             if n.op == "interpolate" and "scale_factor" not in n.attrs and "size_of" not in n.attrs]
    if not names:
        return ""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return (f" or a resize's ({', '.join(names[:shown])}{more} resize to a fixed size; one by a whole scale factor "
            "is described by it now)")


def _follows_input(desc: NetworkDescription) -> bool:
    """Whether ``desc``'s output keeps positions at its input's height and width (a segmentation network's scores)."""
    return list(desc.node(desc.output).output_shape[1:]) == list(desc.input_shape[1:])


def query_at(cfg: Config, name: str, desc: NetworkDescription, input_shape: Sequence[int],
             notes: list[str] | None = None) -> NetworkDescription:
    """The query ``name`` (resolved as ``desc``) at ``input_shape``: :func:`described_at`, else, where the rebuild
    cannot take the shape and ``name`` is a pruned variant of a zoo network or of one ``[networks]`` names
    (``resnet18_l30``), that variant pruned at the shape as the networks stage would (a sentence saying so appended
    to ``notes``); the rebuild's ``UserError`` otherwise."""
    from perf4sight.networks.on_request import pruned_as, pruned_on_request

    try:
        return described_at(desc, input_shape)
    except UserError:
        remade = pruned_on_request(cfg, name, list(input_shape)) if name == desc.name else None
        if remade is None:
            raise
    if notes is not None:
        notes.append(f"{name}: its description cannot be rebuilt at {shape_text(input_shape)}: "
                     f"{remade.network} pruned there as the networks stage would ({pruned_as(cfg)})")
    return remade
