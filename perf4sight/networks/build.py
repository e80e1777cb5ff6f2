"""The networks stage: prune every source network at every level and generate new ones.

Outputs, under ``cfg.models_dir``:
- ``pruned/<strategy>/<network>_l<level>.json`` and ``pruned/<strategy>/manifest.csv``;
- ``generated/gen_<seed>_<index>.json`` and ``generated/manifest.csv``;
- with ``[networks] extra_input_shapes``, each of those networks at each such shape too, beside it:
  ``<name>_<H>x<W>.json`` (the same layers and channels, rebuilt and traced at that shape);
- ``manifest.csv``: every network this run produced (the list later stages should read;
  files left from earlier runs with other settings are not deleted, only left out);
- ``manifest-settings.json``: a hash of the ``[networks]`` settings (and the factory and description
  files they name) the manifest was made with, so the profile stage can say when the config changed since, and the
  ``description_sha`` of each description, so the next run says which changed since (even after an interrupt);
- ``zoo-cache/networks-stage/``: what each network's variants were (:mod:`stage_cache`): a rerun reads back those
  of a network whose settings, files and code did not change, instead of pruning it again.

Manifest columns (``MANIFEST_COLUMNS``): ``network`` (variant name), ``family``, ``source``,
``strategy`` (``generated`` for generated networks), ``target_level`` and ``achieved_level``
(percent of parameters removed), ``seed``, ``params`` (trainable parameters), ``flops_fwd``
(forward FLOPs per sample at ``input_shape``, one multiply-add = 2 FLOPs), ``input_shape``
(``CxHxW``), ``styles`` (stage styles, ``|``-separated, generated only) and ``path``
(relative to ``models_dir``).
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from perf4sight.config import Config
from perf4sight.dataset import read_manifest
from perf4sight.errors import UserError
from perf4sight.files import write_atomically
from perf4sight.ir.schema import FROZEN_LAYERS, FROZEN_PARAMETERS, NetworkDescription
from perf4sight.ir.shapes import shape_text
from perf4sight.networks import stage_cache
from perf4sight.networks.design_space import FULL_STEM_INPUT, MIN_INPUT
from perf4sight.networks.factories import build_factory_model
from perf4sight.networks.generator import GeneratorSettings, forward_flops, generate
from perf4sight.networks.named import config_descriptions, named_networks
from perf4sight.networks.on_request import variant_name
from perf4sight.networks.reshape import query_at, shaped_name
from perf4sight.networks.settings import SETTINGS_FILE, changed_settings_note, settings_sha
from perf4sight.networks.zoo import build_zoo_model
from perf4sight.profiling.results import file_sha
from perf4sight.wording import plural

if TYPE_CHECKING:  # torch is imported where a network is built: a rerun that reads every network back imports none
    from torch import nn

    from perf4sight.networks.pruning import PrunedModel, PruningPlan

__all__ = ["Source", "MANIFEST_COLUMNS", "SETTINGS_FILE", "NetworksMade", "sources", "prune_source", "make_networks",
           "variant_name", "pruning_plan", "write_manifest", "reshaped_description_notes", "settings_sha",
           "changed_settings_note"]

MANIFEST_COLUMNS: tuple[str, ...] = ("network", "family", "source", "strategy", "target_level", "achieved_level",
                                     "seed", "params", "flops_fwd", "input_shape", "styles", "path")
Progress = Callable[[str], None]


@dataclass
class NetworksMade:
    """What one networks stage made: the manifest ``rows``; ``skipped``, one line per pruning level a network
    could not reach (left out); ``added`` and ``removed``, the variant names the manifest gained and lost
    against the one it replaced (both empty on a first run); ``changed``, the names whose description file
    the last complete run made with other content (the profile stage measures them again); ``cached``, the networks
    whose variants were read back from the stage's cache (:mod:`stage_cache`) instead of made again."""

    rows: list[dict[str, Any]]
    skipped: list[str]
    added: list[str]
    removed: list[str]
    changed: list[str] = dataclasses.field(default_factory=list)  # same name, other description: measured again
    had_manifest: bool = False  # one was on disk before: nothing added, changed or removed is then "unchanged"
    untrainable_at_batch_one: list[str] = dataclasses.field(default_factory=list)  # a batch norm over a 1x1 map
    cached: list[str] = dataclasses.field(default_factory=list)  # networks read back from the stage's cache


