"""An episode recording SIGKILLed mid-run resumes to the uninterrupted recording (as tests/recording/
test_recorder.py and test_shard_kills.py do for a family's): the run is a forked child of this process (a real
process, killed with no `finally` running, without a fresh interpreter's imports), recording a model that sleeps
in its forward pass so that it is killed between batches or inside one; the reference and the resume run here.

- one file: killed once its .partial holds a batch (and a random moment later): nothing at the final path, whole
  batches kept, `resume=True` gives the reference's datasets;
- two shards written by forked workers: killed once each shard's .partial holds a batch; the workers die with the
  run (a writer that lived on would publish its shard under a resume), and the resume gives the reference.
"""
from __future__ import annotations

import multiprocessing as mp
import random
import time

import pytest
import torch

from icrl_interp.recording import episodes as rec_eps
from icrl_interp.recording import shards
from icrl_interp.recording.format import partial_path

from .test_episodes_record import UserModel, episodes
from .test_episodes_resume import _same_recording
from .test_recorder import _progress
from .test_shard_kills import kill_mid_shards

FORK = mp.get_context("fork")
BATCH = 1  # five batches of one history


class Slow(UserModel):
    def forward(self, x):
        time.sleep(0.03)
        return super().forward(x)


def _record(out, resume=False, shards=1) -> None:
    rec_eps.record_episodes(Slow(), episodes(), out, token_format="ad-step", context=4, batch_size=BATCH,
                            roles={"resid_post": "layers.{layer}"}, progress=False, resume=resume, shards=shards,
                            workers=2)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("episodes-kill-ref") / "ref.h5"
    _record(out)
    return out


def _child(out, count) -> None:
    torch.set_num_threads(1)
    _record(out, shards=count)


@pytest.mark.parametrize("trial", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_a_killed_run_resumes_to_the_uninterrupted_recording(reference, tmp_path, trial):
    out = tmp_path / "k.h5"
    proc = FORK.Process(target=_child, args=(out, 1))
    proc.start()
    deadline = time.monotonic() + 60
    while _progress(partial_path(out)) < BATCH * (1 + trial) and proc.is_alive() and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(random.Random(trial).uniform(0, 0.05))
    proc.kill()
    proc.join()
    if not out.exists():  # killed before the end: nothing at the final path, whole batches kept
        done = _progress(partial_path(out))
        assert done >= BATCH and done % BATCH == 0
        _record(out, resume=True)
    _same_recording(reference, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.h5"]


@pytest.mark.slow  # fast siblings: test_episodes_resume.py (an interrupted sharded run), test_shard_kills.py
def test_shard_writers_die_with_a_killed_run_and_the_shards_resume(reference, tmp_path):
    out = tmp_path / "k.h5"
    parts = shards.shard_paths(out, 2)
    proc = FORK.Process(target=_child, args=(out, 2))
    proc.start()
    kill_mid_shards(proc, parts, BATCH)
    assert not out.exists() and not all(p.exists() for p in parts)  # at least one shard was cut short
    _record(out, resume=True, shards=2)
    _same_recording(reference, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([out.name, *(p.name for p in parts)])
