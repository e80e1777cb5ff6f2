"""Seeded random search over the multi-style design space (see ``design_space``).

Each candidate draws, per stage, a style from the allowed ones, a depth, a width and the
style's knobs; the first stage's width is drawn from 16 to 256 channels and each later
stage widens it by 1.25x to 3x (at most ``MAX_WIDTH``). A candidate is kept when its
forward FLOPs (``perf4sight.features``: one multiply-add = 2 FLOPs, at the configured input
size) and parameter count lie in the configured ranges and it is not a duplicate of one
already kept. The same seed and settings always give the same networks, named
``gen_<seed>_<index>``.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from perf4sight.errors import UserError
from perf4sight.features.formulas import position_loss
from perf4sight.features.walk import walk
from perf4sight.ir.schema import NetworkDescription
from perf4sight.networks.design_space import STYLES, build_description
from perf4sight.networks.generator_settings import GeneratorSettings, where_in_config

__all__ = ["GeneratorSettings", "sample_stages", "generate", "forward_flops", "MAX_WIDTH", "STYLES"]

MAX_WIDTH = 2048
_FIRST_WIDTHS = (16, 24, 32, 48, 64, 96, 128, 192, 256)
_WIDENING = (1.25, 1.5, 2.0, 2.5, 3.0)
_DEPTHS = {"vgg": (1, 4), "inception": (1, 3), "resnext": (1, 4), "densenet": (2, 6), "mobilenet": (1, 4),
           "convnext": (1, 3), "transformer": (1, 3), "dilated": (1, 4)}
_TRIES_PER_NETWORK = 200  # candidates drawn per requested network before giving up
_MIN_TRIES = 2000


def _round8(x: float) -> int:
    return max(8, int(round(x / 8.0)) * 8)


def sample_stages(rng: np.random.Generator, styles: tuple[str, ...], lead: str | None = None) -> list[dict[str, Any]]:
    """Draw one network spec: four stage dicts (style, depth, width, stride_at and knobs); with ``lead``, the
    first two stages (the largest feature maps) take that style."""
    stages = []
    width = float(_FIRST_WIDTHS[rng.integers(len(_FIRST_WIDTHS))])
    for i in range(4):
        if i:
            width = min(MAX_WIDTH, width * _WIDENING[rng.integers(len(_WIDENING))])
        style = styles[rng.integers(len(styles))]
        if lead and i < 2:
            style = lead
        lo, hi = _DEPTHS[style]
        st: dict[str, Any] = {"style": style, "depth": int(rng.integers(lo, hi + 1)), "width": _round8(width),
                              "stride_at": "first" if rng.random() < 0.5 else "last"}
        if style == "vgg":
            st["kernel"] = int(rng.choice([3, 5]))
        elif style == "inception":
            st["branches"] = int(rng.integers(2, 5))
            st["reduce"] = float(rng.choice([0.25, 0.5]))
        elif style == "resnext":
            st["bottleneck"] = float(rng.choice([0.25, 0.5, 1.0]))
            st["group_width"] = int(rng.choice([4, 8, 16, 32, 64]))
        elif style == "densenet":
            st["growth"] = int(rng.choice([12, 16, 24, 32]))
        elif style in ("mobilenet", "dilated"):
            st["expansion"] = int(rng.choice([1, 3, 6]))
            st["kernel"] = int(rng.choice([3, 5]))
            if style == "dilated":
                st["dilation"] = 2
        elif style == "convnext":
            st["expansion"] = int(rng.choice([2, 3, 4]))
            st["kernel"] = int(rng.choice([3, 5, 7]))
        else:  # transformer
            st["expansion"] = int(rng.choice([2, 4]))
            st["head_dim"] = int(rng.choice([16, 32, 64]))
        stages.append(st)
    return stages


def forward_flops(desc: NetworkDescription) -> float:
    """Forward FLOPs of one sample (one multiply-add = 2 FLOPs): the ``flops_fwd`` feature of ``perf4sight.features``
    (the ops' cost formulas, and a loss scored per position), from the walk over the nodes alone; the whole feature
    set costs the generator about three times as much on each candidate it draws."""
    total = sum(visit.cost.flops_fwd for visit in walk(desc) if visit.cost is not None)
    loss = position_loss(desc.node(desc.output).output_shape)
    return float(total + (loss.flops_fwd if loss is not None else 0.0))


def generate(settings: GeneratorSettings, input_shape: list[int], num_classes: int = 1000,
             config: str | Path | None = None) -> list[NetworkDescription]:
    """``settings.count`` distinct networks inside the ranges, in draw order.

    Raises ``UserError`` when too few candidates satisfy the constraints, naming the one that
    rejected most of them; every error names ``config``, the file the settings came from, if given.
    """
    settings.check(config, input_shape)
    rng = np.random.default_rng(settings.seed)
    seen: set[str] = set()
    kept: list[NetworkDescription] = []
    rejected: Counter[str] = Counter()
    tries = max(_MIN_TRIES, _TRIES_PER_NETWORK * settings.count)
    for _ in range(tries):
        if len(kept) >= settings.count:
            break
        lead = settings.styles[len(kept) % len(settings.styles)] if settings.cover_styles else None
        stages = sample_stages(rng, tuple(settings.styles), lead)
        key = json.dumps(stages, sort_keys=True)
        if key in seen:
            rejected["duplicate"] += 1
            continue
        seen.add(key)
        name = f"gen_{settings.seed}_{len(kept)}"
        family = "gen-" + "-".join(st["style"] for st in stages)
        desc = build_description(stages, input_shape, num_classes, name, network=family, source="generator",
                                 seed=settings.seed, styles=[st["style"] for st in stages], stages=stages)
        reason = _violation(settings, desc)
        if reason:
            rejected[reason] += 1
            continue
        kept.append(desc)
    if len(kept) < settings.count:
        worst = rejected.most_common(1)[0][0] if rejected else "none"
        stuck = (f"; with cover_styles, none led by {settings.styles[len(kept) % len(settings.styles)]} did"
                 if settings.cover_styles else "")
        raise UserError(f"{where_in_config(config)} only {len(kept)} of {settings.count} networks satisfy the "
                        f"constraints after {tries} candidates (most rejected by {worst}: "
                        f"{', '.join(f'{k}: {v} candidates' for k, v in rejected.most_common())}{stuck}); "
                        "widen that range")
    return kept


def _violation(s: GeneratorSettings, desc: NetworkDescription) -> str:
    """The first constraint ``desc`` breaks, as a config key, or ''."""
    if desc.params < s.min_params:
        return "min_params"
    if desc.params > s.max_params:
        return "max_params"
    mflops = forward_flops(desc) / 1e6
    desc.extra["mflops"] = round(mflops, 3)
    if mflops < s.min_mflops:
        return "min_mflops"
    if mflops > s.max_mflops:
        return "max_mflops"
    return ""
