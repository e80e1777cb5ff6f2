"""The nvml and jetson backends, run by the real runner in fresh children on a simulated GPU.

``tests/fakes`` holds simulated ``pynvml`` and ``jtop`` modules (the real libraries' names and
exceptions) and ``cuda_sim`` (torch.cuda on the host, with the real CUDA OOM exception); its
``sitecustomize`` switches the simulation on in child processes when ``P4S_SIM_CUDA_MB`` is set.
The backend code that runs is the code that ships.
"""
from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from perf4sight.ir.from_torch import describe
from perf4sight.ir.schema import save_description
from perf4sight.profiling import results
from perf4sight.profiling.backends.jetson import JetsonBackend, _gpu_load, meminfo_used_mb
from perf4sight.profiling.backends.nvml import NvmlBackend
from perf4sight.profiling.backends.sampling import Sampler
from perf4sight.profiling.plan import TestPlan, save_plan
from perf4sight.profiling.runner import run_plan

FAKES = Path(__file__).parent / "fakes"


def _plan(tmp: Path, backend: str, batch_sizes: list[int]) -> Path:
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                        nn.Flatten(), nn.Linear(4, 10))
    save_description(describe(net, [3, 16, 16], name="tiny", network="tiny"), tmp / "tiny.json")
    return save_plan(TestPlan(device="gpu", backend=backend, networks=["tiny.json"], batch_sizes=batch_sizes,
                              warmup_steps=1, timed_steps=2, timeout_s=120), tmp / "plan.json")


@pytest.fixture
def simulated_gpu(monkeypatch):
    """Children see an 8 MiB simulated GPU plus the fake pynvml and jtop, and run torch on one thread (the simulated
    GPU's kernels are the host's: on a 2-core host running the suite's other worker, the three tests that measure
    spent 22 s of CPU at two threads, 19.5 s at one; the plans' threads stay unset, as a GPU device's are)."""
    monkeypatch.setenv("PYTHONPATH", str(FAKES))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("P4S_SIM_CUDA_MB", "8")
    monkeypatch.delenv("P4S_FAKE_JTOP", raising=False)
    monkeypatch.delenv("P4S_FAKE_NVML_CRASH", raising=False)
    return monkeypatch


def _run(plan: Path) -> list[dict]:
    run_plan(plan, emit=lambda e: None)
    return results.read_rows(plan.parent / "measurements.csv")


def test_nvml_sweep_measures_then_stops_at_first_cuda_oom(simulated_gpu, tmp_path):
    rows = _run(_plan(tmp_path, "nvml", [1, 64, 2048, 4096]))
    assert [r["status"] for r in rows] == ["ok", "ok", "oom", "skipped_after_oom"]
    small, big, oom = rows[0], rows[1], rows[2]
    for r in (small, big):
        assert r["protocol"] == "cuda_events" and float(r["latency_ms_median"]) > 0
        assert 0 < float(r["update_ms_median"]) < float(r["latency_ms_median"])  # between two events in the step
        assert 0 < float(r["torch_alloc_peak_mb"]) <= float(r["torch_reserved_peak_mb"])
        # NVML's figure includes the 300 MiB context of the fake driver plus what the allocator reserved
        assert float(r["device_mem_used_mb"]) == pytest.approx(300 + float(r["torch_reserved_peak_mb"]), abs=0.01)
        assert float(r["gpu_util_pct"]) == 87 and float(r["power_w"]) == 250  # milliwatts converted
        assert r["device_model"] == "NVIDIA Simulated RTX" and r["clocks"] == "sm 1695MHz mem 9751MHz"
    assert float(big["torch_alloc_peak_mb"]) > 10 * float(small["torch_alloc_peak_mb"])
    assert oom["message"].startswith("OutOfMemoryError: CUDA out of memory") and oom["latency_ms_median"] == ""


