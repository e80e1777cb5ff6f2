"""What the networks stage's output depends on, hashed, and the note when it changed since: the profile
stage reads this on the host, so it imports no torch (seconds to load on a small host) and builds nothing."""
from __future__ import annotations

import dataclasses
import hashlib
import json

from perf4sight.config import Config, NetworksConfig
from perf4sight.errors import UserError
from perf4sight.networks.factories import parse_factory

__all__ = ["SETTINGS_FILE", "settings_sha", "changed_settings_note"]

SETTINGS_FILE = "manifest-settings.json"  # beside the manifest: settings_sha, config, manifest_sha, descriptions


def settings_sha(cfg: Config) -> str:
    """A hash of what decides the networks stage's output: the ``[networks]`` settings and the bytes of the
    factory and description files they name, with the Python files beside a factory's, which it may import (a file
    that cannot be read counts as missing)."""
    settings = dataclasses.asdict(cfg.networks)
    if not settings["extra_input_shapes"]:  # a key added later: empty, it hashes as before it existed
        del settings["extra_input_shapes"]
    if not settings["generator"]["cover_styles"]:  # a key added later: off, it hashes as before it existed
        del settings["generator"]["cover_styles"]
    if settings["segmentation_classes"] == NetworksConfig.segmentation_classes:  # likewise, at its default
        del settings["segmentation_classes"]
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for spec in cfg.networks.factories:
        digest.update(spec.encode())
        try:
            for path in parse_factory(spec, cfg.root, cfg.models_dir).code_files:
                digest.update(path.read_bytes())
        except (UserError, OSError):
            digest.update(b"missing")
    for fname in cfg.networks.description_files:
        try:
            digest.update(cfg.resolve(fname).read_bytes())
        except OSError:
            digest.update(b"missing")
    return digest.hexdigest()[:16]


def changed_settings_note(cfg: Config) -> str | None:
    """A note when ``[networks]`` (or a file it names) changed since the networks stage wrote the manifest,
    else ``None`` (also when the manifest or its settings file is absent)."""
    manifest = cfg.models_dir / "manifest.csv"
    try:
        written = json.loads((cfg.models_dir / SETTINGS_FILE).read_text()).get("settings_sha")
    except (OSError, ValueError, AttributeError):
        return None
    if not manifest.is_file() or written == settings_sha(cfg):
        return None
    return (f"note: [networks] in {cfg.path} (or a factory or description file it names) changed since the networks "
            f"stage wrote {manifest}; the networks of that manifest are measured: run --stage networks first "
            "to measure the new ones")
