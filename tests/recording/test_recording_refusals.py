"""Every integrity check of `recording.Recording`, given the bad input it exists for (docs/integrity.md,
"Truncated and corrupt recordings"): damage in a later global heap (not only the first), a missing
`complete` attribute, a pickle or a JSON file given as a recording, an unreadable `integrity`
attribute, and a /progress counter that disagrees with the rows or with `n_prompts`. Each is refused in
one line naming the file.

Mutants caught (tests/mutation.py): the heap digest loop stopping after the first heap (or the heap
scan after the first "GCOL"), `complete` defaulting to true, the progress checks relaxed (`<` -> `<=`,
`and` -> `or`, a `raise` removed), the integrity attribute's parse errors let through.
"""
from __future__ import annotations

import json
import re
import pickle
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from icrl_interp import cli
from icrl_interp.core.errors import UserError
from icrl_interp.recording.format import Recording
from icrl_interp.recording.integrity import INTEGRITY, global_heaps, seal

from .test_recording_integrity import B, _damaged, _in_child, _writer


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    return _writer(tmp_path_factory.mktemp("rec") / "ok.h5").finish()


def _copy(src: Path, dst: Path, edit=None) -> Path:
    """A copy of `src` changed by `edit(h5py.File)`, sealed again afterwards (so that only the check
    under test can object to it)."""
    shutil.copy2(src, dst)
    if edit is not None:
        with h5py.File(dst, "r+") as f:
            edit(f)
        with h5py.File(dst, "r+") as f:  # after HDF5 has written everything: closing writes new heaps
            seal(f)
    return dst