def test_jetson_reads_jtop_when_active_and_says_so_when_not(simulated_gpu, tmp_path):
    (tmp_path / "on").mkdir()
    (tmp_path / "off").mkdir()
    on = _run(_plan(tmp_path / "on", "jetson", [2]))[0]
    simulated_gpu.setenv("P4S_FAKE_JTOP", "inactive")
    off = _run(_plan(tmp_path / "off", "jetson", [2]))[0]
    for r in (on, off):
        assert r["status"] == "ok" and r["protocol"] == "cuda_events"
        assert float(r["torch_alloc_peak_mb"]) > 0
        # host memory is the simulated GPU's unified memory: others' processes freeing theirs can leave it below zero
        assert float(r["device_mem_used_mb"] or 0) > 0 or "below its reading before the step" in r["message"]
    assert float(on["gpu_util_pct"]) == 76.5 and float(on["power_w"]) == 11.4
    assert on["clocks"].startswith("nvpmodel MAXN, jetson_clocks on") and "jtop RAM peak" in on["message"]
    assert off["gpu_util_pct"] == "" and off["power_w"] == ""
    assert "jtop service not active" in off["message"] and "systemctl restart jtop.service" in off["message"]


def test_crashing_child_and_missing_library_are_error_rows(simulated_gpu, tmp_path):
    simulated_gpu.setenv("P4S_FAKE_NVML_CRASH", "1")
    crashed = _run(_plan(tmp_path, "nvml", [1]))[0]
    assert crashed["status"] == "error" and "SIGSEGV" in crashed["message"]
    simulated_gpu.delenv("PYTHONPATH")  # no pynvml at all
    (tmp_path / "bare").mkdir()
    missing = _run(_plan(tmp_path / "bare", "nvml", [1, 2]))
    assert [r["status"] for r in missing] == ["error", "error"]
    assert "needs pynvml" in missing[0]["message"] and "not run" in missing[1]["message"]


# --- in-process pieces (no simulated GPU needed) -------------------------------------------------
def test_cuda_oom_is_oom_and_other_errors_are_not():
    plan = TestPlan(device="g", backend="nvml")
    for backend in (NvmlBackend(plan), JetsonBackend(plan)):
        assert backend.is_oom(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB"))
        assert backend.is_oom(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"))
        assert not backend.is_oom(RuntimeError("CUDA error: an illegal memory access was encountered"))


def test_sampler_peak_mean_and_failures():
    values = iter([1.0, 5.0, None, 3.0] + [2.0] * 1000)

    def read():
        v = next(values)
        if v is None:
            raise OSError("sensor gone")
        return {"m": v, "p": v * 10}

    s = Sampler(read, interval_s=0.001).start()
    s.stop()
    assert s.peak("m") == 5.0 and s.failures == 1 and "sensor gone" in s.error
    assert s.mean("missing") == "" and 20 <= s.mean("p") <= 50


def test_unified_memory_below_its_reading_before_the_step_is_no_figure():
    """Other processes freeing memory during a step can leave the Jetson's unified memory in use below its reading
    before the step: '-23.6' was written, which the measurements' reader refuses (a figure is >= 0), and the
    device's next run reads that file first. Now the cell is empty and the message says why."""
    backend = JetsonBackend(TestPlan(device="j", backend="jetson"))
    sampler = Sampler(lambda: {"unified_mb": -23.6})
    sampler.samples = [{"unified_mb": -30.0}, {"unified_mb": -23.6}]
    cols = backend.sampled_columns(sampler)
    assert cols["device_mem_used_mb"] == "" and "peaked 23.6 MiB below its reading before the step" in cols["message"]
    sampler.samples = [{"unified_mb": -3.0}, {"unified_mb": 1500.0}]
    assert backend.sampled_columns(sampler)["device_mem_used_mb"] == 1500.0


def test_meminfo_used_is_total_minus_free_buffers_cached(tmp_path):
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:        8039920 kB\nMemFree:         4000000 kB\nMemAvailable:    6000000 kB\n"
                 "Buffers:          100000 kB\nCached:          1400000 kB\nSwapCached:            0 kB\n")
    assert meminfo_used_mb(str(f)) == pytest.approx((8039920 - 4000000 - 100000 - 1400000) / 1024)


def test_gpu_load_falls_back_to_stats():
    assert _gpu_load(types.SimpleNamespace(gpu={"gpu": {"status": {"load": 12.5}}}, stats={})) == 12.5
    assert _gpu_load(types.SimpleNamespace(gpu={}, stats={"GPU": 40})) == 40.0
    assert _gpu_load(types.SimpleNamespace(gpu={}, stats={"GPU": "OFF"})) is None


def test_cuda_oom_without_torch_cuda_out_of_memory_error(monkeypatch):
    """torch before 1.13 (a Jetson TX2's JetPack 4.6 wheels go up to 1.10) has no ``torch.cuda.OutOfMemoryError``:
    its CUDA OOM is a ``RuntimeError`` saying "CUDA out of memory". ``is_oom`` asked for that class and raised
    ``AttributeError`` inside the child's handler, so every failing step there, an OOM included, ended the child
    without a result: an ``error`` row, and the batch ladder went on past the first OOM."""
    monkeypatch.delattr(torch.cuda, "OutOfMemoryError")
    plan = TestPlan(device="g", backend="jetson")
    for backend in (NvmlBackend(plan), JetsonBackend(plan)):
        assert backend.is_oom(RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 7.67 GiB "
                                           "total capacity; 5.29 GiB already allocated)"))
        assert backend.is_oom(RuntimeError("NvMapMemAllocInternalTagged: 1075072515 error 12"))
        assert not backend.is_oom(RuntimeError("CUDA error: an illegal memory access was encountered"))
        assert not backend.is_oom(ValueError("bad shape"))


