"""The profile stage as a user meets it on this machine's cpu device: its notes said once per run, the rows it counts
as new, the drift reference's load, and ``--remeasure``. Real runners and real measuring children (about 3 s each):
one tiny network, batch sizes 1 and 2."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from perf4sight.config import load_config
from perf4sight.networks.build import write_manifest
from perf4sight.profiling import results
from perf4sight.profiling.runner import LOAD_ENV

sys.path.insert(0, str(Path(__file__).parent))
from test_profiling import ROOT, write_config, write_net  # noqa: E402


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


def _main(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "main.py"), "--config", str(folder / "config.toml"), *args],
                          capture_output=True, text=True, cwd=folder, timeout=600)


def test_remeasure_measures_chosen_rows_again_and_keeps_the_earlier_ones_aside(tmp_path):
    """A user who thinks some ok rows were measured on a busy host could only delete CSV lines by hand to measure
    them again. ``--remeasure NET@BATCH`` moves that row to superseded.csv beside the measurements and measures it
    again; the measurements hold the new row alone, which the fingerprint stage reads. A name the profile does not
    measure, or a batch size it does not, is one line naming it and the device, with the closest names; nothing is
    moved or measured then."""
    from perf4sight.dataset import device_dataset

    config = _project(tmp_path)
    first = _main(tmp_path, "--stage", "profile", "--device", "local")
    assert first.returncode == 0 and "local: done — 2/2 rows (2 new) [ok 2]" in first.stdout, first.stderr[-2000:]
    csv_path = results.results_path(tmp_path / "profiling_csvs", "local")
    before = results.read_rows(csv_path)
    for spec, said in (("tinny", "error: --remeasure tinny: 'tinny' is not one of the 1 network profiled on device "
                                 "'local' (did you mean 'tiny'?)\n"),
                       ("tiny@4", "error: --remeasure tiny@4: batch size 4 is not one of [profile] batch_sizes (1, 2) "
                                  "profiled on device 'local'\n")):
        refused = _main(tmp_path, "--stage", "profile", "--device", "local", "--remeasure", spec)
        assert (refused.returncode, refused.stderr) == (2, said)
    assert results.read_rows(csv_path) == before and not csv_path.with_name("superseded.csv").exists()
    again = _main(tmp_path, "--stage", "profile", "--device", "local", "--remeasure", "tiny@2")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "local: done — 2/2 rows (1 new) [ok 2]" in again.stdout
    assert (f"local: --remeasure: 1 earlier row moved to {csv_path.with_name('superseded.csv')}, measured again "
            "above") in again.stdout
    after = results.read_rows(csv_path)
    assert [r["batch_size"] for r in after] == ["1", "2"] and after[0] == before[0]
    assert after[1]["timestamp"] >= before[1]["timestamp"] and after[1] != before[1]
    assert results.read_rows(csv_path.with_name("superseded.csv")) == [before[1]]
    cfg = load_config(config)
    assert device_dataset(cfg, "local")[2] == after  # what the fingerprint fits: the newest rows alone


def test_a_profile_that_ends_before_it_measures_what_remeasure_moved_says_so(tmp_path, monkeypatch, cli_here):
    """``--remeasure`` moves the rows aside before the run; a profile that then failed said "1 earlier row moved to
    superseded.csv, measured again above" (measured nothing), and an interrupted one named no row moved. Each now says
    how many were moved and not measured again, and that a plain rerun measures them. No row is measured here: the
    rows are written as a profile writes them, and the run fails (or is interrupted) before it measures."""
    from perf4sight.errors import UserError
    from perf4sight.profiling import local

    config = _project(tmp_path)
    csv_path = results.results_path(tmp_path / "profiling_csvs", "local")
    for how, stop in (("failed", UserError("device 'local': the runner stopped")), ("interrupted", KeyboardInterrupt)):
        if csv_path.exists():
            csv_path.unlink()
        for bs in (1, 2):
            results.append_row(csv_path, {"device": "local", "backend": "cpu", "network": "tiny", "batch_size": bs,
                                          "input_shape": "3x32x32", "status": "ok", "latency_ms_median": 2.0,
                                          "timestamp": f"2026-11-30T10:00:0{bs}Z"})

        def stopped(*args, stop=stop, **kwargs):
            raise stop
        monkeypatch.setattr(local, "profile_local", stopped)
        ran = cli_here(tmp_path, "--config", str(config), "--stage", "profile", "--device", "local",
                       "--remeasure", "tiny@2")
        aside = csv_path.with_name("superseded.csv")
        assert [r["batch_size"] for r in results.read_rows(csv_path)] == ["1"]
        if how == "failed":
            assert ran.returncode == 1, ran.stderr
            assert (f"local: --remeasure: 1 earlier row moved to {aside}; 1 configuration of them not measured "
                    "again, as the profile of local did not finish: rerun --stage profile --device local (no "
                    "--remeasure needed) to measure them\n") in ran.stdout
        else:
            assert ran.returncode == 130
            assert ran.stderr.rstrip().endswith("; --remeasure moved 1 earlier row to superseded.csv beside the "
                                                "measurements: a rerun without --remeasure measures those not "
                                                "measured again yet"), ran.stderr


def test_stage_all_remeasure_checks_its_names_first_then_fits_the_new_rows_alone(tmp_path, monkeypatch):
    """``--stage all --remeasure``: a name the dataset lacks was refused only by the profile stage, after the
    networks stage (minutes on a first run); it is refused before it, with the closest names. A known one is
    measured again and the fingerprint stage fits the measurements as they are then: the new row, not the old one
    (which is in superseded.csv). The earlier rows are written as a profile writes them: one row is measured."""
    from perf4sight import stages
    from perf4sight.errors import UserError
    from perf4sight.fingerprint.api import measurements_differ

    cfg = load_config(_project(tmp_path, names=("tiny", "wide")))  # a fit takes two networks
    csv_path = results.results_path(cfg.profiling_dir, "local")
    nets = tmp_path / "models" / "nets"
    for i, (name, bs) in enumerate((n, b) for n in ("tiny", "wide") for b in (1, 2)):
        results.append_row(csv_path, {
            "device": "local", "backend": "cpu", "network": name, "family": name, "pruning_level": 0,
            "batch_size": bs, "input_shape": "3x32x32", "phase": "train", "status": "ok", "latency_ms_median": 2 + i,
            "timed_steps": 3, "warmup_steps": 1, "protocol": "perf_counter", "repeats": 1, "peak_rss_mb": 700 + i,
            "baseline_rss_mb": 690, "threads": 1, "timestamp": f"2026-11-30T10:00:0{i}+00:00", "momentum": 0.9,
            "weight_decay": 0.0, "loss": "cross_entropy", "torch_version": "2",
            "description_sha": results.file_sha((nets / f"{name}.json").read_bytes())})
    before = results.read_rows(csv_path)
    ran = []
    monkeypatch.setitem(stages.STAGES, "networks", lambda cfg, args: ran.append("networks") or 0)
    with pytest.raises(UserError, match=r"--remeasure tinny: 'tinny' is not one of the 2 networks profiled on "
                                        r"device 'local' \(did you mean 'tiny'\?\)"):
        stages.run("all", cfg, _args(remeasure=["tinny"]))
    assert ran == [] and results.read_rows(csv_path) == before
    monkeypatch.setattr(stages, "STAGE_ORDER", ("networks", "profile", "fingerprint"))
    assert stages.run("all", cfg, _args(remeasure=["tiny@2"])) == 0
    after = results.read_rows(csv_path)
    assert ran == ["networks"] and len(after) == 4 and before[1] not in after
    assert [r["network"] + "@" + r["batch_size"] for r in after if r not in before] == ["tiny@2"]
    assert results.read_rows(csv_path.with_name("superseded.csv")) == [before[1]]
    metadata = json.loads((cfg.fingerprint_dir / "local" / "metadata.json").read_text())
    assert not measurements_differ(cfg, "local", metadata)  # fitted on the rows as they are now


def test_the_load_note_counts_only_the_rows_of_networks_the_profile_measures(tmp_path, capsys):
    """A network removed from the config keeps its rows in the CSV, passed over by every stage; the profile stage's
    load note counted them (6 of 24 ok rows, where the profile had 18) and told to --remeasure them, a command the
    profile refuses ('not one of the networks profiled'). Only the rows of the manifest's networks count now. Every
    configuration is measured already, so no measuring child starts."""
    from perf4sight import stages
    from perf4sight.ir.schema import load_description

    cfg = load_config(_project(tmp_path, names=("tiny",), batch_sizes=(1,)))
    net = tmp_path / "models" / "nets" / "tiny.json"
    shape = "x".join(map(str, load_description(net).input_shape))
    row = {"device": "local", "backend": "cpu", "network": "tiny", "family": "tiny", "batch_size": 1,
           "input_shape": shape, "phase": "train", "status": "ok", "latency_ms_median": 3.0, "peak_rss_mb": 650,
           "threads": 1, "timestamp": "2025-01-01T00:00:00+00:00", "momentum": "0.9", "weight_decay": "0.0",
           "loss": "cross_entropy", "description_sha": results.file_sha(net.read_bytes()),
           "load_avg_1m": "0.5", "cpu_count": "4"}
    csv_path = results.results_path(tmp_path / "profiling_csvs", "local")
    results.append_row(csv_path, row)
    results.append_row(csv_path, dict(row, network="gone", family="gone", load_avg_1m="9.5"))  # not in the manifest
    assert stages.run("profile", cfg, _args()) == 0
    out = capsys.readouterr()
    assert "1/1 rows (0 new)" in out.out
    assert [line for line in out.err.splitlines() if "load average" in line] == []
    results.append_row(csv_path, dict(row, batch_size=2, load_avg_1m="9.5"))  # a loaded row of tiny's does count
    assert stages.run("profile", cfg, _args()) == 0
    (note,) = [line for line in capsys.readouterr().err.splitlines() if "load average" in line]
    assert note.startswith("note: local: 1 of 2 ok rows was measured while its 1-minute load average was above 4.5")
    assert note.endswith("--remeasure tiny while the device is quiet (the earlier rows move to superseded.csv)")
