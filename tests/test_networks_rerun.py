"""The networks stage run again: after an interrupt, after an edit, with nothing changed."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
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


def _dataset(tmp_path: Path) -> dict[Path, bytes]:
    """The bytes of every file the networks stage wrote but those of its cache."""
    return {p: p.read_bytes() for p in (tmp_path / "models").rglob("*") if p.is_file() and "zoo-cache" not in p.parts}


def test_a_rerun_after_an_interrupt_says_what_changed_since_the_last_complete_run(tmp_path, monkeypatch):
    """An interrupted run had rewritten the descriptions it made; the rerun compared with those files and said
    nothing of them (6 of 14 variants said changed, 14 were): it says what changed since the last complete run, the
    one its manifest is of, whatever an interrupted run wrote in between."""
    config = _config(tmp_path, 32)
    assert make_networks(load_config(config)).changed == []
    settings = json.loads((tmp_path / "models" / "manifest-settings.json").read_text())
    assert list(settings["descriptions"]) == NAMES  # each description's sha, the next run's reference

    config = _config(tmp_path, 40)  # every variant another description under the same name
    dataset = _dataset(tmp_path)
    with monkeypatch.context() as m:
        _interrupted_at(m, "tiny_resnet")
        with pytest.raises(KeyboardInterrupt):
            make_networks(load_config(config))
    # the dataset as the last complete run wrote it (descriptions written at the end), tiny_vgg made and kept
    assert _dataset(tmp_path) == dataset
    pruned = _counting(monkeypatch)
    made = make_networks(load_config(config))
    assert made.changed == NAMES and not made.added and not made.removed
    assert pruned == ["tiny_resnet"] and made.cached == ["tiny_vgg"]

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


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the networks the stage prunes from now on, in order."""
    pruned: list[str] = []
    prune = build.prune_source

    def counted(src, *args, **kwargs):
        pruned.append(src.name)
        return prune(src, *args, **kwargs)
    monkeypatch.setattr(build, "prune_source", counted)
    return pruned


def _two_folders(tmp_path: Path, networks: str = "", pruning: str = "") -> Path:
    """A config of tiny_vgg and tiny_resnet, each a factory in a folder of its own, at levels 0 and 30, at 32x32, with
    10 classes; ``networks`` and ``pruning``: keys of [networks] and [networks.pruning] in their place."""
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir(exist_ok=True)
        if not (tmp_path / folder / "nets.py").is_file():
            (tmp_path / folder / "nets.py").write_text(TINY.read_text())
    keys = {"input_shape": "[3, 32, 32]", "num_classes": "10", "levels": "[0, 30]"}
    for line in (networks + pruning).splitlines():
        keys[line.split(" = ")[0]] = line.split(" = ")[1]
    table = "\n".join(f"{k} = {v}" for k, v in keys.items() if k not in ("levels", "min_channels", "seed", "strategy"))
    inner = "\n".join(f"{k} = {v}" for k, v in keys.items() if k in ("levels", "min_channels", "seed", "strategy"))
    config = tmp_path / "config.toml"
    config.write_text('[networks]\nzoo = []\nfactories = ["a/nets.py:tiny_vgg", "b/nets.py:tiny_resnet"]\n'
                      f"{table}\n[networks.pruning]\n{inner}\n")
    return config


