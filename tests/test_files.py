"""The atomic file write every stage shares: the new file replaces the old whole, or the old one stays."""
from __future__ import annotations

import pytest

from perf4sight.files import atomic_path, write_atomically


def test_write_atomically_replaces_the_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "plan.json"
    target.write_text("old")
    assert write_atomically(target, "new") == target and target.read_text() == "new"
    write_atomically(str(target), b"\x00bytes")
    assert target.read_bytes() == b"\x00bytes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_atomic_path_is_beside_the_target_and_a_failed_writer_keeps_the_old_file(tmp_path):
    target = tmp_path / "models.npz"
    target.write_text("old")
    with atomic_path(target, suffix=".tmp.npz") as tmp:
        assert tmp == tmp_path / "models.npz.tmp.npz"
        tmp.write_text("new")
    assert target.read_text() == "new"
    with pytest.raises(RuntimeError, match="writer failed"):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("writer failed")
    assert target.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["models.npz"]