@dataclass
class Source:
    """A network to prune: its name (its variants are ``<name>_l<level>``), where it comes from, how to build
    it, and its family (the network it derives from; ``name`` when empty)."""

    name: str
    source: str
    build: Callable[[], nn.Module]
    family: str = ""
    key: Any = None  # what identifies its network beyond ``source`` (a file's bytes): its variants cached; None: not
    check: Callable[[], None] | None = None  # builds it once, to fail early (a factory's file, its function)


def sources(cfg: Config, check: bool = True) -> list[Source]:
    """The zoo networks, factories and description files the config names, in that order. With ``check``, a factory
    is built here once, to fail early on a file that does not import or a function that fails; else its
    ``Source.check`` does that when called."""
    nc = cfg.networks.num_classes
    shape = cfg.networks.input_shape
    found: list[Source] = [Source(n, f"torchvision:{n}",
                                  lambda n=n: build_zoo_model(n, cfg.networks.classes_of(n), shape),
                                  key=["zoo", cfg.networks.classes_of(n)])
                           for n in cfg.networks.zoo]
    for named in named_networks(cfg):
        if named.factory is not None:
            def builds(f: Any = named.factory) -> None:
                try:
                    build_factory_model(f, nc)
                except UserError as exc:
                    raise UserError(f"{cfg.path}: [networks] factories: {exc}") from None
            if check:
                builds()
            found.append(Source(named.name, named.source, lambda f=named.factory: build_factory_model(f, nc),
                                key=_files_key("factory", named.code_files, nc, data=named.path.parent),
                                check=builds))
        else:
            found.append(Source(named.name, named.source, lambda d=named.description: _built(d), named.family,
                                key=_files_key("description", named.code_files)))
    names = [s.name for s in found]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        # which entries clash: two description files of one `network` but other names clashed without a word why
        clash = "; ".join(f"'{n}' by {', '.join(s.source for s in found if s.name == n)}" for n in dupes)
        why = (" (a description file's variants are named after its `network`, not its `name`, unless it is a pruned "
               "or generated network's: give each file a `network` of its own)"
               if any(s.source.startswith("description:") for s in found if s.name in dupes) else "")
        raise UserError(f"{cfg.path}: [networks] names a network more than once (zoo, factories, description_files): "
                        f"{clash}{why}")
    return found


def _built(desc: NetworkDescription) -> nn.Module:
    from perf4sight.ir.to_torch import build_module  # torch

    return build_module(desc)


def _files_key(kind: str, files: tuple[Path, ...], *more: Any, data: Path | None = None) -> list[Any] | None:
    """A :class:`Source`'s key: its kind, the bytes of its files (a factory's and those beside it, a description
    file), ``more``, and the other files of folder ``data`` (:func:`stage_cache.data_files`: a factory's, which it may
    read); None where a file cannot be read (then nothing of it is cached)."""
    try:
        return [kind, stage_cache.file_digests(files), *more, *([stage_cache.data_files(data)] if data else [])]
    except OSError:
        return None


