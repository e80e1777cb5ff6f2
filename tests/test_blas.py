"""The OpenBLAS kernels are named before numpy loads, so a fit gives the same fingerprint on every x86-64 host."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from perf4sight.blas import X86_KERNELS, pin_openblas_kernels

ROOT = Path(__file__).resolve().parents[1]


def test_pin_sets_the_kernels_on_x86_and_keeps_a_value_the_user_set():
    env: dict[str, str] = {}
    assert pin_openblas_kernels(env, "x86_64") == X86_KERNELS
    assert env == {"OPENBLAS_CORETYPE": X86_KERNELS}
    mine = {"OPENBLAS_CORETYPE": "SkylakeX"}
    assert pin_openblas_kernels(mine, "AMD64") == "SkylakeX"
    assert mine == {"OPENBLAS_CORETYPE": "SkylakeX"}


def test_pin_leaves_other_architectures_to_openblas():
    env: dict[str, str] = {}
    assert pin_openblas_kernels(env, "aarch64") is None
    assert env == {}


def _loaded_kernels(code: str) -> list[str]:
    """The architecture every OpenBLAS that numpy and scipy load reports (threadpoolctl), in a fresh process."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    probe = code + ("\nimport json, numpy, scipy.linalg\nfrom threadpoolctl import threadpool_info\n"
                    "print(json.dumps([i.get('architecture') for i in threadpool_info()"
                    " if i.get('internal_api') == 'openblas']))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="the kernels are named on x86-64")
def test_the_kernels_reach_the_openblas_numpy_and_scipy_load():
    """OpenBLAS itself reports the kernels it took: the pin alone, and main.main (the CLI), which pins before
    anything it runs imports numpy (here a stage that stops at once: its config does not exist)."""
    assert set(_loaded_kernels("from perf4sight.blas import pin_openblas_kernels\npin_openblas_kernels()")) == {
        X86_KERNELS}
    cli = "import main\nassert main.main(['--config', 'no-such.toml', '--stage', 'fingerprint']) == 2"
    assert set(_loaded_kernels(cli)) == {X86_KERNELS}


def test_numpys_targets_above_avx2_are_turned_off_where_numpy_names_them_so():
    from perf4sight.blas import NUMPY_ABOVE_AVX2, pin_numpy_dispatch

    env: dict[str, str] = {}
    assert pin_numpy_dispatch(env, "x86_64", "2.4.6") == NUMPY_ABOVE_AVX2 and env == {
        "NPY_DISABLE_CPU_FEATURES": NUMPY_ABOVE_AVX2}
    mine = {"NPY_DISABLE_CPU_FEATURES": "AVX512_SPR"}
    assert pin_numpy_dispatch(mine, "x86_64", "2.4.6") == "AVX512_SPR"  # the user's own choice is kept
    for machine, version in (("x86_64", "2.3.5"), ("aarch64", "2.4.6")):  # older names, other targets: left
        env = {}
        assert pin_numpy_dispatch(env, machine, version) is None and env == {}
    chosen = {"NPY_ENABLE_CPU_FEATURES": "X86_V3 X86_V4"}  # numpy refuses to load with both variables set
    assert pin_numpy_dispatch(chosen, "x86_64", "2.4.6") is None and chosen == {
        "NPY_ENABLE_CPU_FEATURES": "X86_V3 X86_V4"}


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="the targets are named on x86-64")
def test_the_cli_runs_numpy_on_avx2_loops_and_passes_no_variable_on():
    """On an AVX-512 host the same rows gave other held-out figures (numpy's AVX-512 loops round otherwise): the CLI
    turns those targets off before numpy loads, and leaves the variable out of what its child processes inherit."""
    code = ("import json, os, main\nassert main.main(['--config', 'no-such.toml', '--stage', 'fingerprint']) == 2\n"
            "from perf4sight.blas import numpy_targets\n"
            "print(json.dumps([numpy_targets(), os.environ.get('NPY_DISABLE_CPU_FEATURES')]))")
    env = {k: v for k, v in os.environ.items() if k != "NPY_DISABLE_CPU_FEATURES"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True,
                         timeout=120)
    targets, inherited = json.loads(out.stdout.strip().splitlines()[-1])
    assert inherited is None and "X86_V4" not in targets.split() and "AVX512_ICL" not in targets.split()
