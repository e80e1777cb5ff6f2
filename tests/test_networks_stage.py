"""Networks stage, its second half (test_networks.py holds the first; a file goes to one worker of ``pytest -n 2
--dist loadfile``, and the two halves run side by side): the stage run end to end, its reruns and notes, its
errors, description files and factories beside one another."""
from __future__ import annotations

import csv
import functools
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from perf4sight.config import load_config
from perf4sight.errors import UserError
from perf4sight.ir.from_torch import describe
from perf4sight.ir.schema import load_description
from perf4sight.ir.to_torch import build_module
from perf4sight.networks.build import Source, make_networks, prune_source
from perf4sight.networks.factories import build_factory_model, parse_factory
from perf4sight.networks.generator import GeneratorSettings, generate
from perf4sight.networks.pruning import PruningPlan
from perf4sight.networks.zoo import build_zoo_model, describe_zoo

sys.path.insert(0, str(Path(__file__).parent))
from test_networks import CLASSES, ROOT, SHAPE, TINY, _tiny, _train_step  # noqa: E402

warnings.filterwarnings("ignore", module="torch_pruning")


def test_an_unreachable_level_is_left_out_and_a_rerun_says_what_changed(tmp_path: Path, cli_here) -> None:
    """A level that min_channels keeps a network from reaching stopped the whole stage, with no manifest: it is
    left out with a note; a rerun after a config edit says which variants it added and which it no longer makes,
    and the profile stage's note says when [networks] changed since the manifest was written."""
    from perf4sight.networks.settings import changed_settings_note

    config = tmp_path / "config.toml"
    text = (f'[networks]\nzoo = []\nfactories = ["{TINY}:tiny_vgg"]\ninput_shape = [3, 32, 32]\nnum_classes = 10\n'
            '[networks.pruning]\nlevels = [0, 30, 90]\nmin_channels = 32\n')
    config.write_text(text)
    cmd = [sys.executable, str(ROOT / "main.py"), "--config", str(config), "--stage", "networks"]
    first = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    rerun = functools.partial(cli_here, tmp_path, *cmd[2:])  # the reruns in this process: no torch to load each
    assert first.returncode == 0, first.stderr[-2000:]
    assert "note: tiny_vgg_l90 left out: with min_channels=32 tiny_vgg cannot reach 90% (it reaches" in first.stderr
    assert "manifest changed" not in first.stdout  # a first run: nothing to compare with
    with (tmp_path / "models" / "manifest.csv").open() as fh:
        assert [r["network"] for r in csv.DictReader(fh)] == ["tiny_vgg_l0", "tiny_vgg_l30"]
    assert changed_settings_note(load_config(config)) is None
    # cover_styles (a key added later) off, as written out or left out: the same settings as before it existed
    config.write_text(text + "[networks.generator]\ncover_styles = false\n")
    assert changed_settings_note(load_config(config)) is None
    config.write_text(text + "[networks.generator]\ncover_styles = true\n")
    assert "changed since the networks stage wrote" in changed_settings_note(load_config(config))

    config.write_text(text.replace("[0, 30, 90]", "[0, 50]"))
    assert "changed since the networks stage wrote" in changed_settings_note(load_config(config))
    second = rerun()
    assert second.returncode == 0, second.stderr[-2000:]
    assert "manifest changed: 1 added (tiny_vgg_l50), 1 no longer made (tiny_vgg_l30;" in second.stdout
    assert changed_settings_note(load_config(config)) is None

    config.write_text(text.replace("[0, 30, 90]", "[0, 50]").replace("min_channels = 32", "min_channels = 8"))
    third = rerun()
    assert third.returncode == 0, third.stderr[-2000:]
    assert "manifest changed: 1 changed under the same name (tiny_vgg_l50; the profile stage measures" in third.stdout

    config.write_text(text.replace("[0, 30, 90]", "[90]"))
    none_left = rerun()
    assert none_left.returncode == 2 and "no network made: every [networks.pruning] level was out of reach" \
        in none_left.stderr
    with (tmp_path / "models" / "manifest.csv").open() as fh:  # the last manifest is kept as it was
        assert [r["network"] for r in csv.DictReader(fh)] == ["tiny_vgg_l0", "tiny_vgg_l50"]

    # back to a level the first run made under other settings: added, not also "changed" (it said both)
    config.write_text(text.replace("[0, 30, 90]", "[0, 30]").replace("min_channels = 32", "min_channels = 8"))
    back = rerun()
    assert back.returncode == 0, back.stderr[-2000:]
    assert "manifest changed: 1 added (tiny_vgg_l30), 1 no longer made (tiny_vgg_l50;" in back.stdout
    assert "changed under the same name" not in back.stdout

    # run again as it is: every file as it was, not rewritten, and said so (it printed nothing and rewrote all)
    written = {p: p.stat().st_mtime_ns for p in (tmp_path / "models").rglob("*") if p.is_file()}
    same = rerun()
    assert same.returncode == 0 and "manifest unchanged: every variant as the last run made it" in same.stdout
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "models").rglob("*") if p.is_file()} == written
    # another strategy's folder: every variant is another file (its "strategy" differs), measured again: said so
    config.write_text(text.replace("[0, 30, 90]", "[0, 30]").replace("min_channels = 32", "min_channels = 8")
                      + 'strategy = "random"\n')
    other = rerun()
    assert other.returncode == 0, other.stderr[-2000:]
    assert "manifest changed: 2 changed under the same name (tiny_vgg_l0, tiny_vgg_l30;" in other.stdout
    # back to l1-norm, whose tiny_vgg_l0 a device measured: its rows count again and the profile measures it on no
    # device again, which the stage said it would ("changed ...; the profile stage measures them again")
    from perf4sight.profiling.results import append_row, file_sha
    l0 = tmp_path / "models" / "pruned" / "l1-norm" / "tiny_vgg_l0.json"
    append_row(tmp_path / "profiling_csvs" / "local" / "measurements.csv", {
        "device": "local", "backend": "cpu", "network": "tiny_vgg_l0", "batch_size": 1, "phase": "train",
        "status": "ok", "timestamp": "2026-12-01T00:00:00+00:00", "description_sha": file_sha(l0.read_bytes())})
    config.write_text(text.replace("[0, 30, 90]", "[0, 30]").replace("min_channels = 32", "min_channels = 8")
                      + '[devices.local]\nbackend = "cpu"\n')
    measured = rerun()
    assert measured.returncode == 0, measured.stderr[-2000:]
    assert ("manifest changed: 1 changed under the same name (tiny_vgg_l30; the profile stage measures them again), "
            "1 changed under the same name to what the devices measured before (tiny_vgg_l0; those rows count "
            "again: the profile stage does not measure them again)") in measured.stdout


