"""Size estimates of a run over prompts (icrl_interp.recording.budget; docs/integrity.md, "Sizes are checked before any
work"): known answers for the formulas, the disk estimate against a real recording's size, and the guards on
a user's model per batch (icrl_interp.models.user). The CLI rows are in tests/commands/test_bad_inputs.py."""
from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from torch import nn

from icrl_interp.recording import budget
from icrl_interp.models import checkpoint
from icrl_interp.core import outputs
from icrl_interp.recording import recorder
from icrl_interp.core.errors import ModelFault, UserError
from icrl_interp.models import ModelConfig
from icrl_interp.recording.format import partial_path

from helpers import TASK

CK = Path(__file__).resolve().parents[2] / "data" / "checkpoints" / "linear-td"


def test_per_prompt_known_answer():
    """The shipped linear-td checkpoint: 31 positions of width 9, 10 states x 4 actions, d 4, 3 float32 layers
    of D 9 (each number below is exact: integer arithmetic)."""
    config = checkpoint.read(CK)[0]
    cost = budget.per_prompt(config, 31, 9, own_model=True)
    assert cost.data == 8 * 31 * 9 * 2 + 8 * (40 * 40 + 40 * 4 + 40)  # z twice; P, phi, r of 40 state-actions
    assert cost.recorded == 4 * 3 * (2 * 31 * 9)  # per layer: two streams; linear-td's spec hooks no pattern
    sarsa = checkpoint.read(CK.parent / "sarsa")[0]  # its spec keeps the query row of the scores: 1 row
    item = 8 if sarsa.model.dtype == "float64" else 4
    assert budget.per_prompt(sarsa, 65, sarsa.model.D, own_model=True).recorded == \
        item * sarsa.model.n_layers * (1 * 65 + 2 * 65 * sarsa.model.D)
    assert cost.working == 4 * (2 * 31 * 31 + 4 * 31 * 9)
    assert budget.per_prompt(config, 31, 9, own_model=False) == budget.PerPrompt(cost.data, 0, 0)
    # three buffer sets (the writer holds two batches, the forward fills the third) once there are three
    # batches, one per batch before; the working set once
    assert budget.batch_bytes(cost, 128, 2, 4) == 128 * (cost.data + 2 * 3 * cost.recorded + cost.working)
    assert budget.batch_bytes(cost, 128, 2, 2) == 128 * (cost.data + 2 * 2 * cost.recorded + cost.working)
    assert budget.batch_bytes(cost, 128, 2, 1) == 128 * (cost.data + 2 * cost.recorded + cost.working)


def test_work_limit_known_answer():
    budget.check_work(10**6, 2.0, "--tasks")  # 5.8 days: under the 7-day limit
    with pytest.raises(UserError, match=r"--tasks 1000000 would take ~11.6 days to sample alone \(~1 prompts/s "
                                        r"here\); the limit is 7 days of work: at most --tasks 604800$"):
        budget.check_work(10**6, 1.0, "--tasks")


@pytest.mark.parametrize("untied", [False, True])
def test_parameter_count_is_the_shapes_summed(untied):
    cfg = ModelConfig(family="linear-td", d=3, n_layers=5, tied=not untied)
    assert cfg.parameter_count() == sum(a * b for a, b in cfg.parameter_shapes().values())


def test_prompt_file_shape_read_from_the_header(tmp_path):
    np.savez(tmp_path / "p.npz", z=np.zeros((3, 7, 5)), reward=np.zeros((3, 7)))
    with h5py.File(tmp_path / "p.h5", "w") as f:
        f["z"] = np.zeros((4, 6, 2))
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    assert budget.prompt_file_shape(tmp_path / "p.npz") == (3, 7, 5)
    assert budget.prompt_file_shape(tmp_path / "p.h5") == (4, 6, 2)
    assert budget.prompt_file_shape(tmp_path / "junk.npz") is None  # loading it says what is wrong


