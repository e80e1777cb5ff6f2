"""What a device offers, printed as one JSON line (runs on the device; standard library only).

Sent as ``python -c <this source> BACKEND WORKDIR`` by ``check``: nothing needs to be installed
first. Reports Python and torch versions, CUDA, the backend's library (``pynvml`` for nvml,
``jtop`` and its service for jetson), memory and swap (MiB, from ``/proc/meminfo``: a device
with swap thrashes rather than fails when a step does not fit; see ``max_swap_in_mb``) and free
disk space (MiB) where the work folder is (or would be).

The profile stage's own probe, before every run, passes a third argument: a cache file in the device's work folder.
``import torch`` takes seconds (more on a small device), so its facts (version, CUDA) are kept there with the
identity of the install they came from (this Python, the files torch's package and version are read from: their
sizes and modification times); while that identity holds, a later probe reads them instead of importing torch
again. ``check`` always imports it.

A Python older than the runner needs (3.6) reports its version alone, before this script imports anything newer
(Python 2.7 has no ``importlib.util``): the caller names it as too old.
"""
import json
import platform
import sys

if sys.version_info < (3, 6):
    print(json.dumps({"python": platform.python_version(), "executable": sys.executable}))
    sys.exit(0)

import importlib.util  # noqa: E402 - after the version check above
import os  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402


def _version(module_name):
    try:
        mod = __import__(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure means "not usable"
        return None, "%s: %s" % (type(exc).__name__, exc)
    return str(getattr(mod, "__version__", "") or "present"), ""


def meminfo_mb(path="/proc/meminfo"):
    """{"memory_mb": MemTotal, "swap_mb": SwapTotal} in MiB; {} where unreadable."""
    keys = {"MemTotal": "memory_mb", "SwapTotal": "swap_mb"}
    out = {}
    try:
        with open(path) as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key in keys:
                    out[keys[key]] = round(int(rest.split()[0]) / 1024, 1)
    except (OSError, ValueError, IndexError):
        return {}
    return out


def install_identity(module_name):
    """Where ``module_name`` would be imported from, without importing it: its package files' paths, sizes and
    modification times (None where it is not found): equal identities, the same install."""
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        return None
    files = [spec.origin, os.path.join(os.path.dirname(spec.origin), "version.py")]
    out = []
    for path in files:
        try:
            st = os.stat(path)
        except OSError:
            continue
        out.append([path, st.st_size, st.st_mtime_ns])
    return out


def _torch_facts(cache_path, need_cuda=False):
    """(version, import error, CUDA seen): from ``cache_path`` while torch's install is the one cached there, else by
    importing torch (the cache then rewritten; only a torch that imported is cached). ``need_cuda``: a cached torch
    that saw no CUDA is imported again (a user added to the video group since, a driver loaded since: no
    reinstall tells the cache)."""
    key = [sys.executable, platform.python_version(), install_identity("torch")]
    if cache_path and key[2] is not None:
        try:
            with open(cache_path) as fh:
                cached = json.load(fh)
            if cached.get("key") == key and (cached["cuda"] or not need_cuda):
                return cached["torch"], "", cached["cuda"]
        except (OSError, ValueError, KeyError, AttributeError):
            pass
    version, error = _version("torch")
    cuda = None
    if version:
        import torch
        cuda = bool(torch.cuda.is_available())
        if cache_path and key[2] is not None:
            write_whole(cache_path, json.dumps({"key": key, "torch": version, "cuda": cuda}))
    return version, error, cuda


def write_whole(path, text):
    """Write ``text`` to ``path`` through a temporary file of this writer's own in its folder, then one rename:
    a reader sees the old file or the whole new one, and two probes writing at once (two profile runs on one
    device folder) do not truncate or rename each other's. A folder that cannot be written leaves nothing (the
    probe reports it); returns whether ``path`` was written."""
    folder, name = os.path.split(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=name + ".", suffix=".tmp", dir=folder or ".")
    except OSError:
        return False
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
        return True
    except OSError:
        try:
            os.remove(tmp)
        except OSError:
            pass
        return False


def probe(backend, workdir, cache_path=None):
    """What this device offers ``backend`` (module docstring: memory and free disk in MiB), and whether ``workdir``
    can be made and written in; torch's facts read from ``cache_path`` while its install is unchanged."""
    out = {"python": platform.python_version(), "executable": sys.executable, "machine": platform.machine(),
           "hostname": platform.node()}
    # nvml's check needs CUDA, which a driver or CUDA_VISIBLE_DEVICES can take away without a reinstall: imported
    out["torch"], out["torch_error"], cuda = _torch_facts(cache_path if backend != "nvml" else None,
                                                          need_cuda=backend == "jetson")
    if out["torch"]:
        out["cuda"] = cuda
    lib = {"cpu": None, "nvml": "pynvml", "jetson": "jtop"}.get(backend)
    out["backend_library"] = lib or ""
    if lib:
        out["backend_library_version"], out["backend_library_error"] = _version(lib)
    if backend == "jetson" and out.get("backend_library_version"):
        try:
            from jtop import jtop
            with jtop() as jetson:
                out["jtop_service"] = bool(jetson.ok())
        except Exception as exc:  # noqa: BLE001 - JtopException and socket errors alike
            out["jtop_service"] = False
            out["backend_library_error"] = " ".join(str(exc).split())
    out.update(meminfo_mb())
    path = os.path.expanduser(workdir)
    while path and not os.path.exists(path):
        path = os.path.dirname(path.rstrip("/")) or "/"
    try:
        out["free_disk_mb"] = round(shutil.disk_usage(path or "/").free / 2**20, 1)
    except OSError as exc:
        out["free_disk_mb"], out["disk_error"] = None, str(exc)
    try:  # the profile stage creates the work folder and writes in it: try both
        os.makedirs(os.path.expanduser(workdir), exist_ok=True)
        with tempfile.TemporaryFile(dir=os.path.expanduser(workdir)):
            pass
    except OSError as exc:
        out["workdir_error"] = str(exc.strerror or exc)  # no f-string: an older Python still reports its version
    return out


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1] if len(sys.argv) > 1 else "cpu", sys.argv[2] if len(sys.argv) > 2 else "~",
                           sys.argv[3] if len(sys.argv) > 3 else None)))