def _refused(path, *words) -> str:
    with pytest.raises(UserError) as info:
        Recording(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message, message
    assert all(w in message for w in words), (message, words)
    return message


# ------------------------------------------------------------------ global heaps
def test_damage_in_a_later_global_heap_is_refused(finished, tmp_path):
    """A string attribute added in a second session lives in a second global heap collection; a flip
    in it is caught like one in the first (each heap has its own digest)."""
    note = b"a string attribute written in a later session"
    two = _copy(finished, tmp_path / "two.h5", lambda f: f.attrs.__setitem__("note", note.decode()))
    heaps = global_heaps(two)
    assert len(heaps) >= 2, heaps
    last_at, last_size, _ = heaps[-1]
    raw = two.read_bytes()
    at = raw.index(note, last_at)
    assert last_at < at < last_at + last_size  # the note is in the last heap
    with Recording(two) as rec:  # undamaged, it reads (the test's own edit is sound)
        assert rec.attr("note") == note.decode()
    results = _in_child([_damaged(two, tmp_path / "late.h5", flip=at + 5)])
    (out, _), = results.values()
    assert out.startswith("UserError: ") and f"global heap at byte {last_at}," in out, out
    assert "\n" not in out


@pytest.mark.parametrize("value", [b"not json", b'{"heaps": []}', b'{"global_heaps": [[1, 2]]}',
                                   b'{"global_heaps": [["x", 2, "d"]]}'])
def test_an_unreadable_integrity_attribute_is_refused(finished, tmp_path, value):
    bad = _copy(finished, tmp_path / "bad.h5")
    with h5py.File(bad, "r+") as f:
        f.attrs[INTEGRITY] = np.bytes_(value)
    _refused(bad, "corrupt recording", "unreadable integrity attribute")


def test_a_recording_without_an_integrity_attribute_is_read(finished, tmp_path):
    """Older versions wrote none: the check passes (the counterpart of the refusals above)."""
    old = _copy(finished, tmp_path / "old.h5")
    with h5py.File(old, "r+") as f:
        del f.attrs[INTEGRITY]
    with Recording(old) as rec:
        assert rec.n_prompts == 5 * B


# ------------------------------------------------------------------ complete, /progress
def test_a_recording_without_its_complete_attribute_is_incomplete(finished, tmp_path):
    bad = _copy(finished, tmp_path / "bad.h5", lambda f: f.attrs.__delitem__("complete"))
    _refused(bad, "recording is incomplete")


def _progress(value, dtype=np.int64):
    def edit(f):
        del f["progress"]
        f.create_dataset("progress", data=np.asarray(value, dtype=dtype))
    return edit


def _rows(name, n):
    return lambda f: f[name].resize(n, axis=0)


@pytest.mark.parametrize("edit, words", [
    (lambda f: f.__delitem__("progress"), ["no /progress counter"]),
    (_progress([5 * B, 0]), ["no /progress counter"]),
    (_progress([5.0 * B], np.float64), ["no /progress counter"]),
    (_progress([-1]), ["/progress says -1 prompts"]),
    (_progress([5 * B - 1]), [f"/progress says {5 * B - 1} prompts, its n_prompts attribute {5 * B}"]),
    (_rows("prompts/z", 5 * B - 1), [f"/progress says {5 * B} prompts, but prompts/z holds {5 * B - 1} rows"]),
    (_rows("acts/blocks.0.hook_resid_post", 5 * B + 1), [f"acts/blocks.0.hook_resid_post holds {5 * B + 1} rows"]),
])
def test_a_progress_count_that_disagrees_with_the_file_is_refused(finished, tmp_path, edit, words):
    _refused(_copy(finished, tmp_path / "bad.h5", edit), "corrupt recording", *words)


def test_a_partial_may_hold_rows_past_progress_but_not_fewer(finished, tmp_path):
    """allow_incomplete (a partial being resumed): rows past /progress belong to a batch that was never
    vouched for and are allowed; fewer rows than /progress are not."""
    def partial(f):
        f.attrs["complete"] = False
        del f.attrs["n_prompts"]
        _progress([4 * B])(f)
    ahead = _copy(finished, tmp_path / "ahead.h5", partial)
    with Recording(ahead, allow_incomplete=True) as rec:
        assert rec.n_prompts == 4 * B
    short = _copy(ahead, tmp_path / "short.h5", _rows("prompts/z", 4 * B - 1))
    with pytest.raises(UserError, match=f"prompts/z holds {4 * B - 1} rows"):
        Recording(short, allow_incomplete=True)


# ------------------------------------------------------------------ not a recording at all
@pytest.mark.parametrize("kind", ["pickle-2", "pickle-4", "pickle-5", "json"])
def test_a_pickle_or_a_json_file_is_not_a_recording(tmp_path, capsys, kind):
    """Refused from its first bytes (nothing ever unpickles it); the CLI says so in one line, exit 2."""
    payload = {"schema": "icrl_interp.recording/2", "acts": [1.0, 2.0]}
    raw = json.dumps(payload).encode() if kind == "json" else pickle.dumps(payload, protocol=int(kind[-1]))
    path = tmp_path / "r.h5"
    path.write_bytes(raw)
    _refused(path, "not an HDF5 file (no HDF5 signature)")
    assert cli.main(["analyze", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"icrl-interp analyze: error: {path}: neither a checkpoint directory, an HDF5 recording")
    assert "\n" not in err
    assert path.read_bytes() == raw  # the input is untouched


# ------------------------------------------------------------------ the superblock, before HDF5 reads anything
def _plain_hdf5(path: Path, **kw) -> Path:
    with h5py.File(path, "w", **kw) as f:
        f["x"] = np.arange(2000.0)
    return path


@pytest.mark.parametrize("keep", [0, 8, 12, 15])
def test_a_file_ending_inside_its_superblock_is_refused(finished, tmp_path, keep):
    cut = tmp_path / "cut.h5"
    cut.write_bytes(finished.read_bytes()[:keep])
    words = ["no HDF5 signature"] if keep < 8 else ["truncated HDF5 file (it ends inside its superblock)"]
    _refused(cut, *words)


@pytest.mark.parametrize("at, value, words", [
    (8, 7, "unknown superblock version 7"),
    (9, 3, "unreadable superblock"),    # the size of an address must be 2, 4, 8 or 16 bytes
    (9, 32, "unreadable superblock"),
    (9, 17, "unreadable superblock"),
    (9, 16, "superblock checksum mismatch"),  # a size HDF5 allows: read, then caught by the checksum
])
def test_a_superblock_field_no_hdf5_file_has_is_refused(finished, tmp_path, at, value, words):
    raw = bytearray(finished.read_bytes())
    raw[at] = value
    bad = tmp_path / "bad.h5"
    bad.write_bytes(bytes(raw))
    _refused(bad, words)


@pytest.mark.parametrize("kw", [{"libver": "earliest"}, {"userblock_size": 512}, {"userblock_size": 2048}],
                         ids=["superblock-0", "user-block-512", "user-block-2048"])
def test_older_superblocks_and_user_blocks_are_read_and_their_truncation_caught(tmp_path, kw):
    """A superblock of version 0 (other field offsets) or after a user block (HDF5 looks at 0, 512, 1024,
    2048, ...): whole, the file is read (and refused only as not being a recording); cut, it is truncated."""
    whole = _plain_hdf5(tmp_path / "whole.h5", **kw)
    _refused(whole, "not an icrl_interp recording (no schema attribute")
    raw = whole.read_bytes()
    cut = tmp_path / "cut.h5"
    cut.write_bytes(raw[: len(raw) - 1000])
    _refused(cut, f"truncated HDF5 file ({len(raw) - 1000} bytes; its superblock records {len(raw)})")


# ------------------------------------------------------------------ the writer
def test_the_writer_refuses_to_start_over_a_file_or_a_partial(tmp_path):
    from icrl_interp.recording.format import RecordingWriter, partial_path

    from .test_recording_integrity import META

    done = _writer(tmp_path / "a.h5").finish()
    with pytest.raises(UserError, match="a.h5 exists; remove it or choose another --out"):
        RecordingWriter(done, META)
    _writer(tmp_path / "b.h5", range(2)).close()
    with pytest.raises(UserError, match=r"b.h5.partial exists from an interrupted run; pass --resume"):
        RecordingWriter(tmp_path / "b.h5", META)
    with pytest.raises(UserError, match=r"nothing to resume: .*c.h5.partial does not exist"):
        RecordingWriter(tmp_path / "c.h5", META, resume=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.h5", partial_path(tmp_path / "b.h5").name]


def _partial(tmp_path, edit) -> Path:
    """A partial of two batches, changed by `edit(h5py.File)` and sealed again."""
    from icrl_interp.recording.format import partial_path

    _writer(tmp_path / "a.h5", range(2)).close()
    part = partial_path(tmp_path / "a.h5")
    with h5py.File(part, "r+") as f:
        edit(f)
    with h5py.File(part, "r+") as f:
        seal(f)
    return part


@pytest.mark.parametrize("edit, words", [
    (lambda f: f.__delitem__("progress"), "has no /progress (not a partial recording)"),
    (lambda f: f["progress"].__setitem__(0, 3 * B), f"is corrupt (/progress says {3 * B} prompts, but"),
    (lambda f: f["progress"].__setitem__(0, -1), "is corrupt (/progress says -1 prompts"),
])
def test_resuming_a_partial_whose_progress_is_missing_or_wrong_is_refused(tmp_path, edit, words):
    from icrl_interp.recording.format import RecordingWriter

    from .test_recording_integrity import META

    part = _partial(tmp_path, edit)
    before = part.read_bytes()
    with pytest.raises(UserError, match=re.escape(words)) as info:
        RecordingWriter(tmp_path / "a.h5", META, resume=True)
    assert "cannot resume" in str(info.value) and "\n" not in str(info.value)
    assert part.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [part.name]


def test_a_batch_must_match_the_recording(tmp_path):
    w = _writer(tmp_path / "a.h5", range(1))
    batch = {"prompts/z": np.zeros((B, 17, 7)), "tasks/P": np.zeros((B - 1, 6, 6))}
    with pytest.raises(ValueError, match="disagree on the batch size"):
        w.write_batch(batch)
    with pytest.raises(UserError, match=r"prompts/z: batch has per-prompt shape \(17, 8\), the recording has \(17, 7\)"):
        w.write_batch({"prompts/z": np.zeros((B, 17, 8))})
    assert w.n_done == B
    w.close()


def test_resuming_a_partial_whose_string_attributes_changed_is_refused(tmp_path):
    """A flip inside a string attribute's text (here `created`, which no identity check reads) is caught
    by the heap digest before the resume copies anything."""
    from icrl_interp.recording.format import RecordingWriter, partial_path

    from .test_recording_integrity import META

    _writer(tmp_path / "a.h5", range(2)).close()
    part = partial_path(tmp_path / "a.h5")
    raw = bytearray(part.read_bytes())
    at = raw.index(META["created"].encode())
    raw[at + 3] ^= 0x01  # "2026" -> "2027"
    part.write_bytes(bytes(raw))
    with pytest.raises(UserError, match=r"cannot resume: .*a\.h5\.partial: corrupt recording \(the HDF5 global heap"):
        RecordingWriter(tmp_path / "a.h5", META, resume=True)
    assert part.read_bytes() == bytes(raw)


def test_the_old_partial_is_closed_before_its_fresh_copy_replaces_it(tmp_path, monkeypatch):
    """The resume copies the partial's finished rows into a fresh file and renames that over the partial:
    by then nothing holds the old file open (an open file cannot be replaced everywhere, and no handle
    of it may outlive the rename)."""
    import os

    from icrl_interp.recording.format import RecordingWriter, partial_path

    from .test_recording_integrity import META

    _writer(tmp_path / "a.h5", range(2)).close()
    part = partial_path(tmp_path / "a.h5")
    real = os.replace
    seen = []

    def replace(a, b):
        seen.append((Path(b).name, sorted(Path(fid.name.decode()).name
                                          for fid in h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE))))
        return real(a, b)

    monkeypatch.setattr(os, "replace", replace)
    w = RecordingWriter(tmp_path / "a.h5", META, resume=True)
    assert seen == [(part.name, [])]
    w.close()


def test_a_resume_names_differing_values_only_when_both_are_numbers(tmp_path):
    from icrl_interp.recording.format import RecordingWriter

    from .test_recording_integrity import META

    _writer(tmp_path / "a.h5", range(2)).close()
    with pytest.raises(UserError) as info:
        RecordingWriter(tmp_path / "a.h5", {**META, "seed": "3"}, resume=True)  # a string now, the number 3 there
    assert str(info.value).endswith("it was recorded with a different seed")
    with pytest.raises(UserError) as info:
        RecordingWriter(tmp_path / "a.h5", {**META, "seed": 4}, resume=True)
    assert str(info.value).endswith("it was recorded with a different seed (3 there, 4 now)")


def test_a_corrupt_chunk_index_is_refused_when_the_file_is_opened(finished, tmp_path):
    """Opening reads every dataset's chunk index (`get_num_chunks`), so a damaged one is refused at once,
    before any analysis reads a row (in a child process: a corrupt file must fail, never hang)."""
    import subprocess
    import sys

    raw = finished.read_bytes()
    sigs = [s for s in (b"EAHD", b"EAIB", b"FAHD", b"BTHD", b"BTIN") if s in raw]
    assert sigs
    bad = _damaged(finished, tmp_path / "bad.h5", flip=raw.index(sigs[0]) + 10)
    code = "import sys\nfrom icrl_interp.recording.format import Recording\nRecording(sys.argv[1]).close()"
    env = {**__import__("os").environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-c", code, str(bad)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1 and "UserError" in done.stderr and "bad.h5" in done.stderr.splitlines()[-1]