def reshaped_description_notes(cfg: Config) -> list[str]:
    """One note per ``[networks] description_files`` entry described at another input shape than
    ``[networks] input_shape`` (the networks stage rebuilds it and describes its variants at the configured one),
    and one per entry with another class count than ``[networks] num_classes`` (kept), and one per entry that counts
    frozen parameters (``frozen_params``) without naming them (``frozen_layers``, ``frozen_parameters``: an older
    description), which its rebuilt networks therefore train."""
    want = list(cfg.networks.input_shape)
    lines = []
    for fname, desc in config_descriptions(cfg):
        have = list(desc.input_shape)
        if have != want:
            lines.append(f"note: [networks] description_files: {fname} is described at input shape "
                         f"{shape_text(have)}; its networks are built at [networks] input_shape "
                         f"{shape_text(want)}")
        if desc.num_classes != cfg.networks.num_classes:
            lines.append(f"note: [networks] description_files: {fname} has {desc.num_classes} classes, and keeps "
                         f"them ([networks] num_classes = {cfg.networks.num_classes} applies to zoo and factory "
                         "networks)")
        if desc.extra.get("frozen_params") and FROZEN_LAYERS not in desc.extra and FROZEN_PARAMETERS not in desc.extra:
            lines.append(f"note: [networks] description_files: {fname} counts {desc.extra['frozen_params']} frozen "
                         "parameters but names none of them (frozen_layers, frozen_parameters, written since this "
                         "tool names them: describe the module again): its networks train every layer")
    return lines


def _seeded_build(src: Source, seed: int, input_shape: list[int]) -> nn.Module:
    """Build with a fixed weight initialisation (l1-norm rankings depend on it); lazy layers (``nn.LazyLinear``) get
    their weights from one forward pass at ``input_shape`` ([C, H, W]), seeded too, before anything counts them."""
    import torch

    from perf4sight.ir.from_torch import forward_error, has_lazy_parameters, in_mode

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = src.build()
        if has_lazy_parameters(model):
            try:  # each layer back in its own mode after: a batch norm frozen in eval mode stays so
                with torch.no_grad(), in_mode(model, training=False):
                    model(torch.zeros(2, *input_shape))
            except Exception as exc:  # a user's forward can raise anything
                raise forward_error(src.name, input_shape, exc) from None
        return model


def pruning_plan(src: Source, input_shape: list[int], strategy: str, min_channels: int, seed: int) -> PruningPlan:
    """``src`` built with its seeded weights and traced for pruning at ``input_shape``: one plan serves every
    level (its random choices are drawn here, so a level pruned from it does not depend on the levels before)."""
    from perf4sight.networks.pruning import PruningPlan  # torch, torch-pruning

    return PruningPlan(_seeded_build(src, seed, input_shape), input_shape, strategy, min_channels, seed, src.name)


class _Unpruned:
    """A network's level 0 in a pruning plan's place: the network as built."""

    def __init__(self, base: nn.Module) -> None:
        self.base = base

    def prune(self, level: float, meta: bool = False) -> PrunedModel:
        from perf4sight.networks.pruning import prune_model

        return prune_model(self.base, [], 0)


