"""One small run of every stage through the real command line, on this machine's CPU."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CONFIG = """
[networks]
zoo = ["squeezenet1_1", "resnet18"]
input_shape = [3, 32, 32]
num_classes = 10
[networks.pruning]
levels = [0, 50]
[profile]
batch_sizes = [2, 4]
warmup_steps = 1
timed_steps = 2
timeout_s = 120
[devices.local]
backend = "cpu"
threads = 1
[fingerprint]
n_estimators = 20
[compare]
networks = ["squeezenet1_1"]
"""


def main_py(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "main.py"), "--config", str(tmp_path / "config.toml"), *args],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)


def test_all_stages_then_predict_json(tmp_path):
    (tmp_path / "config.toml").write_text(CONFIG)
    run = main_py(tmp_path, "--stage", "all")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    manifest = list(csv.DictReader((tmp_path / "models" / "manifest.csv").open()))
    assert len(manifest) == 4
    rows = list(csv.DictReader((tmp_path / "profiling_csvs" / "local" / "measurements.csv").open()))
    assert len(rows) == 8 and all(r["status"] == "ok" for r in rows)
    assert all(float(r["peak_rss_mb"]) >= float(r["baseline_rss_mb"]) > 0 for r in rows)
    meta = json.loads((tmp_path / "fingerprinting" / "local" / "metadata.json").read_text())
    assert meta["memory_target"] == "peak_rss_mb" and meta["device"] == "local"
    assert "MAPE" in run.stdout

    again = main_py(tmp_path, "--stage", "profile")  # resume: nothing new, nothing duplicated
    assert again.returncode == 0
    assert len(list(csv.DictReader((tmp_path / "profiling_csvs" / "local" / "measurements.csv").open()))) == 8

    pred = main_py(tmp_path, "--stage", "predict", "--device", "local", "--network", "resnet18",
                   manifest[0]["path"] and str(tmp_path / "models" / manifest[0]["path"]), "--batch-size", "2", "8", "--json")
    assert pred.returncode == 0, pred.stderr
    lines = [json.loads(line) for line in pred.stdout.splitlines()]
    assert [(p["network"], p["batch_size"]) for p in lines] == [
        ("resnet18", 2), ("resnet18", 8), (manifest[0]["network"], 2), (manifest[0]["network"], 8)]
    keys = {"network", "batch_size", "latency_ms", "latency_ms_low", "latency_ms_high", "memory_mb",
            "memory_mb_low", "memory_mb_high", "fits"}
    for p in lines:
        assert set(p) == keys
        assert p["latency_ms_low"] <= p["latency_ms"] <= p["latency_ms_high"]
        assert p["memory_mb_low"] <= p["memory_mb"] <= p["memory_mb_high"]
