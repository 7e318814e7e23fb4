"""Input discovery (the one helper `analyze` and `report` share) and input kinds."""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from icrl_interp.core import heap, threads
from icrl_interp.analyzers import inputs
from icrl_interp.core.errors import UserError

from . import analyzer_data as D


def _checkpoint(path: Path, weights: bool = True) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    if weights:
        (path / "model.safetensors").write_bytes(b"x")
    return path


def test_discover_walks_directories_like_the_report_expects(tmp_path):
    root = tmp_path / "in"
    root.mkdir()
    (root / "rec.h5").write_bytes(b"x")
    (root / "b.hdf5").write_bytes(b"x")
    (root / "notes.txt").write_text("not an input")
    _checkpoint(root / "runs" / "a" / "checkpoints" / "step_000010")
    _checkpoint(root / "runs" / "a" / "checkpoints" / "step_000020", weights=False)  # being written
    (root / "runs" / "a" / "checkpoints" / "step_000030").mkdir()  # empty: still a checkpoint (fails later)
    theta = _checkpoint(root / "theta")
    (theta / "inside.h5").write_bytes(b"x")  # a checkpoint directory is not entered
    (root / "cache").mkdir()
    (root / "cache" / "old.h5").write_bytes(b"x")
    (root / ".hidden").mkdir()
    (root / ".hidden" / "x.h5").write_bytes(b"x")
    (tmp_path / "empty").mkdir()
    half = root / "half.h5.partial"
    half.write_bytes(b"x")
    found = inputs.discover([root, half, tmp_path / "nope", tmp_path / "empty", root / "rec.h5"])
    assert [(f.kind, f.path.relative_to(tmp_path).as_posix(), f.problem) for f in found] == [
        ("recording", "in/b.hdf5", ""),
        ("recording", "in/rec.h5", ""),
        ("checkpoint", "in/runs/a/checkpoints/step_000010", ""),
        ("checkpoint", "in/runs/a/checkpoints/step_000020", ""),
        ("checkpoint", "in/runs/a/checkpoints/step_000030", ""),
        ("checkpoint", "in/theta", ""),
        ("file", "in/half.h5.partial", ""),
        ("missing", "nope", "does not exist"),
        ("missing", "empty", "holds no checkpoints or recordings"),
    ]  # in/rec.h5 named again: found once
    assert len(inputs.discover([root / "rec.h5", root / "rec.h5"], unique=False)) == 2


def test_a_directory_with_a_config_is_one_checkpoint_unless_it_is_a_run(tmp_path):
    broken = _checkpoint(tmp_path / "broken", weights=False)
    assert [(f.kind, f.path) for f in inputs.discover([broken])] == [("checkpoint", broken)]
    run = tmp_path / "run"
    _checkpoint(run / "checkpoints" / "step_000001")
    (run / "config.json").write_text("{}")  # a training run's own config
    assert [f.path.name for f in inputs.discover([run])] == ["step_000001"]


def test_expand_inputs_keeps_what_holds_nothing_for_the_analyzer_to_refuse(tmp_path):
    (tmp_path / "empty").mkdir()
    assert inputs.expand_inputs([str(tmp_path / "empty"), str(tmp_path / "nope")]) == [
        str(tmp_path / "empty"), str(tmp_path / "nope")]
    with pytest.raises(UserError, match="not a checkpoint"):
        inputs.input_kind(tmp_path / "empty")


def test_input_kinds(tmp_path):
    rec = D.write_recording(tmp_path / "r.h5", "sarsa", n_prompts=4, batch=4)
    ck = D.write_checkpoint(tmp_path / "ck", D.config_for("sarsa"), D.theta_params(D.config_for("sarsa")))
    assert inputs.input_kind(rec) == "recording"
    assert inputs.input_kind(ck) == inputs.input_kind(ck / "model.safetensors") == "checkpoint"
    (tmp_path / "tl.safetensors").write_bytes(b"x")
    assert inputs.input_kind(tmp_path / "tl.safetensors") == "tl-weights"
    assert inputs.is_checkpoint(ck) and not inputs.is_checkpoint(rec)
    (tmp_path / "junk").write_bytes(b"junk")
    with pytest.raises(UserError, match="neither"):
        inputs.input_kind(tmp_path / "junk")


