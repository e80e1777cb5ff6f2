"""Running the tool's own stages from a bench script: one ``main.py --config C --stage S`` in a fresh process."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_stage(config: Path, stage: str, bench: str) -> None:
    """Run ``stage`` with ``config``; on failure stop the bench ``bench`` with the stage's last line."""
    cmd = [sys.executable, str(ROOT / "main.py"), "--config", str(config), "--stage", stage]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        last_line = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        sys.exit(f"{bench}: {config.name} --stage {stage} failed: {last_line}")
