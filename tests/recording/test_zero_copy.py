"""The recorder hands the writer a hook's own tensor without a copy where that is safe (`recorder._Buffers`),
copies into reused buffers elsewhere, and never writes what a model changed after its hook ran; the forward
passes leave a core to the writer thread (`threads.beside`)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from icrl_interp.core import threads
from icrl_interp.core.errors import ModelFault
from icrl_interp.models import checkpoint, theta_star_model
from icrl_interp.recording import format as fmt, probe_spec, recorder
from icrl_interp.recording.format import Recording, partial_path

from helpers import ROLES, TASK, Net

F16_SPEC = """
[probe]
name = "f16"
[[hooks]]
pattern = "blocks.*.hook_resid_post"
dtype = "float16"
"""


def _config(model):
    return checkpoint.make_config(model.config, {"task": {"kind": "boyan", "n": 6, "n_states": 4},
                                                 "origin": model.origin})


def _slow_disk(monkeypatch, seconds=0.02):
    real = fmt.RecordingWriter.write_batch

    def slow(self, *a, **kw):
        time.sleep(seconds)
        return real(self, *a, **kw)

    monkeypatch.setattr(fmt.RecordingWriter, "write_batch", slow)


def test_float32_hooks_go_to_the_writer_uncopied():
    model = theta_star_model("linear-td", d=3, n_layers=2, dtype="float32")
    source = recorder.PromptSource(config=_config(model), n_total=12, seed=0)
    with recorder.prepare(model, probe_spec.shipped_spec("linear-td"), source, batch_size=4) as run:
        data = run.run_batch(1, run.probe_sets[1])
        buffers = run.probe_sets[1][0].buffers
        hooks = [k[5:] for k in data if k.startswith("acts/")]
        assert hooks and set(buffers.direct) == set(hooks) and buffers.direct_ok == {}  # none copied
        assert not buffers.arrays  # nothing copied in this set: no buffer was even allocated
        for h in hooks:
            assert data[f"acts/{h}"].base is not None and data[f"acts/{h}"].shape[0] == 4
        first = run.probe_sets[0][0].buffers
        assert not first.arrays and set(first.direct) == set(hooks)  # batch 0 (run by prepare) too, watched
        assert set(first.watched) == set(hooks)


def test_copied_batches_are_written_from_their_own_buffers_while_the_forward_runs_ahead(tmp_path, monkeypatch):
    """float16 activations are copies into the three reused buffer sets (a set refilled before the writer is
    done with it would write another batch's rows; test_background checks the uncopied float32 ones). The
    writer writes batch i only once the forward pass of batch i + 2 has run (as far ahead as the queue lets
    it), so a set reused too early is always overwritten first. Every row is compared with a forward pass of
    its own prompt; a swapped or overwritten batch differs by O(1)."""
    model = theta_star_model("linear-td", d=3, n_layers=2, dtype="float32")
    forwards, written, n_batches = [0], [0], 9
    ran = threading.Condition()

    def count(*_):
        with ran:
            forwards[0] += 1
            ran.notify_all()

    model.register_forward_hook(count)
    real = fmt.RecordingWriter.write_batch

    def behind(self, *a, **kw):
        with ran:  # the timeout only keeps a broken recorder from hanging the test
            ran.wait_for(lambda: forwards[0] >= min(written[0] + 3, n_batches), timeout=5)
        written[0] += 1
        return real(self, *a, **kw)

    monkeypatch.setattr(fmt.RecordingWriter, "write_batch", behind)
    out = tmp_path / "r.h5"
    recorder.record(model, out, probe_spec.parse_spec(F16_SPEC),
                    recorder.PromptSource(config=_config(model), n_total=36, seed=3), batch_size=4, progress=False)
    with Recording(out) as rec:
        z = rec.array("/prompts/z")
        got = {h: rec.read(h) for h in rec.hooks()}
    _, cache = model.run_with_cache(torch.from_numpy(z).float(), names_filter=list(got))
    assert got
    for h, rows in got.items():
        want = cache[h].numpy()  # rounded to float16 once: within its eps of the float32 value
        np.testing.assert_allclose(rows, want, rtol=0, atol=4 * np.finfo(np.float16).eps * float(np.abs(want).max()))


class WritesBack(Net):
    """The last block's output (hooked as its resid_post) is written in place after the hook ran: by the same
    forward pass from its `start`-th call on ('now'), or by the next forward pass ('later', a module keeping its
    last output). The model's output is computed before, so it is the plain Net's."""

    def __init__(self, when: str, start: int = 3):
        torch.manual_seed(0)
        super().__init__()
        self.when, self.start, self.calls, self.kept = when, start, 0, None

    def forward(self, z):
        self.calls += 1
        x = self.embed(z)
        for b in self.blocks:
            x = b(x)
        y = self.head(self.ln_f(x))
        if self.when == "now" and self.calls >= self.start:
            x.mul_(-1.0)
        if self.when == "later":
            if self.kept is not None:
                self.kept.mul_(-1.0)
            self.kept = x
        return y


def _record(model, path):
    return recorder.record_model(model, "linear-td", path, task_options=TASK, probe=ROLES, tasks=24, batch_size=4,
                                 progress=False, baseline="none")


@pytest.mark.parametrize("start", [1, 3])  # from the first batch (run before the file exists) or a later one
def test_an_activation_written_in_place_after_its_hook_is_recorded_as_the_hook_saw_it(tmp_path, start):
    model = WritesBack("now", start)
    _record(model, tmp_path / "r.h5")
    plain = Net()
    plain.load_state_dict(model.state_dict())
    with Recording(tmp_path / "r.h5") as r:
        z = torch.from_numpy(r.array("prompts/z")).float()
        with torch.no_grad():
            x = plain.embed(z)
            for b in plain.blocks:
                x = b(x)
        got = r.read("blocks.1.hook_resid_post")
    # the same float32 kernels on the same rows; a negated batch differs by O(1)
    np.testing.assert_allclose(got, x.numpy(), rtol=0, atol=64 * np.finfo(np.float32).eps * float(x.abs().max()))
    assert model.calls == 24 // 4 + 1  # exact: 6 batches, and one once more when the in-place write showed up


def test_a_model_writing_into_an_earlier_batchs_activation_is_refused(tmp_path, monkeypatch):
    _slow_disk(monkeypatch, 0.05)  # batches wait in the queue while the next forward passes run
    out = tmp_path / "r.h5"
    with pytest.raises(ModelFault, match="wrote into its activations of batch"):
        _record(WritesBack("later"), out)
    assert not out.exists() and not partial_path(out).exists()


def test_the_forward_passes_leave_a_core_to_the_writer(tmp_path, monkeypatch):
    seen = []
    model = theta_star_model("linear-td", d=3, n_layers=1, dtype="float32")
    model.register_forward_hook(lambda *_: seen.append(torch.get_num_threads()))
    monkeypatch.setattr(threads, "allowed_cores", lambda: 4)
    monkeypatch.delenv(threads.ENV, raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        recorder.record(model, tmp_path / "r.h5", probe_spec.shipped_spec("linear-td"),
                        recorder.PromptSource(config=_config(model), n_total=12, seed=0), batch_size=4, progress=False)
        assert torch.get_num_threads() == 4  # restored
    finally:
        torch.set_num_threads(before)
    assert seen[-2:] == [3, 3]  # batches 1 and 2 ran beside the writer thread (batch 0 before it started)


def test_inference_mode_activations_are_copied():
    """An inference-mode tensor has no version counter (`_version` raises), so a later in-place write into it
    could not be detected: such activations are always copied, never handed on."""
    model = theta_star_model("linear-td", d=3, n_layers=2, dtype="float32")
    source = recorder.PromptSource(config=_config(model), n_total=8, seed=0)
    forward = model.forward

    def inferring(*a, **kw):
        with torch.inference_mode():
            return forward(*a, **kw)

    model.forward = inferring
    with recorder.prepare(model, probe_spec.shipped_spec("linear-td"), source, batch_size=4) as run:
        run.run_batch(1, run.probe_sets[1])
        buffers = run.probe_sets[1][0].buffers
        assert buffers.arrays and not buffers.direct  # every hook copied