def prune_source(src: Source, input_shape: list[int], levels: list[float], strategy: str, min_channels: int,
                 seed: int, progress: Progress | None = None, skipped: list[str] | None = None,
                 plan: PruningPlan | None = None) -> list[NetworkDescription]:
    """One description per level (ascending input order kept), each with its achieved level; ``plan``: the
    source's :func:`pruning_plan` with these settings, where the caller keeps one (else it is made here).

    A level the network cannot reach raises ``UnreachableLevel``, and a network that cannot be pruned at all
    ``Unprunable``; with a ``skipped`` list the level (every level but 0) is left out instead and a line saying why
    is appended to the list."""
    from perf4sight.ir.from_torch import describe  # torch, torch-pruning: where a network is pruned
    from perf4sight.networks.described_cuts import described_cut
    from perf4sight.networks.pruning import PrunedModel, Unprunable, UnreachableLevel, check_level

    levels = [check_level(lvl, f"[networks.pruning] levels ({src.name})") for lvl in levels]
    if not plan and all(lvl == 0 for lvl in levels):  # unpruned alone: nothing to trace (a Swin cannot be)
        plan = _Unpruned(_seeded_build(src, seed, input_shape))
    try:
        plan = plan or pruning_plan(src, input_shape, strategy, min_channels, seed)  # traced once for all levels
    except Unprunable as exc:
        if skipped is None or 0 not in levels:
            raise
        skipped.append(f"{', '.join(variant_name(src.name, lvl) for lvl in levels if lvl)} left out: {exc}")
        levels, plan = [lvl for lvl in levels if lvl == 0], _Unpruned(_seeded_build(src, seed, input_shape))
    out: list[NetworkDescription] = []
    layers: dict[str, int] = {}  # a variant's layers (nodes, output, level) -> its place in ``out``
    for lvl in levels:
        try:  # from the unpruned description where it alone says the level's (described_cuts), else a cut copy
            cut = described_cut(plan, plan.counts_at(lvl), input_shape) if lvl and hasattr(plan, "counts_at") \
                else None
            pruned = PrunedModel(None, lvl, plan.achieved_level(cut.params), cut.params, plan.p0, dict(plan.extra)) \
                if cut else plan.prune(lvl, meta=True)
        except UnreachableLevel as exc:
            if skipped is None:
                raise
            skipped.append(f"{variant_name(src.name, lvl)} left out: with min_channels={min_channels} "
                           f"{src.name} cannot reach {lvl:g}% ({exc.reason})")
            continue
        info = dict(name=variant_name(src.name, lvl), network=src.family or src.name,
                    pruning_level=pruned.achieved_level,
                    source=src.source, strategy=strategy, seed=seed, target_level=lvl, **pruned.extra)
        if cut:
            desc = cut.description(input_shape, **info)
        else:
            try:  # meta weights: shapes only, no real forward pass (seconds per level for large networks at 224x224)
                desc = describe(pruned.module, input_shape, **info)
            except Exception:  # an op without a meta kernel: describe a real copy instead
                desc = describe(plan.prune(lvl).module, input_shape, **info)
        same = _same_network(desc, out, layers, skipped)
        if same is not None and skipped is not None:  # two levels its coarse steps cannot tell apart: made once
            if abs(lvl - pruned.achieved_level) >= abs(out[same].extra["target_level"] - pruned.achieved_level):
                skipped.append(_same_note(desc, out[same], src.name))
                continue
            skipped.append(_same_note(out[same], desc, src.name))
            out[same] = desc  # named after the level nearest what it removes
        else:
            out.append(desc)
        if progress:
            progress(f"{desc.name}: {pruned.achieved_level:.1f}% removed, {desc.params:,} parameters")
    return out


def _same_network(desc: NetworkDescription, out: list[NetworkDescription], layers: dict[str, int],
                  skipped: list[str] | None) -> int | None:
    """The place in ``out`` of a variant with ``desc``'s layers and level (another target level cut to the same
    network: the steps of a small network are coarse), else None, ``desc``'s layers then recorded at ``len(out)``;
    ``layers`` holds those of ``out``. Without a ``skipped`` list (one level asked for), always None."""
    if skipped is None:
        return None
    key = json.dumps([[n.to_dict() for n in desc.nodes], desc.output, desc.pruning_level], sort_keys=True)
    if key in layers:
        return layers[key]
    layers[key] = len(out)
    return None


def _same_note(gone: NetworkDescription, kept: NetworkDescription, network: str) -> str:
    """The line for variant ``gone``, left out as the same network as ``kept``."""
    return (f"{gone.name} left out: the same network as {kept.name} ({kept.pruning_level:.1f}% of {network}'s "
            f"parameters removed: its pruning steps do not tell {gone.extra['target_level']:g}% from "
            f"{kept.extra['target_level']:g}%)")


