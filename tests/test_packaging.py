"""The package installs with pip, and its installed copy runs the pipeline as ``main.py`` does.

pip builds a wheel of a copy of the project (so no build folder lands in the working tree) and installs it, without
its dependencies (they are this environment's), into a folder of its own; every command then runs from another
folder, with that folder alone on ``PYTHONPATH``, so the working tree's modules cannot stand in for files the
package forgot to ship (the runner and probe the profile and check stages start as their own processes).
"""
from __future__ import annotations

import csv
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from perf4sight import __version__

ROOT = Path(__file__).resolve().parents[1]

CONFIG = """
[networks]
zoo = []
factories = ["{factory}:tiny_vgg"]
input_shape = [3, 32, 32]
num_classes = 10

[networks.pruning]
levels = [0]

[profile]
batch_sizes = [2]
warmup_steps = 1
timed_steps = 1

[devices.here]
backend = "cpu"
threads = 1
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The folder the package was installed into (``bin/perf4sight`` and ``perf4sight/``)."""
    if importlib.util.find_spec("setuptools") is None:  # torch requires it, so the pinned environment has it
        pytest.skip("setuptools is not installed in this environment: pip cannot build the package here")
    work = tmp_path_factory.mktemp("packaging")
    source = work / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "perf4sight", source / "perf4sight", ignore=shutil.ignore_patterns("__pycache__"))
    target = work / "installed"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                           "--no-index", "--disable-pip-version-check", "--target", str(target), str(source)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return target


def _run(installed: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(installed)
    return subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_installed_copy_is_what_runs(installed, tmp_path):
    done = _run(installed, tmp_path, sys.executable, "-c", "import perf4sight; print(perf4sight.__file__)")
    assert Path(done.stdout.strip()).resolve() == (installed / "perf4sight" / "__init__.py").resolve(), done.stderr
    shipped = {p.relative_to(installed / "perf4sight").as_posix() for p in (installed / "perf4sight").rglob("*.py")}
    in_tree = {p.relative_to(ROOT / "perf4sight").as_posix() for p in (ROOT / "perf4sight").rglob("*.py")}
    assert shipped == in_tree


def test_the_command_and_python_m_read_the_same_command_line(installed, tmp_path):
    """``perf4sight`` and ``python -m perf4sight`` are the command line; ``--stage init`` writes the default config
    (a file the package ships), which then runs."""
    command = installed / "bin" / "perf4sight"
    helped = _run(installed, tmp_path, str(command), "--help")
    assert helped.returncode == 0 and helped.stdout.startswith("usage: perf4sight "), helped.stderr
    assert "--prune-to-fit" in helped.stdout and "stages (run in this order by --stage all)" in helped.stdout
    version = _run(installed, tmp_path, str(command), "--version")  # the package's version, as pip recorded it
    assert version.returncode == 0 and version.stdout == f"perf4sight {__version__}\n"
    assert (installed / f"perf4sight-{__version__}.dist-info").is_dir()
    wrong = _run(installed, tmp_path, sys.executable, "-m", "perf4sight", "--stage", "nope")
    assert wrong.returncode == 2 and "invalid choice: 'nope'" in wrong.stderr
    missing = _run(installed, tmp_path, str(command), "--config", "absent.toml", "--stage", "check")
    assert missing.returncode == 2 and missing.stderr.startswith("error: ") and "--stage init" in missing.stderr
    init = _run(installed, tmp_path, str(command), "--stage", "init")  # the default config, from the package
    assert init.returncode == 0 and (tmp_path / "config.toml").read_bytes() == (ROOT / "config.toml").read_bytes()
    checked = _run(installed, tmp_path, str(command), "--stage", "check")
    assert checked.returncode == 0 and "local [cpu] this machine: ok" in checked.stdout, checked.stderr


def test_the_installed_command_makes_profiles_and_checks_a_network(installed, tmp_path):
    """networks, check (the probe, a process of its own) and profile (the runner and its measuring child) from the
    installed copy, in a folder with nothing of the project but a factory file."""
    shutil.copy(ROOT / "models" / "imagenet" / "tiny_nets.py", tmp_path / "tiny_nets.py")
    (tmp_path / "config.toml").write_text(CONFIG.format(factory="tiny_nets.py"))
    command = str(installed / "bin" / "perf4sight")
    for stage in ("networks", "check", "profile"):
        done = _run(installed, tmp_path, command, "--config", "config.toml", "--stage", stage)
        assert done.returncode == 0, f"{stage}: {done.stderr}"
    with open(tmp_path / "profiling_csvs" / "here" / "measurements.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    # one batch size: a measuring child started from the installed copy (each more is seconds of torch's import)
    assert [(r["network"], r["batch_size"], r["status"]) for r in rows] == [("tiny_vgg_l0", "2", "ok")]
    assert all(float(r["latency_ms_median"]) > 0 and float(r["peak_rss_mb"]) > 0 for r in rows)


def test_dev_sh_that_cannot_set_up_its_environment_says_so_in_one_line_and_leaves_no_half_made_one(tmp_path):
    """``./dev.sh`` on a disk with 4 MiB free: creating the environment fails (offline: ensurepip's own wheel), and
    the script ends with one line naming the environment and the free space, and removes what it half made (a
    half-installed torch is gigabytes that the next run would not use)."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(small)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        for name in ("dev.sh", "requirements.txt"):
            shutil.copy(ROOT / name, small / name)
        done = subprocess.run(["bash", str(small / "dev.sh"), "test"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 1
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith(f"perf4sight: could not set up {small / '.venv'} (the error is above); "), last
        assert " GB free there" in last
        assert not (small / ".venv").exists()
    finally:
        subprocess.run(["umount", "-l", str(small)])


def test_dev_sh_whose_update_of_its_environment_failed_sets_it_up_again_whatever_requirements_txt_says(tmp_path):
    """An environment set up for requirements.txt, whose update to another requirements.txt failed (a branch that
    bumps a pin, on a full disk: pip leaves some packages upgraded), is not taken for finished when requirements.txt
    is back to what it was (the branch left): the stamp of the first setup no longer vouches for it. Offline: the
    requirements are pip's --no-index, then a package that no index holds."""
    shutil.copy(ROOT / "dev.sh", tmp_path / "dev.sh")
    requirements = tmp_path / "requirements.txt"

    def dev_sh() -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(tmp_path / "dev.sh"), "run"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)

    requirements.write_text("--no-index\n")
    first = dev_sh()  # set up; then `python main.py`, which this folder does not hold
    assert "setting up" in first.stderr and "can't open file" in first.stderr, first.stderr
    requirements.write_text("--no-index\nno-such-package-perf4sight==0\n")
    failed = dev_sh()
    assert failed.returncode == 1 and "could not set up" in failed.stderr, failed.stderr
    assert (tmp_path / ".venv" / "bin" / "python").exists()  # not made by this run: kept
    requirements.write_text("--no-index\n")
    again = dev_sh()
    assert "setting up" in again.stderr, again.stderr
    assert "can't open file" in again.stderr
