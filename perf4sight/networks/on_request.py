"""A zoo network's pruned variant made when a stage asks for it by name (``resnet18_l45``), not by the networks stage.

``--stage predict --network resnet18_l45`` asks how a pruning level nobody profiled would train. Where the dataset
has no network of that name, the zoo network is pruned here to that level exactly as the networks stage would
(``[networks.pruning]`` strategy, min_channels and seed; the same seeded build), at the input shape asked for, and
cached under ``<models_dir>/zoo-cache/`` beside the zoo descriptions (keyed by the settings, the library versions
and the pruning code), so a second request reads a file instead of importing torch.
"""
from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from perf4sight.config import Config
from perf4sight.dataset import ZOO_CACHE
from perf4sight.errors import UserError
from perf4sight.ir.schema import NetworkDescription
from perf4sight.networks.zoo import ZOO_NAMES, cache_file, cached_description

__all__ = ["VARIANT", "zoo_variant", "pruned_on_request"]

#: ``<network>_l<level>``: the name the networks stage gives a network pruned to ``level`` percent of parameters.
VARIANT = re.compile(r"(?P<network>.+)_l(?P<level>\d+(?:\.\d+)?)")
_NETWORKS = Path(__file__).resolve().parent


def zoo_variant(name: str) -> tuple[str, float] | None:
    """(zoo network, level in percent) when ``name`` reads ``<zoo network>_l<level>``, else None (no torch)."""
    found = VARIANT.fullmatch(name)
    if found is None or found.group("network") not in ZOO_NAMES:
        return None
    return found.group("network"), float(found.group("level"))


def pruned_on_request(cfg: Config, name: str, input_shape: list[int]) -> NetworkDescription | None:
    """The description of ``name`` = ``<zoo network>_l<level>`` pruned as the networks stage would, at
    ``input_shape`` ([C, H, W]), under that name; None when ``name`` is no such name. A level outside 0..99, or
    one the network cannot reach under ``min_channels`` (``UnreachableLevel``), raises ``UserError``."""
    found = zoo_variant(name)
    if found is None:
        return None
    network, level = found
    if level > 99:
        raise UserError(f"'{name}': {level:g}% of {network}'s parameters cannot be pruned (levels: 0..99)")
    pr, classes = cfg.networks.pruning, cfg.networks.num_classes
    path = cache_file(cfg.models_dir / ZOO_CACHE, name, input_shape, classes, packages=("torch-pruning",),
                      settings=(pr.strategy, pr.min_channels, pr.seed),
                      code=tuple(sorted(_NETWORKS.glob("*.py"))))
    return replace(cached_description(path, lambda: _prune(cfg, network, level, input_shape)), name=name)


def _prune(cfg: Config, network: str, level: float, input_shape: list[int]) -> NetworkDescription:
    """``network`` of the zoo pruned to ``level`` percent by :func:`perf4sight.networks.build.prune_source`."""
    from perf4sight.networks.build import Source, prune_source  # torch: only when a variant is made
    from perf4sight.networks.zoo import build_zoo_model

    pr, classes = cfg.networks.pruning, cfg.networks.num_classes
    source = Source(network, f"torchvision:{network}", lambda: build_zoo_model(network, classes))
    (desc,) = prune_source(source, list(input_shape), [level], pr.strategy, pr.min_channels, pr.seed)
    return desc