def test_family_dims_and_layouts_of_configs():
    from icrl_interp.families import actor_critic

    assert inputs.family_dims("actor-critic", actor_critic.layout(4, 2)) == (4, 2)
    assert inputs.family_dims("linear-td", D.layout_of(D.config_for("linear-td"))) == (3, None)
    with pytest.raises(UserError, match="not a softmax-td layout"):
        inputs.family_dims("softmax-td", actor_critic.layout(4, 2))
    cfg = D.config_for("softmax-td")
    assert inputs.layout_from_config(cfg) == inputs.layout_from_config(cfg.to_dict()) == cfg.model.layout


def _readers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("icrl-interp-reader")]


@pytest.mark.parametrize("cores", [1, 2])
def test_chunked_reading_with_read_ahead_returns_the_file_contents(tmp_path, monkeypatch, cores):
    """With a core to spare a reader thread reads the next chunk while this one is used (and is gone after);
    on one core nothing but the caller reads. Both give the stored numbers."""
    from icrl_interp.recording.format import Recording

    monkeypatch.setattr(threads, "allowed_cores", lambda: cores)
    monkeypatch.delenv(threads.ENV, raising=False)
    p = D.write_recording(tmp_path / "r.h5", "softmax-td", n_prompts=70, batch=20, bf16=True)
    with Recording(p) as rec:
        paths = ["acts/blocks.0.attn.hook_pattern", "prompts/z", "reference/td_errors"]
        ahead = inputs.ReadAhead(rec.path, [rec.f[x] for x in paths])
        assert len(ahead.offset) > 0 and np.all(ahead.size > 0)
        ahead.hint(0, 30)
        ahead.close()
        seen = 0
        trims = []
        slack = []

        class Policy:  # the heap's trimming policy, consulted once after each chunk (`heap.OnGrowth`)
            def __init__(self, nbytes):
                slack.append(nbytes)

            def __call__(self):
                trims.append(seen)

        monkeypatch.setattr(heap, "OnGrowth", Policy)
        monkeypatch.setattr(inputs, "TRIM_SLACK", 0.25)  # the optional policy; the default trims every chunk
        for start, stop, data in inputs.iter_chunks(rec, paths, rows=16):
            assert stop - start == min(16, 70 - start)
            assert len(_readers()) == (cores > 1)
            assert len(trims) == start // 16  # asked once after each chunk, when the caller is done with it
            # exact: both read the same stored numbers
            np.testing.assert_array_equal(data[paths[0]], rec.read("blocks.0.attn.hook_pattern", start, stop))
            assert data[paths[0]].dtype == np.float32  # bfloat16 decoded
            np.testing.assert_array_equal(data["prompts/z"], rec.array("prompts/z", start, stop))
            seen += stop - start
        assert seen == 70 and len(trims) == 5
        # its slack: TRIM_SLACK of one chunk's arrays as read (exact: byte counts)
        assert slack == [int(inputs.TRIM_SLACK * 16 * sum(rec.f[x][:1].nbytes for x in paths))]
        assert not _readers()
    assert inputs.chunk_rows(10, 35, 100) == 2 and inputs.chunk_rows(1, 2**20, 7) == 8


def test_a_read_error_of_the_reader_thread_reaches_the_caller_at_its_chunk(tmp_path, monkeypatch):
    from icrl_interp.recording.format import Recording

    monkeypatch.setattr(threads, "allowed_cores", lambda: 2)
    monkeypatch.delenv(threads.ENV, raising=False)
    p = D.write_recording(tmp_path / "r.h5", "softmax-td", n_prompts=70, batch=20)
    import h5py

    read = h5py.Dataset.__getitem__

    def failing(self, key):
        if isinstance(key, slice) and key.start == 32:
            raise OSError("can't read data (bad chunk)")
        return read(self, key)

    monkeypatch.setattr(h5py.Dataset, "__getitem__", failing)
    got = []
    with Recording(p) as rec, pytest.raises(OSError, match="bad chunk"):
        for start, _, _ in inputs.iter_chunks(rec, ["prompts/z"], rows=16):
            got.append(start)
    assert got == [0, 16]  # the chunks before the bad one were analyzed; none after it
    assert not _readers()


