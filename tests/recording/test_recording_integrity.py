"""Truncated and corrupt recordings are refused at once with one line (never a hang, never
results), `--resume` checks identity and cuts back to /progress, and `finish()` fsyncs before
its atomic rename (docs/integrity.md, "Recordings").

Opening a corrupt file used to hang inside HDF5, so those opens run in a child process with a
timeout: a hang fails the test instead of hanging the suite.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from icrl_interp.core.errors import UserError
from icrl_interp.recording.format import Recording, RecordingWriter, partial_path
from icrl_interp.recording.integrity import INTEGRITY, WRITE_FLAGS, read_superblock

ROOT = Path(__file__).resolve().parents[2]
B = 64  # prompts per batch
META = {"task_family": "linear-td", "model": {"family": "linear-td", "architecture": None, "class": "X"},
        "probe_spec": '{"hooks": []}', "checkpoint_sha256": "c" * 64, "source_sha256": "", "seed": 3,
        "batch_size": B, "n_total": 5 * B, "layout": None, "versions": {}, "created": "2026-01-01T00:00:00+00:00"}


def _batch(i: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([7, i])
    return {"acts/blocks.0.hook_resid_post": rng.standard_normal((B, 17, 7)),
            "acts/blocks.0.attn.hook_pattern": rng.random((B, 1, 17, 17)).astype(np.float32),
            "prompts/z": rng.standard_normal((B, 17, 7)), "tasks/P": rng.random((B, 6, 6))}


ATTRS = {"acts/blocks.0.hook_resid_post": {"dtype": "float64", "positions": ":"},
         "acts/blocks.0.attn.hook_pattern": {"dtype": "float32", "positions": ":"}}


def _writer(path, batches=range(5), meta=META, **kw) -> RecordingWriter:
    w = RecordingWriter(path, meta, **kw)
    w.write_static("params", {"blocks.0.attn.P": np.eye(7)})
    for i in batches:
        w.write_batch(_batch(i), {k: dict(v) for k, v in ATTRS.items()})
    return w


def _contents(path) -> dict:
    """Every dataset and attribute of a recording, for exact comparisons."""
    out = {}
    with h5py.File(path, "r") as f:
        out.update({f"@{k}": f.attrs[k] for k in f.attrs if k not in ("created", INTEGRITY)})

        def visit(name, obj):
            out.update({f"{name}@{k}": obj.attrs[k] for k in obj.attrs})
            if isinstance(obj, h5py.Dataset):
                out[name] = obj[()]

        f.visititems(visit)
    return out


def _assert_same(a: dict, b: dict) -> None:
    """Exact: the resumed writer stores the same numbers it was given."""
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], np.ndarray):
            assert a[k].shape == b[k].shape and a[k].dtype == b[k].dtype, k
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        else:
            assert a[k] == b[k], k


# ------------------------------------------------------------------ corrupt files, in a child
CHILD = r"""
import hashlib, json, sys, time
from icrl_interp.core.errors import UserError
from icrl_interp.recording.format import Recording, RecordingWriter

meta = json.loads(sys.argv[1])
for path in sys.argv[2:]:
    t = time.perf_counter()
    try:
        if path.endswith(".partial"):
            RecordingWriter(path[: -len(".partial")], meta, resume=True).close()
            out = "resumed"
        else:
            h = hashlib.sha256()
            with Recording(path) as r:
                for k in sorted(r.f.attrs):
                    h.update(repr((k, r.attr(k))).encode())
                for name in ("acts", "prompts", "tasks", "params"):
                    for key in sorted(r.f[name]):
                        h.update(r.array(f"/{name}/{key}").tobytes())
                        h.update(repr(sorted((k, r.f[name][key].attrs[k]) for k in r.f[name][key].attrs)).encode())
            out = "read " + h.hexdigest()
    except UserError as e:
        out = "UserError: " + str(e)
    except BaseException as e:
        out = f"{type(e).__name__}: {e}"
    print(json.dumps([path, out, time.perf_counter() - t]), flush=True)
