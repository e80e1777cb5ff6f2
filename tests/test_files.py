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
        assert tmp.parent == tmp_path and tmp.name.startswith("models.npz.") and tmp.name.endswith(".tmp.npz")
        tmp.write_text("new")
    assert target.read_text() == "new"
    with pytest.raises(RuntimeError, match="writer failed"):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("writer failed")
    assert target.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["models.npz"]


def test_two_writers_of_one_file_at_once_each_rename_their_own_and_a_dead_ones_scraps_go(tmp_path):
    """Every writer of ``x`` filled ``x.tmp``: of two at once (two predicts filling one cache), the second's rename
    took the first's file and the first's rename failed (FileNotFoundError). Each now has a name of its own; a killed
    writer's leftover is removed by the next process's first write into its folder once an hour old (a young one may
    be a live writer's). A writer under a lock keeps the fixed name, which the next one overwrites."""
    import os
    import time

    target = tmp_path / "zoo.json"
    with atomic_path(target) as first:
        first.write_text("first")
        write_atomically(target, "second")  # the other writer, done meanwhile
    assert target.read_text() == "first" and first != tmp_path / "zoo.json.tmp"
    cache = tmp_path / "cache"
    cache.mkdir()
    old, young = cache / "zoo.json.4242.0badf00d.tmp", cache / "zoo.json.4243.0badf00d.tmp"
    other, notes = cache / "net.json.4242.0badf00d.tmp", cache / "zoo.json.notes.tmp"  # not a writer's name: kept
    for scrap in (old, young, other, notes):
        scrap.write_text("killed mid-write")
    hours_ago = time.time() - 7200
    for scrap in (old, other, notes):
        os.utime(scrap, (hours_ago, hours_ago))
    write_atomically(cache / "zoo.json", "third")
    assert sorted(p.name for p in cache.iterdir()) == sorted(["zoo.json", young.name, notes.name])
    with atomic_path(target, unique=False) as fixed:
        assert fixed == tmp_path / "zoo.json.tmp"
        fixed.write_text("locked")
    assert target.read_text() == "locked"


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