def at_extra_shapes(cfg: Config, desc: NetworkDescription, skipped: list[str],
                    progress: Progress | None = None) -> list[NetworkDescription]:
    """``desc`` (made at ``[networks] input_shape``) at each of ``[networks] extra_input_shapes``, named
    ``<name>_<H>x<W>`` (:func:`reshape.query_at`: rebuilt there, or pruned there as a variant of its network). One
    that cannot take a shape (a generated transformer stage's position embedding has one entry per pixel; a generated
    network's stem, :func:`_too_small_for_stem`) is left out at it, with a line saying why appended to ``skipped``."""
    out = []
    for shape in cfg.networks.extra_input_shapes:
        name = shaped_name(desc.name, shape)
        try:
            _too_small_for_stem(desc, shape)
            _embedding_per_pixel(desc)
            at = query_at(cfg, desc.name, desc, shape)
        except UserError as exc:
            skipped.append(f"{name} left out: {desc.name} cannot be made at {shape_text(shape)} ({exc})")
            continue
        if "mflops" in at.extra:  # a generated network's forward MFLOPs, recorded at the shape it was drawn at
            at = dataclasses.replace(at, extra={**at.extra, "mflops": round(forward_flops(at) / 1e6, 3)})
        out.append(dataclasses.replace(at, name=name))
        if progress:
            progress(f"{name}: at {shape_text(shape)}")
    return out


def _too_small_for_stem(desc: NetworkDescription, shape: list[int]) -> None:
    """``UserError`` where ``desc`` is a generated network and ``shape`` ([C, H, W]) is smaller than its stem
    allows: at least ``FULL_STEM_INPUT`` (64) pixels a side for a stem of stride 2, ``MIN_INPUT`` (32) for one of
    stride 1. The generator chose the stride at ``[networks] input_shape`` so that the last maps are at least 2x2;
    rebuilt smaller, they would be 1x1 and batch norm cannot train on them at batch size 1 (which the profile stage
    measures). Left out per network, as a transformer stage is: the bound depends on each network's recorded stem."""
    if desc.extra.get("source") != "generator":
        return
    stem = next((n for n in desc.nodes if n.name == "stem_conv"), None)
    stride = max(stem.attrs.get("stride", [1])) if stem is not None else 1
    need = FULL_STEM_INPUT if stride > 1 else MIN_INPUT
    if min(shape[1:]) < need:
        raise UserError(f"its stem strides by {stride}, drawn at {shape_text(desc.input_shape)}: its last maps would "
                        f"be under 2x2 and batch norm cannot train at batch size 1; it needs at least {need}x{need}")


def _embedding_per_pixel(desc: NetworkDescription) -> None:
    """``UserError`` where ``desc`` is a generated network with a transformer stage: its position embedding (a
    ``shift``) holds one entry per pixel of the stage's map at the shape it was drawn at, which no other input shape
    has (torch's own error, a reshape of the wrong size, says nothing of why)."""
    if desc.extra.get("source") != "generator":
        return
    pos = next((n for n in desc.nodes if n.op == "shift"), None)
    if pos is not None:
        raise UserError(f"its transformer stage's position embedding ({pos.name}) holds one entry per pixel of its "
                        f"map at {shape_text(desc.input_shape)}, {pos.attrs['shape'][0]} of them")


def _row(desc: NetworkDescription, path: Path, models_dir: Path) -> dict[str, Any]:
    ex = desc.extra
    return {"network": desc.name, "family": desc.network, "source": ex.get("source", ""),
            "strategy": ex.get("strategy", "generated" if ex.get("source") == "generator" else ""),
            "target_level": ex.get("target_level", 0), "achieved_level": desc.pruning_level,
            "seed": ex.get("seed", ""), "params": desc.params, "flops_fwd": int(forward_flops(desc)),
            "input_shape": shape_text(desc.input_shape), "styles": "|".join(ex.get("styles", [])),
            "path": path.relative_to(models_dir).as_posix()}


def write_manifest(rows: list[dict[str, Any]], path: Path) -> Path:
    """Write ``rows`` as CSV with ``MANIFEST_COLUMNS`` (atomic replace); ``perf4sight.dataset.read_manifest``
    reads it back."""
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=MANIFEST_COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    return _write_if_changed(path, text.getvalue())


