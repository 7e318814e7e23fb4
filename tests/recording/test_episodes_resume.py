"""Resumed and sharded episode recordings (`record_episodes(resume=True, shards=K)`): an interrupted run resumes
from its last complete batch to exactly the uninterrupted recording (a torn batch past /progress dropped, the
random-init copy and a model's own random draws the same), a resume of another run is refused in one line
leaving the partial file as it was, K shards joined by a master hold exactly the single file's datasets and read
back alike, and the final path only ever holds a complete, fsynced file. A real SIGKILL of a forked run:
test_episodes_kills.py."""
from __future__ import annotations

import itertools
import os
import re

import h5py
import numpy as np
import psutil
import pytest
import torch

from icrl_interp.analyzers.episode_recording import open_episode_recording
from icrl_interp.core.errors import UserError
from icrl_interp.recording import episodes as rec_eps
from icrl_interp.recording import shards
from icrl_interp.recording.format import Recording, RecordingWriter, partial_path

from .test_episodes_record import UserModel, episodes, model

H = 5  # histories of test_episodes_record.episodes(); batches of 2: [0, 2), [2, 4), [4, 5)


class Noisy(UserModel):
    """A user's model that draws random numbers in its forward pass (noise on its logits). Each one leaves torch's
    generator in another state (the weights are the same), as separate processes would."""

    runs = itertools.count(100)

    def __init__(self):
        super().__init__()
        torch.manual_seed(next(self.runs))

    def forward(self, x):
        y = super().forward(x)
        return y + torch.rand(y.shape)


KINDS = {
    "ad": lambda: (model(), dict(patterns=True, baseline="random-init", baseline_seed=3)),
    "noisy": lambda: (Noisy(), dict(token_format="ad-step", context=4, baseline="random-init",
                                    roles={"resid_post": "layers.{layer}"})),
}


def _record(kind, out, ep=None, **kw):
    m, args = KINDS[kind]()
    args = {**args, "batch_size": 2, "progress": False, **kw}
    return rec_eps.record_episodes(m, episodes() if ep is None else ep, out, **args)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted single-file recording of each kind."""
    d = tmp_path_factory.mktemp("episodes-ref")
    return {kind: _record(kind, d / f"{kind}.h5").path for kind in KINDS}


def _datasets(rec: Recording) -> dict:
    out = {}
    rec.f.visititems(lambda n, o: out.__setitem__(n, (o[()], dict(o.attrs))) if isinstance(o, h5py.Dataset) else None)
    return out


def _same_recording(a, b) -> None:
    """Every dataset and its attributes bit for bit (exact: the same batches of the same histories through the same
    models; NaN where the other has NaN, on padding), and the root attributes but the file's own (`created`,
    `integrity`, a master's `shards`)."""
    own = ("created", "integrity", "shards")
    with Recording(a) as x, Recording(b) as y:
        one, two = _datasets(x), _datasets(y)
        assert one.keys() == two.keys()
        for name, (data, attrs) in one.items():
            other = two[name][0]
            assert data.dtype == other.dtype and np.array_equal(data, other, equal_nan=data.dtype.kind == "f"), name
            assert attrs == two[name][1], name
        assert {k: x.attr(k) for k in x.f.attrs if k not in own} == {k: y.attr(k) for k in y.f.attrs if k not in own}


def _interrupted(monkeypatch, at_call: int, run) -> None:
    """`run()` stopped by a KeyboardInterrupt at its `at_call`-th batch write (before that batch is written)."""
    real, calls = RecordingWriter.write_batch, []

    def write_batch(self, *a, **k):
        calls.append(1)
        if len(calls) == at_call:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        m.setattr(RecordingWriter, "write_batch", write_batch)
        run()


def _progress(path) -> int:
    with h5py.File(path, "r") as f:
        return int(f["progress"][0])


def _row_counts(path) -> set[int]:
    counts = set()
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: counts.add(o.shape[0]) if isinstance(o, h5py.Dataset) and o.maxshape
                     and o.maxshape[0] is None else None)
    return counts


def _stop(*_):
    raise KeyboardInterrupt


def _tear(path, rows: int) -> None:
    """What a writer killed between a batch's data and its /progress leaves: `rows` more rows of garbage in every
    per-history dataset, /progress not moved."""
    with h5py.File(path, "r+") as f:
        grown = []
        f.visititems(lambda n, o: grown.append(o) if isinstance(o, h5py.Dataset) and o.maxshape
                     and o.maxshape[0] is None else None)
        for ds in grown:
            ds.resize(ds.shape[0] + rows, axis=0)
            ds[-rows:] = np.full((rows, *ds.shape[1:]), 7, dtype=ds.dtype)


