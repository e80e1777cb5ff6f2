"""The generator's settings (``[networks.generator]``) and their check; no numpy, no torch, so the config
check can run it before any work starts (MFLOPs = 1e6 forward FLOPs)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perf4sight.errors import UserError
from perf4sight.networks.design_space import DEFAULT_STYLES, MIN_INPUT, STYLES

__all__ = ["GeneratorSettings", "where_in_config"]


#: The most networks one config may generate: more is a typing slip (their draw alone would take hours).
MAX_COUNT = 10_000


@dataclass
class GeneratorSettings:
    """What to generate: counts, seed, styles and the accepted ranges (MFLOPs = 1e6 forward FLOPs)."""

    count: int
    seed: int = 0
    styles: tuple[str, ...] = DEFAULT_STYLES
    min_mflops: float = 0.0
    max_mflops: float = float("inf")
    min_params: int = 0
    max_params: int = 10**12
    cover_styles: bool = False

    @classmethod
    def from_config(cls, gen: Any) -> "GeneratorSettings":
        """The settings of a config's ``[networks.generator]`` table (``cfg.networks.generator``)."""
        return cls(gen.count, gen.seed, tuple(gen.styles), gen.min_mflops, gen.max_mflops, gen.min_params,
                   gen.max_params, gen.cover_styles)

    def check(self, config: str | Path | None = None, input_shape: list[int] | None = None) -> None:
        """``UserError`` naming the setting that cannot work (and ``config``, the file it came from, if given);
        with ``input_shape`` ([C, H, W]), also whether networks can be generated at that input."""
        where = where_in_config(config)
        unknown = [s for s in self.styles if s not in STYLES]
        if unknown:
            raise UserError(f"{where} styles: unknown {unknown} (known: {', '.join(STYLES)})")
        if not self.styles:
            raise UserError(f"{where} styles is empty: allow at least one of {', '.join(STYLES)}")
        if self.count < 0:
            raise UserError(f"{where} count must be >= 0, got {self.count}")
        if self.count > MAX_COUNT:  # count = 1000000000 drew candidates for ever, without a word
            raise UserError(f"{where} count must be at most {MAX_COUNT:,} (each network is profiled at every batch "
                            f"size), got {self.count:,}")
        for key in ("min_mflops", "max_mflops", "min_params", "max_params"):
            if not getattr(self, key) >= 0:  # NaN too: it would accept every network
                raise UserError(f"{where} {key} must be >= 0, got {getattr(self, key)}")
        if self.min_mflops > self.max_mflops:
            raise UserError(f"{where} min_mflops ({self.min_mflops:g}) exceeds max_mflops ({self.max_mflops:g})")
        if self.min_params > self.max_params:
            raise UserError(f"{where} min_params ({self.min_params}) exceeds max_params ({self.max_params})")
        if input_shape is not None and self.count > 0 and min(input_shape[1:]) < MIN_INPUT:
            file = f"{config}: " if config else ""
            raise UserError(f"{file}[networks] input_shape {list(input_shape)} is too small for generated networks "
                            f"([networks.generator] count = {self.count}): they need at least {MIN_INPUT}x{MIN_INPUT}")


def where_in_config(config: str | Path | None) -> str:
    """The section in errors, after the config file when one is named."""
    return f"{config}: [networks.generator]" if config else "[networks.generator]"