def _write_if_changed(path: Path, text: str | bytes, on_disk: bytes | None = None) -> Path:
    """Write ``text`` to ``path`` (UTF-8, atomic replace) unless the file holds it already: a rerun rewrites
    nothing. ``on_disk``: the file's bytes, where the caller has read them."""
    data = text if isinstance(text, bytes) else text.encode("utf-8")
    if on_disk is None and path.is_file():
        on_disk = path.read_bytes()
    if on_disk == data:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomically(path, data)


def _manifest_paths(path: Path) -> dict[str, str]:
    """The variant names of a manifest on disk, each with its description file's path (relative to the models
    folder); none when it is absent, unreadable or damaged: the stage writes it anew."""
    try:
        return {r["network"]: r.get("path", "") for r in read_manifest(path)}
    except (UserError, OSError):
        return {}


def _check_not_an_output(cfg: Config, outputs: list[Path]) -> None:
    """``UserError`` for a ``[networks] description_files`` entry that this run writes over: it would be read
    before the run and rewritten by it, so two runs of one config would make different networks."""
    written = {p.resolve() for p in outputs}
    for fname in cfg.networks.description_files:
        if cfg.resolve(fname).resolve() in written:
            raise UserError(f"{cfg.path}: [networks] description_files: {fname} is a file this networks stage "
                            "writes (a variant or generated network it makes); copy it out of "
                            f"{cfg.models_dir} and name the copy")


def _save(desc: NetworkDescription, path: Path, changed: list[str], before: Path | None = None,
          recorded: str | None = None) -> tuple[Path, str]:
    """Save ``desc`` at ``path`` unless the file holds it already (a rerun rewrites nothing); ``path`` and the
    ``description_sha`` of what it holds. Its name goes into ``changed`` when the last complete run made another
    description of it: ``recorded``, the ``description_sha`` that run recorded for it (:func:`_recorded_shas`), else
    the file the last manifest named for it (``before``; else ``path``): another strategy's folder, for one."""
    data = desc.to_json().encode("utf-8")  # JSON's ASCII: the same bytes in any locale, as save_description writes
    sha = file_sha(data)
    here = path.read_bytes() if path.is_file() else None
    if recorded is not None:  # right too where an interrupted run since has rewritten the file
        differs = recorded != sha
    else:
        previous = before.read_bytes() if before is not None and before != path and before.is_file() else here
        differs = previous is not None and previous != data
    if differs:
        changed.append(desc.name)
    return _write_if_changed(path, data, here), sha


def _recorded_shas(models_dir: Path) -> dict[str, str]:
    """Variant name -> the ``description_sha`` of its description as the last complete networks stage wrote it (its
    ``manifest-settings.json``), where that file belongs to the manifest on disk; none otherwise (an older version's
    file, or one a run stopped between writing the manifest and it)."""
    try:
        data = json.loads((models_dir / SETTINGS_FILE).read_text(encoding="utf-8"))
        manifest = (models_dir / "manifest.csv").read_bytes()
    except (OSError, ValueError):
        return {}
    shas = data.get("descriptions") if isinstance(data, dict) else None
    if not isinstance(shas, dict) or data.get("manifest_sha") != file_sha(manifest):
        return {}
    return {name: sha for name, sha in shas.items() if isinstance(sha, str)}


def _settings_key(cfg: Config) -> dict[str, Any]:
    """The ``[networks]`` settings that decide what one network's variants are: all but the lists of the other
    networks and the generator's table (a key added later is in it at once)."""
    settings = dataclasses.asdict(cfg.networks)
    for other in ("zoo", "factories", "description_files", "generator"):
        settings.pop(other)
    return settings


def _entry(cfg: Config, name: str, key: Any) -> Path | None:
    """Where the stage's cache keeps what it made of network ``name`` (:mod:`stage_cache`), keyed by ``key`` (what
    identifies the network; None: nothing kept) and :func:`_settings_key`."""
    return None if key is None else stage_cache.entry_path(cfg.models_dir, name, [key, _settings_key(cfg)])


