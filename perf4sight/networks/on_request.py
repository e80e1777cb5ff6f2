"""A network's pruned variant made when a stage asks for it by name (``resnet18_l45``), not by the networks stage.

``--stage predict --network resnet18_l45`` asks how a pruning level nobody profiled would train. Where the dataset
has no network of that name, the network (a zoo network, or one of the config's ``[networks]`` factories and
description files) is pruned here to that level exactly as the networks stage would (``[networks.pruning]``
strategy, min_channels and seed; the same seeded build), at the input shape asked for. The variant is cached under
``<models_dir>/zoo-cache/`` beside the zoo descriptions, keyed by the settings, the library versions and the pruning
code, and for one of the config's own networks by the bytes of its description file, or of its factory's file, the
Python files beside it and the user's modules they import (and the name, size and time of its other files beside it),
too (an edited file is pruned anew), so a second request
reads a file instead of importing torch. Within a process a network is traced for pruning once, whatever the number
of levels asked of it.

``prunable_networks`` says which names can be pruned so (the compare report's pruning section and
``--prune-to-fit`` ask), and ``variant_at`` gives a level of one at a device's input shape: the networks stage's
file where it made it at that shape, else pruned here.
"""
from __future__ import annotations

import functools
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from perf4sight.config import Config
from perf4sight.dataset import ZOO_CACHE, is_description_file, resolve_networks
from perf4sight.errors import UserError
from perf4sight.ir.schema import NetworkDescription
from perf4sight.networks.factories import COMMAND_LINE_FACTORY, check_factory, factory_data, parse_factory
from perf4sight.networks.named import NamedNetwork, named_networks
from perf4sight.networks.zoo import ZOO_NAMES, build_zoo_model, cache_file, cached_description

__all__ = ["VARIANT", "variant_name", "pruned_as", "pruned_on_request", "unpruned_own", "prunable_networks", "PRUNABLE",
           "with_command_line_factories", "variant_at", "LevelVariants"]

#: ``<network>_l<level>``: the name the networks stage gives a network pruned to ``level`` percent of parameters.
VARIANT = re.compile(r"(?P<network>.+)_l(?P<level>\d+(?:\.\d+)?)")
_NETWORKS = Path(__file__).resolve().parent


def variant_name(network: str, level: float) -> str:
    """``resnet18_l30`` for level 30; ``resnet18_l12.5`` for 12.5 (read back by ``VARIANT``)."""
    return f"{network}_l{level:g}"


def pruned_as(cfg: Config) -> str:
    """How a variant is pruned on request, for the notes that say so: ``l1-norm, min_channels 4, seed 0``."""
    pr = cfg.networks.pruning
    return f"{pr.strategy}, min_channels {pr.min_channels}, seed {pr.seed}"


def pruned_on_request(cfg: Config, name: str, input_shape: list[int]) -> NetworkDescription | None:
    """The description of ``name`` = ``<network>_l<level>`` pruned as the networks stage would, at ``input_shape``
    ([C, H, W]), under that name (read from the cache where made before: torch is imported only to prune); None
    when ``name`` reads otherwise or ``<network>`` is neither a zoo network nor one the config's ``[networks]``
    names (``named.named_networks``). A level outside 0..99, or one the network cannot reach under
    ``min_channels`` (``UnreachableLevel``), raises ``UserError``."""
    found = VARIANT.fullmatch(name)
    if found is None:
        return None
    network, level = found.group("network"), float(found.group("level"))
    pr, classes = cfg.networks.pruning, cfg.networks.classes_of(network)
    settings: tuple[Any, ...] | None = (pr.strategy, pr.min_channels, pr.seed)
    code = _networks_code()
    named = own_network(cfg, network)  # the config's own network of that name before torchvision's
    if named is None and network not in ZOO_NAMES:
        return None
    if named is not None:
        # the bytes of its own files, and where it comes from, key its variants: an edited file is pruned anew; a
        # factory's other files beside it too, by name, size and time (a widths file it reads), as the stage's key
        data = factory_data(named.path) if named.factory is not None else ()
        code = code + named.code_files
        settings = None if data is None else settings + (named.source,) + data  # None: made, not cached
    _check_level(name, network, level)

    def make() -> NetworkDescription:
        source = _zoo_source(network, classes, input_shape) if named is None else _own_source(cfg, network)
        return _prune(cfg, source, level, input_shape)

    path = None if settings is None else cache_file(cfg.models_dir / ZOO_CACHE, name, input_shape, classes,
                                                    packages=("torch-pruning",), settings=settings, code=code)
    return replace(cached_description(path, make), name=name)