def test_a_rerun_prunes_again_only_what_a_change_made_another_network(tmp_path, monkeypatch):
    """A rerun with nothing changed pruned every network again (minutes for a zoo at 224x224) before finding its
    files unchanged: it reads each network's variants back from the stage's cache, importing no torch, and prunes
    again exactly the networks whose files, settings, library versions or code changed."""
    from perf4sight.networks import stage_cache

    pruned = _counting(monkeypatch)
    config = _two_folders(tmp_path)
    first = make_networks(load_config(config))
    assert pruned == ["tiny_vgg", "tiny_resnet"] and first.cached == []
    files = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (tmp_path / "models").rglob("*") if p.is_file()}
    again = make_networks(load_config(config))
    assert pruned == ["tiny_vgg", "tiny_resnet"] and again.cached == ["tiny_vgg", "tiny_resnet"]
    assert again.rows == first.rows and again.changed == [] and again.skipped == first.skipped
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (tmp_path / "models").rglob("*") if p.is_file()} \
        == files  # nothing written, the cache's files included
    code = ("import sys; from perf4sight.config import load_config; from perf4sight.networks.build import "
            f"make_networks; make_networks(load_config({str(config)!r})); print('torch' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "False", run.stderr[-2000:]

    def rerun(**patched) -> list[str]:
        """The networks a run prunes, with ``stage_cache``'s functions patched as given."""
        del pruned[:]
        with monkeypatch.context() as m:
            for name, value in patched.items():
                m.setattr(stage_cache, name, value)
            make_networks(load_config(config))
        return list(pruned)

    (tmp_path / "a" / "nets.py").write_text(TINY.read_text() + "# edited\n")  # a factory's own file
    assert rerun() == ["tiny_vgg"] and rerun() == []
    (tmp_path / "b" / "helper.py").write_text("WIDTH = 3\n")  # a file beside a factory, which it may import
    assert rerun() == ["tiny_resnet"]
    both = ["tiny_vgg", "tiny_resnet"]
    assert rerun(_environment=lambda: ("3.11.0", "x86_64", "9.9.9", "0", "0", "0")) == both  # another torch
    assert rerun(_code_sha=lambda: "another perf4sight") == both
    config = _two_folders(tmp_path, pruning="levels = [0, 40]")
    assert rerun() == both
    config = _two_folders(tmp_path)  # back to the settings before: read back (a few entries are kept per network)
    assert rerun() == []
    for networks, pruning in (("", "levels = [30, 0]"), ("", "min_channels = 8"), ("", "seed = 3"),
                              ("", 'strategy = "random-weighted"'), ("input_shape = [3, 40, 40]", ""),
                              ("extra_input_shapes = [[3, 48, 48]]", ""), ("num_classes = 7", "")):
        config = _two_folders(tmp_path, networks, pruning)
        assert rerun() == both, networks + pruning
    entries = list((tmp_path / "models" / "zoo-cache" / stage_cache.FOLDER).glob("tiny_vgg-*.json"))
    assert len(entries) == stage_cache.KEEP
    for entry in entries:  # damaged: made again, and kept anew
        entry.write_text('{"format": 1, "key": ')
    assert rerun() == ["tiny_vgg"] and rerun() == []


def test_a_description_deleted_by_hand_is_said_and_written_again(tmp_path):
    """A description the manifest lists, deleted by hand: the profile stage said "network description not found:
    PATH", nothing of the manifest or of what to do; it says both, and a rerun of the networks stage writes it again
    (read back from its cache)."""
    from perf4sight.dataset import dataset_descriptions
    from perf4sight.errors import UserError

    cfg = load_config(_two_folders(tmp_path))
    make_networks(cfg)
    gone = tmp_path / "models" / "pruned" / "l1-norm" / "tiny_resnet_l30.json"
    kept = gone.read_bytes()
    gone.unlink()
    with pytest.raises(UserError, match=rf"^{tmp_path / 'models' / 'manifest.csv'} lists 1 description file no longer "
                                        rf"there \({gone}\): run --stage networks again, which writes them$"):
        dataset_descriptions(cfg)
    again = make_networks(cfg)
    assert again.cached == ["tiny_vgg", "tiny_resnet"] and again.changed == [] and gone.read_bytes() == kept
    assert gone in dataset_descriptions(cfg)


def test_a_file_of_the_code_that_cannot_be_read_makes_the_stage_cache_nothing(tmp_path, monkeypatch):
    """An editor's lock file in the package (Emacs' .#build.py, a link to nowhere) stopped every networks stage with
    '[Errno 2] No such file or directory' from the hash of perf4sight's code that keys the stage's cache (and the
    fingerprint stage, whose inputs' hash holds the same): it is no source, and passed over; a source that cannot be
    read makes the networks all the same, and caches nothing."""
    from perf4sight import files
    from perf4sight.networks import stage_cache

    package = tmp_path / "package"
    package.mkdir()
    (package / "build.py").write_text("x = 1\n")
    clean = files.sources_sha256(package)
    (package / ".#build.py").symlink_to(package / "user@host.123:1700000000")
    assert files.sources_sha256(package) == clean
    monkeypatch.setattr(files, "_PACKAGE", package)
    files.package_sha256.cache_clear()
    try:
        cfg = load_config(_config(tmp_path, 32))
        assert make_networks(cfg).cached == [] and sorted(make_networks(cfg).cached) == ["tiny_resnet", "tiny_vgg"]

        def unreadable(package):
            raise PermissionError(13, "Permission denied", str(package / "build.py"))
        monkeypatch.setattr(files, "sources_sha256", unreadable)
        files.package_sha256.cache_clear()
        shutil.rmtree(tmp_path / "models" / "zoo-cache")
        first = make_networks(cfg)
        assert len(first.rows) == len(NAMES) and first.cached == [] and make_networks(cfg).cached == []
        assert not (tmp_path / "models" / "zoo-cache" / stage_cache.FOLDER).exists()
    finally:
        files.package_sha256.cache_clear()  # the package's own hash for the tests after this one (patches undone)


#: a factory reading its width from a JSON file beside it
WIDE_FACTORY = ("import json\nfrom pathlib import Path\nfrom torch import nn\n\n\ndef net(num_classes=10):\n"
                "    width = json.loads((Path(__file__).parent / 'widths.json').read_text())['width']\n"
                "    return nn.Sequential(nn.Conv2d(3, width, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),\n"
                "                         nn.Linear(width, num_classes))\n")


def test_a_file_a_factory_reads_beside_it_keys_its_variants(tmp_path):
    """A factory reading its width from a JSON file beside it: after an edit of that file, the rerun read the
    variants back from the stage's cache, the network made with the old width (314 parameters, not 2,442), and said
    the manifest unchanged; it makes the network again and says it changed."""
    (tmp_path / "nets").mkdir()
    (tmp_path / "nets" / "wide.py").write_text(WIDE_FACTORY)
    (tmp_path / "nets" / "widths.json").write_text('{"width": 8}')
    config = tmp_path / "config.toml"
    config.write_text('[networks]\nzoo = []\nfactories = ["nets/wide.py:net"]\ninput_shape = [3, 16, 16]\n'
                      "num_classes = 10\n")
    assert [r["params"] for r in make_networks(load_config(config)).rows] == [314]
    (tmp_path / "nets" / "widths.json").write_text('{"width": 64}')
    made = make_networks(load_config(config))
    assert [r["params"] for r in made.rows] == [2442] and made.changed == ["net_l0"] and made.cached == []
    assert make_networks(load_config(config)).cached == ["net"]  # nothing changed since: read back


def test_each_network_is_looked_up_in_the_cache_once_and_each_description_serialised_once(tmp_path, monkeypatch):
    """A first run looked each network's cache entry up twice (keyed and read before the factories' checks, then
    again when pruned) and serialised and hashed each description twice (to save it, then for
    manifest-settings.json): once each now, whether the network is made or read back."""
    from perf4sight.ir.schema import NetworkDescription
    from perf4sight.networks import stage_cache
    from perf4sight.profiling.results import file_sha

    keyed, read, serialised = [], [], []
    entry_path, read_entry, to_json = stage_cache.entry_path, stage_cache.read_entry, NetworkDescription.to_json
    monkeypatch.setattr(stage_cache, "entry_path", lambda *args: keyed.append(args[1]) or entry_path(*args))
    monkeypatch.setattr(stage_cache, "read_entry", lambda path: read.append(path.stem) or read_entry(path))
    monkeypatch.setattr(NetworkDescription, "to_json", lambda self: serialised.append(self.name) or to_json(self))
    cfg = load_config(_config(tmp_path, 32))
    for cached in ([], ["tiny_vgg", "tiny_resnet"]):  # made, then read back
        del keyed[:], read[:], serialised[:]
        made = make_networks(cfg)
        assert made.cached == cached and [r["network"] for r in made.rows] == NAMES
        assert keyed == ["tiny_vgg", "tiny_resnet"] and len(read) == len(set(read)) == 2
        assert serialised == NAMES
    shas = json.loads((tmp_path / "models" / "manifest-settings.json").read_text())["descriptions"]
    for name in NAMES:
        path = tmp_path / "models" / "pruned" / "l1-norm" / f"{name}.json"
        assert shas[name] == file_sha(path.read_bytes())  # the sha recorded is of the bytes saved


def test_a_module_a_factory_imports_from_elsewhere_on_the_path_keys_its_variants(tmp_path):
    """A factory importing its width from a module of the user's on PYTHONPATH, outside the factory's folder: after
    an edit of that module, the rerun read the variants back from the stage's cache (314 parameters, not 2,442) and
    said the manifest unchanged; it makes the network again and says it changed. Modules of Python's own library and
    of the installed packages (torch) are not read for the key."""
    (tmp_path / "nets").mkdir()
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "outside_widths.py").write_text("WIDTH = 8\n")
    (tmp_path / "nets" / "net.py").write_text(
        "import json\nfrom torch import nn\nfrom outside_widths import WIDTH\n\n\ndef net(num_classes=10):\n"
        "    return nn.Sequential(nn.Conv2d(3, WIDTH, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),\n"
        "                         nn.Linear(WIDTH, num_classes))\n")
    (tmp_path / "config.toml").write_text('[networks]\nzoo = []\nfactories = ["nets/net.py:net"]\n'
                                          "input_shape = [3, 16, 16]\nnum_classes = 10\n")

    def networks() -> subprocess.CompletedProcess:  # a process per run, as a user's: a module is imported once
        done = subprocess.run([sys.executable, str(ROOT / "main.py"), "--config", "config.toml", "--stage",
                               "networks"], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(tmp_path / "lib")})
        assert done.returncode == 0, done.stderr[-2000:]
        return done

    assert "314 parameters" in networks().stdout
    (tmp_path / "lib" / "outside_widths.py").write_text("WIDTH = 64\n")
    again = networks()
    assert "2,442 parameters" in again.stdout and "1 changed under the same name (net_l0" in again.stdout

    from perf4sight.networks.factories import parse_factory
    sys.path.insert(0, str(tmp_path / "lib"))
    try:
        files = parse_factory("nets/net.py:net", tmp_path).code_files
    finally:
        sys.path.remove(str(tmp_path / "lib"))
    assert files == (tmp_path / "lib" / "outside_widths.py", tmp_path / "nets" / "net.py")


