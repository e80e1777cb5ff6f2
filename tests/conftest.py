"""Shared fixtures: the project root on sys.path, the shared TX2 data location, tiny networks."""
from __future__ import annotations

import os
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