def own_network(cfg: Config, network: str) -> NamedNetwork | None:
    """The factory or description file of the config's ``[networks]`` named ``network``, else None; it wins a zoo
    network of the same name (a description file of ``resnet18`` with classes of its own is the dataset's
    ``resnet18``). Read without torch; nothing is read where the config names no factory or file."""
    if not (cfg.networks.factories or cfg.networks.description_files):
        return None
    return next((n for n in named_networks(cfg) if n.name == network), None)


def unpruned_own(cfg: Config, network: str, input_shape: list[int]) -> NetworkDescription | None:
    """A network the config's ``[networks]`` names (a factory, a description file), asked for by its own name:
    its level 0 as the networks stage describes it (``<network>_l0``), at ``input_shape``, under ``network``;
    None for another name."""
    if own_network(cfg, network) is None:
        return None
    return replace(pruned_on_request(cfg, variant_name(network, 0), input_shape), name=network)


def prunable_networks(cfg: Config, entries: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the networks of ``entries`` that can be pruned, each once; the entries that cannot). Zoo networks and the
    networks ``[networks]`` names can (read without torch: ``named.named_networks``); a pruned variant's name
    (``tiny_resnet_l0``, the way a factory's network is named in the dataset) stands for its network."""
    own: list[str] | None = None  # the config's factories and description files, named at the first need

    def prunable(name: str) -> bool:
        nonlocal own
        if name in ZOO_NAMES:
            return True
        if own is None:
            own = [n.name for n in named_networks(cfg)]
        return name in own

    out, refused = [], []
    for name in entries:
        if is_description_file(name, cfg):
            network = None
        elif prunable(name):
            network = name
        else:
            variant = VARIANT.fullmatch(name)
            network = variant.group("network") if variant and prunable(variant.group("network")) else None
        if network:
            out.append(network)
        else:
            refused.append(name)
    return list(dict.fromkeys(out)), refused


#: what :func:`prunable_networks` accepts, for the line that refuses another name
PRUNABLE = ("a zoo network or one [networks] names (a factory, a description file), a pruned variant of one, or "
            "FILE.py:FUNCTION")


def with_command_line_factories(cfg: Config, entries: Sequence[str]) -> tuple[Config, list[str]]:
    """``entries`` with every ``FILE.py:FUNCTION`` (relative to the current folder) replaced by the function's name,
    and ``cfg`` with those factories added to ``[networks] factories``, so that they are pruned as the config's own
    networks are (their variants cached by the file's bytes). A file that is not there, or a function whose name is
    a zoo network's or another network's that ``[networks]`` names, raises ``UserError``."""
    own = {n.name: n for n in named_networks(cfg)}
    added, out = [], []
    for entry in entries:
        if not COMMAND_LINE_FACTORY.fullmatch(entry):
            out.append(entry)
            continue
        factory = parse_factory(entry, Path.cwd())
        check_factory(factory)  # a function the file lacks: said of the entry, not of [networks] factories
        if factory.name in ZOO_NAMES or (factory.name in own and own[factory.name].path != factory.path):
            taken = "a zoo network's" if factory.name in ZOO_NAMES else f"that of {own[factory.name].source}"
            raise UserError(f"{entry}: its network's name, {factory.name}, is {taken}: name the function otherwise "
                            "to prune it")
        if factory.name not in own:
            added.append(f"{factory.path}:{factory.function}")
        out.append(factory.name)
    if not added:
        return cfg, out
    factories = [*cfg.networks.factories, *dict.fromkeys(added)]
    return replace(cfg, networks=replace(cfg.networks, factories=factories)), out


def variant_at(cfg: Config, network: str, level: float, shape: list[int]) -> tuple[NetworkDescription, bool]:
    """``<network>_l<level>`` at ``shape``, and whether it was pruned on request: the dataset's file when it was
    described at that shape, else pruned as the networks stage would."""
    name = variant_name(network, level)
    noted: list[str] = []
    desc = resolve_networks(cfg, [name], shape, noted)[0]
    if list(desc.input_shape) != list(shape):  # the dataset's file, made at another device's input shape
        return pruned_on_request(cfg, name, shape), True
    return desc, bool(noted)


class LevelVariants:
    """``network``'s variants at ``shape`` for a search over levels: called with a level, the description
    (:func:`variant_at`), each level made once; ``pruned``: the names of those pruned on request, in order."""

    def __init__(self, cfg: Config, network: str, shape: Sequence[int]) -> None:
        self.cfg, self.network, self.shape = cfg, network, list(shape)
        self.pruned: list[str] = []
        self._made: dict[float, NetworkDescription] = {}

    def __call__(self, level: float) -> NetworkDescription:
        if level not in self._made:
            self._made[level], pruned = variant_at(self.cfg, self.network, level, self.shape)
            if pruned:
                self.pruned.append(self._made[level].name)
        return self._made[level]


@functools.lru_cache(maxsize=None)
def _networks_code() -> tuple[Path, ...]:
    """The pruning code's files (this folder's), whose bytes key every variant cached: listed once per process."""
    return tuple(sorted(_NETWORKS.glob("*.py")))


def _check_level(name: str, network: str, level: float) -> None:
    """``UserError`` for a level no pruning reaches."""
    if level > 99:
        raise UserError(f"'{name}': {level:g}% of {network}'s parameters cannot be pruned (levels: 0..99)")


def _zoo_source(network: str, classes: int, input_shape: list[int]) -> Any:
    """The networks stage's source of zoo network ``network`` at ``input_shape`` (a ``build.Source``)."""
    from perf4sight.networks.build import Source  # torch: only when a variant is made

    return Source(network, f"torchvision:{network}", lambda: build_zoo_model(network, classes, input_shape))


def _own_source(cfg: Config, network: str) -> Any:
    """The networks stage's source of ``network``, one the config's ``[networks]`` names (a ``build.Source``)."""
    from perf4sight.networks.build import sources  # torch: only when a variant is made

    return next(s for s in sources(cfg) if s.name == network)


def _prune(cfg: Config, source: Any, level: float, input_shape: list[int]) -> NetworkDescription:
    """``source`` (a ``build.Source``) pruned to ``level`` percent by :func:`perf4sight.networks.build.prune_source`,
    from a pruning plan kept for the rest of the process (the trace is most of the time a level takes: a search
    over levels, ``--prune-to-fit``, traces each network once)."""
    from perf4sight.networks.build import prune_source, pruning_plan

    pr = cfg.networks.pruning
    key = (source.source, tuple(input_shape), pr.strategy, pr.min_channels, pr.seed,
           cfg.networks.classes_of(source.name))
    if key not in _PLANS:
        _PLANS[key] = pruning_plan(source, list(input_shape), pr.strategy, pr.min_channels, pr.seed)
    (desc,) = prune_source(source, list(input_shape), [level], pr.strategy, pr.min_channels, pr.seed,
                           plan=_PLANS[key])
    return desc


#: pruning plans traced in this process: (source, shape, strategy, min_channels, seed, classes) -> plan
_PLANS: dict[tuple[Any, ...], Any] = {}
