"""Atomic writes: the final path only ever holds a complete file, the data is fsynced before the
rename, a failure leaves the old file (or nothing) and no temporary behind; JSON is cleaned."""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from icrl_interp.core import files


def _listing(d):
    return sorted(p.name for p in d.iterdir())


def test_write_atomic_replaces_and_leaves_no_temporaries(tmp_path):
    target = tmp_path / "sub" / "out.txt"
    files.write_atomic(target, "one")
    files.write_atomic(target, b"two")
    assert target.read_bytes() == b"two" and _listing(target.parent) == ["out.txt"]
    assert oct(target.stat().st_mode & 0o777) == oct(0o644)


def test_a_failing_writer_keeps_the_old_file(tmp_path):
    target = tmp_path / "fig.png"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with files.atomic_path(target, suffix=".png") as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("killed")
    assert target.read_bytes() == b"old" and _listing(tmp_path) == ["fig.png"]


def test_data_is_fsynced_before_the_rename_and_the_directory_after(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: events.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
                        or real_fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b: events.append(("replace", os.path.basename(b))) or real_replace(a, b))
    files.write_atomic(tmp_path / "a.json", "{}")
    kinds = [e[0] for e in events]
    assert kinds == ["fsync", "replace", "fsync"]
    assert events[0][1].startswith(".a.json.") and events[1][1] == "a.json" and events[2][1] == tmp_path.name


def test_atomic_dir_swaps_whole_directories(tmp_path):
    out = tmp_path / "ck"
    with files.atomic_dir(out) as tmp:
        (tmp / "a").write_text("1")
    with pytest.raises(ValueError):
        with files.atomic_dir(out) as tmp:
            (tmp / "a").write_text("2")
            raise ValueError("crash")
    assert (out / "a").read_text() == "1" and _listing(tmp_path) == ["ck"]
    with files.atomic_dir(out) as tmp:
        (tmp / "b").write_text("3")
    assert _listing(out) == ["b"] and _listing(tmp_path) == ["ck"]


def test_json_clean_and_write_json(tmp_path):
    payload = {"a": np.float32(1.5), "b": np.arange(3), "c": (math.nan, math.inf, np.int64(4)), 5: np.bool_(True)}
    assert files.json_clean(payload) == {"a": 1.5, "b": [0, 1, 2], "c": [None, None, 4], "5": True}
    files.write_json(tmp_path / "x.json", payload)
    assert json.loads((tmp_path / "x.json").read_text())["c"] == [None, None, 4]


def _watch(monkeypatch, events, target=None):
    """Record os.fsync (by file name) and os.replace calls; at each one note whether `target` exists yet."""
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}")), target is not None and target.exists()))
        return real_fsync(fd)

    def replace(a, b):
        events.append(("replace", os.path.basename(b), target is not None and target.exists()))
        return real_replace(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)


@pytest.mark.parametrize("writer", ["write_atomic", "write_json", "atomic_path"])
def test_every_file_writer_fsyncs_then_renames_and_the_target_appears_only_by_the_rename(tmp_path, monkeypatch, writer):
    target = tmp_path / "out.json"
    events = []
    _watch(monkeypatch, events, target)
    if writer == "write_atomic":
        files.write_atomic(target, "{}")
    elif writer == "write_json":
        files.write_json(target, {"a": 1})
    else:
        with files.atomic_path(target) as tmp:
            tmp.write_text("{}")
    assert [e[0] for e in events] == ["fsync", "replace", "fsync"]
    (_, synced, _), (_, renamed_to, existed), (_, dir_synced, _) = events
    assert synced.startswith(".out.json.") and synced.endswith(".tmp")  # the temporary, before the rename
    assert renamed_to == "out.json" and not existed  # nothing at the final path before os.replace
    assert dir_synced == tmp_path.name and target.exists()


