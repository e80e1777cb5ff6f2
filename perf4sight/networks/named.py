"""The networks a config's ``[networks]`` table names in files of its own, read without torch.

A factory (``[networks] factories``, a Python file and a function) or a description file (``[networks]
description_files``) is a network the networks stage prunes, as it prunes the zoo networks. This module says what
each is called, where it comes from and which file holds it, without building it: the names a stage may prune on
request, and the file whose bytes key a variant cached on request (``networks/on_request.py``). Building the
networks is ``networks/build.py``'s (``sources``), with torch.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from perf4sight.config import Config
from perf4sight.errors import UserError
from perf4sight.ir.schema import NetworkDescription, load_description
from perf4sight.networks.factories import Factory, parse_factory

__all__ = ["NamedNetwork", "named_networks", "config_descriptions"]


@dataclass(frozen=True)
class NamedNetwork:
    """One factory or description file the config names: ``name`` (its variants are ``<name>_l<level>``),
    ``source`` (``factory:<spec>`` or ``description:<entry>``), ``path`` (the file it comes from), ``family`` (the
    network it derives from) and the parsed ``factory`` or ``description``, whichever it is."""

    name: str
    source: str
    path: Path
    family: str
    factory: Factory | None = None
    description: NetworkDescription | None = None

    @property
    def code_files(self) -> tuple[Path, ...]:
        """The files whose bytes key its variants cached on request: a factory's file and the Python files beside
        it (``Factory.code_files``), or the description file."""
        return self.factory.code_files if self.factory is not None else (self.path,)


def named_networks(cfg: Config) -> list[NamedNetwork]:
    """The config's factories, then its description files, in the order written. A factory whose file is missing,
    or a description file that is missing or not a description, raises ``UserError`` naming the config and key."""
    found = []
    for spec in cfg.networks.factories:
        try:
            factory = parse_factory(spec, cfg.root, cfg.models_dir)
        except UserError as exc:  # say which config and key named it, as the other [networks] errors do
            raise UserError(f"{cfg.path}: [networks] factories: {exc}") from None
        found.append(NamedNetwork(factory.name, factory.source, factory.path, factory.name, factory=factory))
    for fname, desc in config_descriptions(cfg):
        # a pruned or generated description, or a variant made of one, keeps its own name (resnet18_l30 ->
        # resnet18_l30_l0, not resnet18_l0, which reads as the unpruned network; gen_0_1 -> gen_0_1_l0, not its style
        # family's name, which other generated networks share) and the family of the network it derives from
        own = desc.pruning_level or desc.extra.get("source") == "generator" or _made_of_own_name(desc)
        found.append(NamedNetwork(desc.name if own else desc.network or desc.name, f"description:{fname}",
                                  cfg.resolve(fname), desc.network or desc.name, description=desc))
    return found


#: a variant's suffixes as the networks stage writes them: ``_l<level>``, then ``_<H>x<W>`` at an extra shape
_MADE_SUFFIX = re.compile(r"_l\d+(?:\.\d+)?(?:_\d+x\d+)?$")


def _made_of_own_name(desc: NetworkDescription) -> bool:
    """Whether ``desc`` is a variant the networks stage made (it records ``target_level``) of a source named other
    than its family: resnet18_l30_l0, the level 0 of a description file of resnet18_l30, has half resnet18's
    parameters and must not be read as resnet18."""
    made_of = _MADE_SUFFIX.sub("", desc.name)
    return "target_level" in desc.extra and made_of != desc.name and made_of != (desc.network or desc.name)


def config_descriptions(cfg: Config) -> list[tuple[str, NetworkDescription]]:
    """(entry, description) per ``[networks] description_files`` entry; a file that is missing or not a
    description raises ``UserError`` naming the config and the key, as the other [networks] errors do."""
    found = []
    for fname in cfg.networks.description_files:
        try:
            found.append((fname, load_description(cfg.resolve(fname))))
        except UserError as exc:
            raise UserError(f"{cfg.path}: [networks] description_files: {exc}") from None
    return found