def test_an_editors_lock_file_among_a_factorys_modules_is_no_code_file(tmp_path):
    """An editor's lock file (Emacs' .#widths.py, a link to nowhere) in a package of the user's that a factory
    imports from elsewhere on the path, or beside the factory, was among its code files: describing the factory
    (``--network FILE.py:FUNCTION``, the Python API) ended in '[Errno 2] No such file or directory' from the key of
    its cached description, and the networks stage cached nothing of it. It is no source, and passed over."""
    from perf4sight.networks.factories import describe_factory, parse_factory

    (tmp_path / "nets").mkdir()
    (tmp_path / "lib" / "lockedlib").mkdir(parents=True)
    (tmp_path / "lib" / "lockedlib" / "__init__.py").write_text("WIDTH = 8\n")
    (tmp_path / "lib" / "lockedlib" / ".#widths.py").symlink_to(tmp_path / "lib" / "user@host.123:1700000000")
    (tmp_path / "nets" / ".#net.py").symlink_to(tmp_path / "nets" / "user@host.123:1700000001")
    (tmp_path / "nets" / "net.py").write_text(
        "from torch import nn\nfrom lockedlib import WIDTH\n\n\ndef net(num_classes=10):\n"
        "    return nn.Sequential(nn.Conv2d(3, WIDTH, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),\n"
        "                         nn.Linear(WIDTH, num_classes))\n")
    sys.path.insert(0, str(tmp_path / "lib"))
    try:
        spec = f"{tmp_path / 'nets' / 'net.py'}:net"
        assert parse_factory(spec, tmp_path).code_files == (tmp_path / "lib" / "lockedlib" / "__init__.py",
                                                            tmp_path / "nets" / "net.py")
        desc = describe_factory(spec, [3, 16, 16], 10, tmp_path / "cache")
        assert desc.params == 314 and len(list((tmp_path / "cache").glob("*.json"))) == 1
    finally:
        sys.path.remove(str(tmp_path / "lib"))
        sys.modules.pop("lockedlib", None)