def test_atomic_dir_fsyncs_files_and_both_directories_around_the_rename(tmp_path, monkeypatch):
    out = tmp_path / "ck"
    events = []
    _watch(monkeypatch, events, out)
    with files.atomic_dir(out) as tmp:
        (tmp / "a.json").write_text("{}")
        (tmp / "b.bin").write_bytes(b"x")
    kinds = [e[0] for e in events]
    assert kinds == ["fsync", "fsync", "fsync", "replace", "fsync"]
    assert {events[0][1], events[1][1]} == {"a.json", "b.bin"}  # the files' data ...
    assert events[2][1].startswith(".ck.") and events[2][1].endswith(".tmp")  # ... and their directory entries
    assert events[3][1:] == ("ck", False)  # the directory appears by the rename only
    assert events[4][1] == tmp_path.name and (out / "a.json").read_text() == "{}"

    events.clear()  # replacing an existing directory: the old one stays in place until the new one is complete
    with files.atomic_dir(out) as tmp:
        (tmp / "c").write_text("new")
        assert (out / "a.json").exists()
    assert [e[0] for e in events] == ["fsync", "fsync", "replace", "replace", "fsync"]
    assert events[3][1] == "ck" and _listing(out) == ["c"] and _listing(tmp_path) == ["ck"]


# ------------------------------------------------------------------ leftovers and locks
def test_temporaries_are_exactly_the_names_atomic_path_gives(tmp_path):
    """mkstemp's `.NAME.XXXXXXXX.tmp` (8 of a-z, 0-9, _), files only: nothing a user would name so."""
    with files.atomic_path(tmp_path / "a.json") as tmp:
        assert files.temporaries(tmp_path, "a.json") == [tmp]  # what a kill here would leave
        assert files.temporaries(tmp_path) == [tmp]
    for name in (".a.json.tmp", "a.json.abcd_123.tmp", ".a.json.abcd_1234.tmp", ".a.json.ABCD_123.tmp",
                 ".b.json.abcd_123.tmp", ".a.json.abcd_123.png"):
        (tmp_path / name).write_text("user")
    (tmp_path / ".a.json.abcd_999.tmp").mkdir()
    (tmp_path / ".a.json.abcd_888.tmp").symlink_to(tmp_path / "a.json")
    assert files.temporaries(tmp_path, "a.json") == []
    assert [p.name for p in files.temporaries(tmp_path, suffix=".png")] == [".a.json.abcd_123.png"]
    assert [p.name for p in files.temporaries(tmp_path)] == [".b.json.abcd_123.tmp"]
    assert files.temporaries(tmp_path / "missing") == []


def test_a_lock_is_exclusive_names_its_holder_and_goes_with_its_last_process(tmp_path, monkeypatch):
    import multiprocessing as mp

    monkeypatch.setattr(files, "LOCK_WAIT_S", 0.05)
    path = tmp_path / "r.lock"
    with files.locked(path, "the thing"):
        assert json.loads(path.read_text()) == {"schema": files.LOCK_SCHEMA, "pid": os.getpid()}
        assert files.is_lock_file(path)
        with pytest.raises(files.UserError, match=rf"^the thing is being written by process {os.getpid()} of "):
            with files.locked(path, "the thing"):
                pass
    assert not path.exists()  # removed by its holder
    with files.locked(path, "x", keep=True):  # a marker: kept, and free again once its holder is done
        pass
    assert files.is_lock_file(path)
    # a forked child holds the lock it inherited until it exits, also when its parent is gone (killed: no
    # `finally` removed the file); the lock of a dead process is free at once
    go, done = mp.get_context("fork").Event(), mp.get_context("fork").Event()
    with files.locked(path, "x", keep=True):
        child = mp.get_context("fork").Process(target=lambda: (done.set(), go.wait(30)))
        child.start()
        done.wait(30)
    with pytest.raises(files.UserError, match="is being written by"):
        with files.locked(path, "x"):
            pass
    go.set()
    child.join(30)
    with files.locked(path, "x"):
        pass
    path.write_text("")  # a holder killed between creating and writing the file
    assert files.is_lock_file(path)
    path.write_text(json.dumps({"schema": "icrl_interp.other/1"}))
    assert not files.is_lock_file(path)


def test_atomic_path_creates_the_missing_parents_of_its_file(tmp_path):
    """The helper's own contract: every missing directory above the file is made (the commands refuse a
    missing parent of --out before they write anything; the helper does not refuse)."""
    target = tmp_path / "a" / "b" / "c.json"
    files.write_json(target, {"x": 1})
    assert json.loads(target.read_text()) == {"x": 1} and _listing(tmp_path / "a" / "b") == ["c.json"]
