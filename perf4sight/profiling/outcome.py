"""What a device's sweep is expected to write, how it ended, and what its probe found.

Shared by the local runner's path and the SSH path (``fleet.py``, ``remote.py``), and free of paramiko, so that
profiling this machine's own devices needs no SSH library (as on a GPU machine that runs the profile stage itself).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from perf4sight.errors import UserError
from perf4sight.ir.schema import NetworkDescription, load_description_bytes
from perf4sight.ir.shapes import shape_text
from perf4sight.profiling import results

__all__ = ["DeviceSummary", "PROBE", "PROBE_CACHE", "MIN_PYTHON", "probe_facts", "probe_problems", "not_ready",
           "expected_keys",
           "read_descriptions", "read_keys", "covering", "plan_counts"]


@dataclass
class DeviceSummary:
    """How profiling one device ended. ``status``: done | failed | unreachable | login failed."""
    device: str
    status: str
    message: str = ""
    new_rows: int = 0      # rows measured by this invocation (a run it started)
    pulled: int = 0        # rows an earlier invocation's run measured on an SSH device, copied over by this one
    superseded: int = 0    # rows moved to superseded.csv to be measured again (--remeasure)
    remeasure_left: int = 0  # of their configurations, those with no row in the measurements at the end
    rows: int = 0          # plan keys present locally at the end
    expected: int = 0      # plan keys (networks x batch sizes)
    counts: dict[str, int] = field(default_factory=dict)  # status -> rows of this plan
    reconnects: int = 0
    restarts: int = 0
    attached: bool = False  # followed a run an earlier profile had started and left going on the device
    errors_retried: bool = False  # its plan measured the error rows again (--retry-errors), in a run this one started
    elapsed_s: float = 0.0


PROBE = Path(__file__).with_name("probe.py")
PROBE_CACHE = "probe-cache.json"  # in the device's work folder: torch's facts, kept while its install is unchanged
MIN_PYTHON = (3, 6)  # the device's; a Jetson TX2's JetPack 4.6 has 3.6 (see remote.code_files)


def probe_facts(python: str, rc: int, stdout: str, stderr: str) -> dict:
    """The facts ``probe.py`` printed (its last stdout line, JSON); ``UserError`` naming ``python``, its exit
    status and the tail of its output when it printed none (the interpreter is missing or cannot run it): stderr,
    then stdout, where a login shell of ``nologin`` says why ("This account is currently not available.")."""
    try:
        return json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        said = " ".join(f"{stderr or ''} {stdout or ''}".split())
        raise UserError(f"python '{python}' did not run the probe (exit {rc}): {said[-300:]}") from None


def probe_problems(backend: str, facts: dict, workdir: str) -> list[str]:
    """What would stop a run on a device, from ``probe.py``'s ``facts`` (empty: ready); ``workdir`` names
    the work folder in the message."""
    problems = []
    version = tuple(int(p) for p in str(facts.get("python", "0")).split(".")[:2] if p.isdigit())
    if version < MIN_PYTHON:  # its probe looked no further: torch and the rest are unknown
        return [f"python {facts.get('python', '?')} is older than {'.'.join(map(str, MIN_PYTHON))}, "
                "which the runner needs"]
    if not facts.get("torch"):
        problems.append(f"torch not importable ({facts.get('torch_error', '')})")
    if facts.get("backend_library") and not facts.get("backend_library_version"):
        problems.append(f"{facts['backend_library']} not importable ({facts.get('backend_library_error', '')})")
    if facts.get("workdir_error"):
        problems.append(f"work folder {workdir} cannot be created or written ({facts['workdir_error']})")
    if backend in ("nvml", "jetson") and facts.get("torch") and not facts.get("cuda"):
        # a Jetson's too: pip's aarch64 torch is built without CUDA (NVIDIA's wheel has it); every row would be an
        # error, which a plain rerun after the fix does not measure again
        problems.append("torch sees no CUDA device")
    return problems


def not_ready(device: str, backend: str, python: str, rc: int, stdout: str, stderr: str, workdir: str) -> str:
    """The one line that refuses to run ``device`` after its probe (``python``'s exit status ``rc`` and output, the
    run's work folder ``workdir``): that the probe did not run (:func:`probe_facts`), or what stops a run
    (:func:`probe_problems`); empty where the device is ready. The SSH profiler's and the local one's preflight."""
    try:
        facts = probe_facts(python, rc, stdout, stderr)
    except UserError as exc:
        return f"device '{device}': {exc}"
    problems = probe_problems(backend, facts, workdir)
    if not problems:
        return ""
    return (f"device '{device}' is not ready, nothing was run: {'; '.join(problems)} (python '{python}'; see --stage "
            "check)")


def read_descriptions(descriptions: Sequence[Path]) -> list[tuple[Path, bytes, NetworkDescription]]:
    """Each description file as (path, its bytes, the description in them), each read once: the sha of those bytes
    is the one its rows carry, and the SSH profiler ships them, whatever the file holds later. ``UserError`` as
    ``load_description``'s."""
    read = []
    for path in descriptions:
        desc, data = load_description_bytes(path)
        read.append((Path(path), data, desc))
    return read


def expected_keys(device: str, descriptions: Sequence[Path], batch_sizes: Sequence[int],
                  phase: str = "train", loss: str = "cross_entropy") -> set[tuple]:
    """Measurement keys the plan will produce, as ``results.row_key`` spells them (``phase``: its optimiser's,
    ``plan.training_phase``; ``loss``: its loss)."""
    return read_keys(device, read_descriptions(descriptions), batch_sizes, phase, loss)


def read_keys(device: str, read: Sequence[tuple[Path, bytes, NetworkDescription]], batch_sizes: Sequence[int],
              phase: str = "train", loss: str = "cross_entropy") -> set[tuple]:
    """:func:`expected_keys` of descriptions already read (:func:`read_descriptions`)."""
    keys = set()
    for _, data, desc in read:
        shape, sha = shape_text(desc.input_shape), results.file_sha(data)
        keys |= {results.row_key({"device": device, "network": desc.name, "batch_size": bs, "input_shape": shape,
                                  "phase": phase, "loss": loss,
                                  "description_sha": sha}) for bs in batch_sizes}
    return keys


def covering(keys: set[tuple]) -> set[tuple]:
    """The row keys that cover plan ``keys``: each as it is and with an empty description sha (a row of an
    older CSV, which the runner takes as measured)."""
    return keys | {key[:-1] + ("",) for key in keys}


def plan_counts(csv_path: Path, covered: set[tuple]) -> tuple[int, dict[str, int]]:
    """(rows of the CSV that ``covered`` (:func:`covering`) holds, their count per status)."""
    rows = [r for r in results.latest_rows(results.read_rows(csv_path)) if results.row_key(r) in covered]
    return len(rows), {st: sum(r["status"] == st for r in rows) for st in results.STATUSES}