"""


def _in_child(paths, timeout=90) -> dict[str, tuple[str, float]]:
    """{path: (outcome, seconds)} of opening each file (a .partial: resuming it) in one child process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(META), *map(str, paths)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, _ = proc.communicate()
        done = [json.loads(line)[0] for line in stdout.splitlines()]
        pytest.fail(f"hung on {next(p for p in map(str, paths) if p not in done)}")
    assert proc.returncode == 0, stderr
    return {p: (out, sec) for p, out, sec in map(json.loads, stdout.splitlines())}


def _assert_refused(results, *words, limit=2.0):
    for path, (out, seconds) in results.items():
        assert out.startswith("UserError: "), (path, out)
        assert "\n" not in out and Path(path).name in out, (path, out)
        assert all(w in out for w in words), (path, out, words)
        assert seconds < limit, (path, out, seconds)


def _damaged(src: Path, dst: Path, *, keep: int | None = None, flip: int | None = None) -> Path:
    raw = bytearray(src.read_bytes())
    if flip is not None:
        raw[flip] ^= 0x5A
    dst.write_bytes(bytes(raw[:keep] if keep is not None else raw))
    return dst


def _metadata_offsets(path) -> list[int]:
    """Byte offsets that hold HDF5 metadata (everything but the datasets' raw data)."""
    size = os.path.getsize(path)
    raw = np.zeros(size, bool)
    with h5py.File(path, "r") as f:
        def visit(_, obj):
            if isinstance(obj, h5py.Dataset) and obj.chunks:
                for i in range(obj.id.get_num_chunks()):
                    info = obj.id.get_chunk_info(i)
                    raw[info.byte_offset : info.byte_offset + info.size] = True
            elif isinstance(obj, h5py.Dataset) and obj.id.get_offset() is not None:
                raw[obj.id.get_offset() : obj.id.get_offset() + obj.id.get_storage_size()] = True

        f.visititems(visit)
    return [int(i) for i in np.flatnonzero(~raw)]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    return _writer(tmp_path_factory.mktemp("rec") / "ok.h5").finish()


