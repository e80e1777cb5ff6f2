"""Config validation: every bad input is one clear line naming the key and file, exit code 2."""
from __future__ import annotations

import codecs
import re
import subprocess
import sys
from pathlib import Path

import pytest

from perf4sight.config import load_config
from perf4sight.errors import UserError

ROOT = Path(__file__).resolve().parents[1]

GOOD = """
[networks]
zoo = ["resnet18"]
input_shape = [3, 32, 32]
[networks.pruning]
levels = [0, 50]
[profile]
batch_sizes = [1, 2]
[devices.local]
backend = "cpu"
memory_limit_mb = 512
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_shipped_config_loads():
    cfg = load_config(ROOT / "config.toml")
    assert list(cfg.devices) == ["local"] and cfg.devices["local"].backend == "cpu"
    assert cfg.profile.batch_sizes[0] == 1 and cfg.networks.pruning.levels == [0, 30, 60]
    assert cfg.networks.generator.count == 6 and cfg.networks.generator.max_mflops == 600


def test_good_config_is_typed(tmp_path):
    cfg = load_config(write(tmp_path, GOOD))
    assert cfg.networks.pruning.levels == [0.0, 50.0] and isinstance(cfg.networks.pruning.levels[1], float)
    assert cfg.devices["local"].memory_limit_mb == 512 and cfg.devices["local"].name == "local"
    assert cfg.models_dir == tmp_path / "models"


@pytest.mark.parametrize("text, expected", [
    (GOOD + "\n[profiles]\nx = 1\n", r"unknown section \[profiles\] \(did you mean \[profile\]\?\) \(known: project, "),
    (GOOD + "\n[extras]\nx = 1\n", r"unknown section \[extras\] \(known: project, networks, "),
    # a key above the first heading read "unknown section [seed]": it is a key, and its sections are named
    ("seed = 1\n" + GOOD, r"key 'seed' is outside any section: keys go under a section heading \('seed' is a key of "
     r"\[project\], \[networks.pruning\], \[networks.generator\], \[fingerprint\]\)$"),
    ("memory_limit_mb = 9\n" + GOOD, r"'memory_limit_mb' is a key of \[devices.<name>\]\)$"),
    (GOOD.replace("batch_sizes", "batch_size"),
     r"\[profile\] unknown key 'batch_size' \(did you mean 'batch_sizes'\?\) \(known: batch_sizes, warmup_steps, "),
    # a key of another section: the key's sections are named (the known keys alone did not say where it goes)
    (GOOD.replace("batch_sizes = [1, 2]", "batch_sizes = [1, 2]\nmemory_limit_mb = 512"),
     r"\[profile\] unknown key 'memory_limit_mb' \('memory_limit_mb' is a key of \[devices.<name>\]\) \(known: "),
    (GOOD.replace('backend = "cpu"', 'backend = "cpu"\ninput_shape = [3, 32, 32]'),
     r"\[devices.local\] unknown key 'input_shape' \('input_shape' is a key of \[networks\]\) \(known: "),
    (GOOD.replace("batch_sizes = [1, 2]", "batch_sizes = 4"), r"\[profile\] 'batch_sizes' must be a list of integers"),
    (GOOD.replace("batch_sizes = [1, 2]", "batch_sizes = [4, 2]"), r"ascending"),
    (GOOD.replace("batch_sizes = [1, 2]", "batch_sizes = [1, 2]\nmin_timed_s = -0.5"),
     r"\[profile\] min_timed_s must lie in"),
    (GOOD.replace("batch_sizes = [1, 2]", "batch_sizes = [1, 2]\nmax_swap_in_mb = -1"),
     r"\[profile\] max_swap_in_mb must be >= 0"),
    (GOOD.replace("batch_sizes = [1, 2]", "batch_sizes = [1, 2]\nrepeats = 0"), r"\[profile\] repeats must be >= 1"),
    (GOOD.replace("batch_sizes = [1, 2]", "batch_sizes = [1, 2]\nreference_every = -6"),
     r"\[profile\] reference_every and reference_batch_size must be >= 0"),
    (GOOD.replace('backend = "cpu"', 'backend = "tpu"'), r"\[devices.local\] backend 'tpu'"),
    (GOOD.replace("memory_limit_mb = 512", 'memory_limit_mb = "lots"'),
     r"\[devices.local\] 'memory_limit_mb' must be an integer"),
    (GOOD.replace("levels = [0, 50]", "levels = [0, 120]"), r"levels must lie in 0..99"),
    (GOOD.replace("levels = [0, 50]", "level = [0]"), r"\[networks.pruning\] unknown key 'level'"),
    (GOOD.replace("batch_sizes = [1, 2]", "batch_sizes = [1, 2]\ndevices = ['tx2']"),
     r"\[profile\] devices names unknown device 'tx2'"),
    (GOOD.replace("batch_sizes = [1, 2]", "batch_sizes = [1, 2]\ntimeout_s = -1"),
     r"\[profile\] timeout_s must be > 0"),
    (GOOD + "\n[fingerprint]\nmodel = 'xgboost'\n", r"\[fingerprint\] model 'xgboost' is not one of"),
    (GOOD + "\n[fingerprint]\nn_estimators = 0\n", r"\[fingerprint\] n_estimators and min_samples_leaf must be >= 1"),
    (GOOD.replace("levels = [0, 50]", "levels = [0, 50]\nstrategy = 'l2-norm'"),
     r"\[networks.pruning\] strategy 'l2-norm'"),
    (GOOD.replace('zoo = ["resnet18"]', 'zoo = ["resnett50"]'),
     r"\[networks\] zoo: 'resnett50' is not a zoo network \(did you mean 'resnet50'.*\?\) \(zoo networks: "
     r".*resnet18.*; networks of your own: \[networks\] factories or description_files\)"),
    # a typo's closest names come first (the 86 names filled the screen), another case too
    (GOOD.replace('zoo = ["resnet18"]', 'zoo = ["MobileNet_V2"]'),
     r"'MobileNet_V2' is not a zoo network \(did you mean 'mobilenet_v2'"),
    (GOOD.replace('zoo = ["resnet18"]', 'zoo = ["qqqq"]'), r"'qqqq' is not a zoo network \(zoo networks: alexnet"),
    # [networks] zoo takes torchvision names only (a file passed here, then failed in the networks stage)
    (GOOD.replace('zoo = ["resnet18"]', 'zoo = ["/some/path/x.json"]'),
     r"\[networks\] zoo: '/some/path/x.json' is a file, not a zoo network: list description files under "
     r"\[networks\] description_files$"),
    (GOOD.replace('zoo = ["resnet18"]', 'zoo = ["models/imagenet/tiny_nets.py:tiny_vgg"]'),
     r"\[networks\] zoo: 'models/imagenet/tiny_nets.py:tiny_vgg' is a factory, not a zoo network: list it under "
     r"\[networks\] factories$"),
    (GOOD + "\n[compare]\nnetworks = ['mobilnet_v2']\n",
     r"\[compare\] networks: unknown network 'mobilnet_v2' \(did you mean 'mobilenet_v2'\?\)"),
    (GOOD + "\n[predict]\nbatch_sizes = [0]\n", r"\[predict\] batch_sizes must be positive"),
    (GOOD.replace('zoo = ["resnet18"]', 'description_files = ["nope.json"]'), r"file not found: nope.json"),
    # a folder there is not "file not found"
    (GOOD.replace('zoo = ["resnet18"]', 'description_files = ["."]'),
     r"\[networks\] description_files: \. is a folder, not a description file: list its .json files one by one$"),
    # an empty entry read as the config's folder: ":  is a folder"
    (GOOD.replace('zoo = ["resnet18"]', 'description_files = [" "]'),
     r"\[networks\] description_files: entry 1 is empty: give a description .json file$"),
    ("[networks\nzoo=1", r"not valid TOML"),
    (GOOD + "\n[fingerprint]\npredictor = 'forest'\n", r"\[fingerprint\] predictor 'forest' is not one of trees, gnn"),
    (GOOD + "\n[fingerprint]\ngnn_arch = 'gat'\n", r"\[fingerprint\] gnn_arch 'gat'"),
    # the offending key and its value, in words a user reads
    (GOOD + "\n[fingerprint]\ngnn_patience = 0\n", r"\[fingerprint\] gnn_patience must be >= 1, got 0$"),
    (GOOD + "\n[fingerprint]\ngnn_hidden = -3\n", r"\[fingerprint\] gnn_hidden must be >= 1, got -3$"),
    (GOOD + "\n[fingerprint]\nsimulate_memory = 'yes'\n",
     r"\[fingerprint\] 'simulate_memory' must be true or false, got 'yes'$"),
    (GOOD.replace("batch_sizes = [1, 2]", "batch_sizes = [1, 2]\ntimed_steps = 0"),
     r"\[profile\] timed_steps must be >= 1, got 0$"),
    (GOOD.replace("batch_sizes = [1, 2]", "batch_sizes = [1, 2]\nwarmup_steps = -1"),
     r"\[profile\] warmup_steps must be >= 0, got -1$"),
    # values a stage would otherwise fail on deep inside torch, numpy or scikit-learn, or write error rows for
    (GOOD.replace("input_shape = [3, 32, 32]", "input_shape = [3, 32, 32]\nnum_classes = -1"),
     r"num_classes must lie in 1..1,000,000, got -1"),
    # values the types allow that ended in a traceback at the stage that used them
    (GOOD.replace("input_shape = [3, 32, 32]", "input_shape = [3, 32, 32]\nnum_classes = 4611686018427387904"),
     r"\[networks\] num_classes must lie in 1..1,000,000, got 4611686018427387904$"),
    (GOOD.replace("input_shape = [3, 32, 32]", "input_shape = [3, 32, 32]\nsegmentation_classes = 100000000000"),
     r"\[networks\] segmentation_classes must lie in 1..1,000,000"),
    (GOOD + "\n[fingerprint]\nseed = 4294967296\n",
     r"\[fingerprint\] seed must lie in 0..4294967295 \(scikit-learn's random_state\), got 4294967296$"),
    (GOOD.replace("batch_sizes = [1, 2]", "batch_sizes = [1, 2]\nmax_swap_in_mb = nan"),
     r"\[profile\] max_swap_in_mb must be >= 0, got nan"),
    ("[project]\nreports_dir = 'c.toml'\n" + GOOD,
     r"\[project\] reports_dir = 'c.toml' is a file \(.*c.toml\), not a folder$"),
    # a folder under a file: the stage that wrote there said "[Errno 20] Not a directory: ..." and exited 1
    ("[project]\nfingerprint_dir = 'c.toml/fp'\n" + GOOD,
     r"\[project\] fingerprint_dir = 'c.toml/fp' lies under a file \(.*c.toml\), not a folder$"),
    (GOOD + "\n[fingerprint]\nseed = -1\n", r"\[fingerprint\] seed must be >= 0, got -1"),
    (GOOD + "\n[networks.generator]\nseed = -1\n", r"\[networks.generator\] seed must be >= 0"),
    (GOOD + "\n[networks.generator]\ncount = -1\n", r"\[networks.generator\] count must be >= 0"),
    (GOOD.replace("batch_sizes = [1, 2]", "batch_sizes = [1, 2]\nlearning_rate = -0.5"),
     r"learning_rate must be a finite number > 0"),
    # an infinite learning rate was taken: every weight inf/NaN after the first step, rows of no training
    (GOOD.replace("batch_sizes = [1, 2]", "batch_sizes = [1, 2]\nlearning_rate = inf"),
     r"\[profile\] learning_rate must be a finite number > 0 and momentum in \[0, 1\), got inf and 0.9$"),
    (GOOD.replace("memory_limit_mb = 512", "threads = -2"), r"\[devices.local\] threads must be >= 0, got -2"),
    (GOOD.replace('backend = "cpu"', 'backend = "nvml"'),
     r"\[devices.local\] memory_limit_mb bounds a process's resident memory .*: drop the key$"),
    (GOOD + "\n[predict]\nbatch_sizes = []\n", r"\[predict\] batch_sizes is empty: give at least one"),
    (GOOD.replace("memory_limit_mb = 512", "reconnect_timeout_s = 0"),
     r"\[devices.local\] reconnect_timeout_s must be > 0 \(seconds\), got 0.0"),
    (GOOD.replace("memory_limit_mb = 512", 'python = ""'),
     r"\[devices.local\] python is empty: name the device's interpreter, or drop the key for python3$"),
    (GOOD.replace("memory_limit_mb = 512", 'python = "  "'), r"\[devices.local\] python is empty"),
    (GOOD.replace("levels = [0, 50]", "levels = [30, 30.0]"), r"levels name a level twice"),
    (GOOD + "\n[compare]\npruning_levels = [0, 100]\n",
     r"\[compare\] pruning_levels must lie in 0..99, got \[0.0, 100.0\]"),
    (GOOD + "\n[compare]\npruning_levels = [50, 50]\n", r"\[compare\] pruning_levels name a level twice"),
    # two levels of one variant name: the networks stage wrote resnet18_l30 twice and two manifest rows of it
    (GOOD.replace("levels = [0, 50]", "levels = [0, 50, 50.0000001]"),
     r"\[networks.pruning\] levels: 50.0 and 50.0000001 give one variant name \(_l50\); levels must differ"),
    (GOOD + "\n[compare]\npruning_levels = [12.5, 12.50000001]\n", r"\[compare\] pruning_levels: 12.5 and 12.5"),
    (GOOD + "\n[compare]\npruning_batch_size = 0\n", r"\[compare\] pruning_batch_size must be >= 1, got 0$"),
    (GOOD.replace("levels = [0, 50]", "levels = [0, 50]\nmin_channels = 0"),
     r"\[networks.pruning\] min_channels must be >= 1"),
    # [networks.generator]: refused here, not by the generator after the pruning (without the file), or not at all
    (GOOD + "\n[networks.generator]\nstyles = ['vgg', 'capsule']\n",
     r"\[networks.generator\] styles: unknown \['capsule'\]"),
    (GOOD + "\n[networks.generator]\nstyles = []\n", r"\[networks.generator\] styles is empty"),
    (GOOD + "\n[networks.generator]\nmin_mflops = 100.0\nmax_mflops = 10.0\n",
     r"\[networks.generator\] min_mflops \(100\) exceeds max_mflops \(10\)"),
    (GOOD + "\n[networks.generator]\nmin_params = 100\nmax_params = 10\n",
     r"\[networks.generator\] min_params \(100\) exceeds max_params \(10\)"),
    (GOOD + "\n[networks.generator]\nmax_params = -5\n", r"\[networks.generator\] max_params must be >= 0, got -5"),
    (GOOD + "\n[networks.generator]\nmin_mflops = -1.0\n", r"\[networks.generator\] min_mflops must be >= 0"),
    (GOOD + "\n[networks.generator]\nmax_mflops = nan\n", r"\[networks.generator\] max_mflops must be >= 0, got nan"),
    (GOOD.replace("input_shape = [3, 32, 32]", "input_shape = [3, 16, 16]") + "\n[networks.generator]\ncount = 2\n",
     r"\[networks\] input_shape \[3, 16, 16\] is too small for generated networks"),
    # a NaN timeout read as "min_timed_s must lie in [0, timeout_s)"; inf (or a wait epoll cannot take) stopped the
    # runner with an OverflowError (at the op prices' measurement)
    (GOOD.replace("batch_sizes = [1, 2]", "batch_sizes = [1, 2]\ntimeout_s = nan"),
     r"\[profile\] timeout_s must be > 0 seconds and at most 1,000,000 \(about 11 days\), got nan$"),
    (GOOD.replace("batch_sizes = [1, 2]", "batch_sizes = [1, 2]\ntimeout_s = inf"), r"\[profile\] timeout_s .* inf$"),
    (GOOD.replace("batch_sizes = [1, 2]", "batch_sizes = [1, 2]\ntimeout_s = 1e7"), r"\[profile\] timeout_s .* 1"),
    # batch sizes past the largest any stage takes: "predict: batch size ... is above 1,000,000,000" from the predict
    # and compare stages, without the file or the key, at the end of --stage all
    (GOOD.replace("batch_sizes = [1, 2]", "batch_sizes = [1, 99_999_999_999]"),
     r"\[profile\] batch_sizes must be at most 1,000,000,000, got 99,999,999,999$"),
    (GOOD + "\n[predict]\nbatch_sizes = [8, 2_000_000_000]\n",
     r"\[predict\] batch_sizes must be at most 1,000,000,000, got 2,000,000,000$"),
    (GOOD + "\n[compare]\npruning_batch_size = 99_999_999_999\n",
     r"\[compare\] pruning_batch_size must be at most 1,000,000,000, got 99,999,999,999$"),
    # sizes whose fit would not end, or asked torch for a 40 GB layer (a traceback from the fingerprint stage)
    (GOOD + "\n[fingerprint]\ngnn_hidden = 100_000\n",
     r"\[fingerprint\] gnn_hidden must lie in 1..4,096 \(default 64\), got 100,000$"),
    (GOOD + "\n[fingerprint]\ngnn_layers = 1000\n", r"\[fingerprint\] gnn_layers must lie in 1..64 \(default 3\)"),
    (GOOD + "\n[fingerprint]\nn_estimators = 1_000_000_000\n",
     r"\[fingerprint\] n_estimators must lie in 1..100,000 \(trees per ensemble; default 200\), got 1,000,000,000$"),
    # a draw without end (the networks stage drew candidates for ever, without a word)
    (GOOD + "\n[networks.generator]\ncount = 1_000_000_000\n",
     r"\[networks.generator\] count must be at most 10,000 \(each network is profiled at every batch size\)"),
    # an SSH device's keys without a host (user, key_file and known_hosts were refused): this machine profiled under
    # the device's name
    (GOOD.replace("memory_limit_mb = 512", "port = 2222"), r"\[devices.local\] sets port but no host: without a host"),
    (GOOD.replace("memory_limit_mb = 512", 'python = "/opt/venv/bin/python"\nworkdir = "/data/p4s"'),
     r"\[devices.local\] sets python, workdir but no host: without a host the device is this machine"),
    (GOOD.replace("memory_limit_mb = 512", "accept_new_host_key = true\nreconnect_timeout_s = 600"),
     r"\[devices.local\] sets accept_new_host_key, reconnect_timeout_s but no host"),
    (GOOD.replace("memory_limit_mb = 512", 'host = "10.0.0.2"\nworkdir = " "'),
     r"\[devices.local\] workdir is empty: name the device's work folder, or drop the key for ~/perf4sight-work$"),
    # a host with more in it, which the connection looked up as a name ("Name or service not known")
    (GOOD.replace("memory_limit_mb = 512", 'host = "nvidia@10.0.0.2"'),
     r"\[devices.local\] host 'nvidia@10.0.0.2' holds a user: give host = '10.0.0.2' and user = 'nvidia'$"),
    (GOOD.replace("memory_limit_mb = 512", 'host = "10.0.0.2:2222"'),
     r"\[devices.local\] host '10.0.0.2:2222' holds a port: give host = '10.0.0.2' and port = 2222$"),
    (GOOD.replace("memory_limit_mb = 512", 'host = "ssh://tx2.lan"'), r"\[devices.local\] host 'ssh://tx2.lan' is a"),
    (GOOD.replace("memory_limit_mb = 512", 'host = " tx2.lan"'), r"\[devices.local\] host ' tx2.lan' has a space"),
    (GOOD.replace("memory_limit_mb = 512", 'host = "  "'), r"\[devices.local\] host '  ' has a space in it"),
])
def test_bad_config_names_file_and_key(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(UserError, match=expected) as info:
        load_config(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_config_naming_a_directory_says_so(tmp_path):
    """`--config .` said "config file not found" although the path is there."""
    with pytest.raises(UserError, match=r"is a directory, not a config file \(give the TOML file, e.g. .*config.toml"):
        load_config(tmp_path)
    proc = subprocess.run([sys.executable, str(ROOT / "main.py"), "--config", str(tmp_path), "--stage", "check"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr == f"error: {tmp_path}: is a directory, not a config file (give " \
        f"the TOML file, e.g. {tmp_path / 'config.toml'})\n", proc.stderr


def test_list_type_names_read_as_words():
    """"must be a list of true/falses" and the like: the item type of a list is named in the plural."""
    from perf4sight.config import _type_name

    assert _type_name(list[bool]) == "a list of true/false values" and _type_name(list[int]) == "a list of integers"
    assert _type_name(bool) == "true or false" and _type_name(list[float]) == "a list of numbers"


def test_predict_and_compare_networks_still_take_zoo_names_and_description_files(tmp_path):
    """Unlike [networks] zoo, [predict] and [compare] networks name either (the predict stage resolves both)."""
    cfg = load_config(write(tmp_path, GOOD + '[predict]\nnetworks = ["resnet18", "x.json"]\n'
                                             '[compare]\nnetworks = ["x.json", "squeezenet1_1"]\n'))
    assert cfg.predict.networks == ["resnet18", str(tmp_path / "x.json")]
    assert cfg.compare.networks == [str(tmp_path / "x.json"), "squeezenet1_1"]


def test_predict_and_compare_networks_take_the_datasets_names_too(tmp_path):
    """As ``--network``: a name the networks stage gives (before it has run), or a network on disk (an imported
    graph), is looked up when the stage runs; a path to a file that is not there, or a name that is none of these,
    is an error at once."""
    cfg = load_config(write(tmp_path, GOOD + '[predict]\nnetworks = ["resnet18_l30", "gen_0_3"]\n'
                                             '[compare]\nnetworks = ["resnet18_l30"]\n'))
    assert cfg.predict.networks == ["resnet18_l30", "gen_0_3"] and cfg.compare.networks == ["resnet18_l30"]
    with pytest.raises(UserError, match=r"\[compare\] networks: 'nets/mine': no such file"):
        load_config(write(tmp_path, GOOD + '[compare]\nnetworks = ["nets/mine"]\n'))
    with pytest.raises(UserError, match=r"\[predict\] networks: unknown network 'resnet50_O' \(did you mean"):
        load_config(write(tmp_path, GOOD + '[predict]\nnetworks = ["resnet50_O"]\n'))
    (tmp_path / "models" / "imported" / "tx2").mkdir(parents=True)
    (tmp_path / "models" / "imported" / "tx2" / "resnet50_0.json").write_text("{}")  # imported: found by name
    assert load_config(write(tmp_path, GOOD + '[predict]\nnetworks = ["resnet50_0"]\n')).predict.networks == [
        "resnet50_0"]


def test_every_torchvision_transformer_is_a_zoo_network(tmp_path):
    load_config(write(tmp_path, GOOD + '[predict]\nnetworks = ["swin_t", "swin_v2_b", "maxvit_t"]\n'))
    load_config(write(tmp_path, GOOD.replace('zoo = ["resnet18"]', 'zoo = ["maxvit_t"]')))
    with pytest.raises(UserError, match=r"\[predict\] networks: unknown network 'maxvit_s' \(did you mean 'maxvit_t'"):
        load_config(write(tmp_path, GOOD + '[predict]\nnetworks = ["maxvit_s"]\n'))


def test_predict_and_compare_networks_take_factories_and_the_configs_own_networks(tmp_path):
    """``nets/mine.py:net`` (relative to the config file, made absolute) and the name of a network ``[networks]``
    names (a factory's function), as ``--network`` takes them; a factory file that is not there is an error."""
    (tmp_path / "nets").mkdir()
    (tmp_path / "nets" / "mine.py").write_text("def net():\n    pass\n")
    own = GOOD.replace("[networks]\n", '[networks]\nfactories = ["nets/mine.py:net"]\n', 1)
    cfg = load_config(write(tmp_path, own + '[predict]\nnetworks = ["nets/mine.py:net", "net"]\n'))
    assert cfg.predict.networks == [f"{tmp_path / 'nets' / 'mine.py'}:net", "net"]
    with pytest.raises(UserError, match=r"\[compare\] networks: 'nets/other.py:net': no such file \(.*other.py\)"):
        load_config(write(tmp_path, GOOD + '[compare]\nnetworks = ["nets/other.py:net"]\n'))
    with pytest.raises(UserError, match=r"\[predict\] networks: unknown network 'net'"):  # named by no [networks]
        load_config(write(tmp_path, GOOD + '[predict]\nnetworks = ["net"]\n'))


def test_predict_and_compare_show_the_configs_own_networks_where_no_zoo_network_is_named(tmp_path):
    """With ``[networks] zoo`` empty, predict and compare (``--stage all`` too) show the factories and description
    files ``[networks]`` names, else the networks stage's unpruned networks (a dataset of generated networks)."""
    from perf4sight.dataset import default_networks

    (tmp_path / "nets").mkdir()
    (tmp_path / "nets" / "mine.py").write_text("def net():\n    pass\n")
    zoo_less = GOOD.replace('zoo = ["resnet18"]', "zoo = []")
    own = zoo_less.replace("[networks]\n", '[networks]\nfactories = ["nets/mine.py:net"]\n', 1)
    cfg = load_config(write(tmp_path, own))
    assert default_networks(cfg) == ["net"]
    cfg = load_config(write(tmp_path, zoo_less))
    assert default_networks(cfg) == []  # before the networks stage: nothing to show, predict and compare say so
    from rich.console import Console

    from perf4sight.report.compare import compare_devices
    with pytest.raises(UserError, match=r"compare: no networks to show: name them in \[compare\] networks"):
        compare_devices(cfg, ["local"], Console())
    (cfg.models_dir).mkdir(parents=True)
    (cfg.models_dir / "manifest.csv").write_text("network,family,target_level,path\n"
                                                 "gen_0,gen,0.0,generated/gen_0.json\n"
                                                 "gen_0_l50,gen,50.0,pruned/gen_0_l50.json\n")
    assert default_networks(cfg) == ["gen_0"]
    # a generated network at [networks] extra_input_shapes is the same network: shown once, at the query's shape
    # (both were shown, predicted twice at the fingerprint's shape)
    (cfg.models_dir / "manifest.csv").write_text("network,family,target_level,input_shape,path\n"
                                                 "gen_0,gen,0,3x32x32,generated/gen_0.json\n"
                                                 "gen_0_48x48,gen,0,3x48x48,generated/gen_0_48x48.json\n")
    assert default_networks(cfg) == ["gen_0"]
    assert default_networks(load_config(write(tmp_path, GOOD))) == ["resnet18"]


def test_a_device_named_twice_is_one_device(tmp_path):
    """``--device r r`` (or ``[profile] devices``) would have two followers profile one SSH device at once, each
    pulling its rows into one CSV: each device is taken once, in order."""
    from perf4sight.dataset import fingerprinted_devices
    from perf4sight.stages import _configured

    cfg = load_config(write(tmp_path, GOOD + '[devices.other]\nbackend = "cpu"\n'))
    assert _configured(cfg, ["other", "local", "other"]) == ["other", "local"]
    (cfg.fingerprint_dir / "local").mkdir(parents=True)
    (cfg.fingerprint_dir / "local" / "metadata.json").write_text("{}")
    assert fingerprinted_devices(cfg, ["local", "local"]) == ["local"]


def test_config_that_is_not_utf8_is_one_line(tmp_path):
    """The line of the first byte that is not UTF-8 (a position in bytes, before) and what to do."""
    path = tmp_path / "c.toml"
    path.write_bytes(b"[project]\nseed = 0 # caf\xe9\n")
    with pytest.raises(UserError, match=r"c.toml: is not UTF-8 text \(byte 0xe9 on line 2: another encoding, such as "
                                        r"Latin-1\); TOML is UTF-8: save it as UTF-8$") as info:
        load_config(path)
    assert "\n" not in str(info.value)


def test_a_config_saved_with_a_byte_order_mark_loads_and_utf16_says_so(tmp_path):
    """Notepad's UTF-8 with a byte-order mark was "not valid TOML (Invalid statement (at line 1, column 1))"; a
    UTF-16 file (PowerShell's `>`) was a codec's message."""
    path = tmp_path / "c.toml"
    path.write_bytes(codecs.BOM_UTF8 + GOOD.encode())
    assert load_config(path).devices["local"].memory_limit_mb == 512
    for encoding in ("utf-16", "utf-16-be"):
        path.write_bytes((codecs.BOM_UTF16_BE if encoding.endswith("be") else b"") + GOOD.encode(encoding))
        with pytest.raises(UserError, match=r"c.toml: is UTF-16 text; TOML is UTF-8: save it as UTF-8$"):
            load_config(path)


@pytest.mark.parametrize("text, key", [
    ('[project]\nmodels_dir = "~no-such-user-p4s/models"\n', r"\[project\] models_dir"),
    ('[devices.tx2]\nhost = "10.0.0.2"\nkey_file = "~no-such-user-p4s/.ssh/id"\n', r"\[devices.tx2\] key_file"),
    ('[devices.tx2]\nhost = "10.0.0.2"\nknown_hosts = "~no-such-user-p4s/kh"\n', r"\[devices.tx2\] known_hosts"),
    ('[networks]\nfactories = ["~no-such-user-p4s/nets.py:net"]\n', r"\[networks\] factories"),
    ('[networks]\ndescription_files = ["~no-such-user-p4s/n.json"]\n', r"\[networks\] description_files"),
    ('[predict]\nnetworks = ["~no-such-user-p4s/n.json"]\n', r"\[predict\] networks"),
    ('[compare]\nnetworks = ["~no-such-user-p4s/nets.py:net"]\n', r"\[compare\] networks"),
])
def test_a_home_of_no_user_is_one_line_naming_the_key(tmp_path, text, key):
    """``~someone`` of no user of this machine: Path.expanduser's RuntimeError was a traceback from the config check
    (or from the first stage to read the path, e.g. check's SSH connection for key_file)."""
    path = write(tmp_path, text + ("" if "devices" in text else '[devices.local]\nbackend = "cpu"\n'))
    with pytest.raises(UserError, match=rf"c.toml: {key}: '~no-such-user-p4s/[^']*': ~no-such-user-p4s is the home "
                                        r"folder of no user of this machine: write the folder out \(or ~/ for your "
                                        r"own home\)$"):
        load_config(path)
    from perf4sight.config import Config, expand_home
    with pytest.raises(UserError, match=r"c.toml: '~no-such-user-p4s/x': ~no-such-user-p4s is the home folder"):
        Config(path=path).resolve("~no-such-user-p4s/x")  # a path read later, by a stage
    assert expand_home("~/x") == Path.home() / "x"


def test_cli_prints_one_line_and_exits_2(tmp_path):
    path = write(tmp_path, GOOD.replace("batch_sizes", "batch_size"))
    for argv in (["--config", str(path), "--stage", "networks"],
                 ["--config", str(tmp_path / "missing.toml"), "--stage", "profile"]):
        proc = subprocess.run([sys.executable, str(ROOT / "main.py"), *argv], capture_output=True, text=True,
                              cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr
    proc = subprocess.run([sys.executable, str(ROOT / "main.py"), "--config", "other.toml", "--stage", "check"],
                          capture_output=True, text=True, cwd=tmp_path)  # a relative path: where it was looked for
    assert proc.stderr == (f"error: other.toml: config file not found (looked in {tmp_path}); --stage init writes "
                           "the default one there\n")


def test_init_writes_the_default_config_and_never_over_a_file(tmp_path):
    """``--stage init`` writes the project's own config.toml (shipped in the package), which then loads; a file
    already there is an error and stays as it was."""
    from perf4sight.config import DEFAULT_CONFIG

    assert DEFAULT_CONFIG.read_bytes() == (ROOT / "config.toml").read_bytes()  # the packaged copy is the project's
    init = subprocess.run([sys.executable, str(ROOT / "main.py"), "--stage", "init"], capture_output=True, text=True,
                          cwd=tmp_path)
    assert init.returncode == 0 and init.stdout.startswith("wrote config.toml: the default configuration"), init.stderr
    assert (tmp_path / "config.toml").read_bytes() == DEFAULT_CONFIG.read_bytes()
    assert list(load_config(tmp_path / "config.toml").devices) == ["local"]
    (tmp_path / "mine.toml").write_text("# mine\n")
    again = subprocess.run([sys.executable, str(ROOT / "main.py"), "--config", "mine.toml", "--stage", "init"],
                           capture_output=True, text=True, cwd=tmp_path)
    assert again.returncode == 2 and again.stderr == ("error: mine.toml: is there already: left as it is (give "
                                                      "--config with another file name to write one)\n")
    assert (tmp_path / "mine.toml").read_text() == "# mine\n"
    nowhere = subprocess.run([sys.executable, str(ROOT / "main.py"), "--config", "no/such/c.toml", "--stage", "init"],
                             capture_output=True, text=True, cwd=tmp_path)
    assert nowhere.returncode == 2 and nowhere.stderr == "error: no/such/c.toml: folder no/such does not exist\n"
    for folder in ("sub/", "no"):  # a folder (one to be, one there): said so, nothing written
        (tmp_path / "no").mkdir(exist_ok=True)
        into = subprocess.run([sys.executable, str(ROOT / "main.py"), "--config", folder, "--stage", "init"],
                              capture_output=True, text=True, cwd=tmp_path)
        assert into.returncode == 2 and into.stderr == (f"error: {folder}: is a folder, not a config file (give the "
                                                        f"file to write, e.g. {folder.rstrip('/')}/config.toml)\n")
    assert not (tmp_path / "sub").exists() and not any((tmp_path / "no").iterdir())


@pytest.mark.parametrize("argv, expected", [
    (["--stage", "predcit"], "error: argument --stage: invalid choice: 'predcit'"),
    (["--stage", "predict", "--batch-size", "x"], "error: argument --batch-size: invalid int value: 'x'"),
    (["--network", "resnet18"], "error: the following arguments are required: --stage"),
    (["--stage", "profile", "--network", "resnet18_l0", "--batch-size", "2"],
     "--network is for --stage predict or all"),
    (["--stage", "compare", "--batch-size", "8"], "--batch-size is for --stage predict or all"),
    (["--stage", "check", "--predictor", "gnn"], "--predictor is for --stage fingerprint, predict or all"),
    (["--stage", "import", "--output", "ds"], "--output is for --stage export"),
    (["--stage", "init", "--device", "jetson"],
     "--device is for --stage profile, fingerprint, predict, compare, all, import, export or check"),
    (["--stage", "predict", "--max-batch-size", "--max-latency-ms", "5"], "--max-batch-size answers alone"),
    (["--stage", "predict", "--max-batch-size", "64", "--prune-to-fit"], "--max-batch-size answers alone"),
    # inf wrote "max_latency_ms": Infinity into --json's lines, which is no JSON; without --prune-to-fit it was said
    # only once a fingerprint had loaded (after "unknown device" or "no fingerprint", where there was none)
    (["--stage", "predict", "--prune-to-fit", "--max-latency-ms", "inf"],
     "error: argument --max-latency-ms: --max-latency-ms must be a positive number of milliseconds, got inf"),
    (["--stage", "predict", "--prune-to-fit", "--max-latency-ms", "nan"], "must be a positive number of milliseconds"),
    (["--stage", "predict", "--prune-to-fit", "--max-latency-ms", "0"], "must be a positive number of milliseconds"),
    (["--stage", "predict", "--prune-to-fit", "--max-latency-ms", "-5"], "a positive number of milliseconds, got -5"),
    (["--stage", "predict", "--prune-to-fit", "--max-latency-ms", "fast"],
     "--max-latency-ms takes a number of milliseconds, got 'fast'"),
    (["--stage", "predict", "--network", "resnet18", "--max-latency-ms", "5"],
     "error: --max-latency-ms is the step-time budget of --prune-to-fit: give that too"),
])
def test_argument_mistakes_are_one_line(tmp_path, argv, expected):
    """A mistyped argument, and an option the stage would pass over (profile --network x measured every
    network), are one line, before the config is read."""
    proc = subprocess.run([sys.executable, str(ROOT / "main.py"), *argv], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and expected in proc.stderr, proc.stderr


def test_export_to_a_file_is_one_line(tmp_path):
    """--output naming a file (not a folder) was "[Errno 17] File exists" with exit code 1."""
    path = write(tmp_path, GOOD)
    (tmp_path / "afile").write_text("x")
    proc = subprocess.run([sys.executable, str(ROOT / "main.py"), "--config", str(path), "--stage", "export",
                           "--format", "perfseer", "--output", str(tmp_path / "afile")],
                          capture_output=True, text=True, cwd=tmp_path)
    assert (proc.returncode == 2 and proc.stderr.count("\n") == 1
            and "is a file, not a folder" in proc.stderr), proc.stderr


def test_check_of_a_cpu_device_says_it_needs_no_backend_library(tmp_path):
    """A cpu device's check line said "no backend library", which reads as something missing on a device that is
    ok; it says none is needed (an nvml or jetson device names its library, or that it is missing)."""
    path = tmp_path / "cpu.toml"
    path.write_text('[networks]\nzoo = ["resnet18"]\n\n[devices.box]\nbackend = "cpu"\n')
    proc = subprocess.run([sys.executable, str(ROOT / "main.py"), "--config", str(path), "--stage", "check"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0 and proc.stdout.startswith("box [cpu] this machine: ok; python "), proc.stderr
    assert ", no backend library needed, memory " in proc.stdout


def test_no_devices_configured_is_one_line(tmp_path):
    """A config without a [devices.*] table: check (and profile) say so instead of printing nothing."""
    path = tmp_path / "empty.toml"
    path.write_text("[networks]\nzoo = ['resnet18']\n")
    proc = subprocess.run([sys.executable, str(ROOT / "main.py"), "--config", str(path), "--stage", "check"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no devices configured" in proc.stderr


@pytest.mark.parametrize("change, expected", [
    (lambda t: t.replace('zoo = ["resnet18"]', "zoo = []"), "names no network"),
    (lambda t: t.replace("levels = [0, 50]", "levels = []"), "levels is empty"),
])
def test_networks_stage_that_would_make_nothing_is_one_line(tmp_path, change, expected):
    path = write(tmp_path, change(GOOD))
    proc = subprocess.run([sys.executable, str(ROOT / "main.py"), "--config", str(path), "--stage", "networks"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and expected in proc.stderr, proc.stderr


def test_generator_ranges_no_network_meets_fail_in_one_line_before_the_pruning(tmp_path):
    """Ranges no candidate satisfies can only be found by drawing candidates: the networks stage draws them
    before it prunes anything, and the line names the config file and the key that rejected most."""
    path = write(tmp_path, GOOD + "\n[networks.generator]\ncount = 2\nmax_mflops = 0.001\n")
    proc = subprocess.run([sys.executable, str(ROOT / "main.py"), "--config", str(path), "--stage", "networks"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{path}: [networks.generator] only 0 of 2 networks" in proc.stderr and "by max_mflops" in proc.stderr
    assert not (tmp_path / "models" / "pruned").exists()  # failed before the pruning, not after it


def test_unknown_device_on_the_command_line(tmp_path):
    path = write(tmp_path, GOOD)
    proc = subprocess.run([sys.executable, str(ROOT / "main.py"), "--config", str(path), "--stage", "predict",
                           "--device", "jetson9"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2 and "jetson9" in proc.stderr and "Traceback" not in proc.stderr


def test_compare_may_name_an_imported_device(tmp_path):
    """An imported device (``--stage import``) has fingerprints but no [devices] table."""
    cfg = load_config(write(tmp_path, GOOD + "\n[compare]\ndevices = ['tx2']\n"))
    assert cfg.compare.devices == ["tx2"]


def test_predict_and_compare_description_files_are_relative_to_the_config_file(tmp_path, monkeypatch):
    """Like every path in the config: a description file in [predict]/[compare] networks is found from the
    config's folder whatever the working directory; zoo names stay names."""
    (tmp_path / "nets").mkdir()
    (tmp_path / "nets" / "mine.json").write_text("{}")
    path = write(tmp_path, GOOD + '[predict]\nnetworks = ["resnet18", "nets/mine.json"]\n'
                                  '[compare]\nnetworks = ["nets/mine.json"]\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(path)
    assert cfg.predict.networks == ["resnet18", str(tmp_path / "nets" / "mine.json")]
    assert cfg.compare.networks == [str(tmp_path / "nets" / "mine.json")]


def test_a_device_without_data_is_named_beside_those_with_it(tmp_path):
    """``--device tx22`` (a typo) said only "no measurements for device(s) tx22": a name no config section,
    measurement or fingerprint knows is an unknown device, with the closest names; a known device without the data
    is told the command that makes it, for that device."""
    from perf4sight.dataset import fingerprinted_devices, measured_devices

    cfg = load_config(write(tmp_path, GOOD))
    for dev in ("local", "tx2"):
        (cfg.profiling_dir / dev).mkdir(parents=True)
        (cfg.profiling_dir / dev / "measurements.csv").write_text("device\n")
    with pytest.raises(UserError, match=r"unknown device 'tx22' \(did you mean 'tx2'\?\): no \[devices.tx22\] in "
                                        r".*\(devices: local, tx2\)"):
        measured_devices(cfg, ["tx22"])
    with pytest.raises(UserError, match=r"unknown device 'gpu0': "):
        fingerprinted_devices(cfg, ["gpu0"])
    with pytest.raises(UserError, match=r"no trees fingerprint for device\(s\) tx2 under [^(]*\(run --stage "
                                        r"fingerprint --device tx2 first\)"):  # the config's predictor: not named
        fingerprinted_devices(cfg, ["tx2"])  # none has one: nothing to list
    (cfg.profiling_dir / "local" / "measurements.csv").unlink()  # fitting it would fail next: the whole way
    with pytest.raises(UserError, match=r"\(run --stage all, or --stage profile --device local \(or --stage import\) "
                                        r"and then --stage fingerprint --device local, first\)"):
        fingerprinted_devices(cfg, ["local"])
    (cfg.profiling_dir / "local" / "measurements.csv").write_text("device\n")
    (cfg.fingerprint_dir / "local").mkdir(parents=True)
    (cfg.fingerprint_dir / "local" / "metadata.json").write_text("{}")
    with pytest.raises(UserError, match=r"no gnn fingerprint for device\(s\) local .*\(run --stage fingerprint "
                                        r"--device local --predictor gnn first\)"):
        fingerprinted_devices(cfg, ["local"], "gnn")
    assert measured_devices(cfg, None) == ["local", "tx2"]


def test_predict_and_compare_in_a_fresh_project_say_every_stage_it_lacks(tmp_path):
    """A new user's first predict (or compare) in a folder holding only config.toml was told to run the fingerprint
    stage, which said there was nothing to fit, and the profile stage then that there was nothing to profile: with
    no measurements either, the line says --stage all (or import, then fingerprint); with some, the fingerprint."""
    import argparse

    from perf4sight import stages

    cfg = load_config(write(tmp_path, GOOD))
    fresh = (f"no trees fingerprint under {cfg.fingerprint_dir}, nor any measurements under {cfg.profiling_dir}: "
             "run --stage all first (the networks, profile and fingerprint stages), or --stage import and then "
             "--stage fingerprint")
    with pytest.raises(UserError) as predict:
        stages._predict_device(cfg, None, "trees")
    assert str(predict.value) == fresh + " --predictor trees"
    with pytest.raises(UserError) as compare:
        stages.run_compare(cfg, argparse.Namespace(device=None))
    assert str(compare.value) == fresh
    (cfg.profiling_dir / "local").mkdir(parents=True)
    (cfg.profiling_dir / "local" / "measurements.csv").write_text("device\n")
    with pytest.raises(UserError, match=r"fingerprinting: run --stage fingerprint --predictor gnn first$"):
        stages._predict_device(cfg, None, "gnn")
    with pytest.raises(UserError, match=r"fingerprinting: run --stage fingerprint first$"):
        stages.run_compare(cfg, argparse.Namespace(device=None))


def test_predict_without_device_takes_a_configured_fingerprint_else_the_first_one(tmp_path):
    """--help and the README said predict's default is the first configured device with a fingerprint; with none
    (an imported TX2 alone fitted) it is the first device with one, as the note of a choice among several says."""
    from perf4sight import stages

    cfg = load_config(write(tmp_path, GOOD))
    for dev in ("tx2", "atx"):  # imported devices: no [devices] table
        (cfg.fingerprint_dir / dev).mkdir(parents=True)
        (cfg.fingerprint_dir / dev / "metadata.json").write_text("{}")
    assert list(cfg.devices) == ["local"] and stages._predict_device(cfg, None, "trees") == "atx"
    (cfg.fingerprint_dir / "local").mkdir()
    (cfg.fingerprint_dir / "local" / "metadata.json").write_text("{}")
    assert stages._predict_device(cfg, None, "trees") == "local"


def test_compare_names_its_config_key_for_a_device_it_does_not_know(tmp_path):
    """``[compare] devices = ["lokal"]`` (a typo): --stage all named the key, --stage compare alone did not (its line
    read as if --device had been given); both name it now, and --device's own names are told as before."""
    import argparse

    from perf4sight import stages

    cfg = load_config(write(tmp_path, GOOD + '[compare]\ndevices = ["lokal"]\n'))
    with pytest.raises(UserError, match=r"^\S*c\.toml: \[compare\] devices: unknown device 'lokal' \(did you "
                                        r"mean 'local'\?\)"):
        stages.run_compare(cfg, argparse.Namespace(device=None))
    with pytest.raises(UserError, match=r"^unknown device 'lokall' \(did you mean 'local'\?\)"):
        stages.run_compare(cfg, argparse.Namespace(device=["lokall"]))


def test_prune_to_fit_tells_a_misspelt_network_with_the_closest_names(tmp_path):
    """``--network resnt18 --prune-to-fit`` said 'resnt18: cannot be pruned here, only a zoo network or ...', where
    predict without --prune-to-fit names the closest names of an unknown network: it does too now; a known network
    that cannot be pruned on request (a description file) is told as before. No fingerprint is read before."""
    import argparse
    from types import SimpleNamespace

    from perf4sight import stages

    cfg = load_config(write(tmp_path, GOOD))
    args = argparse.Namespace(max_latency_ms=None, batch_size=[8], json=True, input_shape=None)
    fp = SimpleNamespace(capacity_mb=900.0)
    with pytest.raises(UserError, match=r"^--network: unknown network 'resnt18' \(did you mean 'resnet18'"):
        stages._predict_prune_to_fit(cfg, args, fp, "local", ["resnt18"])
    with pytest.raises(UserError, match=r"^--prune-to-fit: mine\.json: cannot be pruned here, only a zoo network"):
        stages._predict_prune_to_fit(cfg, args, fp, "local", ["mine.json"])


def test_the_commands_suggested_for_a_device_named_with_a_space_can_be_pasted(tmp_path):
    """A device name may hold a space (an imported ``jetson tx2``): the commands suggested said ``--device jetson
    tx2``, which a shell reads as two devices; each name is one shell word now, quoted where it must be."""
    import shlex

    from perf4sight.dataset import fingerprinted_devices, measured_devices
    from perf4sight.stages import _changed_limit_note

    cfg = load_config(write(tmp_path, GOOD + '[devices."bench b"]\nbackend = "cpu"\nmemory_limit_mb = 256\n'))
    for dev in ("jetson tx2", "bench b"):
        (cfg.profiling_dir / dev).mkdir(parents=True)
        (cfg.profiling_dir / dev / "measurements.csv").write_text("device\n")
    with pytest.raises(UserError) as exc:
        fingerprinted_devices(cfg, ["jetson tx2", "local"])
    said = str(exc.value).split("(run ", 1)[1]
    assert "--device 'jetson tx2' local (or" in said, said
    assert shlex.split(said.split("then ", 1)[1].split(",")[0])[3:] == ["jetson tx2", "local"]
    (cfg.fingerprint_dir / "jetson tx2").mkdir(parents=True)
    (cfg.fingerprint_dir / "jetson tx2" / "metadata.json").write_text("{}")
    with pytest.raises(UserError, match=r"run --stage profile --device 'tx2 b' \(or --stage import \.\.\. "
                                        r"--device 'tx2 b'\) first"):
        (cfg.profiling_dir / "tx2 b").mkdir()
        (cfg.fingerprint_dir / "tx2 b").mkdir()
        (cfg.fingerprint_dir / "tx2 b" / "metadata.json").write_text("{}")
        measured_devices(cfg, ["tx2 b"])
    (cfg.fingerprint_dir / "bench b").mkdir(parents=True)
    (cfg.fingerprint_dir / "bench b" / "metadata.json").write_text('{"capacity_mb": 512, "capacity_source": '
                                                                    '"configured memory_limit_mb"}')
    assert "run --stage fingerprint --device 'bench b' to fit" in _changed_limit_note(
        cfg, "bench b", cfg.fingerprint_dir / "bench b")
    # the config's table of such a device, as TOML reads it: [devices.jetson tx3] is no TOML, [devices.tx2.b] a table
    with pytest.raises(UserError, match=r'no \[devices."jetson tx3"\] in .*c.toml, and no measurements'):
        measured_devices(cfg, ["jetson tx3"])
    with pytest.raises(UserError, match=r'\[devices."tx2.b"\] backend \'gpu\' is not one of'):
        load_config(write(tmp_path, '[devices."tx2.b"]\nbackend = "gpu"\n'))


def test_init_suggests_a_config_path_with_a_space_quoted(tmp_path, capsys):
    """``--stage init --config 'my project/c.toml'`` said ``next: --config my project/c.toml --stage all``."""
    import shlex

    from perf4sight import cli

    (tmp_path / "my project").mkdir()
    assert cli.main(["--config", str(tmp_path / "my project" / "c.toml"), "--stage", "init"]) == 0
    words = shlex.split(capsys.readouterr().out.split("next: ", 1)[1])
    assert words == ["--config", str(tmp_path / "my project" / "c.toml"), "--stage", "all"], words


def test_names_and_folders_with_brackets_are_printed_as_they_are(capsys):
    """Rich read a bracketed word as markup: a project in ``p [v2]/`` was printed as ``p /fingerprinting`` and a
    device ``tx2[b]`` as ``tx2`` (the fingerprint and compare stages' lines, the predictions' titles); a ``[/x]`` in
    a path was a traceback. Names and paths are text now."""
    from types import SimpleNamespace

    from perf4sight import stages
    from perf4sight.report.compare import _print_summary

    stages._print_accuracy("tx2[b]", {"folder": "/d/p [v2]/fingerprinting/tx2[b]"})
    pred = {"network": "n", "batch_size": 8, "latency_ms": 10.0, "latency_ms_low": 9.0, "latency_ms_high": 11.0,
            "memory_mb": 100.0, "memory_mb_low": 90.0, "memory_mb_high": 110.0, "fits": True}
    stages._print_predictions([pred], "predicted training step on tx2[b] by the trees predictor")
    dev = SimpleNamespace(name="tx2[b]", metadata={}, rows=[], families=[], networks=[], max_batch={},
                          fingerprint=SimpleNamespace(capacity_mb=None))
    _print_summary(stages.console, [dev], [], Path("/d/p [v2]/reports/x[/y]"))
    out = capsys.readouterr().out
    assert "tx2[b]: fingerprint in /d/p [v2]/fingerprinting/tx2[b]" in out, out
    assert "on tx2[b] by" in out and "│ tx2[b] " in out, out
    assert "report: /d/p [v2]/reports/x[/y]/index.html" in out, out


def test_predicts_images_per_second_under_ten_are_not_rounded_to_a_whole_number(capsys):
    """The table's images/s was a whole number: the TX2's vgg19 at 448x448, one image in 1,273.7 ms, read '1' for
    0.79 images/s (a step slower than 2 s read '0'); under 10 it has two significant figures now."""
    from perf4sight import stages

    def pred(batch: int, ms: float) -> dict:
        return {"network": f"n{batch}", "batch_size": batch, "latency_ms": ms, "latency_ms_low": ms * 0.9,
                "latency_ms_high": ms * 1.1, "memory_mb": 100.0, "memory_mb_low": 90.0, "memory_mb_high": 110.0,
                "fits": True}

    stages._print_predictions([pred(1, 1273.7), pred(1, 2500.0), pred(8, 700.0), pred(32, 743.4)], "t")
    rates = [line.split("│")[4].strip() for line in capsys.readouterr().out.splitlines() if line.startswith("│ n")]
    assert rates == ["0.79", "0.4", "11", "43"], rates


def test_a_file_in_the_current_folder_does_not_hide_a_network_of_its_name(tmp_path, monkeypatch):
    """A file called ``resnet18_0`` or ``resnet18`` in the current folder (a log, a checkpoint) made ``--network
    resnet18_0`` read it as a description ("not valid JSON"), where a folder of that name gives way to the network;
    a bare name of a zoo or dataset network is that network now, and a path or a .json name still the file."""
    from tiny_graphs import conv_node, tiny_description

    from perf4sight.dataset import is_description_file, resolve_networks
    from perf4sight.ir.schema import Node, save_description

    cfg = load_config(write(tmp_path, GOOD))
    desc = tiny_description([Node("input", "input", [], {}, [4, 8, 8]), conv_node("c", "input", 4, 6, 3, 1, 8)])
    desc.name = "net_0"
    save_description(desc, cfg.models_dir / "imported" / "tx2" / "net_0.json")
    monkeypatch.chdir(tmp_path)
    for name in ("net_0", "resnet18", "mine"):
        (tmp_path / name).write_text("training log\n")
    assert not is_description_file("net_0", cfg) and not is_description_file("resnet18", cfg)
    assert is_description_file("mine", cfg) and is_description_file("./net_0", cfg)
    assert resolve_networks(cfg, ["net_0"], [4, 8, 8])[0].nodes[1].name == "c"
    with pytest.raises(UserError, match="not valid JSON"):
        resolve_networks(cfg, ["./net_0"], [4, 8, 8])
    text = GOOD + '[predict]\nnetworks = ["net_0", "mine"]\n'  # beside the config: the same rule
    assert load_config(write(tmp_path, text)).predict.networks == ["net_0", str(tmp_path / "mine")]


def test_a_drift_reference_without_reference_every_is_said_not_passed_over(tmp_path):
    """``reference_network`` and ``reference_batch_size`` without ``reference_every`` (the shipped config has the
    three commented out together) measured no reference, without a word."""
    for keys, said in (('reference_network = "resnet18_l0"\nreference_batch_size = 2', "reference_network and "
                        "reference_batch_size are the drift reference's, but reference_every is 0"),
                       ("reference_batch_size = 2", "reference_batch_size is the drift reference's")):
        with pytest.raises(UserError, match=rf"\[profile\] {said}.*set reference_every \(e.g. 6"):
            load_config(write(tmp_path, GOOD.replace("[profile]\n", f"[profile]\n{keys}\n")))
    cfg = load_config(write(tmp_path, GOOD.replace("[profile]\n", "[profile]\nreference_every = 3\n"
                                                                   "reference_batch_size = 2\n")))
    assert (cfg.profile.reference_every, cfg.profile.reference_batch_size) == (3, 2)


def test_export_in_perf4sight_format_says_perfseer_is_the_only_one(tmp_path):
    path = write(tmp_path, GOOD)
    proc = subprocess.run([sys.executable, str(ROOT / "main.py"), "--config", str(path), "--stage", "export",
                           "--format", "perf4sight", "--output", str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=tmp_path)
    assert (proc.returncode == 2 and proc.stderr.count("\n") == 1
            and "perfseer is the only export format" in proc.stderr), proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["../../escaped", "my dev/x", ".hidden", " padded"])
def test_a_device_name_that_cannot_name_a_folder_is_refused(tmp_path, name):
    """[devices."../../escaped"] wrote its measurements outside profiling_dir: refused at load, as import's
    --device already was."""
    path = tmp_path / "c.toml"
    path.write_text(f'[devices."{name}"]\nbackend = "cpu"\n')
    with pytest.raises(UserError, match=f"device name {re.escape(repr(name))} cannot name a folder"):
        load_config(path)


def test_ssh_keys_without_a_host_are_refused(tmp_path):
    """A device with key_file (or user, known_hosts) but no host was this machine, profiled under the device's
    name without a word: a forgotten host is one line."""
    path = tmp_path / "c.toml"
    path.write_text('[devices.jetson]\nbackend = "jetson"\nuser = "nvidia"\nkey_file = "~/.ssh/id_ed25519"\n')
    with pytest.raises(UserError, match=r"\[devices.jetson\] sets user, key_file but no host: without a host the "
                                        r"device is this machine"):
        load_config(path)


def test_an_empty_network_name_says_so(tmp_path):
    """``--network ""`` read as the current folder: ": is a folder; give description files"."""
    from perf4sight.dataset import resolve_networks
    cfg = load_config(write(tmp_path, GOOD))
    for name in ("", "  "):
        with pytest.raises(UserError, match=rf"^network name '{name}' is empty: give a zoo name"):
            resolve_networks(cfg, [name], [3, 32, 32])


def test_a_description_file_relative_to_the_config_not_the_current_folder_says_so(tmp_path, monkeypatch):
    """``--config proj/config.toml --network models/generated/x.json`` from the folder above read only "network
    description file not found": command-line paths are relative to the current folder, the config's to the config
    file. Where the config's folder has the file, the line says so and gives its path."""
    from perf4sight.dataset import resolve_networks
    (tmp_path / "proj" / "models").mkdir(parents=True)
    cfg = load_config(write(tmp_path / "proj", GOOD))
    (tmp_path / "proj" / "models" / "x.json").write_text("not json")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"^models/x.json: network description file not found in the current folder "
                                        rf"\({tmp_path}\); the config's folder has one: give it as "
                                        rf"{tmp_path / 'proj' / 'models' / 'x.json'} \(command-line"):
        resolve_networks(cfg, ["models/x.json"], [3, 32, 32])
    with pytest.raises(UserError, match=r"^models/y.json: network description file not found$"):  # in neither
        resolve_networks(cfg, ["models/y.json"], [3, 32, 32])
    (tmp_path / "proj" / "models" / "nets.py").write_text("def net():\n    return 3\n")  # a factory's file too
    with pytest.raises(UserError, match=r"^factory 'models/nets.py:net': file not found in the current folder "
                                        rf"\({tmp_path}\); the config's folder has one: give it as "
                                        rf"{tmp_path / 'proj' / 'models' / 'nets.py'} \(command-line"):
        resolve_networks(cfg, ["models/nets.py:net"], [3, 32, 32])
    monkeypatch.chdir(tmp_path / "proj")  # where it is: read (and found wanting)
    with pytest.raises(UserError, match=r"^models/x.json: network description file is not valid JSON"):
        resolve_networks(cfg, ["models/x.json"], [3, 32, 32])
    with pytest.raises(UserError, match=r"^factory 'models/nets.py:net': net\(\) returned int"):
        resolve_networks(cfg, ["models/nets.py:net"], [3, 32, 32])


def test_a_factory_spec_whose_function_is_not_a_name_says_so(tmp_path):
    """``--network nets.py:`` (the function left out), ``nets.py:net()`` or ``nets.py:net(width=3)`` (a call) and
    ``nets.py:my-net`` fell through to the unknown-name line listing zoo and dataset names, which did not say what
    was wrong: the line now says that a Python name goes after the colon, and quotes what was given."""
    from perf4sight.dataset import resolve_networks
    cfg = load_config(write(tmp_path, GOOD))
    for given, function in (("nets.py:", ""), ("nets.py:net()", "net()"), ("dir/nets.py:net(width=3)", "net(width=3)"),
                            ("nets.py::net", ":net"), ("nets.py:my-net", "my-net")):
        with pytest.raises(UserError) as raised:
            resolve_networks(cfg, [given], [3, 32, 32])
        assert str(raised.value) == (f"{given}: FILE.py:FUNCTION names after the colon the function that returns the "
                                     "network, a Python name such as mynet without parentheses or arguments; got "
                                     f"{function!r}")


def test_ctrl_c_before_a_stage_begins_is_one_line(tmp_path, monkeypatch, capsys):
    """Ctrl-C in the command line's first moments (reading the arguments, pinning the BLAS kernels) printed a
    traceback and exited -2: one line and 130, as later."""
    import os
    import signal

    from perf4sight import blas, cli

    monkeypatch.setattr(blas, "pin_kernels", lambda: os.kill(os.getpid(), signal.SIGINT))  # a real SIGINT, then
    assert cli.main(["--config", str(tmp_path / "config.toml"), "--stage", "init"]) == 130
    assert capsys.readouterr().err == "interrupted: nothing was written\n"
    assert not (tmp_path / "config.toml").exists()


def test_import_names_the_options_it_misses(tmp_path):
    """"import needs --format ... --source DIR --device NAME" whichever was missing: now which."""
    path = write(tmp_path, GOOD)
    for argv, missing in ((["--source", "data"], "--format and --device"),
                          (["--format", "perfseer", "--device", "tx2"], "--source"),
                          ([], "--format and --source and --device")):
        proc = subprocess.run([sys.executable, str(ROOT / "main.py"), "--config", str(path), "--stage", "import",
                               *argv], capture_output=True, text=True, cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr == (
            f"error: import needs --format {{perf4sight,perfseer}} --source DIR --device NAME ({missing} missing)\n")


@pytest.mark.parametrize("argv, extra, expected", [
    (["--batch-size", "0"], "", r"^error: predict: batch sizes must be positive integers, got \[0\]$"),
    (["--network", "resnt18"], "", r"^error: --network: unknown network 'resnt18' \(did you mean 'resnet18'"),
    (["--network", "nets/mine.py:net"], "", r"^error: --network: 'nets/mine.py:net': no such file \(nets/mine.py\)$"),
    (["--device", "locl"], "", r"^error: .*c.toml: unknown device 'locl' \(devices: local\)$"),
    ([], "\n[compare]\ndevices = ['locl']\n",
     r"^error: .*c.toml: \[compare\] devices: unknown device 'locl' \(did you mean 'local'\?\)"),
])
def test_all_refuses_what_a_later_stage_would_before_the_first(tmp_path, argv, extra, expected):
    """--stage all ran the networks, profile and fingerprint stages (5-10 minutes on the default config) before the
    predict or compare stage refused a batch size, a network name or a device; the profile stage refused a device
    only after the networks stage. Now one line before any stage, and nothing written."""
    path = write(tmp_path, GOOD + extra)
    proc = subprocess.run([sys.executable, str(ROOT / "main.py"), "--config", str(path), "--stage", "all", *argv],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2 and re.search(expected, proc.stderr) and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stdout == "" and sorted(p.name for p in tmp_path.iterdir()) == ["c.toml"]


def test_all_checks_compare_devices_only_where_no_device_stands_for_them(tmp_path):
    """With --device, the compare stage of --stage all compares those devices, not [compare] devices: a name there
    of a device imported later (tx2) stopped --stage all --device local before its first stage, which ran through."""
    import argparse

    from perf4sight.cli import build_parser
    from perf4sight.stages import _check_all_arguments

    cfg = load_config(write(tmp_path, GOOD + "\n[compare]\ndevices = ['local', 'tx2']\n"))
    args = build_parser().parse_args(["--stage", "all", "--device", "local"])
    _check_all_arguments(cfg, args)  # nothing to refuse: compare takes --device's local
    with pytest.raises(UserError, match=r"\[compare\] devices: unknown device 'tx2'"):
        _check_all_arguments(cfg, argparse.Namespace(**{**vars(args), "device": None}))


def test_a_name_the_networks_stage_gives_at_an_extra_input_shape_is_taken_before_it_runs(tmp_path):
    """--stage all --network resnet18_l50_48x48 (made by its networks stage at [networks] extra_input_shapes) was
    refused before its first stage as an unknown network, though that stage makes it and the predict stage reads it;
    a shape the config does not give is still refused."""
    from perf4sight.config import checked_network_names

    cfg = load_config(write(tmp_path, GOOD.replace("input_shape = [3, 32, 32]", "input_shape = [3, 32, 32]\n"
                                                   "extra_input_shapes = [[3, 48, 48]]")))
    names = ["resnet18_l50_48x48", "gen_0_1_48x48", "resnet18_l0"]
    assert checked_network_names(cfg, names, "--network", Path) == names
    with pytest.raises(UserError, match=r"^--network: unknown network 'resnet18_l50_64x64'"):
        checked_network_names(cfg, ["resnet18_l50_64x64"], "--network", Path)