def test_jtop_figures_that_fail_cost_no_unified_memory_figure():
    """The jetson backend read /proc/meminfo and jtop's figures as one reading: where jtop could not give one (a
    jetson-stats 3.x, whose client has ``ram``, not ``memory``, and a ``power`` tuple; its service gone mid-step),
    the whole reading failed, and every row lost its memory figure (``device_mem_used_mb``, the fingerprint's
    target). Now each jtop figure fails alone, and the message counts them."""
    backend = JetsonBackend(TestPlan(device="j", backend="jetson"))
    backend.baseline_mb = 0.0  # the host's memory in use is the figure: above 0

    class Jtop3:  # jetson-stats 3.x's client, as far as the backend reads it
        power = ({"cur": 5000, "avg": 4000}, {})
        gpu = {"val": 40, "frq": 1300}
        stats = {"GPU": 40}

    backend.jetson = Jtop3()
    sampler = Sampler(backend.read_device, interval_s=0.001).start()
    sampler.stop()
    cols = backend.sampled_columns(sampler)
    assert sampler.failures == 0 and cols["device_mem_used_mb"] > 0
    assert cols["gpu_util_pct"] == 40.0 and cols["power_w"] == ""
    assert f"{backend.jtop_failures} jtop readings failed: AttributeError" in cols["message"]
    assert backend.jtop_failures == len(sampler.samples) >= 2