@pytest.mark.parametrize("kind", list(KINDS))
def test_an_interrupted_run_resumes_from_its_last_complete_batch_to_the_uninterrupted_recording(
        reference, tmp_path, monkeypatch, kind):
    """Kills: the interrupted run deleting its partial file; the resume keeping the rows a torn batch left past
    /progress (its copy not cut back); the model's own random draws not seeded per batch (`noisy`: torch's generator
    is in another state in each run); anything else that makes the resumed rows differ."""
    out = tmp_path / "r.h5"
    _interrupted(monkeypatch, 2, lambda: _record(kind, out))
    part = partial_path(out)
    assert not out.exists() and _progress(part) == 2  # one batch kept, nothing at the final path
    assert str(part) not in {f.path for f in psutil.Process().open_files()}  # and the writer closed it
    _tear(part, 2)
    assert _row_counts(part) == {4}
    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):  # a resume stopped before its first batch
        m.setattr(rec_eps._Job, "batch", _stop)
        _record(kind, out, resume=True)
    assert _row_counts(part) == {2} and _progress(part) == 2  # the torn batch is gone
    summary = _record(kind, out, resume=True)
    assert summary.resumed_from == 2 and summary.path == out
    _same_recording(reference[kind], out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.h5"]  # no .partial, scratch file or lock
    if kind == "noisy":  # the noise is there: the recording is not the noiseless forward pass
        with Recording(out) as rec:
            clean = rec_eps.record_episodes(UserModel(), episodes(), tmp_path / "clean.h5", token_format="ad-step",
                                            context=4, baseline="none", progress=False, batch_size=2,
                                            roles={"resid_post": "layers.{layer}"})
            with Recording(clean.path) as c:
                assert not np.allclose(rec.array("outputs/logits")[episodes().valid],
                                       c.array("outputs/logits")[episodes().valid], atol=1e-3)


def test_a_run_stopped_before_publishing_resumes_by_publishing_without_a_forward_pass(reference, tmp_path,
                                                                                      monkeypatch):
    """Also: a run stopped before its first batch leaves nothing."""
    out = tmp_path / "r.h5"
    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        m.setattr(rec_eps._Job, "batch", _stop)
        _record("ad", out)
    assert list(tmp_path.iterdir()) == []
    with monkeypatch.context() as m, pytest.raises(KeyboardInterrupt):
        m.setattr(RecordingWriter, "finish", _stop)
        _record("ad", out)
    assert _progress(partial_path(out)) == H and not out.exists()
    summary = _record("ad", out, resume=True)
    assert (summary.resumed_from, summary.forward_seconds) == (H, 0.0)  # exact: no batch ran
    _same_recording(reference["ad"], out)


def _perturbed() -> torch.nn.Module:
    m = model()
    with torch.no_grad():
        next(m.parameters()).view(-1)[0] += 1e-3
    return m


OTHER_RUNS = {
    "histories_sha256": dict(ep=episodes(seed=1)),
    "model_sha256": dict(model=_perturbed),
    "batch_size": dict(batch_size=1),
    "seed": dict(baseline_seed=4),
    "baseline": dict(baseline="none"),
    "patterns": dict(patterns=False),
    "token_format": dict(stride=2),
}


def test_a_resume_of_another_run_is_refused_in_one_line_and_leaves_the_partial_file(tmp_path, monkeypatch):
    """Other histories, weights, batches, baseline, hooks or format than the partial file's: each refused (whatever
    were resumed would be the recording of neither run), naming what differs; the same run still resumes."""
    out = tmp_path / "r.h5"
    _interrupted(monkeypatch, 2, lambda: _record("ad", out))
    before = partial_path(out).read_bytes()
    for key, change in OTHER_RUNS.items():
        change = dict(change)
        make = change.pop("model", None)
        with pytest.raises(UserError, match=rf"^cannot resume \S+r\.h5\.partial: it was recorded with a different "
                                            rf"{key}\b") as e:
            if make is None:
                _record("ad", out, resume=True, **change)
            else:
                rec_eps.record_episodes(make(), episodes(), out, patterns=True, baseline_seed=3, batch_size=2,
                                        progress=False, resume=True)
        assert "\n" not in str(e.value)
        assert partial_path(out).read_bytes() == before and not out.exists()
    with h5py.File(partial_path(out), "r+") as f:  # /progress vouching for half a batch (edited, damaged)
        f["progress"][0] = 1
    with pytest.raises(UserError, match="1 histories done is not a whole number of batches of 2"):
        _record("ad", out, resume=True)
    partial_path(out).write_bytes(before)
    assert _record("ad", out, resume=True).resumed_from == 2


class NaNLater(UserModel):
    """NaN logits from its `calls`-th forward pass on (a model that goes wrong midway through a run)."""

    calls = 0

    def forward(self, x):
        type(self).calls += 1
        y = super().forward(x)
        return y * torch.nan if type(self).calls >= 2 else y


def test_a_batch_refused_midway_leaves_no_new_file_and_keeps_a_resumed_ones_batches(tmp_path, monkeypatch):
    """A NaN in the second batch: a new recording is deleted (resuming would refuse the batch again), a resumed one
    keeps the checked batches it had."""
    args = dict(token_format="ad-step", context=4, baseline="none", roles={"resid_post": "layers.{layer}"},
                batch_size=2, progress=False)
    out = tmp_path / "r.h5"
    with pytest.raises(UserError, match="NaN"):
        rec_eps.record_episodes(NaNLater(), episodes(), out, **args)
    assert list(tmp_path.iterdir()) == []
    NaNLater.calls = -10
    _interrupted(monkeypatch, 2, lambda: rec_eps.record_episodes(NaNLater(), episodes(), out, **args))
    NaNLater.calls = 1
    with pytest.raises(UserError, match="NaN"):
        rec_eps.record_episodes(NaNLater(), episodes(), out, resume=True, **args)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.h5.partial"] and _progress(partial_path(out)) == 2


def test_shards_hold_the_single_files_datasets_and_read_back_alike(reference, tmp_path):
    """3 shards (written in this process; forked workers: tests/commands/test_record_episodes.py and
    test_episodes_kills.py): the master reads (`open_episode_recording`, what `analyze` opens) exactly as the single
    file."""
    out = tmp_path / "s.h5"
    summary = _record("ad", out, shards=3, workers=0)
    assert summary.path == out and summary.n_histories == H
    _same_recording(reference["ad"], out)
    with Recording(out) as rec:
        assert [e["file"] for e in rec.attr("shards")] == [p.name for p in shards.shard_paths(out, 3)]
    with open_episode_recording(reference["ad"]) as one, open_episode_recording(out) as two:
        assert all(np.array_equal(getattr(one.episodes, n), getattr(two.episodes, n)) for n in ("actions", "valid"))
        assert np.array_equal(one.logits, two.logits, equal_nan=True) and one.layers.keys() == two.layers.keys()
        assert all(np.array_equal(one.random_layers[l][()], two.random_layers[l][()], equal_nan=True)
                   for l in one.layers)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert not any(n.endswith((".partial", ".lock", ".tmp")) for n in names), names


def test_an_interrupted_sharded_run_resumes_and_a_complete_shard_of_another_run_is_refused(reference, tmp_path,
                                                                                            monkeypatch):
    """Batches of 1, shards [0, 2) and [2, 5): stopped in shard 1 after its first batch, the resume keeps shard 0,
    continues shard 1 and gives the single file; with shard 0 complete, a resume over other histories is refused
    (a complete shard proves to be this run's, as a partial file does)."""
    ref = tmp_path / "ref.h5"
    _record("ad", ref, batch_size=1)
    out = tmp_path / "s.h5"
    one, two = shards.shard_paths(out, 2)
    _interrupted(monkeypatch, 4, lambda: _record("ad", out, batch_size=1, shards=2, workers=0))
    assert one.exists() and _progress(partial_path(two)) == 1 and not out.exists()
    for refused in (dict(ep=episodes(seed=1)), dict(baseline_seed=4)):
        with pytest.raises(UserError, match=rf"^shard 0 \(\S+\): cannot resume: {re.escape(str(one))} was recorded "):
            _record("ad", out, batch_size=1, shards=2, workers=0, resume=True, **refused)
    summary = _record("ad", out, batch_size=1, shards=2, workers=0, resume=True)
    assert summary.resumed_from == 2 + 1
    _same_recording(ref, out)
    out.unlink()  # as a run killed while publishing leaves it: both shards complete, no master
    with pytest.raises(UserError, match="different histories_sha256"):
        _record("ad", out, batch_size=1, shards=2, workers=0, resume=True, ep=episodes(seed=1))
    summary = _record("ad", out, batch_size=1, shards=2, workers=0, resume=True)
    assert (summary.resumed_from, summary.forward_seconds) == (H, 0.0)  # exact: no batch ran
    _same_recording(ref, out)


@pytest.mark.parametrize("count", [1, 2])
def test_the_final_paths_appear_only_by_renaming_a_complete_fsynced_file(tmp_path, monkeypatch, count):
    """Every file (the recording, each shard, the master) is fsynced under its temporary name, then renamed onto a
    free final path, then its directory fsynced; no final path exists while a batch is written. Kills a removed
    fsync and a writer that publishes (or writes) at the final path before the file is complete."""
    out = tmp_path / "r.h5"
    finals = [out, *(shards.shard_paths(out, count) if count > 1 else [])]
    events = []
    real_fsync, real_replace, real_write = os.fsync, os.replace, RecordingWriter.write_batch

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(a, b):
        if str(b) in map(str, finals):
            with Recording(a) as r:  # what is renamed into place is a complete, sealed recording
                assert r.attr("complete") and r.attr("integrity") is not None
        events.append(("replace", str(a), str(b), os.path.exists(b)))
        return real_replace(a, b)

    def write_batch(self, *a, **k):
        assert not self.path.exists() and not out.exists()  # the file being written, and the master
        return real_write(self, *a, **k)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(RecordingWriter, "write_batch", write_batch)
    _record("ad", out, shards=count, workers=0)
    for final in finals:
        into = [i for i, e in enumerate(events) if e[0] == "replace" and e[2] == str(final)]
        assert len(into) == 1, (final, events)
        at = into[0]
        _, source, _, existed = events[at]
        assert not existed
        assert ("fsync", source) in events[:at]  # the data is on disk before the rename
        assert ("fsync", str(tmp_path)) in events[at + 1:]  # and the new directory entry after it