def test_a_factory_that_puts_a_folder_on_the_path_itself_leaves_no_note_that_its_settings_changed(tmp_path):
    """A factory whose file puts a folder of the user's on ``sys.path`` and imports a module from there: the
    networks stage hashed its code files after importing it (the module found then) for manifest-settings.json, the
    profile stage before (not found), so the profile stage said [networks] had changed since the networks stage after
    every run that made the network. Its code files are found once per process, before the factory is imported in
    the networks stage as in the profile stage: no note, and the stage cache reads the network back."""
    (tmp_path / "nets").mkdir()
    (tmp_path / "third_party").mkdir()
    (tmp_path / "third_party" / "path_widths.py").write_text("WIDTH = 8\n")
    (tmp_path / "nets" / "net.py").write_text(
        "import os\nimport sys\n"
        "sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'third_party'))\n"
        "from torch import nn  # noqa: E402\nfrom path_widths import WIDTH  # noqa: E402\n\n\n"
        "def net(num_classes=10):\n"
        "    return nn.Sequential(nn.Conv2d(3, WIDTH, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),\n"
        "                         nn.Linear(WIDTH, num_classes))\n")
    (tmp_path / "config.toml").write_text('[networks]\nzoo = []\nfactories = ["nets/net.py:net"]\n'
                                          "input_shape = [3, 16, 16]\nnum_classes = 10\n\n[networks.pruning]\n"
                                          "levels = [0]\n")
    note = ("from perf4sight.config import load_config\nfrom perf4sight.networks.settings import "
            "changed_settings_note\nprint(changed_settings_note(load_config('config.toml')))\n")

    def run(*args: str) -> str:  # a process per stage, as a user's
        done = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    for cached in ("", "read back"):
        made = run(str(ROOT / "main.py"), "--config", "config.toml", "--stage", "networks")
        assert "314 parameters" in made and cached in made
        assert run("-c", note) == "None\n"


