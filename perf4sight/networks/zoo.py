"""Torchvision networks by name, built without downloading weights."""
from __future__ import annotations

import functools
import hashlib
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from perf4sight.errors import UserError
from perf4sight.ir.schema import NetworkDescription, load_description, save_description
from perf4sight.ir.shapes import shape_text

if TYPE_CHECKING:  # torch is imported where a model is built: predicting from description files does without it
    from torch import nn

__all__ = ["ZOO_NAMES", "ZOO_CHANNELS", "SEGMENTATION_NAMES", "build_zoo_model", "describe_zoo",
           "check_channels"]

#: zoo name -> extra keyword arguments for the torchvision builder: every one of torchvision's image classifiers. A
#: ViT and MaxViT are built for the input size they are described at (``image_size``: ViT's position embedding;
#: ``input_size``: MaxViT's partitions).
_BUILD_KWARGS: dict[str, dict[str, Any]] = {
    name: {} for name in (
        "alexnet", "vgg11", "vgg11_bn", "vgg13", "vgg13_bn", "vgg16", "vgg16_bn", "vgg19", "vgg19_bn",
        "resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnext50_32x4d", "resnext101_32x8d",
        "resnext101_64x4d", "wide_resnet50_2", "wide_resnet101_2",
        "mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large", "mnasnet0_5", "mnasnet0_75", "mnasnet1_0",
        "mnasnet1_3", "shufflenet_v2_x0_5", "shufflenet_v2_x1_0", "shufflenet_v2_x1_5", "shufflenet_v2_x2_0",
        "squeezenet1_0", "squeezenet1_1", "densenet121", "densenet161", "densenet169", "densenet201",
        "efficientnet_b0", "efficientnet_b1", "efficientnet_b2", "efficientnet_b3", "efficientnet_b4",
        "efficientnet_b5", "efficientnet_b6", "efficientnet_b7", "efficientnet_v2_s", "efficientnet_v2_m",
        "efficientnet_v2_l",
        "regnet_x_400mf", "regnet_x_800mf", "regnet_x_1_6gf", "regnet_x_3_2gf", "regnet_x_8gf", "regnet_x_16gf",
        "regnet_x_32gf", "regnet_y_400mf", "regnet_y_800mf", "regnet_y_1_6gf", "regnet_y_3_2gf", "regnet_y_8gf",
        "regnet_y_16gf", "regnet_y_32gf", "regnet_y_128gf",
        "convnext_tiny", "convnext_small", "convnext_base", "convnext_large",
        "vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32", "vit_h_14", "swin_t", "swin_s", "swin_b",
        "swin_v2_t", "swin_v2_s", "swin_v2_b", "maxvit_t")
} | {name: {"aux_logits": False, "init_weights": False} for name in ("googlenet", "inception_v3")}
#: torchvision's semantic segmentation networks (``torchvision.models.segmentation``): a class score per pixel at the
#: input's size. Built without their auxiliary head and without a backbone's weights (which would be downloaded).
SEGMENTATION_NAMES: tuple[str, ...] = ("fcn_resnet50", "fcn_resnet101", "deeplabv3_resnet50", "deeplabv3_resnet101",
                                       "deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large")
_BUILD_KWARGS.update({name: {"weights_backbone": None, "aux_loss": False} for name in SEGMENTATION_NAMES})
ZOO_NAMES: tuple[str, ...] = tuple(sorted(_BUILD_KWARGS))
#: The channels of the images every zoo network takes (torchvision's classifiers and segmentation networks: RGB)
ZOO_CHANNELS = 3
#: MaxViT's input side must be a multiple of this: its 7x7 partitions of a map a 32nd of the input's
MAXVIT_SIDE = 224
#: ViT zoo name -> its patch size: the input must be square and a multiple of it
_VIT_PATCH = {"vit_b_16": 16, "vit_b_32": 32, "vit_l_16": 16, "vit_l_32": 32, "vit_h_14": 14}


def check_channels(name: str, input_shape: list[int] | None, called: str = "") -> None:
    """``UserError`` where zoo network ``name`` (``called``: the name asked for, a variant's) cannot take
    ``input_shape``'s channels (:data:`ZOO_CHANNELS`): said before torchvision loads, not by its first convolution
    seconds later."""
    from perf4sight.networks.reshape import channels_refusal

    said = "" if input_shape is None else channels_refusal(called or name, ZOO_CHANNELS, f"torchvision's {name}",
                                                           input_shape)
    if said:
        raise UserError(said)


def _check_name(name: str) -> None:
    """``UserError`` unless ``name`` is a zoo network, saying what to give instead."""
    if name in _BUILD_KWARGS:
        return
    raise UserError(f"unknown network '{name}' (zoo networks: {', '.join(ZOO_NAMES)}; any other network: "
                    "give its description .json file, e.g. the one the networks stage wrote under models/)")


def build_zoo_model(name: str, num_classes: int = 1000, input_shape: list[int] | None = None) -> nn.Module:
    """A randomly initialised torchvision model (``weights=None``; a segmentation network's backbone too); a ViT for
    images of ``input_shape`` ([C, H, W], square, a multiple of its patch size; 224x224 when not given), else
    ``UserError``."""
    _check_name(name)
    check_channels(name, input_shape)
    kwargs = dict(_BUILD_KWARGS[name])  # a shape the network cannot take is refused before torchvision loads
    if name in _VIT_PATCH and input_shape is not None:
        kwargs["image_size"] = _vit_image_size(name, input_shape)
    if name.startswith("maxvit_") and input_shape is not None:
        kwargs["input_size"] = (_maxvit_image_size(name, input_shape),) * 2
    import torchvision.models as tvm  # host side only: devices never import torchvision

    builder: Callable[..., nn.Module] = getattr(tvm.segmentation if name in SEGMENTATION_NAMES else tvm, name)
    return builder(weights=None, num_classes=num_classes, **kwargs)