def _made(path: Path | None, kept: stage_cache.Made | None,
          make: Callable[[Progress, list[str]], list[NetworkDescription]],
          progress: Progress | None) -> tuple[stage_cache.Made, bool]:
    """``kept``, what the stage's cache holds at ``path`` (:func:`stage_cache.read_entry`, which the caller has
    looked up), its progress lines said again, and True; on a miss (None) what ``make(progress, skipped)`` makes, kept
    at ``path`` for the next run, and False."""
    if kept is not None:
        for line in kept.progress if progress else ():
            progress(line)
        return kept, True
    lines: list[str] = []
    skipped: list[str] = []

    def said(line: str) -> None:
        lines.append(line)
        if progress:
            progress(line)
    made = stage_cache.Made(make(said, skipped), skipped, lines)
    stage_cache.write_entry(path, made)  # before the next network: an interrupted run keeps what it made
    return made, False


def _source_entry(cfg: Config, src: Source) -> Path | None:
    """Where the stage's cache keeps ``src``'s variants."""
    return _entry(cfg, src.name, None if src.key is None else ["source", src.name, src.source, src.family, src.key])


def _variants(cfg: Config, src: Source, entry: Path | None, kept: stage_cache.Made | None,
              progress: Progress | None) -> tuple[stage_cache.Made, bool]:
    """``src`` pruned at every ``[networks.pruning]`` level, each variant at every extra input shape after it (as
    :func:`_made`: ``kept``, what the cache holds at its ``entry``, :func:`_source_entry`), and whether they were
    read back from the stage's cache."""
    net, pr = cfg.networks, cfg.networks.pruning

    def make(said: Progress, skipped: list[str]) -> list[NetworkDescription]:
        return [each for desc in prune_source(src, list(net.input_shape), list(pr.levels), pr.strategy,
                                              pr.min_channels, pr.seed, said, skipped)
                for each in [desc, *at_extra_shapes(cfg, desc, skipped, said)]]
    try:
        return _made(entry, kept, make, progress)
    except UserError as exc:  # say where the config names the network, as the other [networks] errors do
        if str(exc).startswith(f"{cfg.path}:"):
            raise
        raise UserError(f"{cfg.path}: [networks] {_config_entry(src)}: {exc}") from None


def _config_entry(src: Source) -> str:
    """The ``[networks]`` key that names ``src``, with its entry: ``zoo``, ``factories: factory 'f.py:net'``."""
    kind, _, entry = src.source.partition(":")
    return {"factory": f"factories: factory '{entry}'", "description": f"description_files: {entry}"}.get(kind, "zoo")


def _generated_at_extra_shapes(cfg: Config, desc: NetworkDescription) -> tuple[stage_cache.Made, bool]:
    """Generated network ``desc`` at every extra input shape (none without ``[networks] extra_input_shapes``), and
    whether they were read back from the stage's cache."""
    if not cfg.networks.extra_input_shapes:
        return stage_cache.Made([], [], []), False
    path = _entry(cfg, desc.name, ["generated", file_sha(desc.to_json().encode("utf-8"))])
    return _made(path, stage_cache.read_entry(path), lambda said, skipped: at_extra_shapes(cfg, desc, skipped), None)