def test_the_modules_a_file_imports_are_read_from_its_lines(tmp_path):
    """Every import statement's top-level module, as Python's parser finds them (indented ones, lists, aliases,
    parenthesised names; relative imports name none), read from the file's lines: a line of a string that reads like
    an import adds its name too (a file more in a cache key, never one less)."""
    import ast

    from perf4sight.networks.factories import _imported_modules

    source = ('"""A factory.\nimport in_a_docstring\n"""\nimport a.b as c, d\nfrom e.f import g\nfrom . import h\n'
              "from .i import j\nimport os, sys as system  # a comment\n\n\ndef f():\n    import k\n"
              "    from l import (m,\n                   n)\n")
    (tmp_path / "x.py").write_text(source)
    tree = ast.parse(source)
    parsed = {a.name.partition(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    parsed |= {n.module.partition(".")[0] for n in ast.walk(tree)
               if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module}
    assert _imported_modules(tmp_path / "x.py") == parsed | {"in_a_docstring"}
    assert parsed == {"a", "d", "e", "os", "sys", "k", "l"}


@pytest.mark.parametrize("line", ["import torch; import blocks.layers", "try: import blocks\nexcept ImportError: pass",
                                  "import os, \\\n    blocks", "if True: from blocks.layers import conv",
                                  "x = 1; from blocks import layers"])
def test_an_import_after_a_semicolon_a_colon_or_a_continued_line_keys_the_package_it_imports(tmp_path, line):
    """The parser finds an import that follows another statement on its line (``import torch; import blocks``,
    ``try: import blocks``) or continues a line (``import os, \\``); the lines' reading missed it, and the package
    beside the factory that it imports was left out of the factory's code files (its change cached nothing anew)."""
    import ast

    from perf4sight.networks.factories import Factory, _imported_modules

    (tmp_path / "blocks").mkdir()
    (tmp_path / "blocks" / "__init__.py").write_text("")
    (tmp_path / "blocks" / "layers.py").write_text("conv = None\n")
    source = f"{line}\n\n\ndef net():\n    return None\n"
    (tmp_path / "net.py").write_text(source)
    tree = ast.parse(source)
    parsed = {a.name.partition(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    parsed |= {n.module.partition(".")[0] for n in ast.walk(tree)
               if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module}
    assert "blocks" in parsed and _imported_modules(tmp_path / "net.py") >= parsed
    assert tmp_path / "blocks" / "layers.py" in Factory("net:net", tmp_path / "net.py", "net").code_files


def test_a_file_a_factory_reads_beside_it_keys_what_predict_caches_of_it(tmp_path):
    """The networks stage's cache keys a factory's variants by the files beside it (the test above), but the two
    caches of predict did not: after an edit of the widths file, ``--network nets/wide.py:net`` and a variant
    pruned on request (``net_l0``) were read back as the old network (314 parameters, not 2,442)."""
    from perf4sight.dataset import ZOO_CACHE
    from perf4sight.networks.factories import describe_factory
    from perf4sight.networks import on_request

    (tmp_path / "nets").mkdir()
    (tmp_path / "nets" / "wide.py").write_text(WIDE_FACTORY)
    config = tmp_path / "config.toml"
    config.write_text('[networks]\nzoo = []\nfactories = ["nets/wide.py:net"]\ninput_shape = [3, 16, 16]\n'
                      "num_classes = 10\n")
    cfg, spec = load_config(config), f"{tmp_path / 'nets' / 'wide.py'}:net"
    for width, params in ((8, 314), (64, 2442), (8, 314)):
        (tmp_path / "nets" / "widths.json").write_text(f'{{"width": {width}}}')
        assert describe_factory(spec, [3, 16, 16], 10, cfg.models_dir / ZOO_CACHE).params == params
        on_request._PLANS.clear()  # each predict is a process of its own: its plans traced anew
        assert on_request.pruned_on_request(cfg, "net_l0", [3, 16, 16]).params == params
    kept = sorted((cfg.models_dir / ZOO_CACHE).glob("net*.json"))  # one per widths file written, each kind
    assert len(kept) == 6
    on_request._PLANS.clear()  # nothing changed since: both read back, nothing made or written
    assert describe_factory(spec, [3, 16, 16], 10, cfg.models_dir / ZOO_CACHE).params == 314
    assert on_request.pruned_on_request(cfg, "net_l0", [3, 16, 16]).params == 314
    assert sorted((cfg.models_dir / ZOO_CACHE).glob("net*.json")) == kept and not on_request._PLANS
