"""The atomic file write every stage shares: the new file replaces the old whole, or the old one stays."""
from __future__ import annotations

import pytest

from perf4sight.files import atomic_path, naming_file, write_atomically


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


def test_a_full_disk_names_the_measurement_csv_and_an_error_without_errno_is_left_alone(tmp_path):
    """A write to a full disk raises an ``OSError`` naming no file: appending a row names the CSV (here a link to
    /dev/full, whose every write fails with ENOSPC); an ``OSError`` with no errno keeps its own message."""
    from perf4sight.profiling.results import append_row

    csv_path = tmp_path / "measurements.csv"
    csv_path.symlink_to("/dev/full")
    with pytest.raises(OSError, match="No space left on device") as raised:
        append_row(csv_path, {"network": "alpha", "status": "ok"})
    assert raised.value.filename == str(csv_path)
    with pytest.raises(OSError) as bare:
        with naming_file(csv_path):
            raise OSError("no errno")
    assert bare.value.filename is None and str(bare.value) == "no errno"


def test_the_package_is_hashed_once_for_the_networks_cache_and_the_fit_inputs(monkeypatch):
    """The networks stage's cache and the fingerprint stage's inputs both key on the package's code: each kept a hash
    of its own, so ``--stage all`` read the package twice; one kept hash serves both."""
    from perf4sight import files
    from perf4sight.fingerprint.fit_inputs import inputs_sha256
    from perf4sight.networks import stage_cache

    hashed = []
    real = files.sources_sha256
    monkeypatch.setattr(files, "sources_sha256", lambda package: hashed.append(package) or real(package))
    files.package_sha256.cache_clear()
    try:
        code = stage_cache._code_sha()
        inputs_sha256("trees", [], {}, {}, {})
        assert hashed == [files._PACKAGE] and code == real(files._PACKAGE)
    finally:
        files.package_sha256.cache_clear()  # hashed again, unpatched, where a later test asks

