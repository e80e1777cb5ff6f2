"""The networks stage: prune every source network at every level and generate new ones.

Outputs, under ``cfg.models_dir``:
- ``pruned/<strategy>/<network>_l<level>.json`` and ``pruned/<strategy>/manifest.csv``;
- ``generated/gen_<seed>_<index>.json`` and ``generated/manifest.csv``;
- ``manifest.csv``: every network this run produced (the list later stages should read;
  files left from earlier runs with other settings are not deleted, only left out).

Manifest columns (``MANIFEST_COLUMNS``): ``network`` (variant name), ``family``, ``source``,
``strategy`` (``generated`` for generated networks), ``target_level`` and ``achieved_level``
(percent of parameters removed), ``seed``, ``params`` (trainable parameters), ``flops_fwd``
(forward FLOPs per sample at ``input_shape``, one multiply-add = 2 FLOPs), ``input_shape``
(``CxHxW``), ``styles`` (stage styles, ``|``-separated, generated only) and ``path``
(relative to ``models_dir``).
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from perf4sight.config import Config
from perf4sight.errors import UserError
from perf4sight.files import atomic_path
from perf4sight.ir.from_torch import describe
from perf4sight.ir.schema import NetworkDescription, load_description, save_description
from perf4sight.ir.to_torch import build_module
from perf4sight.networks.factories import build_factory_model, parse_factory
from perf4sight.networks.generator import GeneratorSettings, forward_flops, generate
from perf4sight.networks.pruning import PruningPlan, check_level
from perf4sight.networks.zoo import build_zoo_model
from perf4sight.wording import plural

__all__ = ["Source", "MANIFEST_COLUMNS", "sources", "prune_source", "make_networks", "variant_name",
           "write_manifest", "read_manifest", "reshaped_description_notes"]

MANIFEST_COLUMNS: tuple[str, ...] = ("network", "family", "source", "strategy", "target_level", "achieved_level",
                                     "seed", "params", "flops_fwd", "input_shape", "styles", "path")
Progress = Callable[[str], None]


@dataclass
class Source:
    """A network to prune: its family name, where it comes from and how to build it."""

    name: str
    source: str
    build: Callable[[], nn.Module]


def sources(cfg: Config) -> list[Source]:
    """The zoo networks, factories and description files the config names, in that order."""
    nc = cfg.networks.num_classes
    found: list[Source] = [Source(n, f"torchvision:{n}", lambda n=n: build_zoo_model(n, nc)) for n in cfg.networks.zoo]
    for spec in cfg.networks.factories:
        factory = parse_factory(spec, cfg.root, cfg.models_dir)
        build_factory_model(factory, nc)  # fail early on a file that does not import
        found.append(Source(factory.name, factory.source, lambda f=factory: build_factory_model(f, nc)))
    for fname in cfg.networks.description_files:
        desc = load_description(cfg.resolve(fname))
        found.append(Source(desc.network or desc.name, f"description:{fname}", lambda d=desc: build_module(d)))
    names = [s.name for s in found]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UserError(f"{cfg.path}: [networks] names {dupes} more than once (zoo, factories, description_files)")
    return found


def reshaped_description_notes(cfg: Config) -> list[str]:
    """One note per ``[networks] description_files`` entry described at another input shape than
    ``[networks] input_shape``: the networks stage rebuilds it and describes its variants at the configured one."""
    want = list(cfg.networks.input_shape)
    lines = []
    for fname in cfg.networks.description_files:
        have = list(load_description(cfg.resolve(fname)).input_shape)
        if have != want:
            lines.append(f"note: [networks] description_files: {fname} is described at input shape "
                         f"{'x'.join(map(str, have))}; its networks are built at [networks] input_shape "
                         f"{'x'.join(map(str, want))}")
    return lines


def variant_name(network: str, level: float) -> str:
    """``resnet18_l30`` for level 30; ``resnet18_l12.5`` for 12.5."""
    return f"{network}_l{level:g}"


def _seeded_build(src: Source, seed: int) -> nn.Module:
    """Build with a fixed weight initialisation (l1-norm rankings depend on it)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return src.build()


