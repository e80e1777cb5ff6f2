"""bench/bench_generator_draw.py: the config of each draw, written from the shipped one."""
from __future__ import annotations

import tomllib
from pathlib import Path

from bench_module import load_bench

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    return load_bench("bench_generator_draw")


def test_each_draw_changes_only_the_generators_count_seed_and_cover_styles():
    bench = _bench()
    shipped = (ROOT / "config.toml").read_text()
    before = tomllib.loads(shipped)
    for count, seed, cover in ((6, 3, False), (6, 1, True), (0, None, None)):
        after = tomllib.loads(bench.with_generator(shipped, count, seed, cover))
        gen = after["networks"].pop("generator")
        expected = dict(before["networks"]["generator"], count=count)
        if seed is not None:
            expected.update(seed=seed, cover_styles=cover)
        assert gen == expected
        assert {k: v for k, v in after.items() if k != "networks"} == {k: v for k, v in before.items()
                                                                      if k != "networks"}
        assert after["networks"] == {k: v for k, v in before["networks"].items() if k != "generator"}
    # a config without the table, or without the key: added
    bare = tomllib.loads(bench.with_generator('[networks]\nzoo = ["resnet18"]\n', 6, 2, True))
    assert bare["networks"]["generator"] == {"count": 6, "seed": 2, "cover_styles": True}
    tail = tomllib.loads(bench.with_generator('[networks.generator]\ncount = 1\n', 6, 2, False))
    assert tail["networks"]["generator"] == {"count": 6, "seed": 2, "cover_styles": False}