def test_truncated_recordings_are_refused_at_once(finished, tmp_path):
    size = os.path.getsize(finished)
    assert size > 400_000
    cuts = [40, 512, 5_000, 200_000, size // 2, size - 64, size - 1]
    results = _in_child([_damaged(finished, tmp_path / f"cut{n}.h5", keep=n) for n in cuts])
    _assert_refused(results, "truncated")
    assert str(size) in results[str(tmp_path / "cut512.h5")][0]  # says how long the file should be


def test_flipped_metadata_bytes_are_refused_at_once_or_harmless(finished, tmp_path):
    """Offset 20 (superblock), the root object header, the global heap holding the string
    attributes (its object sizes used to send HDF5 into an endless loop), the `integrity`
    attribute, a chunk index, and a spread of other metadata bytes: each flip is refused,
    or (padding, free space) reads exactly the original."""
    raw = finished.read_bytes()
    heap = raw.index(b"GCOL")
    named = {"superblock": 20, "root-header": 60, "heap-size": heap + 24, "heap-text": heap + 40,
             "integrity": raw.index(b'{"global_heaps"') + 20}
    for sig in (b"EAHD", b"EAIB", b"FAHD"):  # the chunk indexes of the datasets
        if sig in raw:
            named[sig.decode()] = raw.index(sig) + 10
    spread = np.random.default_rng(0).choice(_metadata_offsets(finished), 60, replace=False)
    offsets = {**named, **{f"m{i}": int(i) for i in spread}}
    results = _in_child([finished] + [_damaged(finished, tmp_path / f"{k}.h5", flip=v) for k, v in offsets.items()])
    original = results.pop(str(finished))[0]
    assert original.startswith("read ")
    for name in named:
        _assert_refused({k: v for k, v in results.items() if Path(k).stem == name})
    harmless = [k for k, (out, _) in results.items() if out == original]
    _assert_refused({k: v for k, v in results.items() if k not in harmless})
    assert len(harmless) < len(results) // 2  # most metadata bytes matter, and were caught


def _killed_copy(tmp_path, batches=3) -> Path:
    """A partial file as a killed writer leaves it: a byte copy taken while the writer has it
    open (SWMR mode, "open for writing" flags set)."""
    w = _writer(tmp_path / "w" / "k.h5", range(batches))
    killed = partial_path(tmp_path / "k.h5")
    shutil.copy(w.partial, killed)
    w.close()
    assert read_superblock(killed).flags & WRITE_FLAGS
    return killed


def test_a_killed_partial_is_incomplete_not_read_in_swmr_mode(tmp_path):
    killed = _killed_copy(tmp_path)
    renamed = tmp_path / "renamed.h5"
    shutil.copy(killed, renamed)
    with pytest.raises(UserError, match=r"renamed\.h5: recording is incomplete"):
        Recording(renamed)
    with pytest.raises(UserError, match="incomplete"):
        Recording(killed, allow_incomplete=True)


def test_resuming_a_truncated_or_corrupt_partial_is_refused_at_once(tmp_path):
    killed = _killed_copy(tmp_path)
    size, raw = os.path.getsize(killed), killed.read_bytes()
    cases = {"cut512": dict(keep=512), "cut5000": dict(keep=5000), "half": dict(keep=size // 2),
             "last64": dict(keep=size - 64), "flip20": dict(flip=20), "flip60": dict(flip=60),
             "heap": dict(flip=raw.index(b"GCOL") + 24)}
    paths = []
    for name, how in cases.items():
        (tmp_path / name).mkdir()
        paths.append(_damaged(killed, tmp_path / name / killed.name, **how))
    results = _in_child(paths)
    _assert_refused(results, "cannot resume")
    for name in ("cut512", "cut5000", "half", "last64"):
        assert "truncated" in results[str(tmp_path / name / killed.name)][0]
    # checked before the flags are cleared: clearing re-signs the superblock
    assert "superblock checksum" in results[str(tmp_path / "flip20" / killed.name)][0]


def test_resume_cuts_back_to_progress_and_equals_an_uninterrupted_run(tmp_path):
    reference = _contents(_writer(tmp_path / "ref.h5").finish())
    # killed after batch 2's rows were appended and flushed, before /progress vouched for them
    w = _writer(tmp_path / "w" / "k.h5", range(2))
    for path, arr in _batch(2).items():
        ds = w._f[path]
        ds.resize(2 * B + B, axis=0)
        ds[2 * B :] = arr + 1000.0  # not what the resumed run writes
    w._f.flush()
    killed = partial_path(tmp_path / "k.h5")
    shutil.copy(w.partial, killed)
    w.close()
    with h5py.File(killed, "r", libver="latest", swmr=True) as f:
        assert f["progress"][0] == 2 * B and f["prompts/z"].shape[0] == 3 * B

    r = RecordingWriter(tmp_path / "k.h5", META, resume=True)
    assert r.n_done == 2 * B
    rows = {name: ds.shape[0] for name, ds in r._datasets(r._f) if ds.maxshape[0] is None}
    assert set(rows.values()) == {2 * B}, rows  # every appendable dataset cut back to /progress
    for i in range(2, 5):
        r.write_batch(_batch(i), {k: dict(v) for k, v in ATTRS.items()})
    _assert_same(_contents(r.finish()), reference)
    assert not killed.exists()


# ------------------------------------------------------------------ resume identity, finish
@pytest.mark.parametrize("key, value", [("n_total", 4 * B), ("seed", 4), ("batch_size", 32), ("source_sha256", "ab" * 32),
                                        ("checkpoint_sha256", "d" * 64), ("probe_spec", '{"hooks": [1]}'),
                                        ("task_family", "sarsa")])
def test_resume_refuses_another_run(tmp_path, key, value):
    _writer(tmp_path / "a.h5", range(2)).close()
    with pytest.raises(UserError, match=f"cannot resume .*a different {key}") as info:
        RecordingWriter(tmp_path / "a.h5", {**META, key: value}, resume=True)
    assert "\n" not in str(info.value)
    if key in ("n_total", "seed", "batch_size"):
        assert f"({META[key]} there, {value} now)" in str(info.value)


@pytest.mark.parametrize("progress", [10**9, 2 * B + 1, -1])
def test_resume_refuses_a_progress_outside_the_rows(tmp_path, progress):
    """A damaged /progress would stretch every dataset to that many rows of nothing (or below zero)."""
    _writer(tmp_path / "a.h5", range(2)).close()
    partial = partial_path(tmp_path / "a.h5")
    with h5py.File(partial, "r+") as f:
        f["progress"][0] = progress
    before = partial.read_bytes()
    with pytest.raises(UserError, match=rf"cannot resume: .* is corrupt \(/progress says {progress} prompts, "
                                        rf"but /\S+ holds {2 * B} rows\)"):
        RecordingWriter(tmp_path / "a.h5", META, resume=True)
    assert partial.read_bytes() == before and not partial.with_name(partial.name + ".resume").exists()


def test_partials_of_older_versions_resume_without_n_total(tmp_path):
    old = {k: v for k, v in META.items() if k != "n_total"}
    _writer(tmp_path / "a.h5", range(2), meta=old).close()
    w = RecordingWriter(tmp_path / "a.h5", META, resume=True)
    assert w.n_done == 2 * B
    w.close()


def test_finish_publishes_only_all_requested_prompts(tmp_path):
    w = _writer(tmp_path / "a.h5", range(3))
    with pytest.raises(UserError, match=r"192 of 320 prompts written"):
        w.finish()
    w.close()
    assert not (tmp_path / "a.h5").exists() and partial_path(tmp_path / "a.h5").exists()


def test_finish_fsyncs_the_complete_file_then_renames_then_fsyncs_the_directory(tmp_path, monkeypatch):
    w = _writer(tmp_path / "a.h5")
    final, partial = tmp_path / "a.h5", w.partial
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"), final.exists()))
        return real_fsync(fd)

    def replace(a, b):
        with Recording(a) as r:  # what is renamed is already a complete, sealed recording
            complete, sealed = bool(r.attr("complete")), r.attr(INTEGRITY) is not None
        events.append(("replace", (str(a), str(b)), final.exists(), complete, sealed))
        return real_replace(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    assert w.finish() == final
    renames = [e for e in events if e[0] == "replace"]
    assert renames == [("replace", (str(partial), str(final)), False, True, True)]  # atomic, onto a free path
    at = events.index(renames[0])
    assert ("fsync", str(partial), False) in events[:at]  # the data is on disk before the rename
    assert ("fsync", str(tmp_path), True) in events[at:]  # and the new directory entry after it
    assert not partial.exists()
    with Recording(final) as r:
        assert r.n_prompts == 5 * B


def test_the_integrity_attribute_digests_the_global_heaps(finished):
    with h5py.File(finished, "r") as f:
        heaps = json.loads(f.attrs[INTEGRITY])["global_heaps"]
    raw = finished.read_bytes()
    assert heaps and all(raw[at : at + 4] == b"GCOL" for at, _, _ in heaps)
    assert all(hashlib.sha256(raw[at : at + n]).hexdigest() == d for at, n, d in heaps)


def test_a_writer_killed_before_its_first_batch_leaves_no_torn_partial_file(tmp_path):
    """Until its first batch is on disk in SWMR mode, HDF5 holds a new file's metadata in memory: a writer
    SIGKILLed then left a torn .partial that --resume could not open. The file now takes the partial name
    only after that batch; before, it is `.partial.new`, which the next run overwrites."""
    import multiprocessing as mp
    import signal

    from icrl_interp.recording.format import scratch_paths

    out = tmp_path / "k.h5"

    def killed_before_the_first_batch():
        w = RecordingWriter(out, META)
        w.write_static("params", {"blocks.0.attn.P": np.eye(7)})
        os.kill(os.getpid(), signal.SIGKILL)

    proc = mp.get_context("fork").Process(target=killed_before_the_first_batch)
    proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    new = scratch_paths(out)[0]
    assert not partial_path(out).exists() and new.is_file()
    with pytest.raises(UserError, match="nothing to resume"):
        RecordingWriter(out, META, resume=True)
    w = _writer(out, range(1))  # a new run starts over it
    assert partial_path(out).is_file() and not new.exists()
    w.close()
    r = RecordingWriter(out, META, resume=True)
    assert r.n_done == B
    r.close()