def make_networks(cfg: Config, progress: Progress | None = None) -> NetworksMade:
    """Run the networks stage for ``cfg``; the manifest rows are also written to disk.

    Every network is made first (read back from the stage's cache where an earlier run made it with the same
    settings and code: :mod:`stage_cache`), then the descriptions and manifests are written: an interrupted or
    failed run leaves the dataset as the last complete run wrote it."""
    net, pr, gen = cfg.networks, cfg.networks.pruning, cfg.networks.generator
    models_dir = cfg.models_dir
    before = _manifest_paths(models_dir / "manifest.csv")
    recorded = _recorded_shas(models_dir) if before else {}

    def was(name: str) -> Path | None:  # the file the last manifest named for ``name``
        return models_dir / before[name] if before.get(name) else None
    # generated networks are drawn first (in memory, seconds): constraints that too few candidates satisfy
    # fail before the pruning (minutes) instead of after it
    generated: list[NetworkDescription] = []
    if gen.count > 0:
        generated = generate(GeneratorSettings.from_config(gen), list(net.input_shape), net.num_classes,
                             config=cfg.path)
    found = sources(cfg, check=False) if net.zoo or net.factories or net.description_files else []
    outputs = [models_dir / "pruned" / pr.strategy / f"{variant_name(src.name, lvl)}.json"
               for src in found for lvl in pr.levels] + [models_dir / "generated" / f"{d.name}.json" for d in generated]
    _check_not_an_output(cfg, outputs + [p.with_name(f"{shaped_name(p.stem, shape)}.json") for p in outputs
                                         for shape in net.extra_input_shapes])
    skipped: list[str] = []
    cached: list[str] = []  # networks read back from the stage's cache
    pruned: list[NetworkDescription] = []
    entries = [_source_entry(cfg, src) for src in found]  # each looked up once: a miss is made, not read again
    kept = [stage_cache.read_entry(entry) for entry in entries]
    for src, was_kept in zip(found, kept):
        if was_kept is None and src.check is not None:
            src.check()  # a factory that fails to build fails before any network is pruned
    for src, entry, was_kept in zip(found, entries, kept):
        made, hit = _variants(cfg, src, entry, was_kept, progress)
        pruned += made.descriptions
        skipped += made.skipped
        cached += [src.name] if hit else []
    made_generated: list[NetworkDescription] = []
    for desc in generated:
        made, hit = _generated_at_extra_shapes(cfg, desc)
        made_generated += [desc, *made.descriptions]
        skipped += made.skipped
        cached += [desc.name] if hit else []
    if not pruned and not made_generated:
        why = f"every [networks.pruning] level was out of reach ({skipped[0]}); lower the levels or min_channels" \
            if skipped else "[networks] names no network"
        raise UserError(f"{cfg.path}: no network made: {why}")
    # every network made: now the files, the manifest last
    rows: list[dict[str, Any]] = []
    shas: dict[str, str] = {}
    changed: list[str] = []
    one_image: list[str] = []  # networks a batch of one image cannot train
    for folder, descs, wanted in ((models_dir / "pruned" / pr.strategy, pruned, bool(found)),
                                  (models_dir / "generated", made_generated, bool(generated))):
        if not wanted:
            continue
        these = []
        for desc in descs:
            one_image += [desc.name] if desc.untrainable_at_batch_one else []
            path, shas[desc.name] = _save(desc, folder / f"{desc.name}.json", changed, was(desc.name),
                                          recorded.get(desc.name))
            these.append(_row(desc, path, models_dir))
        write_manifest(these, folder / "manifest.csv")
        rows += these
    if generated and progress:
        extra = len(made_generated) - len(generated)
        progress(f"generated {plural(len(generated), 'network')} in {models_dir / 'generated'}"
                 + (f" ({extra} more at the extra input shapes)" if extra else ""))
    manifest = write_manifest(rows, models_dir / "manifest.csv")
    # what the manifest was made with, and each description's sha: the next run says what changed since
    _write_if_changed(models_dir / SETTINGS_FILE, json.dumps(
        {"settings_sha": settings_sha(cfg), "config": str(cfg.path), "manifest_sha": file_sha(manifest.read_bytes()),
         "descriptions": shas}, indent=1) + "\n")
    names = [r["network"] for r in rows]
    added = [n for n in names if n not in before] if before else []
    # a name new to the manifest is said to be added, even where an older run's file of it held another network
    return NetworksMade(rows, skipped, added, [n for n in before if n not in names],
                        [n for n in changed if n not in added], had_manifest=bool(before),
                        untrainable_at_batch_one=one_image, cached=cached)
