"""`--device {auto,cpu,cuda}`: resolution, the one-line error without CUDA, and the GPU code paths that
can run on the CPU (nested batches moved, buffers handed on only after a synchronize)."""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import torch

from helpers import theta_star_setup

from icrl_interp import cli
from icrl_interp.core import devices
from icrl_interp.recording import recorder
from icrl_interp.core.errors import UserError
from icrl_interp.recording.format import Recording

CK = Path(__file__).resolve().parents[2] / "data" / "checkpoints" / "sarsa"


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_auto_is_cuda_only_when_torch_sees_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert devices.resolve("auto") == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert devices.resolve("auto") == torch.device("cpu")
    assert devices.resolve("cpu") == devices.resolve(torch.device("cpu")) == torch.device("cpu")


def test_cuda_without_a_gpu_and_unknown_devices_are_one_line_errors(no_cuda):
    for name, words in (("cuda", "no CUDA GPU"), ("cuda:0", "no CUDA GPU"), ("bogus", "must be one of auto, cpu, cuda"),
                        ("mps", "must be one of"), (3, "must be one of")):
        with pytest.raises(UserError, match=words) as e:
            devices.resolve(name)
        assert "\n" not in str(e.value)


def test_device_helpers_are_no_ops_on_the_cpu():
    cpu = torch.device("cpu")
    assert not devices.pinned(cpu)
    buf = devices.host_empty((2, 3), torch.bfloat16, cpu)
    assert buf.shape == (2, 3) and buf.dtype == torch.bfloat16 and buf.device == cpu
    devices.synchronize(cpu)
    assert devices.of(torch.nn.Linear(2, 2).double()) == cpu and devices.of(torch.nn.ReLU()) == cpu


class Pair(NamedTuple):
    x: torch.Tensor
    label: str


@dataclasses.dataclass
class Batch:
    z: torch.Tensor
    parts: list
    n: int


def test_to_device_moves_every_tensor_of_a_nested_batch():
    meta = torch.device("meta")  # a device every torch build has: proves each tensor was moved
    t = torch.ones(2)
    batch = {"a": t, "b": (t, [t, 3]), "pair": Pair(t, "keep"), "dc": Batch(t, [Pair(t, "x")], 5)}
    moved = devices.to_device(batch, meta)
    assert moved["a"].is_meta and moved["b"][0].is_meta and moved["b"][1][0].is_meta and moved["b"][1][1] == 3
    assert isinstance(moved["pair"], Pair) and moved["pair"].x.is_meta and moved["pair"].label == "keep"
    assert isinstance(moved["dc"], Batch) and moved["dc"].z.is_meta and moved["dc"].parts[0].x.is_meta
    assert moved["dc"].n == 5 and not t.is_meta  # the input is untouched


def _setup():
    model, cfg, spec = theta_star_setup(8)
    return model, recorder.PromptSource(config=cfg, n_total=24, seed=1), spec


def test_buffers_are_handed_to_the_writer_only_after_a_synchronize(tmp_path, monkeypatch):
    """Each batch's activations are copied without blocking; the device is synchronized once per batch,
    before the batch (and its buffers) goes to the writer thread, and the buffers come from host_empty
    for the model's device."""
    model, source, spec = _setup()
    events, allocated = [], []
    real_write, real_empty = recorder.RecordingWriter.write_batch, devices.host_empty
    monkeypatch.setattr(devices, "synchronize", lambda device: events.append(("sync", device.type)))
    monkeypatch.setattr(recorder.RecordingWriter, "write_batch",
                        lambda self, data, attrs=None: (events.append(("write",)), real_write(self, data, attrs))[1])
    monkeypatch.setattr(devices, "host_empty",
                        lambda shape, dtype, device: (allocated.append(device.type), real_empty(shape, dtype, device))[1])
    recorder.record(model, tmp_path / "a.h5", spec, source, batch_size=8, progress=False, baseline="random-init",
                    device="cpu")
    # three batches, one synchronize each; batch k is written only after k + 1 synchronizes (the writer
    # thread's order against the next forward pass is free: batch k+1 runs while batch k is written)
    kinds = [e[0] for e in events]
    assert kinds.count("sync") == 3 and kinds.count("write") == 3
    writes = [i for i, kind in enumerate(kinds) if kind == "write"]
    assert all(kinds[:at].count("sync") >= k + 1 for k, at in enumerate(writes))
    assert {e[1] for e in events if e[0] == "sync"} == {"cpu"}
    assert allocated and set(allocated) == {"cpu"}


def test_device_cpu_records_what_the_default_records(tmp_path):
    model, source, spec = _setup()
    recorder.record(model, tmp_path / "a.h5", spec, source, batch_size=8, progress=False)
    recorder.record(model, tmp_path / "b.h5", spec, source, batch_size=8, progress=False, device="cpu")
    with Recording(tmp_path / "a.h5") as a, Recording(tmp_path / "b.h5") as b:
        for hook in a.hooks():
            np.testing.assert_array_equal(a.read(hook), b.read(hook))  # exact: the same computation on the CPU


def test_record_on_cuda_without_one_creates_nothing(tmp_path, no_cuda):
    model, source, spec = _setup()
    with pytest.raises(UserError, match="--device cuda: torch sees no CUDA GPU"):
        recorder.record(model, tmp_path / "a.h5", spec, source, progress=False, device="cuda")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [
    ["record", "{t}/ck", "--out", "{t}/r.h5", "--tasks", "8", "--no-progress"],
    ["train", "sarsa", "--out", "{t}/run", "--n-states", "2", "--n-actions", "2", "--steps", "2", "--no-progress"],
    ["control", "{t}/ck", "--mdps", "2", "--no-progress"],
    ["causal", "{t}/ck", "--layer", "0", "--tasks", "8"],
], ids=lambda a: a[0])
def test_every_command_refuses_cuda_without_a_gpu_in_one_line(argv, tmp_path, no_cuda, capfd):
    shutil.copytree(CK, tmp_path / "ck")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    code = cli.main([a.replace("{t}", str(tmp_path)) for a in argv] + ["--device", "cuda"])
    err = capfd.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--device cuda: torch sees no CUDA GPU" in err[0]
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
