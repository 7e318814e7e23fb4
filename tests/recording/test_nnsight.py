"""nnsight is an optional extra (`pip install icrl_interp[nnsight]`): where it is installed, an
NNsight-wrapped model of ours sees exactly the values our recorder stores."""
import numpy as np
import pytest
import torch

from icrl_interp.models import checkpoint
from icrl_interp.recording import probe_spec, prompts, recorder
from icrl_interp.families import registry
from icrl_interp.models import theta_star_model
from icrl_interp.recording.format import Recording

nnsight = pytest.importorskip("nnsight", reason="nnsight is an optional extra and is not installed")


def test_nnsight_trace_equals_recording(tmp_path):
    model = theta_star_model("softmax-td", d=4, n_layers=3)
    config = checkpoint.make_config(model.config, {"task": {"kind": "boyan", "n": 10, "n_states": 4}, "origin": model.origin})
    z = registry.get(config.task.family).sample(config, config.task, 6, np.random.default_rng(0)).prompt.z
    np.savez(tmp_path / "p.npz", z=z)
    spec = probe_spec.parse_spec('[[hooks]]\npattern = "blocks.*.attn.hook_pattern"\ndtype = "float64"\n'
                                 '[[hooks]]\npattern = "blocks.*.hook_resid_post"\ndtype = "float64"\n')
    source = prompts.load_prompt_file(tmp_path / "p.npz", config, model.layout)
    recorder.record(model, tmp_path / "r.h5", spec, source, batch_size=6, progress=False)
    wrapped = nnsight.NNsight(model)
    saved = {}
    with wrapped.trace(torch.from_numpy(z)):
        for layer in range(3):  # in execution order, as nnsight requires
            saved[f"blocks.{layer}.attn.hook_pattern"] = wrapped.blocks[layer].attn.hook_pattern.output.save()
            saved[f"blocks.{layer}.hook_resid_post"] = wrapped.blocks[layer].hook_resid_post.output.save()
    with Recording(tmp_path / "r.h5") as rec:
        for name, value in saved.items():
            np.testing.assert_array_equal(rec.read(name), value.detach().numpy())  # exact: the same forward
