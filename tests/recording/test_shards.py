"""Sharded recordings (`record --shards K`): shard files joined by a master of virtual datasets.

A sharded recording must hold exactly the single file's datasets and analyze to the same JSON; a
shard killed mid-run resumes on its own; every reader of the master checks every shard."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from helpers import TASK, theta_star_setup

import icrl_interp
from icrl_interp.models import checkpoint
from icrl_interp.recording import prompts, recorder, shards
from icrl_interp.core.errors import UserError
from icrl_interp.recording.format import Recording, partial_path

N, BATCH = 40, 8  # five batches: three shards of 1, 2 and 2 batches


@pytest.fixture(scope="module")
def setup():
    return theta_star_setup(8)


def _record(setup, out, seed=3, **kw):
    model, cfg, spec = setup
    src = recorder.PromptSource(config=cfg, n_total=N, seed=seed)
    return recorder.record(model, out, spec, src, batch_size=BATCH, progress=False, baseline="random-init", **kw)


@pytest.fixture(scope="module")
def pair(setup, tmp_path_factory):
    """(single file, sharded master): the same prompts, the shards written by forked workers."""
    d = tmp_path_factory.mktemp("pair")
    _record(setup, d / "one.h5")
    summary = _record(setup, d / "sh.h5", shards=3, workers=2)
    assert summary.n_prompts == N and summary.path == d / "sh.h5"
    return d / "one.h5", d / "sh.h5"


def _datasets(path) -> dict:
    out = {}
    with Recording(path) as rec:
        rec.f.visititems(lambda n, o: out.__setitem__(n, (o[()], dict(o.attrs))) if isinstance(o, h5py.Dataset)
                         else None)
    return out


def _same_datasets(a, b) -> None:
    one, two = _datasets(a), _datasets(b)
    assert set(one) == set(two)
    for name, (data, attrs) in one.items():
        # exact: the shards run the same batches of the same prompts as the single file
        assert data.dtype == two[name][0].dtype and np.array_equal(data, two[name][0]), name
        assert attrs == two[name][1], name


def test_ranges_are_contiguous_whole_batches():
    assert shards.batch_ranges(5, 3) == [(0, 1), (1, 3), (3, 5)]
    assert shards.batch_ranges(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    with pytest.raises(UserError, match="splits into 1 to 5 shards"):
        shards.batch_ranges(5, 6)
    assert [p.name for p in shards.shard_paths("x/r.h5", 12)][::11] == ["r.shard-00-of-12.h5", "r.shard-11-of-12.h5"]


def test_the_plan_gives_each_shard_its_file_attribute_and_prompts(tmp_path):
    """`shards.plan`: one entry per shard with its file, its `shard` attribute, the whole run's batches it
    holds (prompt i of the run is row i of z here) and what an earlier run left of it."""
    z = np.arange(10.0)[:, None, None] * np.ones((10, 3, 2))
    whole = prompts.PromptSource(arrays={"prompts/z": z}, n_total=10)
    out = tmp_path / "r.h5"
    parts = shards.plan(out, whole, 4, 3, resume=False)  # batches [0, 4), [4, 8), [8, 10): the last one short
    assert [p.path for p in parts] == shards.shard_paths(out, 3) and [p.state for p in parts] == ["new"] * 3
    assert [p.meta for p in parts] == [shards.shard_meta(i, 3, i, 4 * i, 10, 4) for i in range(3)]
    assert [p.meta["first_prompt"] for p in parts] == [0, 4, 8]
    assert [p.source.n_total for p in parts] == [4, 4, 2]
    last = parts[2].source
    assert last.batch(0, 0, 2)["prompts/z"][:, 0, 0].tolist() == [8.0, 9.0]  # exact: the row numbers
    assert last.task_ids(0, 2).tolist() == [8, 9]
    # messages name a batch's place in the whole run, also when the short last shard records in batches of 2
    assert whole.where(2, 8, 10, 4) == "batch 3 of 3 (prompts 8..9)"
    assert last.where(0, 0, 2, 2) == "batch 3 of 3 (prompts 8..9)"
    assert parts[1].source.where(0, 0, 4, 4) == "batch 2 of 3 (prompts 4..7)"
    parts[0].path.touch()
    partial_path(parts[1].path).touch()
    assert [p.state for p in shards.plan(out, whole, 4, 3, resume=True)] == ["done", "resume", "new"]


def test_a_nan_in_the_short_last_shard_names_its_batch_in_the_whole_run(tmp_path):
    from .test_budget import _nan_from

    with pytest.raises(UserError, match=r"^shard 2 \(.*r\.shard-2-of-3\.h5\): non-finite activations: the model's hook "
                                        r"blocks\.0\.hook_resid_post holds NaN in batch 3 of 3 \(prompts 8\.\.9\)$"):
        recorder.record_model(_nan_from(3), "linear-td", tmp_path / "r.h5", task_options=TASK,  # 3rd forward: shard 2
                              probe={"resid_post": ["embed"]}, tasks=10, batch_size=4, baseline="none", progress=False,
                              shards=3, workers=0)


def test_sharded_recording_holds_and_analyzes_to_the_single_file(pair):
    one, sharded = pair
    _same_datasets(one, sharded)
    parts = shards.shard_paths(sharded, 3)
    sizes = []
    for i, p in enumerate(parts):
        with Recording(p) as rec:  # each shard is an ordinary recording of its batches
            sizes.append(rec.n_prompts)
            assert rec.attr("shard")["index"] == i
    assert sizes == [8, 16, 16]
    with Recording(sharded) as m, Recording(one) as s:
        assert m.n_prompts == N and m.attr("n_total") == N
        assert [e["file"] for e in m.attr("shards")] == [p.name for p in parts]
        assert m.f["acts/blocks.1.hook_resid_post"].is_virtual
        skip = {"created", "integrity", "shards"}
        assert {k: m.attr(k) for k in m.f.attrs if k not in skip} == {k: s.attr(k) for k in s.f.attrs if k not in skip}
    a, b = icrl_interp.analyze(one, progress=False), icrl_interp.analyze(sharded, progress=False)
    assert a.pop("source") == str(one) and b.pop("source") == str(sharded)
    assert a == b  # exact: the same analysis of the same numbers


def test_master_reads_its_shards_from_its_own_directory(pair, tmp_path, monkeypatch):
    _, sharded = pair
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    for p in [sharded, *shards.shard_paths(sharded, 3)]:
        shutil.copy2(p, moved / p.name)
    monkeypatch.chdir(tmp_path)  # relative shard names resolve beside the master, not in the working directory
    _same_datasets(pair[0], moved / sharded.name)


def _copy(pair, tmp_path) -> tuple[Path, list[Path]]:
    _, sharded = pair
    for p in [sharded, *shards.shard_paths(sharded, 3)]:
        shutil.copy2(p, tmp_path / p.name)
    return tmp_path / sharded.name, shards.shard_paths(tmp_path / sharded.name, 3)


def test_reader_refuses_a_missing_truncated_or_corrupt_shard(pair, tmp_path):
    master, parts = _copy(pair, tmp_path)
    parts[1].unlink()
    with pytest.raises(UserError, match=f"shard {parts[1]} is missing"):
        Recording(master)
    shutil.copy2(shards.shard_paths(pair[1], 3)[1], parts[1])
    Recording(master).close()
    with open(parts[2], "r+b") as f:  # truncated
        f.truncate(os.path.getsize(parts[2]) // 2)
    with pytest.raises(UserError, match=f"bad shard: {parts[2]}: truncated"):
        Recording(master)
    with pytest.raises(UserError, match="bad shard: .*shard-2-of-3"):
        icrl_interp.analyze(master, progress=False)
    shutil.copy2(shards.shard_paths(pair[1], 3)[2], parts[2])
    raw = bytearray(parts[0].read_bytes())
    raw[20] ^= 0xFF  # inside the superblock (its checksum fails)
    parts[0].write_bytes(bytes(raw))
    with pytest.raises(UserError, match=f"bad shard: {parts[0]}: corrupt HDF5 file"):
        Recording(master)


def test_reader_refuses_a_shard_rewritten_after_the_master(setup, pair, tmp_path):
    master, parts = _copy(pair, tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    _record(setup, other / "sh.h5", seed=4, shards=3, workers=0)  # a whole, valid shard of another run
    shutil.copy2(shards.shard_paths(other / "sh.h5", 3)[1], parts[1])
    with pytest.raises(UserError, match="is not the file the master was made from"):
        Recording(master)


def test_a_killed_shard_resumes_on_its_own(setup, pair, tmp_path, monkeypatch):
    out = tmp_path / "sh.h5"
    parts = shards.shard_paths(out, 3)
    real = recorder.PromptSource.batch

    def dies_at_batch_4(self, index, start, stop):
        if index == 4:  # shard 2's second batch: its first is in its .partial
            raise KeyboardInterrupt
        return real(self, index, start, stop)

    monkeypatch.setattr(recorder.PromptSource, "batch", dies_at_batch_4)
    with pytest.raises(KeyboardInterrupt):
        _record(setup, out, shards=3, workers=0)
    monkeypatch.setattr(recorder.PromptSource, "batch", real)
    assert parts[0].exists() and parts[1].exists() and not parts[2].exists()
    assert partial_path(parts[2]).exists() and not out.exists()  # no master before every shard is complete
    kept = [p.read_bytes() for p in parts[:2]]
    with pytest.raises(UserError, match="pass --resume"):
        _record(setup, out, shards=3, workers=0)
    summary = _record(setup, out, shards=3, resume=True, workers=2)
    assert summary.resumed_from == 8 + 16 + 8  # two finished shards and one batch of the third
    assert [p.read_bytes() for p in parts[:2]] == kept  # finished shards are not rewritten
    assert not partial_path(parts[2]).exists()
    _same_datasets(pair[0], out)
    with pytest.raises(UserError, match="exists; remove it"):
        _record(setup, out, shards=3, resume=True, workers=0)


def test_resume_refuses_a_shard_of_another_split(setup, tmp_path):
    out = tmp_path / "sh.h5"
    _record(setup, out, shards=2, workers=0)
    out.unlink()
    two = shards.shard_paths(out, 2)
    three = shards.shard_paths(out, 3)
    shutil.copy2(two[0], three[0])  # shard 0 of two: batches 0-1, not shard 0 of three (batch 0)
    with pytest.raises(UserError, match="is not shard 0 of this run"):
        _record(setup, out, shards=3, resume=True, workers=0)
    assert not out.exists()


@pytest.mark.parametrize("change, key", [("seed", "seed"), ("checkpoint", "checkpoint_sha256")])
def test_resume_refuses_complete_shards_of_another_run(setup, tmp_path, change, key):
    """Every shard complete and only the master missing: a --resume with other prompts or other weights must not
    publish the old shards as its own recording."""
    out = tmp_path / "sh.h5"
    _record(setup, out, shards=2, workers=0, checkpoint_sha256="a" * 64)
    out.unlink()
    kept = [p.read_bytes() for p in shards.shard_paths(out, 2)]
    other = {"seed": {"seed": 4, "checkpoint_sha256": "a" * 64}, "checkpoint": {"checkpoint_sha256": "b" * 64}}[change]
    with pytest.raises(UserError, match=f"recorded with a different {key}"):
        _record(setup, out, shards=2, resume=True, workers=0, **other)
    assert not out.exists() and [p.read_bytes() for p in shards.shard_paths(out, 2)] == kept


def test_bad_shard_counts_leave_nothing(setup, tmp_path):
    for bad, words in ((0, "positive integer"), (6, "splits into 1 to 5 shards"), (True, "positive integer")):
        with pytest.raises(UserError, match=words):
            _record(setup, tmp_path / "r.h5", shards=bad)
    assert list(tmp_path.iterdir()) == []


def test_a_prompt_file_shards_like_one_file(setup, tmp_path):
    """User prompts (with their own task ids): each shard reads its rows of the file."""
    model, cfg, spec = setup
    batch = cfg.sample(N, np.random.default_rng(7))
    task_id = np.repeat(np.arange(N // 2), 2)[::-1].copy()  # pairs of prompts share a task, ids not the row index
    np.savez(tmp_path / "p.npz", z=batch.prompt.z, state=batch.prompt.states, task_id=task_id)
    for out, kw in ((tmp_path / "one.h5", {}), (tmp_path / "sh.h5", {"shards": 2, "workers": 0})):
        source = prompts.load_prompt_file(tmp_path / "p.npz", cfg, model.layout)
        recorder.record(model, out, spec, source, batch_size=BATCH, progress=False, **kw)
    _same_datasets(tmp_path / "one.h5", tmp_path / "sh.h5")
    with Recording(tmp_path / "sh.h5") as rec:
        np.testing.assert_array_equal(rec.array("/prompts/task_id"), task_id)
        np.testing.assert_array_equal(rec.array("/prompts/z"), batch.prompt.z)  # exact: a copy


def test_record_command_writes_shards_and_master(tmp_path, capsys):
    from icrl_interp import cli

    ck = Path(__file__).resolve().parents[2] / "data" / "checkpoints" / "sarsa"
    out = tmp_path / "r.h5"
    assert cli.main(["record", str(ck), "--out", str(out), "--tasks", "12", "--batch-size", "4", "--shards", "2",
                     "--baseline", "none", "--no-progress"]) == 0
    assert "2 shards (r.shard-0-of-2.h5 ...)" in capsys.readouterr().out
    with Recording(out) as rec:
        assert rec.n_prompts == 12 and [e["n_prompts"] for e in rec.attr("shards")] == [4, 8]
        assert rec.attr("checkpoint_sha256") == checkpoint.sha256(ck)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.h5", "r.shard-0-of-2.h5", "r.shard-1-of-2.h5"]
