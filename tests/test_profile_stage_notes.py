"""The profile stage as a user meets it on this machine's cpu device: its notes said once per run, the rows it counts
as new, the drift reference's load, and ``--remeasure``. Real runners and real measuring children (about 3 s each):
one tiny network, batch sizes 1 and 2."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from perf4sight.config import load_config
from perf4sight.networks.build import write_manifest
from perf4sight.profiling.runner import LOAD_ENV

sys.path.insert(0, str(Path(__file__).parent))
from test_profiling import write_config, write_net  # noqa: E402


def _project(folder: Path, names=("tiny",), batch_sizes=(1, 2), extra: str = "") -> Path:
    """A config of the cpu device ``local`` and a manifest of tiny networks ``names``; the config's path."""
    for i, name in enumerate(names):
        write_net(folder / "models" / "nets", name, width=8 + 4 * i)
    write_manifest([{"network": n, "family": n, "path": f"nets/{n}.json"} for n in names],
                   folder / "models" / "manifest.csv")
    path = write_config(folder, batch_sizes=batch_sizes)
    if extra:
        path.write_text(path.read_text().replace("[devices.local]", extra + "\n[devices.local]"))
    return path


def _args(**given) -> argparse.Namespace:
    return argparse.Namespace(**{"device": ["local"], "retry_errors": False, "batch_size": None, "network": None,
                                 "predictor": "trees", "refit": False, **given})


def test_stage_all_says_the_busy_host_notes_once_and_the_drift_references_load_too(tmp_path, monkeypatch, capsys):
    """``--stage all`` on a busy host said the load note twice, once by its profile stage and again by its
    fingerprint stage, of the same rows; it is said once, by the profile stage, saying the fingerprint fits them.
    The drift reference's measurements record the load as the rows do, and nothing read it: one note says how many
    were taken under load and what that does to the correction (said once too). The fingerprint stage run alone
    says both."""
    from perf4sight import stages

    refs = "reference_every = 4"  # a reference before the first of the four measurements and after the last
    cfg = load_config(_project(tmp_path, names=("tiny", "wide"), extra=refs))  # a fit takes two networks
    monkeypatch.setenv(LOAD_ENV, "1000")
    monkeypatch.setattr(stages, "STAGE_ORDER", ("profile", "fingerprint"))  # the stages that read the rows
    assert stages.run("all", cfg, _args()) == 0
    out = capsys.readouterr()
    notes = [line for line in out.err.splitlines() if "load average" in line]
    assert len(notes) == 2, notes
    assert notes[0].startswith("note: local: 4 of 4 ok rows were measured while its 1-minute load average was above ")
    assert "and the fingerprint fits them" in notes[0]
    refs_csv = tmp_path / "profiling_csvs" / "local" / "references.csv"
    assert notes[1] == (f"note: local: 2 of 2 drift reference measurements in {refs_csv} were taken while its "
                        "1-minute load average was more than half a CPU above its CPU count (up to 1000, column "
                        "load_avg_1m): the drift correction takes that slowdown for drift and scales the rows "
                        "measured near them by it, rightly where they shared the load, wrongly where it came and "
                        "went between measurements; profile again while the device is quiet to be sure")
    assert "step times corrected for drift by the reference tiny @ 1 (2 measurements" in out.out
    assert stages.run("fingerprint", cfg, _args(refit=True)) == 0
    assert len([line for line in capsys.readouterr().err.splitlines() if "load average" in line]) == 2
