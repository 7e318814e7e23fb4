"""Recorder checks given the inputs they exist to refuse (beyond tests/recording/test_recorder.py): prompts
holding a NaN or an Inf among finite numbers (given as arrays, which no prompt file check has seen),
and the memory check counting the random-init copy's activations. Nothing is written either way.

Mutants caught (tests/mutation.py): `torch.isfinite(x).all()` -> `.any()` (only all-NaN prompts
refused), the models counted for the memory estimate (`2 if baseline == "random-init" else 1`).
"""
from __future__ import annotations

import numpy as np
import pytest

from helpers import theta_star_setup

from icrl_interp.recording import budget, recorder
from icrl_interp.core.errors import UserError

N, BATCH = 12, 4


@pytest.fixture(scope="module")
def setup():
    return theta_star_setup(6)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_prompts_with_one_non_finite_number_are_refused_and_leave_nothing(setup, tmp_path, bad):
    model, cfg, spec = setup
    z = cfg.sample(N, np.random.default_rng(0)).prompt.z.copy()
    z[BATCH + 1, 2, 0] = bad  # one number of one prompt of the second batch
    source = recorder.PromptSource(config=cfg, arrays={"prompts/z": z}, n_total=N)
    with pytest.raises(UserError, match=rf"prompts {BATCH}\.\.{2 * BATCH - 1} contain NaN or Inf"):
        recorder.record(model, tmp_path / "r.h5", spec, source, batch_size=BATCH, progress=False)
    assert list(tmp_path.iterdir()) == []  # nor a .partial: resuming would refuse the same batch again


@pytest.mark.parametrize("baseline, models", [("none", 1), ("random-init", 2)])
def test_the_memory_check_counts_the_random_init_copy(setup, tmp_path, monkeypatch, baseline, models):
    model, cfg, spec = setup
    seen = []
    real = budget.check_memory
    monkeypatch.setattr(budget, "check_memory", lambda *a, **k: seen.append(a[4]) or real(*a, **k))
    recorder.record(model, tmp_path / "r.h5", spec, recorder.PromptSource(config=cfg, n_total=N), batch_size=BATCH,
                    progress=False, baseline=baseline)
    assert seen == [models]


@pytest.mark.parametrize("field, value", [("batch_size", True), ("batch_size", -3), ("batch_size", 0),
                                          ("n_total", True), ("n_total", -3), ("n_total", 0)])
def test_a_sharded_run_refuses_a_count_that_is_not_a_positive_integer(setup, tmp_path, field, value):
    """Checked before the shards are split (True, a bool, would split as 1). Floats are refused by the
    type checker under pytest, so only integers that are not positive and a bool are given here."""
    model, cfg, spec = setup
    n_total = value if field == "n_total" else N
    batch_size = value if field == "batch_size" else BATCH
    flag = "--tasks" if field == "n_total" else "--batch-size"
    source = recorder.PromptSource(config=cfg, n_total=n_total)
    with pytest.raises(UserError, match=rf"{flag} must be a positive integer, got {value!r}"):
        recorder.record(model, tmp_path / "r.h5", spec, source, batch_size=batch_size, progress=False, shards=2)
    assert [p.name for p in tmp_path.iterdir()] == []


def test_the_logit_lens_note_says_when_the_readout_is_not_the_models_own(tmp_path):
    """A readout of ln_f then head is the model's own (its last layer's lens equals the output: no note);
    the head alone is not (the note says so, with the difference)."""
    import torch

    from helpers import ROLES, TASK, Net

    torch.manual_seed(0)
    model = Net()
    own = recorder.record_model(model, "linear-td", tmp_path / "a.h5", task_options=TASK, probe=ROLES, tasks=8,
                                batch_size=8, progress=False)
    assert not any("not the model's own readout" in n for n in own.notes)
    other = recorder.record_model(model, "linear-td", tmp_path / "b.h5", task_options=TASK,
                                  probe={**ROLES, "readout": ["head"]}, tasks=8, batch_size=8, progress=False)
    assert any("differs from the model's output" in n and "not the model's own readout" in n for n in other.notes)


def test_the_buffers_are_synchronized_before_every_batch_is_handed_on(setup, tmp_path, monkeypatch):
    """On a GPU the activations reach the host buffers by non-blocking copies; each batch waits for them
    (`devices.synchronize`) before it is checked and written. On the CPU the wait is a no-op, so this
    checks the call itself: once per batch run, for the run's device."""
    from icrl_interp.core import devices

    model, cfg, spec = setup
    calls = []
    real = devices.synchronize
    monkeypatch.setattr(devices, "synchronize", lambda device: calls.append(str(device)) or real(device))
    recorder.record(model, tmp_path / "r.h5", spec, recorder.PromptSource(config=cfg, n_total=N), batch_size=BATCH,
                    progress=False)
    assert calls == ["cpu"] * (N // BATCH)