def test_free_bytes_of_a_path_not_made_yet(tmp_path):
    assert outputs.free_bytes(tmp_path / "no" / "such" / "file.h5") == outputs.free_bytes(tmp_path) > 0


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A real recording of the linear-td checkpoint (256 prompts, with its random-init baseline): its size."""
    path = tmp_path_factory.mktemp("rec") / "r.h5"
    recorder.record_model(checkpoint.load(CK), CK, path, tasks=256, batch_size=128, progress=False)
    return os.path.getsize(path)


@pytest.mark.parametrize("free, refused", [(0.9, True), (1.05, False)])
def test_disk_estimate_before_torch_is_the_recordings_size(recorded, tmp_path, monkeypatch, free, refused):
    """The estimate lies within [0.9, 1.05] of the file `record` writes: a refusal at 90 % of its size, none
    at 105 % (a missing baseline, a missing pattern term, ... fall outside)."""
    monkeypatch.setattr(outputs, "free_bytes", lambda path: int(free * recorded))
    config = checkpoint.read(CK)[0]
    run = lambda: budget.check_run(config, tasks=256, batch_size=128, baseline=True, own_model=True,  # noqa: E731
                                   out=tmp_path / "r.h5")
    if refused:
        with pytest.raises(UserError, match=r"^--tasks 256 would write ~4\.\d+ MiB \(free on /\S*: 4\.\d+ MiB\)$"):
            run()
    else:
        run()


@pytest.mark.parametrize("free, refused", [(0.9, True), (1.05, False)])
def test_recorder_checks_the_disk_with_its_first_batch(recorded, tmp_path, monkeypatch, free, refused):
    """The same bound from the exact bytes of batch 0, before the file exists (a user's model too)."""
    monkeypatch.setattr(outputs, "free_bytes", lambda path: int(free * recorded))
    out = tmp_path / "r.h5"
    record = lambda: recorder.record_model(checkpoint.load(CK), CK, out, tasks=256, batch_size=128,  # noqa: E731
                                           progress=False)
    if refused:
        with pytest.raises(UserError, match=r"^recording 256 prompts would write ~4\.\d+ MiB"):
            record()
        assert not out.exists() and not partial_path(out).exists()
    else:
        record()
        assert out.exists()


def test_memory_check_names_the_batch_size_that_fits(monkeypatch):
    monkeypatch.setattr(outputs, "memory_bytes", lambda: 2**30)
    config = checkpoint.read(CK)[0]
    cost = budget.per_prompt(config, 31, 9, own_model=True)
    fits = max(b for b in range(1, 20000) if budget.batch_bytes(cost, b, 2, -(-10**6 // b)) <= 2**30)
    with pytest.raises(UserError, match=rf"--batch-size 100000 needs ~.* this machine has 1 GiB: at most "
                                        rf"--batch-size {fits} fits$"):
        budget.check_run(config, tasks=10**6, batch_size=10**5, baseline=True, own_model=True)


# ------------------------------------------------------------------ a user's model, per batch
class NaNInside(nn.Module):
    """A finite output (nan_to_num) whatever its embedding holds (`_nan_from` makes that NaN)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = nn.Linear(9, 8), nn.Linear(8, 1)
        self.calls = 0

    def forward(self, z):
        self.calls += 1
        h = self.embed(z)  # recorded: the hook sees this module's output
        return self.head(torch.nan_to_num(h))[:, -1]


def _nan_from(at: int):
    """A NaNInside whose embedding's output turns NaN from forward call `at` on (a hook multiplies it)."""
    model = NaNInside()
    model.embed.register_forward_hook(lambda m, i, o: o * float("nan") if model.calls >= at else o)
    return model


def test_nan_activations_in_a_later_batch_are_refused_and_leave_nothing(tmp_path):
    out = tmp_path / "r.h5"
    with pytest.raises(ModelFault, match=r"^non-finite activations: the model's hook blocks\.0\.hook_resid_post holds "
                                         r"NaN in batch 3 of 3 \(prompts 16\.\.23\)$"):
        recorder.record_model(_nan_from(3), "linear-td", out, task_options=TASK, probe={"resid_post": ["embed"]},
                              tasks=24, batch_size=8, baseline="none", progress=False)
    assert list(tmp_path.iterdir()) == []  # no output, no .partial


def test_an_inf_activation_is_allowed(tmp_path):
    """Masked attention scores are -inf by design: only NaN is refused in activations."""

    class MaskedScores(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.head = nn.Linear(9, 8), nn.Linear(8, 1)
            self.scores = nn.Identity()

        def forward(self, z):
            h = self.embed(z)
            self.scores(torch.full_like(h, -float("inf")))
            return self.head(h)[:, -1]

    recorder.record_model(MaskedScores(), "linear-td", tmp_path / "r.h5", task_options=TASK,
                          probe={"resid_post": ["embed"], "attn_out": ["scores"]}, tasks=8, batch_size=4,
                          baseline="none", progress=False)
    assert (tmp_path / "r.h5").exists()