def _vit_image_size(name: str, input_shape: list[int]) -> int:
    """The side of the square images ViT ``name`` takes at ``input_shape``; ``UserError`` where it cannot."""
    _, h, w = input_shape
    if h != w or h % _VIT_PATCH[name]:
        raise UserError(f"'{name}': a ViT takes square images whose side is a multiple of its patch size "
                        f"{_VIT_PATCH[name]}; the input shape is {list(input_shape)}")
    return int(h)


def _maxvit_image_size(name: str, input_shape: list[int]) -> int:
    """The side of the square images MaxViT ``name`` takes at ``input_shape``; ``UserError`` where it cannot."""
    _, h, w = input_shape
    if h != w or h % MAXVIT_SIDE:
        raise UserError(f"'{name}': MaxViT takes square images whose side is a multiple of {MAXVIT_SIDE} (its 7x7 "
                        f"partitions of maps a 32nd of the input's); the input shape is {list(input_shape)}")
    return int(h)


def cache_file(cache_dir: Path, name: str, input_shape: list[int], num_classes: int, packages: tuple[str, ...] = (),
               settings: tuple[Any, ...] = (), code: tuple[Path, ...] = ()) -> Path | None:
    """Where a description is cached: keyed by the network, its shape and class count, the torch and
    torchvision versions (and those of ``packages``), ``settings``, and the source of the code that describes it
    (and of ``code``); None if a version is unknown. The versions and perf4sight's own files are read once per
    process (they do not change while it runs; a search over levels asks this of each level); ``code`` outside
    perf4sight (a user's factory file, edited between two calls) is read at each call."""
    versions = [_version(p) for p in ("torch", "torchvision", *packages)]
    if None in versions:
        return None
    # without settings, the key a zoo description always had: the files cached before stay valid
    h = hashlib.sha256(repr((name, list(input_shape), num_classes, versions) + ((settings,) if settings else ()))
                       .encode())
    for src in (*_own_sources(), *code):
        h.update(_own_bytes(src) if _PACKAGE in src.parents else src.read_bytes())
    shape = shape_text(input_shape)
    return cache_dir / f"{name}-{shape}-{num_classes}-{h.hexdigest()[:16]}.json"


_PACKAGE = Path(__file__).resolve().parents[1]  #: perf4sight's own folder: its files are read once per process


@functools.lru_cache(maxsize=None)
def _own_sources() -> tuple[Path, ...]:
    """This file and the IR's, whose source keys every cached description."""
    return (Path(__file__).resolve(), *sorted((_PACKAGE / "ir").glob("*.py")))


@functools.lru_cache(maxsize=None)
def _own_bytes(path: Path) -> bytes:
    return path.read_bytes()


@functools.lru_cache(maxsize=None)
def _version(package: str) -> str | None:
    """``package``'s installed version, None where it is not installed."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def cached_description(path: Path | None, make: Callable[[], NetworkDescription]) -> NetworkDescription:
    """The description cached at ``path`` (:func:`cache_file`), else ``make()``'s, written there. Best effort: an
    unwritable or damaged file is passed over (and a damaged one made again)."""
    if path is not None and path.is_file():
        try:
            return load_description(path)
        except UserError:
            pass  # damaged: made again below and rewritten
    desc = make()
    if path is not None:
        try:
            save_description(desc, path)
        except OSError:
            pass
    return desc


def describe_zoo(name: str, input_shape: list[int], num_classes: int = 1000,
                 cache_dir: str | Path | None = None) -> NetworkDescription:
    """The description of zoo network ``name`` at ``input_shape`` ([C, H, W]).

    With ``cache_dir`` a description made before (same network, shape, classes, torch and
    torchvision versions and describing code) is read from there instead of importing torch and
    tracing the model again (seconds); a new one is written there (:func:`cached_description`)."""
    _check_name(name)
    check_channels(name, input_shape)
    path = None if cache_dir is None else cache_file(Path(cache_dir), name, input_shape, num_classes)
    return cached_description(path, lambda: _describe_built(name, input_shape, num_classes))


def _describe_built(name: str, input_shape: list[int], num_classes: int) -> NetworkDescription:
    import torch

    from perf4sight.ir.from_torch import describe

    info = dict(name=name, network=name, source=f"torchvision:{name}")
    if name in _VIT_PATCH:
        _vit_image_size(name, input_shape)  # an input it cannot take is said once, not retried
    if name.startswith("maxvit_"):
        _maxvit_image_size(name, input_shape)
    try:
        with torch.device("meta"):  # shapes only: no weights initialised (3-10x faster)
            model = build_zoo_model(name, num_classes, input_shape)
        return describe(model, input_shape, **info)
    except (UserError, NotImplementedError):  # an op without a meta kernel, or an initialiser that copies data
        return describe(build_zoo_model(name, num_classes, input_shape), input_shape, **info)  # (regnets)
