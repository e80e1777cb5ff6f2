"""Shared fixtures: the project root on sys.path, the shared TX2 data location, tiny networks."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: The real Jetson TX2 measurements; override with PERF4SIGHT_TX2_DATA.
TX2_DATA = Path(os.environ.get("PERF4SIGHT_TX2_DATA", ROOT.parent / "shared" / "data" / "tx2-perf4sight"))


@pytest.fixture
def tx2_data() -> Path:
    """The shared TX2 folder, or a skip saying where it was looked for."""
    if not (TX2_DATA / "graphs").is_dir():
        pytest.skip(f"shared TX2 data not found at {TX2_DATA} (set PERF4SIGHT_TX2_DATA)")
    return TX2_DATA


@pytest.fixture(scope="session", autouse=True)
def quiet_load():
    """Every runner a test starts (here or over SSH) records a load average of 0, whatever the load of the machine
    that runs the tests (a 2-core host shared with other work reads 4 and more): no stage's notes depend on it. Set
    for the session, before any module's fixture measures; a test of the load note sets ``PERF4SIGHT_LOAD_AVG``
    itself (``monkeypatch.setenv``)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PERF4SIGHT_LOAD_AVG", "0")
        yield


#: the variables ``perf4sight.blas.pin_kernels`` sets for the processes a command line starts
_KERNEL_PINS = ("OPENBLAS_CORETYPE", "NPY_DISABLE_CPU_FEATURES")


@pytest.fixture(autouse=True)
def kernel_pins_kept_to_their_test():
    """A test that runs ``cli.main`` in this process pins OpenBLAS's kernels in ``os.environ``, for the processes it
    starts; left there, every process a later test of this worker starts loaded other kernels than this process's
    numpy (loaded unpinned), and a figure compared across the two differed in the last bits
    (test_gnn's stored GNN predicted without torch, after test_config's init). Put back after each test."""
    before = {name: os.environ.get(name) for name in _KERNEL_PINS}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    """torch computes in the tests' own processes on one thread (the processes the tests start keep their settings:
    a measuring child's threads are its plan's). torch's default is a thread per core: two on a 2-core machine, where
    ``-n 2`` runs two workers, so each worker's second thread waits for a core, and OpenMP's threads spin while they
    wait (a Swin's forward and training step in this process took 4-5 times the CPU at two threads than at one, for
    the same results). Set before each test and its fixtures, as a test may change it (``measure_prices`` sets its
    own), and torch may be imported late."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


#: The test files that take longest (seconds of one worker of ``./dev.sh test`` on a 2-core machine, 2026-11-30,
#: the sum of each file's phases, ``--durations=0``): they go first, the longest first, so that the two workers of
#: ``-n 2 --dist loadfile`` end together. xdist's own order (files with the most tests first) left
#: test_end_to_end.py (3 tests, 77 s) for last: one worker ran it alone for about a minute while the other had
#: finished. A file not named here follows them, in collection order.
LONGEST_FILES = {"test_profiling.py": 106, "test_remote_reruns.py": 99, "test_profiling_signals.py": 86,
                 "test_remote.py": 66, "test_end_to_end.py": 59, "test_optimizers.py": 59, "test_allocator.py": 52,
                 "test_fingerprint.py": 44, "test_profile_stage_notes.py": 38, "test_ir.py": 36, "test_report.py": 34,
                 "test_networks.py": 34, "test_remote_setup.py": 28, "test_packaging.py": 25,
                 "test_perfseer_round_trip.py": 20, "test_backends_gpu.py": 19, "test_losses.py": 19,
                 "test_networks_stage.py": 18, "test_config.py": 15, "test_networks_rerun.py": 15,
                 "test_input_shape.py": 13, "test_features.py": 13}


def pytest_configure(config) -> None:
    """Keep the files in the order :func:`pytest_collection_modifyitems` gives them under pytest-xdist (whose
    default reorders them by their number of tests). Ctrl-C raises KeyboardInterrupt here and in the processes the
    tests start, as in a terminal, though the suite itself was started in the background by a shell without job
    control (``./dev.sh test &`` in a script), which ignores SIGINT in it and in every process it starts: the tests
    of Ctrl-C then failed."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items) -> None:
    """The files of :data:`LONGEST_FILES` first, longest first; each file's tests in their own order."""
    def seconds(item) -> int:
        return LONGEST_FILES.get(item.path.name, 0)
    items.sort(key=lambda item: -seconds(item))


def _cli_in_this_process(folder: Path, *args: str) -> int:
    """``python main.py ARGS`` run in this process in ``folder`` (``perf4sight.cli.main``): its exit code. This
    process's folder, environment and SIGTERM handler (which the command line sets) are put back after it."""
    from perf4sight import cli

    cwd, environ, sigterm = os.getcwd(), dict(os.environ), signal.getsignal(signal.SIGTERM)
    os.chdir(folder)
    try:
        return cli.main(list(args), prog="main.py")
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(environ)
        signal.signal(signal.SIGTERM, sigterm)


@pytest.fixture(scope="session")
def cli_in_process():
    """``cli_in_process(folder, *args)``: the command line run in this process, its exit code (its output is the
    test's). For a stage that imports torch (seconds a fresh process) where the process boundary is not what a test
    checks; a module's fixture can take it."""
    return _cli_in_this_process


@pytest.fixture
def cli_here(capsys):
    """``cli_here(folder, *args)``: :func:`cli_in_process` with its ``returncode``, ``stdout`` and ``stderr``, as
    ``subprocess.run`` gives them."""
    from types import SimpleNamespace

    def run(folder: Path, *args: str) -> SimpleNamespace:
        capsys.readouterr()
        code = _cli_in_this_process(folder, *args)
        out, err = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)

    return run