def test_stage_reports_a_factory_that_fails_to_import(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("raise RuntimeError('no torch here')\n")
    (tmp_path / "config.toml").write_text('[networks]\nzoo = []\nfactories = ["bad.py:net"]\n')
    # the error names the config and its key, as every other [networks] error does
    with pytest.raises(UserError, match=r"config.toml: \[networks\] factories: factory 'bad.py:net': "
                                        r"\S*bad.py fails to import \(RuntimeError: no torch here\)"):
        make_networks(load_config(tmp_path / "config.toml"))


def test_stage_reports_a_description_file_that_is_not_a_description(tmp_path: Path) -> None:
    """A description_files entry that is not JSON: the error names the config and its key, then the file."""
    (tmp_path / "nets").mkdir()
    (tmp_path / "nets" / "broken.json").write_text('{"name": "broken", ')
    (tmp_path / "config.toml").write_text('[networks]\nzoo = []\ndescription_files = ["nets/broken.json"]\n')
    with pytest.raises(UserError, match=r"config.toml: \[networks\] description_files: \S*broken.json"):
        make_networks(load_config(tmp_path / "config.toml"))


def test_two_description_files_of_one_network_are_named_with_why_they_clash(tmp_path: Path) -> None:
    """Two description files named hand_small and hand_big, both of `network` 'hand', were refused with "[networks]
    names ['hand'] more than once", naming neither file nor why files of other names clash."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, CLASSES))
    from perf4sight.ir.schema import save_description

    for name in ("hand_small", "hand_big"):
        save_description(describe(model, SHAPE, name, network="hand"), tmp_path / "nets" / f"{name}.json")
    (tmp_path / "config.toml").write_text(
        '[networks]\nzoo = ["resnet18"]\ndescription_files = ["nets/hand_small.json", "nets/hand_big.json"]\n'
        'input_shape = [3, 32, 32]\n')
    with pytest.raises(UserError) as info:
        make_networks(load_config(tmp_path / "config.toml"))
    assert str(info.value) == (
        f"{tmp_path / 'config.toml'}: [networks] names a network more than once (zoo, factories, description_files): "
        "'hand' by description:nets/hand_small.json, description:nets/hand_big.json (a description file's variants "
        "are named after its `network`, not its `name`, unless it is a pruned or generated network's: give each file "
        "a `network` of its own)")


def test_stage_makes_a_vit_and_convnext_style_networks(tmp_path: Path) -> None:
    """The networks stage builds a ViT for the configured input, prunes its MLPs (its token width kept whole, said in
    the description), and generates networks of the convnext style when named; a ViT at an input it cannot take
    is one line from the CLI, exit code 2, said before torchvision loads (every import of it refused here)."""
    text = ('[networks]\nzoo = ["vit_b_32"]\ninput_shape = [3, 32, 32]\nnum_classes = 10\n'
            '[networks.pruning]\nlevels = [0, 30]\n[networks.generator]\ncount = 1\nstyles = ["convnext"]\n')
    (tmp_path / "config.toml").write_text(text)
    rows = make_networks(load_config(tmp_path / "config.toml")).rows
    assert [r["network"] for r in rows] == ["vit_b_32_l0", "vit_b_32_l30", "gen_0_0"]
    vit = load_description(tmp_path / "models" / rows[1]["path"])
    assert vit.extra["pruning_unpruned_groups"] == {"an attention's embedding width": 1}
    assert {"attention", "token", "shift"} <= {n.op for n in vit.nodes} and abs(vit.pruning_level - 30) <= 2
    assert rows[2]["styles"] == "convnext|convnext|convnext|convnext"
    (tmp_path / "config.toml").write_text(text.replace("[3, 32, 32]", "[3, 48, 48]"))
    refuse = ("import os, runpy, sys\nclass Refuse:\n    def find_spec(self, name, path=None, target=None):\n"
              "        if name.split('.')[0] == 'torchvision':\n"
              "            raise ImportError('torchvision refused by the test')\n"
              "sys.meta_path.insert(0, Refuse())\nsys.argv = sys.argv[1:]\n"
              "sys.path.insert(0, os.path.dirname(sys.argv[0]))\n"
              "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    run = subprocess.run([sys.executable, "-c", refuse, str(Path(__file__).resolve().parents[1] / "main.py"),
                          "--config", str(tmp_path / "config.toml"), "--stage", "networks"], capture_output=True,
                         text=True, cwd=tmp_path, timeout=300)
    assert run.returncode == 2, run.stderr[-2000:]
    (line,) = run.stderr.strip().splitlines()
    assert "'vit_b_32': a ViT takes square images whose side is a multiple of its patch size 32" in line


def test_stage_reports_a_factory_whose_forward_fails_at_the_input_shape(tmp_path: Path) -> None:
    """A grey-scale model at a 3-channel input shape: one line naming the model, the shape and torch's
    complaint, exit code 2 from the CLI (was a 49-line traceback)."""
    (tmp_path / "gray.py").write_text("from torch import nn\n"
                                      "def net(num_classes=10):\n"
                                      "    return nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), "
                                      "nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, num_classes))\n")
    (tmp_path / "config.toml").write_text('[networks]\nzoo = []\nfactories = ["gray.py:net"]\n'
                                          'input_shape = [3, 32, 32]\n[networks.pruning]\nlevels = [0, 50]\n')
    run = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "main.py"), "--config",
                          str(tmp_path / "config.toml"), "--stage", "networks"], capture_output=True, text=True,
                         cwd=tmp_path, timeout=300)
    assert run.returncode == 2, run.stderr[-2000:]
    (line,) = run.stderr.strip().splitlines()
    assert "forward fails at input shape [3, 32, 32]" in line and "expected input" in line and "1 channels" in line
    # where: the config and its entry (it said the network alone, which a zoo name or a factory's function gives)
    assert line.startswith(f"error: {tmp_path / 'config.toml'}: [networks] factories: factory 'gray.py:net': net: ")


def test_a_dataset_network_is_found_by_its_name(tmp_path: Path) -> None:
    """``--network resnet18_l30`` (a pruned variant, or an imported graph) said only "give its description file"
    though it knew the file: the file is read; a name that two devices' imported graphs share with different
    contents names both files; zoo names and unknown names are as before."""
    from perf4sight.dataset import resolve_networks
    from perf4sight.ir.schema import save_description

    (tmp_path / "config.toml").write_text('[networks]\nzoo = ["resnet18"]\n[devices.local]\nbackend = "cpu"\n')
    cfg = load_config(tmp_path / "config.toml")
    (variant,) = prune_source(_tiny("tiny_vgg"), SHAPE, [30], "l1-norm", 4, seed=0)
    save_description(variant, cfg.models_dir / "pruned" / "l1-norm" / "tiny_vgg_l30.json")
    (cfg.models_dir / "manifest.csv").write_text("network,family,path\n"
                                                 "tiny_vgg_l30,tiny_vgg,pruned/l1-norm/tiny_vgg_l30.json\n")
    graph = describe(build_factory_model(parse_factory(f"{TINY}:tiny_resnet", ROOT), CLASSES), SHAPE, "net_0")
    for device in ("tx2", "tx3"):
        save_description(graph, cfg.models_dir / "imported" / device / "net_0.json")
    found = resolve_networks(cfg, ["tiny_vgg_l30", "net_0"], [3, 32, 32])
    assert [(d.name, d.params) for d in found] == [("tiny_vgg_l30", variant.params), ("net_0", graph.params)]
    (cfg.models_dir / "imported" / "tx3" / "net_0.json").write_text(variant.to_json())
    with pytest.raises(UserError, match=r"'net_0' names 2 different networks .*tx2/net_0\.json, .*tx3/net_0\.json"):
        resolve_networks(cfg, ["net_0"], [3, 32, 32])
    with pytest.raises(UserError, match="unknown network 'resnet19' \\(did you mean 'resnet18'") as info:
        resolve_networks(cfg, ["resnet19"], [3, 32, 32])
    assert "a network of the dataset (2: net_0, tiny_vgg_l30)" in str(info.value)  # the kinds of name, and which
    with pytest.raises(UserError, match="unknown network 'Tiny_VGG_L30' \\(did you mean 'tiny_vgg_l30'"):
        resolve_networks(cfg, ["Tiny_VGG_L30"], [3, 32, 32])  # another case
    with pytest.raises(UserError, match=r"tiny_nets\.py: a Python file, not a network: name the function that "
                                        r"builds the network, .*tiny_nets\.py:function"):
        resolve_networks(cfg, [str(TINY)], [3, 32, 32])
    manifest = cfg.models_dir / "manifest.csv"
    manifest.write_text(manifest.read_text()[:-30])  # cut off mid-path: the file it names is not there
    with pytest.raises(UserError, match=r"models/pru: network description file not found$"):
        resolve_networks(cfg, ["tiny_vgg_l30"], [3, 32, 32])
    manifest.write_text(manifest.read_text().rsplit(",", 1)[0])  # cut off before its path: one line, not a traceback
    with pytest.raises(UserError, match=r"manifest\.csv: line 2: incomplete row .*: run --stage networks again$"):
        resolve_networks(cfg, ["tiny_vgg_l30"], [3, 32, 32])


def test_a_description_file_counting_frozen_weights_it_does_not_name_is_noted(tmp_path: Path) -> None:
    """A description file written before descriptions named their frozen layers (``frozen_params`` alone) cannot be
    rebuilt frozen: a note says so, and not of a file that names them (``frozen_layers``)."""
    from perf4sight.config import load_config
    from perf4sight.ir.schema import save_description
    from perf4sight.networks.build import reshaped_description_notes

    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, CLASSES))
    model[0].requires_grad_(False)
    named = describe(model, SHAPE, "named")
    older = describe(model, SHAPE, "older")
    del older.extra["frozen_layers"]
    save_description(named, tmp_path / "named.json")
    save_description(older, tmp_path / "older.json")
    model[0].weight.requires_grad_(False)
    model[0].bias.requires_grad_(True)  # a layer partly frozen: its weight named alone (frozen_parameters)
    partly = describe(model, SHAPE, "partly")
    assert "frozen_layers" not in partly.extra and partly.extra["frozen_parameters"] == ["_0.weight"]
    save_description(partly, tmp_path / "partly.json")
    (tmp_path / "config.toml").write_text(
        '[networks]\nzoo = []\ndescription_files = ["named.json", "older.json", "partly.json"]\n'
        'input_shape = [3, 32, 32]\nnum_classes = 10\n')
    assert reshaped_description_notes(load_config(tmp_path / "config.toml")) == [
        "note: [networks] description_files: older.json counts 224 frozen parameters but names none of them "
        "(frozen_layers, frozen_parameters, written since this tool names them: describe the module again): its "
        "networks train every layer"]


def test_a_description_file_at_another_input_shape_is_noted(tmp_path: Path) -> None:
    """A [networks] description_files entry described at 3x64x64 under input_shape = [3, 32, 32] was rebuilt
    at 3x32x32 without a word: one note per such file says what shape it had and what it is built at."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, CLASSES))
    from perf4sight.ir.schema import save_description

    save_description(describe(model, [3, 64, 64], "wide"), tmp_path / "nets" / "wide.json")
    save_description(describe(model, SHAPE, "same"), tmp_path / "nets" / "same.json")
    (tmp_path / "config.toml").write_text(
        '[networks]\nzoo = []\ndescription_files = ["nets/wide.json", "nets/same.json"]\ninput_shape = [3, 32, 32]\n'
        'num_classes = 10\n[networks.pruning]\nlevels = [0]\n[networks.generator]\ncount = 1\n')
    run = subprocess.run([sys.executable, str(ROOT / "main.py"), "--config", str(tmp_path / "config.toml"),
                          "--stage", "networks"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    notes = [line for line in run.stderr.splitlines() if "description_files" in line]
    assert notes == ["note: [networks] description_files: nets/wide.json is described at input shape 3x64x64; "
                     "its networks are built at [networks] input_shape 3x32x32"]
    assert load_description(tmp_path / "models" / "pruned" / "l1-norm" / "wide_l0.json").input_shape == SHAPE
    assert "generated 1 network in" in run.stdout  # not "1 networks"


def test_a_pruned_description_file_keeps_its_name_and_family(tmp_path: Path) -> None:
    """A description file of a pruned variant (tiny_vgg_l40) made variants named tiny_vgg_l0, which reads as the
    unpruned network (and clashed with a zoo or factory tiny_vgg): they are tiny_vgg_l40_l<level> now, in the
    family of the network it was pruned from."""
    from perf4sight.ir.schema import save_description

    (pruned,) = prune_source(_tiny("tiny_vgg"), SHAPE, [40], "l1-norm", 4, seed=0)
    save_description(pruned, tmp_path / "nets" / "tiny_vgg_l40.json")
    (tmp_path / "config.toml").write_text(
        f'[networks]\nzoo = []\nfactories = ["{TINY}:tiny_vgg"]\ndescription_files = ["nets/tiny_vgg_l40.json"]\n'
        'input_shape = [3, 32, 32]\nnum_classes = 10\n[networks.pruning]\nlevels = [0, 20]\n')
    rows = make_networks(load_config(tmp_path / "config.toml")).rows
    assert [(r["network"], r["family"]) for r in rows] == [
        ("tiny_vgg_l0", "tiny_vgg"), ("tiny_vgg_l20", "tiny_vgg"),
        ("tiny_vgg_l40_l0", "tiny_vgg"), ("tiny_vgg_l40_l20", "tiny_vgg")]
    assert int(rows[2]["params"]) == pruned.params and int(rows[3]["params"]) < pruned.params
    # a level-0 variant of it given back as a file (under any file name) was named tiny_vgg, which it is not
    made = load_config(tmp_path / "config.toml").models_dir / "pruned" / "l1-norm" / "tiny_vgg_l40_l0.json"
    (tmp_path / "nets" / "copy.json").write_bytes(made.read_bytes())
    (tmp_path / "config.toml").write_text(
        '[networks]\nzoo = []\ndescription_files = ["nets/copy.json"]\n'
        'input_shape = [3, 32, 32]\nnum_classes = 10\n[networks.pruning]\nlevels = [0]\n')
    rows = make_networks(load_config(tmp_path / "config.toml")).rows
    assert [(r["network"], r["family"], int(r["params"])) for r in rows] == [("tiny_vgg_l40_l0_l0", "tiny_vgg",
                                                                              pruned.params)]

    # generated networks keep their names too (they were named by their style family, which others share)
    cfg = load_config(tmp_path / "config.toml")
    gen = [save_description(d, tmp_path / "nets" / f"{d.name}.json")
           for d in generate(GeneratorSettings(count=2, seed=1, styles=("vgg",)), SHAPE, CLASSES)]
    (tmp_path / "config.toml").write_text(
        f'[networks]\nzoo = []\ndescription_files = ["{gen[0]}", "{gen[1]}"]\n'
        'input_shape = [3, 32, 32]\nnum_classes = 10\n[networks.pruning]\nlevels = [0]\n')
    rows = make_networks(load_config(tmp_path / "config.toml")).rows
    assert [(r["network"], r["family"]) for r in rows] == [("gen_1_0_l0", "gen-vgg-vgg-vgg-vgg"),
                                                           ("gen_1_1_l0", "gen-vgg-vgg-vgg-vgg")]

    # a description file the stage itself writes: two runs of one config would make different networks
    (tmp_path / "config.toml").write_text(
        f'[networks]\nzoo = []\nfactories = ["{TINY}:tiny_vgg"]\n'
        f'description_files = ["{cfg.models_dir}/pruned/l1-norm/tiny_vgg_l20.json"]\n'
        'input_shape = [3, 32, 32]\nnum_classes = 10\n[networks.pruning]\nlevels = [0, 20]\n')
    with pytest.raises(UserError, match=r"tiny_vgg_l20.json is a file this networks stage writes .*copy it out"):
        make_networks(load_config(tmp_path / "config.toml"))


def test_a_factory_whose_helper_another_factorys_folder_shadows_is_refused(tmp_path: Path) -> None:
    """Two factories in two folders that each ``from common import WIDTH``: one process imports ``common`` once, so
    the second network was built silently from the first folder's helper; it is refused in one line, whether the
    helper is imported with the file or only when its function is called (``later``)."""
    for folder, width in (("a", 8), ("b", 64), ("c", 32)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / f"common_{tmp_path.name}.py").write_text(f"WIDTH = {width}\n")
        (tmp_path / folder / f"later_{tmp_path.name}.py").write_text(f"OUT = {width // 4}\n")
    for folder in ("a", "b"):
        (tmp_path / folder / "net.py").write_text(
            f"from torch import nn\nfrom common_{tmp_path.name} import WIDTH\n\n\ndef net():\n    return "
            "nn.Sequential(nn.Conv2d(3, WIDTH, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(WIDTH, 10))\n")
    (tmp_path / "c" / "net.py").write_text(
        f"from torch import nn\n\n\ndef net():\n    from later_{tmp_path.name} import OUT\n    return "
        "nn.Sequential(nn.Conv2d(3, 4, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, OUT))\n")
    (tmp_path / "a" / "late.py").write_text(
        f"from torch import nn\n\n\ndef net():\n    from later_{tmp_path.name} import OUT\n    return "
        "nn.Sequential(nn.Conv2d(3, 4, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, OUT))\n")
    assert build_factory_model(parse_factory("a/net.py:net", tmp_path))[0].out_channels == 8
    with pytest.raises(UserError, match=rf"factory 'b/net.py:net': its common_{tmp_path.name}.py is shadowed by "
                                        rf".*/a/common_{tmp_path.name}.py, imported for another factory under the "
                                        r"same name: give the helper modules distinct names$"):
        build_factory_model(parse_factory("b/net.py:net", tmp_path))
    assert build_factory_model(parse_factory("a/late.py:net", tmp_path))[-1].out_features == 2
    with pytest.raises(UserError, match=rf"factory 'c/net.py:net': its later_{tmp_path.name}.py is shadowed"):
        build_factory_model(parse_factory("c/net.py:net", tmp_path))


def test_a_generated_network_is_left_out_at_an_extra_shape_too_small_for_its_stem(tmp_path: Path) -> None:
    """A generated network drawn at 64x64 has a stem of stride 2: rebuilt at 32x32 its last maps would be 1x1 and
    batch size 1 would not train, so it is left out there (said why) and made at 80x64; one drawn at 48x48 (a stem
    of stride 1) is made at 32x32 and trains at batch size 1 there, and is left out at 16x16."""
    from perf4sight.networks.build import at_extra_shapes
    from perf4sight.networks.generator import forward_flops

    (tmp_path / "config.toml").write_text(
        '[networks]\nzoo = []\ninput_shape = [3, 64, 64]\nextra_input_shapes = [[3, 32, 32], [3, 80, 64]]\n'
        'num_classes = 10\n[networks.generator]\ncount = 1\nmax_mflops = 50\n')
    made = make_networks(load_config(tmp_path / "config.toml"))
    assert [r["network"] for r in made.rows] == ["gen_0_0", "gen_0_0_80x64"]
    (line,) = made.skipped
    assert line == ("gen_0_0_32x32 left out: gen_0_0 cannot be made at 3x32x32 (its stem strides by 2, drawn at "
                    "3x64x64: its last maps would be under 2x2 and batch norm cannot train at batch size 1; it needs "
                    "at least 64x64)")
    (tmp_path / "small.toml").write_text(
        '[networks]\nzoo = []\ninput_shape = [3, 48, 48]\nextra_input_shapes = [[3, 32, 32], [3, 16, 16]]\n'
        'num_classes = 10\n[networks.generator]\ncount = 1\nmax_mflops = 50\n')
    cfg = load_config(tmp_path / "small.toml")
    (desc,) = generate(GeneratorSettings.from_config(cfg.networks.generator), [3, 48, 48], CLASSES)
    skipped: list[str] = []
    (at_32,) = at_extra_shapes(cfg, desc, skipped)
    assert at_32.name == "gen_0_0_32x32" and at_32.input_shape == [3, 32, 32]
    # its forward MFLOPs are its own at 32x32, not those it was drawn with at 48x48 (the file said 2.25 times more)
    assert at_32.extra["mflops"] == round(forward_flops(at_32) / 1e6, 3) < desc.extra["mflops"] / 2
    _train_step(at_32, batch=1)
    assert skipped == ["gen_0_0_16x16 left out: gen_0_0 cannot be made at 3x16x16 (its stem strides by 1, drawn at "
                       "3x48x48: its last maps would be under 2x2 and batch norm cannot train at batch size 1; it "
                       "needs at least 32x32)"]


def test_a_factorys_cached_description_follows_the_packages_beside_it(tmp_path):
    """A factory importing a helper from a package beside it (``from blocks import layers``) kept its cached
    description after the helper's width was edited: only the Python files beside the factory keyed the cache."""
    from perf4sight.networks.factories import describe_factory

    (tmp_path / "blocks" / "deep").mkdir(parents=True)
    (tmp_path / "blocks" / "__init__.py").write_text("")
    (tmp_path / "blocks" / "deep" / "__init__.py").write_text("")
    (tmp_path / "blocks" / "layers.py").write_text("from .deep.width import WIDTH\n")
    (tmp_path / "blocks" / "deep" / "width.py").write_text("WIDTH = 8\n")
    (tmp_path / "unrelated").mkdir()
    (tmp_path / "unrelated" / "big.py").write_text("X = 1\n")
    (tmp_path / "broken.py").write_text("def (:\n")  # a file beside it that does not parse: no imports of its own
    (tmp_path / "p4s_pkg_net.py").write_text(
        "from torch import nn\nfrom blocks import layers\n\n\ndef net(num_classes=1000):\n"
        "    return nn.Sequential(nn.Conv2d(3, layers.WIDTH, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),\n"
        "                         nn.Linear(layers.WIDTH, num_classes))\n")
    factory = parse_factory(f"{tmp_path}/p4s_pkg_net.py:net", tmp_path)
    assert {p.relative_to(tmp_path).as_posix() for p in factory.code_files} == {
        "p4s_pkg_net.py", "broken.py", "blocks/__init__.py", "blocks/layers.py", "blocks/deep/__init__.py",
        "blocks/deep/width.py"}
    cache = tmp_path / "cache"
    first = describe_factory(f"{tmp_path}/p4s_pkg_net.py:net", [3, 16, 16], 10, cache)
    (tmp_path / "blocks" / "deep" / "width.py").write_text("WIDTH = 16\n")
    for module in [m for m in sys.modules if m == "blocks" or m.startswith("blocks.") or "p4s_pkg_net" in m]:
        del sys.modules[module]  # as a new process would import it
    second = describe_factory(f"{tmp_path}/p4s_pkg_net.py:net", [3, 16, 16], 10, cache)
    assert (first.params, second.params) == (3 * 8 * 9 + 8 + 8 * 10 + 10, 3 * 16 * 9 + 16 + 16 * 10 + 10)
    assert len(list(cache.glob("net-*.json"))) == 2


def test_a_described_channel_shuffle_is_made_unpruned_with_a_note(tmp_path: Path) -> None:
    """A ShuffleNetV2 description given as a file (its channel shuffle a view, a transpose and a view, not
    torchvision's blocks, which a stand-in traces) ran torch-pruning's dependency search without end, taking 16 GB:
    its level 0 is made and the others are left out with a note, as a Swin's are."""
    from perf4sight.ir.schema import save_description
    from perf4sight.networks.pruning import Unprunable

    desc = describe_zoo("shufflenet_v2_x0_5", SHAPE, num_classes=CLASSES)
    with pytest.raises(Unprunable, match=r"shuffle: a description with a channel shuffle .* cannot be pruned"):
        PruningPlan(build_module(desc), SHAPE, network="shuffle")
    save_description(replace(desc, name="shuffle", network="shuffle"), tmp_path / "shuffle.json")
    (tmp_path / "config.toml").write_text(
        '[networks]\nzoo = []\ndescription_files = ["shuffle.json"]\ninput_shape = [3, 32, 32]\nnum_classes = 10\n'
        '[networks.pruning]\nlevels = [0, 10]\nmin_channels = 2\n')
    made = make_networks(load_config(tmp_path / "config.toml"))
    assert [r["network"] for r in made.rows] == ["shuffle_l0"]
    assert made.skipped and "shuffle_l10 left out" in made.skipped[0] and "channel shuffle" in made.skipped[0]
    zoo = PruningPlan(build_zoo_model("shufflenet_v2_x0_5", CLASSES), SHAPE, network="zoo")  # torchvision's: a plan
    assert zoo.prune(30, meta=True).achieved_level == pytest.approx(30, abs=2)
    own = PruningPlan(_OwnShuffle(), SHAPE, min_channels=4, network="own")  # a module's own shuffle prunes
    assert own.prune(40, meta=True).achieved_level == pytest.approx(40, abs=2)


class _OwnShuffle(nn.Module):
    """A stem and a residual block whose channels are shuffled in two groups by a view and a transpose."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.conv = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, CLASSES))

    def forward(self, x):
        x = torch.relu(self.stem(x))
        b, c, h, w = x.shape
        y = self.conv(x).view(b, 2, c // 2, h, w).transpose(1, 2).reshape(b, c, h, w)
        return self.head(x + y)


def test_a_factory_with_lazy_layers_is_pruned(tmp_path: Path) -> None:
    """A factory ending in ``nn.LazyLinear`` stopped the networks stage with torch's ValueError (an uninitialised
    parameter counted): its lazy layers now get their weights from one seeded forward at the input shape."""
    (tmp_path / "lazy.py").write_text(
        "from torch import nn\n\n\ndef lazy(num_classes=10):\n"
        "    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),\n"
        "                         nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.LazyLinear(num_classes))\n")
    (tmp_path / "config.toml").write_text('[networks]\nzoo = []\nfactories = ["lazy.py:lazy"]\n'
                                          'input_shape = [3, 32, 32]\nnum_classes = 10\n'
                                          '[networks.pruning]\nlevels = [0, 30]\n')
    made = make_networks(load_config(tmp_path / "config.toml"))
    assert [r["network"] for r in made.rows] == ["lazy_l0", "lazy_l30"]
    assert int(made.rows[0]["params"]) == 3 * 16 * 9 + 16 + 16 * 16 * 9 + 16 + 64 * 10 + 10
    assert abs(float(made.rows[1]["achieved_level"]) - 30) <= 2


def test_the_seeded_forward_of_lazy_layers_keeps_each_layers_mode() -> None:
    """The forward that gives lazy layers their weights set the whole model back with ``model.train(was_training)``:
    a batch norm the user froze in eval mode inside a training model came back training. Each layer keeps its own."""
    from perf4sight.networks.build import _seeded_build

    def frozen_norm() -> nn.Module:
        model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3),
                              nn.BatchNorm2d(8), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.LazyLinear(CLASSES))
        model[1].eval()  # frozen: the one batch norm in eval mode, the rest training
        return model
    before = [m.training for m in frozen_norm().modules()]
    model = _seeded_build(Source("frozen", "factory:frozen.py:frozen_norm", frozen_norm), 0, [3, 8, 8])
    assert [m.training for m in model.modules()] == before
    assert before[2] is False and before[5] is True  # the frozen norm and a training one (index 0 is the Sequential)
    assert model[-1].weight.shape == (CLASSES, 8)  # the lazy layer has its weights


def test_the_stage_says_which_networks_batch_one_cannot_train(tmp_path: Path, cli_here) -> None:
    """A batch norm over a 1x1 map has one value per channel in a batch of one image, which torch refuses in
    training: the stage says so where the profile's batch sizes hold 1 (its rows there are errors), not otherwise."""
    (tmp_path / "heads.py").write_text(
        "import torch.nn as nn\n\n"
        "def pooled_bn():\n"
        "    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Conv2d(8, 8, 1),\n"
        "                         nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8, 10))\n\n"
        "def plain():\n"
        "    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),\n"
        "                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))\n")
    text = ('[networks]\nzoo = []\nfactories = ["heads.py:pooled_bn", "heads.py:plain"]\ninput_shape = [3, 16, 16]\n'
            'num_classes = 10\n[networks.pruning]\nlevels = [0]\n')
    config = tmp_path / "config.toml"
    config.write_text(text + "[profile]\nbatch_sizes = [1, 2]\n")
    made = make_networks(load_config(config))
    assert made.untrainable_at_batch_one == ["pooled_bn_l0"]
    cmd = [sys.executable, str(ROOT / "main.py"), "--config", str(config), "--stage", "networks"]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "note: batch 1 does not train pooled_bn_l0 at all: a batch norm over a 1x1 map" in run.stderr
    config.write_text(text + "[profile]\nbatch_sizes = [2, 4]\n")
    run = cli_here(tmp_path, *cmd[2:])  # in this process: no torch to load again
    assert run.returncode == 0 and "manifest unchanged" in run.stdout and "batch 1 does not train" not in run.stderr



def test_two_levels_a_networks_coarse_steps_cut_to_one_network_make_it_once() -> None:
    """A small network's pruning steps are coarse: levels 0 and 1 both gave the unpruned network (``_l1``, 0.0%
    removed), and 50 and 48 both its 48.5% cut, each kept twice under two names (profiled twice, as two networks).
    Each is made once now, named after the level nearest what it removes, the other left out with a note."""
    def tiny() -> nn.Module:
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                             nn.Flatten(), nn.Linear(8, 10))
    skipped: list[str] = []
    made = prune_source(Source("tiny", "factory:tiny.py:tiny", tiny), SHAPE, [1, 0, 50, 48], "l1-norm", 4, 0,
                        skipped=skipped)
    assert [(d.name, d.pruning_level, d.params) for d in made] == [("tiny_l0", 0.0, 330), ("tiny_l48", 48.485, 170)]
    assert skipped == ["tiny_l1 left out: the same network as tiny_l0 (0.0% of tiny's parameters removed: its "
                       "pruning steps do not tell 1% from 0%)",
                       "tiny_l50 left out: the same network as tiny_l48 (48.5% of tiny's parameters removed: its "
                       "pruning steps do not tell 50% from 48%)"]
    # one level asked for (a variant pruned on request, --prune-to-fit) is made whatever it cuts to
    (alone,) = prune_source(Source("tiny", "factory:tiny.py:tiny", tiny), SHAPE, [1], "l1-norm", 4, 0)
    assert (alone.name, alone.pruning_level) == ("tiny_l1", 0.0)