def prune_source(src: Source, input_shape: list[int], levels: list[float], strategy: str, min_channels: int,
                 seed: int, progress: Progress | None = None) -> list[NetworkDescription]:
    """One description per level (ascending input order kept), each with its achieved level."""
    levels = [check_level(lvl, f"[networks.pruning] levels ({src.name})") for lvl in levels]
    base = _seeded_build(src, seed)
    plan = PruningPlan(base, input_shape, strategy, min_channels, seed, src.name)  # traced once for all levels
    out = []
    for lvl in levels:
        pruned = plan.prune(lvl, meta=True)
        info = dict(name=variant_name(src.name, lvl), network=src.name, pruning_level=pruned.achieved_level,
                    source=src.source, strategy=strategy, seed=seed, target_level=lvl, **pruned.extra)
        try:  # meta weights: shapes only, no real forward pass (seconds per level for large networks at 224x224)
            desc = describe(pruned.module, input_shape, **info)
        except Exception:  # an op without a meta kernel: describe a real copy instead
            desc = describe(plan.prune(lvl).module, input_shape, **info)
        out.append(desc)
        if progress:
            progress(f"{desc.name}: {pruned.achieved_level:.1f}% removed, {desc.params:,} parameters")
    return out


def _row(desc: NetworkDescription, path: Path, models_dir: Path) -> dict[str, Any]:
    ex = desc.extra
    return {"network": desc.name, "family": desc.network, "source": ex.get("source", ""),
            "strategy": ex.get("strategy", "generated" if ex.get("source") == "generator" else ""),
            "target_level": ex.get("target_level", 0), "achieved_level": desc.pruning_level,
            "seed": ex.get("seed", ""), "params": desc.params, "flops_fwd": int(forward_flops(desc)),
            "input_shape": "x".join(str(s) for s in desc.input_shape), "styles": "|".join(ex.get("styles", [])),
            "path": path.relative_to(models_dir).as_posix()}


def write_manifest(rows: list[dict[str, Any]], path: Path) -> Path:
    """Write ``rows`` as CSV with ``MANIFEST_COLUMNS`` (atomic replace)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp, tmp.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=MANIFEST_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return path


def read_manifest(path: Path) -> list[dict[str, str]]:
    """Rows of a manifest CSV (strings); ``UserError`` if missing."""
    if not path.is_file():
        raise UserError(f"{path}: network manifest not found; run the networks stage first")
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def make_networks(cfg: Config, progress: Progress | None = None) -> list[dict[str, Any]]:
    """Run the networks stage for ``cfg``; returns the manifest rows (also written to disk)."""
    net, pr, gen = cfg.networks, cfg.networks.pruning, cfg.networks.generator
    models_dir = cfg.models_dir
    rows: list[dict[str, Any]] = []
    # generated networks are drawn first (in memory, seconds): constraints that too few candidates satisfy
    # fail before the pruning (minutes) instead of after it
    generated: list[NetworkDescription] = []
    if gen.count > 0:
        generated = generate(GeneratorSettings.from_config(gen), list(net.input_shape), net.num_classes,
                             config=cfg.path)
    if net.zoo or net.factories or net.description_files:
        folder = models_dir / "pruned" / pr.strategy
        pruned_rows = []
        for src in sources(cfg):
            for desc in prune_source(src, list(net.input_shape), list(pr.levels), pr.strategy, pr.min_channels,
                                     pr.seed, progress):
                path = save_description(desc, folder / f"{desc.name}.json")
                pruned_rows.append(_row(desc, path, models_dir))
        write_manifest(pruned_rows, folder / "manifest.csv")
        rows += pruned_rows
    if generated:
        folder = models_dir / "generated"
        gen_rows = []
        for desc in generated:
            path = save_description(desc, folder / f"{desc.name}.json")
            gen_rows.append(_row(desc, path, models_dir))
        write_manifest(gen_rows, folder / "manifest.csv")
        if progress:
            progress(f"generated {plural(len(gen_rows), 'network')} in {folder}")
        rows += gen_rows
    write_manifest(rows, models_dir / "manifest.csv")
    return rows
