"""The networks stage run again: after an interrupt, after an edit, with nothing changed."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from perf4sight.config import load_config
from perf4sight.networks import build
from perf4sight.networks.build import make_networks

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "models" / "imagenet" / "tiny_nets.py"
NAMES = ["tiny_vgg_l0", "tiny_vgg_l30", "tiny_resnet_l0", "tiny_resnet_l30"]


def _config(tmp_path: Path, side: int, extra: str = "") -> Path:
    """A config of two factories (tiny_vgg, then tiny_resnet) at levels 0 and 30, at ``side`` x ``side``."""
    (tmp_path / "nets").mkdir(exist_ok=True)
    if not (tmp_path / "nets" / "tiny.py").is_file():
        (tmp_path / "nets" / "tiny.py").write_text(TINY.read_text())
    config = tmp_path / "config.toml"
    config.write_text(f'[networks]\nzoo = []\nfactories = ["nets/tiny.py:tiny_vgg", "nets/tiny.py:tiny_resnet"]\n'
                      f'input_shape = [3, {side}, {side}]\nnum_classes = 10\n{extra}'
                      '[networks.pruning]\nlevels = [0, 30]\n')
    return config


def _interrupted_at(monkeypatch: pytest.MonkeyPatch, network: str) -> None:
    """Ctrl-C as the stage begins to prune ``network`` (the networks before it made)."""
    prune = build.prune_source

    def interrupted(src, *args, **kwargs):
        if src.name == network:
            raise KeyboardInterrupt
        return prune(src, *args, **kwargs)
    monkeypatch.setattr(build, "prune_source", interrupted)


def test_a_rerun_after_an_interrupt_says_what_changed_since_the_last_complete_run(tmp_path, monkeypatch):
    """An interrupted run had rewritten the descriptions it made; the rerun compared with those files and said
    nothing of them (6 of 14 variants said changed, 14 were): it says what changed since the last complete run, the
    one its manifest is of, whatever an interrupted run wrote in between."""
    config = _config(tmp_path, 32)
    assert make_networks(load_config(config)).changed == []
    settings = json.loads((tmp_path / "models" / "manifest-settings.json").read_text())
    assert list(settings["descriptions"]) == NAMES  # each description's sha, the next run's reference

    config = _config(tmp_path, 40)  # every variant another description under the same name
    with monkeypatch.context() as m:
        _interrupted_at(m, "tiny_resnet")
        with pytest.raises(KeyboardInterrupt):
            make_networks(load_config(config))
    made = make_networks(load_config(config))
    assert made.changed == NAMES and not made.added and not made.removed

    config = _config(tmp_path, 48)  # interrupted again, then back to the settings of the last complete run
    with monkeypatch.context() as m:
        _interrupted_at(m, "tiny_resnet")
        with pytest.raises(KeyboardInterrupt):
            make_networks(load_config(config))
    config = _config(tmp_path, 40)
    made = make_networks(load_config(config))
    assert made.changed == [] and made.had_manifest  # the manifest's networks as that run made them

    # an older version's settings file, without the shas: the files on disk are the reference, as before
    (tmp_path / "models" / "manifest-settings.json").write_text('{"settings_sha": "x", "config": "config.toml"}\n')
    assert make_networks(load_config(_config(tmp_path, 32))).changed == NAMES