def test_heap_release_runs_where_the_c_library_has_malloc_trim():
    import platform

    glibc = platform.libc_ver()[0] == "glibc"
    assert heap.release_free_memory() is glibc  # glibc (Linux, CI): trimmed; elsewhere a no-op that says so
    assert heap.release_free_memory() is glibc


def _chunks_of_a_small_recording(tmp_path) -> int:
    """The chunks `iter_chunks` yields over a 40-prompt linear-td recording, 10 prompts at a time."""
    from icrl_interp.recording.format import Recording

    p = D.write_recording(tmp_path / "r.h5", "linear-td", n_prompts=40, batch=20)
    with Recording(p) as rec:
        return sum(1 for _ in inputs.iter_chunks(rec, ["prompts/z"], rows=10))


def test_by_default_the_heap_is_trimmed_whenever_its_free_bytes_grew(tmp_path, monkeypatch):
    """The live RSS and speed targets (docs/benchmarks.md) chose the default: the growth policy with no slack."""
    assert inputs.TRIM_SLACK == 0.0  # exact: the documented default
    made, asked = [], []

    def policy(nbytes):
        made.append(nbytes)
        return lambda: asked.append(1)

    monkeypatch.setattr(heap, "OnGrowth", policy)
    assert _chunks_of_a_small_recording(tmp_path) == 4 and made == [0] and len(asked) == 4


def test_trim_slack_none_trims_after_every_chunk(tmp_path, monkeypatch):
    trims = []
    monkeypatch.setattr(inputs, "TRIM_SLACK", None)
    monkeypatch.setattr(heap, "release_free_memory", lambda: trims.append(1) or True)
    monkeypatch.setattr(heap, "OnGrowth", lambda nbytes: pytest.fail("None trims every chunk"))
    assert _chunks_of_a_small_recording(tmp_path) == 4 and len(trims) == 4


def test_read_ahead_spans_are_the_stored_chunks_and_hints_cover_the_prompts_asked_for(tmp_path, monkeypatch):
    """`chunk_spans` walks the chunk index once (`chunk_iter`) or chunk by chunk (the fallback): both give every
    stored chunk's prompts and bytes, checked against the chunk's own bytes in the file; a hint asks the OS for
    ranges that hold every chunk of the prompts asked for."""
    from icrl_interp.recording.format import Recording

    p = D.write_recording(tmp_path / "r.h5", "softmax-td", n_prompts=70, batch=20, bf16=True)
    with Recording(p) as rec:
        paths = ["acts/blocks.0.attn.hook_pattern", "prompts/z", "reference/td_errors"]
        raw = p.read_bytes()
        for x in paths:
            ds = rec.f[x]
            walked = inputs.chunk_spans(ds)

            class OneByOne:  # the dataset as an h5py without chunk_iter sees it
                chunks, id = ds.chunks, type("Id", (), {"get_num_chunks": ds.id.get_num_chunks,
                                                         "get_chunk_info": ds.id.get_chunk_info})()
            assert sorted(walked) == sorted(inputs.chunk_spans(OneByOne())) and len(walked) == ds.id.get_num_chunks()
            for first, last, offset, size in walked:
                assert last - first == ds.chunks[0] and first % ds.chunks[0] == 0
                _, stored = ds.id.read_direct_chunk((first,) + (0,) * (ds.ndim - 1))
                assert raw[offset : offset + size] == stored  # the span is that chunk's bytes in the file
        asked = []
        monkeypatch.setattr(inputs.os, "posix_fadvise", lambda fd, off, n, advice: asked.append((off, off + n)))
        ahead = inputs.ReadAhead(rec.path, [rec.f[x] for x in paths])
        for start, stop in [(0, 16), (25, 41), (60, 70)]:
            asked.clear()
            ahead.hint(start, stop)
            for x in paths:
                for first, last, offset, size in inputs.chunk_spans(rec.f[x]):
                    if first < stop and last > start:
                        assert any(a <= offset and offset + size <= b for a, b in asked), (x, first, start, stop)
        ahead.close()