@pytest.fixture
def fake_pynvml(monkeypatch):
    """The simulated pynvml of ``tests/fakes``, imported in this process, with four GPUs."""
    spec = importlib.util.spec_from_file_location("pynvml", FAKES / "pynvml.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.GPUS = 4
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return module


def test_nvml_reads_the_gpu_cuda_steps_on_under_cuda_visible_devices(fake_pynvml, monkeypatch):
    """NVML numbers every GPU of the machine whatever CUDA_VISIBLE_DEVICES says: on a shared server with
    CUDA_VISIBLE_DEVICES=2 (set in the device account's ~/.bashrc, which the runner's login shell reads) the steps
    ran on the third GPU while NVML's handle was of the first, so device_mem_used_mb, the nvml fingerprint's memory
    target, GPU load and power were another GPU's. The handle is now of the GPU CUDA's index names."""
    from perf4sight.profiling.backends.cuda import CudaBackend

    monkeypatch.setattr(CudaBackend, "prepare", lambda self: None)  # no CUDA here: NVML's side alone

    def handle_of(gpu_index: int, visible: str | None) -> int:
        if visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        backend = NvmlBackend(TestPlan(device="g", backend="nvml", gpu_index=gpu_index))
        backend.prepare()
        return backend.handle.index

    assert handle_of(1, None) == 1  # no CUDA_VISIBLE_DEVICES: CUDA's index is NVML's
    assert handle_of(0, "2") == 2
    assert handle_of(1, "3, 1") == 1 and handle_of(0, "3,1") == 3
    assert handle_of(0, fake_pynvml._uuid(3)) == 3  # a UUID, as nvidia-smi -L prints it
    assert handle_of(0, fake_pynvml._uuid(2)[:12]) == 2  # the start of one, as CUDA takes it
    with pytest.raises(RuntimeError, match="CUDA_VISIBLE_DEVICES entry 'GPU-'.*4 GPU UUID"):
        handle_of(0, "GPU-")  # every UUID starts so: no one GPU


class _FakeLibcuda:
    """The CUDA driver library's three calls the nvml backend makes through ctypes, as ``ctypes.CDLL`` gives them:
    return codes (0 = CUDA_SUCCESS), results written through the pointers passed."""

    def __init__(self, bus_of_ordinal: dict[int, str]) -> None:
        self.bus_of_ordinal = bus_of_ordinal

    def cuInit(self, flags) -> int:
        return 0

    def cuDeviceGet(self, device_ref, ordinal) -> int:
        if ordinal not in self.bus_of_ordinal:
            return 101  # CUDA_ERROR_INVALID_DEVICE
        device_ref._obj.value = ordinal
        return 0

    def cuDeviceGetPCIBusId(self, buffer, length, device) -> int:
        buffer.value = self.bus_of_ordinal[device.value].encode()
        return 0


def test_nvml_reads_the_gpu_torch_runs_on_whatever_cuda_numbers_it(fake_pynvml, monkeypatch):
    """CUDA numbers GPUs fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID; NVML numbers them in PCI bus order. The
    backend set PCI_BUS_ID only where the variable was unset, so with CUDA_DEVICE_ORDER=FASTEST_FIRST (exported to
    pick the fast GPU of a mixed machine) CUDA's GPU 0 was NVML's third while NVML's handle was of its first: the
    memory, load and power of another GPU. The handle is now the GPU at the PCI address CUDA gives its index (torch's
    device properties, else the CUDA driver's cuDeviceGetPCIBusId for an older torch), and where neither tells, a
    CUDA order other than NVML's on a machine of several GPUs is refused in one line."""
    import ctypes

    from perf4sight.profiling.backends.cuda import CudaBackend

    monkeypatch.setattr(CudaBackend, "prepare", lambda self: None)  # no CUDA here: torch's properties stand in
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    newer = types.SimpleNamespace(name="fast", total_memory=1, pci_domain_id=0, pci_bus_id=0x12, pci_device_id=0)
    older = types.SimpleNamespace(name="fast", total_memory=1)  # torch 1.10's: no PCI fields
    props = {"value": newer}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props["value"])

    def handle() -> int:
        backend = NvmlBackend(TestPlan(device="g", backend="nvml", gpu_index=0))
        backend.prepare()
        return backend.handle.index

    assert handle() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", fake_pynvml._uuid(1))  # a UUID names the GPU (a MIG one, its instance)
    assert handle() == 1
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    props["value"] = older
    monkeypatch.setattr(ctypes, "CDLL", lambda name: _FakeLibcuda({0: "0000:13:00.0"}))
    assert handle() == 3

    def no_driver(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", no_driver)
    with pytest.raises(RuntimeError, match="CUDA_DEVICE_ORDER=FASTEST_FIRST numbers .* unset it or set PCI_BUS_ID"):
        handle()
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # then CUDA's numbers are NVML's
    assert handle() == 0
    fake_pynvml.GPUS = 1  # one GPU: no other to read
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    assert handle() == 0


def test_a_jtop_service_that_does_not_answer_costs_its_figures_not_the_measurement(monkeypatch):
    """jtop is optional, but the backend caught its JtopException alone: a service that takes the connection and
    never answers (the real client's start() then raises queue.Empty from its configuration request), or an error
    its reader thread kept and ok() raises, ended the child's setup, and as every child met it, no network of the
    device was measured. Now any failure of the client is the note's, as an inactive service's is."""
    from perf4sight.profiling.backends.cuda import CudaBackend

    spec = importlib.util.spec_from_file_location("jtop", FAKES / "jtop" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "jtop", module)
    monkeypatch.setattr(CudaBackend, "prepare", lambda self: None)  # no CUDA here: jtop's side alone
    monkeypatch.setenv("P4S_FAKE_JTOP", "stuck")
    backend = JetsonBackend(TestPlan(device="j", backend="jetson"))
    backend.prepare()
    assert backend.jetson is None and backend.baseline_mb > 0
    assert backend.jtop_note == "jtop service not active (Empty): RAM, GPU load and power not measured"


def test_a_jetson_whose_torch_sees_no_cuda_runs_nothing():
    """The probe before a run refused an nvml device whose torch sees no CUDA, but let a jetson one run: with pip's
    torch for aarch64 (built without CUDA; NVIDIA's wheel has it) every child failed its setup and the CSV filled
    with error rows, which a plain rerun after installing the right torch does not measure again. A jetson device
    is now refused as the nvml one is, and measures nothing."""
    from perf4sight.profiling.outcome import probe_problems

    facts = {"python": "3.6.9", "torch": "1.10.0", "cuda": False, "backend_library": "jtop",
             "backend_library_version": "4.2.12"}
    assert probe_problems("jetson", facts, "w") == ["torch sees no CUDA device"]
    assert probe_problems("jetson", {**facts, "cuda": True}, "w") == []
    assert probe_problems("cpu", {**facts, "backend_library": ""}, "w") == []


def test_a_jetsons_probe_asks_torch_again_where_its_cache_says_no_cuda(tmp_path):
    """With a jetson device refused where torch sees no CUDA, the probe's cache of torch's facts (kept while torch's
    install is unchanged) must not keep a 'no CUDA' that no reinstall undoes (the device's user added to the video
    group, a driver loaded since): a jetson's probe imports torch again then; a cached 'CUDA seen' is read as before.
    A stand-in torch package counts its imports; the real probe script runs in real processes."""
    import json
    import os
    import subprocess

    from perf4sight.profiling.outcome import PROBE
    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    imports, seen = tmp_path / "imports.txt", tmp_path / "cuda-seen"
    (fake / "__init__.py").write_text(
        f"import os\nwith open({str(imports)!r}, 'a') as fh:\n    fh.write('imported\\n')\n__version__ = '1.10.0'\n"
        f"class cuda:\n    @staticmethod\n    def is_available():\n        return os.path.exists({str(seen)!r})\n")
    (fake / "version.py").write_text("__version__ = '1.10.0'\n")
    cache = tmp_path / "work" / "probe-cache.json"
    cache.parent.mkdir()

    def probe(backend: str) -> tuple:
        out = subprocess.run([sys.executable, str(PROBE), backend, str(cache.parent), str(cache)], capture_output=True,
                             text=True, check=True, env={**os.environ, "PYTHONPATH": str(tmp_path / "site")})
        facts = json.loads(out.stdout.strip().splitlines()[-1])
        return facts["cuda"], len(imports.read_text().splitlines())

    assert probe("jetson") == (False, 1)
    seen.touch()  # CUDA usable now, torch's install unchanged
    assert probe("jetson") == (True, 2)  # it read 'no CUDA' from its cache and stayed refused
    assert probe("jetson") == (True, 2) and probe("cpu") == (True, 2)  # a cached 'CUDA seen' is read
