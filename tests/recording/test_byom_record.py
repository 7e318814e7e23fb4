"""Recording a user's own model on a family's task (docs/byom.md): outputs, lens, random-init baseline,
roles, task ids, eval mode, and the one-line refusals of bad input."""
from __future__ import annotations

import textwrap

import h5py
import numpy as np
import pytest
import torch
from torch import nn

from icrl_interp import cli
from icrl_interp.models import construct
from icrl_interp.models.random_init import random_init_copy
from icrl_interp.recording import probe_spec, prompts, recorder
from icrl_interp.recording.capture import attached_hook_count
from icrl_interp.core.errors import UserError
from icrl_interp.recording.format import Recording, partial_path

from helpers import D_IN, ROLES, TASK, Block, Net  # noqa: F401 - the user's model of these tests


def _net(seed=0, **kw):
    torch.manual_seed(seed)
    return Net(**kw)


def _record(model, path, **kw):
    kw.setdefault("tasks", 24)
    kw.setdefault("batch_size", 8)
    return recorder.record_model(model, "linear-td", path, task_options=TASK, probe=kw.pop("probe", ROLES),
                                 progress=False, **kw)


def test_outputs_lens_roles_and_task_ids(tmp_path):
    model = _net()
    summary = _record(model, tmp_path / "r.h5")
    assert set(summary.hooks) == {"blocks.0.hook_resid_post", "blocks.1.hook_resid_post",
                                  "blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"}
    with Recording(tmp_path / "r.h5") as r:
        z = torch.from_numpy(r.array("prompts/z")).float()
        with torch.no_grad():
            y = model(z)[:, -1]
            x = model.embed(z)
            resid = []
            for b in model.blocks:
                x = b(x)
                resid.append(x)
        np.testing.assert_allclose(r.array("outputs/model"), y.numpy(), atol=1e-6)
        for l, h in enumerate(resid):
            np.testing.assert_allclose(r.read(f"blocks.{l}.hook_resid_post"), h.numpy(), atol=1e-6)
            lens = model.head(model.ln_f(h[:, -1])).detach().numpy()
            np.testing.assert_allclose(r.array(f"lens/{l}"), lens, atol=1e-6)
        # the per-head pattern of nn.MultiheadAttention is recorded under the canonical name
        assert r.shape("blocks.0.attn.hook_pattern") == (24, 2, 9, 9)
        np.testing.assert_allclose(r.read("blocks.0.attn.hook_pattern").sum(-1), 1.0, atol=1e-5)
        np.testing.assert_array_equal(r.array("prompts/task_id"), np.arange(24))
        assert r.attr("roles")["blocks.1.hook_resid_post"] == "blocks.1"
        assert r.attr("readout")["modules"] == ["ln_f", "head"]
        assert r.attr("readout")["max_abs_diff_last_layer"] < 1e-6
        assert r.attr("gamma") == pytest.approx(0.9) and r.attr("n_total") == 24
        assert r.array("reference/td_errors").shape == (24, 3, 8)  # steps 0..layers
        assert r.task_family == "linear-td" and r.model_info["family"] is None
    assert attached_hook_count(model) == 0


def test_random_init_baseline_is_the_same_architecture_reset(tmp_path):
    model = _net(seed=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _record(model, tmp_path / "r.h5", baseline="random-init")
    for k, v in model.state_dict().items():  # the user's model is never touched
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)
    clone, info = random_init_copy(model, 0)
    assert info["reset_modules"] > 0 and info["redrawn"] == []  # MultiheadAttention resets through _reset_parameters
    with Recording(tmp_path / "r.h5") as r:
        z = torch.from_numpy(r.array("prompts/z")).float()
        with torch.no_grad():
            np.testing.assert_allclose(r.array("baseline/outputs/model"), clone(z)[:, -1].numpy(), atol=1e-6)
            assert not np.allclose(r.array("baseline/outputs/model"), r.array("outputs/model"))
        base = r.f["baseline/acts/blocks.1.hook_resid_post"][()]
        assert base.shape == r.read("blocks.1.hook_resid_post").shape
        assert not np.allclose(base, r.read("blocks.1.hook_resid_post"))
        assert r.attr("baseline")["kind"] == "random-init"
        assert "baseline/lens/1" in r.f
    # same seed, same baseline
    _record(model, tmp_path / "s.h5", baseline="random-init")
    with h5py.File(tmp_path / "r.h5") as a, h5py.File(tmp_path / "s.h5") as b:
        np.testing.assert_array_equal(a["baseline/outputs/model"][()], b["baseline/outputs/model"][()])  # same run again


def test_parameters_without_reset_are_redrawn():
    class Raw(nn.Module):
        def __init__(self):
            super().__init__()
            self.P = nn.Parameter(torch.ones(5, 5))
            self.b = nn.Parameter(torch.ones(5))

    clone, info = random_init_copy(Raw(), 3)
    assert info["redrawn"] == ["P", "b"]
    assert torch.all(clone.b == 0) and not torch.allclose(clone.P, torch.ones(5, 5))  # a bias is redrawn as literal 0
    assert abs(float(clone.P.std()) - 5 ** -0.5) < 0.3


def test_eval_mode_for_the_run_and_modes_restored(tmp_path):
    model = _net(dropout=0.5)
    model.train()
    model.blocks[1].eval()  # a user's mixed modes come back exactly
    summary = _record(model, tmp_path / "a.h5", baseline="none")
    _record(model, tmp_path / "b.h5", baseline="none")
    assert any("stochastic" in n for n in summary.notes)
    assert model.training and model.blocks[0].training and not model.blocks[1].training
    assert not model.blocks[1].attn.training
    with h5py.File(tmp_path / "a.h5") as a, h5py.File(tmp_path / "b.h5") as b:  # exact: the same run again
        np.testing.assert_array_equal(a["acts/blocks.1.hook_resid_post"][()], b["acts/blocks.1.hook_resid_post"][()])
        np.testing.assert_array_equal(a["outputs/model"][()], b["outputs/model"][()])


def test_batches_are_seeded_per_batch(tmp_path):
    model = _net()
    _record(model, tmp_path / "r.h5", baseline="none", seed=5)
    config = construct.task_config("linear-td", TASK)
    with Recording(tmp_path / "r.h5") as r:
        z = r.array("prompts/z")
    for i in range(3):
        expect = config.sample(8, np.random.default_rng([5, i])).prompt.z
        np.testing.assert_array_equal(z[8 * i : 8 * (i + 1)], expect)  # exact: the same sampling again
    assert not np.allclose(z[:8], z[8:16])


def test_hooked_transformer_inside_a_wrapper_needs_no_roles(tmp_path):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=2, d_model=8, n_ctx=16, d_head=4, n_heads=2, d_vocab=1, d_vocab_out=1,
                                  act_fn="relu", normalization_type="LN", seed=0)

    class Wrapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Linear(D_IN, 8)
            self.tl = HookedTransformer(cfg)

        def forward(self, z):
            return self.tl(self.embed(z), start_at_layer=0)

    model = Wrapped()
    _record(model, tmp_path / "tl.h5", probe=None, baseline="none")
    with Recording(tmp_path / "tl.h5") as r:
        assert "blocks.1.hook_resid_post" in r.hooks() and "blocks.0.attn.hook_pattern" in r.hooks()
        assert r.attr("readout")["modules"] == ["tl.ln_final", "tl.unembed"]
        assert r.attr("readout")["max_abs_diff_last_layer"] < 1e-5
        assert r.shape("blocks.0.attn.hook_pattern") == (24, 2, 9, 9)


def test_prompt_file_with_task_ids_gamma_and_reference(tmp_path):
    config = construct.task_config("linear-td", {**TASK, "gamma": 0.5})
    pb = config.sample(6, np.random.default_rng(0))
    z = np.repeat(pb.prompt.z, 2, axis=0)  # two prompts per task
    ids = np.repeat(np.arange(6) + 100, 2)
    own_output = np.arange(12, dtype=np.float64)[:, None]
    np.savez(tmp_path / "p.npz", z=z, task_id=ids, gamma=np.float64(0.5), reference_output=own_output)
    recorder.record_model(_net(), "linear-td", tmp_path / "r.h5", task_options={**TASK, "gamma": 0.5}, probe=ROLES,
                          prompts=tmp_path / "p.npz", batch_size=4, progress=False, baseline="none")
    with Recording(tmp_path / "r.h5") as r:
        np.testing.assert_array_equal(r.array("prompts/task_id"), ids)
        assert r.attr("gamma") == 0.5  # exact here and below: copies of the file's numbers
        np.testing.assert_array_equal(r.array("reference/output"), own_output)  # the file's own run wins
        np.testing.assert_allclose(r.array("reference/td_errors"), config.reference(z)["td_errors"], atol=1e-12)
    with pytest.raises(UserError, match="gamma 0.5 disagrees with the task's gamma 0.9"):
        recorder.record_model(_net(), "linear-td", tmp_path / "x.h5", task_options=TASK, probe=ROLES,
                              prompts=tmp_path / "p.npz", progress=False)
    assert not partial_path(tmp_path / "x.h5").exists()


@pytest.mark.parametrize("bad, message", [
    (lambda z: np.array(z, dtype=np.complex128), "complex"),
    (lambda z: z[:, :1], "position"),
    (lambda z: np.where(np.arange(z.shape[1])[None, :, None] == 2, np.nan, z), "NaN"),
])
def test_bad_prompt_files_are_refused(tmp_path, bad, message):
    z = construct.task_config("linear-td", TASK).sample(4, np.random.default_rng(0)).prompt.z
    np.savez(tmp_path / "p.npz", z=bad(z))
    with pytest.raises(UserError, match=message):
        recorder.record_model(_net(), "linear-td", tmp_path / "x.h5", task_options=TASK, probe=ROLES,
                              prompts=tmp_path / "p.npz", progress=False)
    assert not partial_path(tmp_path / "x.h5").exists()


MODEL_FILE = textwrap.dedent('''
    import torch
    from torch import nn

    def good():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(9, 16), nn.ReLU(), nn.Linear(16, 1))

    def wide():
        return nn.Sequential(nn.Linear(9, 16), nn.ReLU(), nn.Linear(16, 3))

    def not_a_module():
        return 42
''')


def _cli(tmp_path, capsys, *argv):
    capsys.readouterr()
    code = cli.main(["record", *argv, "--no-progress"])
    err = capsys.readouterr().err.strip()
    return code, err


@pytest.fixture
def user_files(tmp_path):
    (tmp_path / "m.py").write_text(MODEL_FILE)
    (tmp_path / "roles.toml").write_text('[roles]\nresid_post = ["0", "1"]\nreadout = "2"\n')
    (tmp_path / "nothing.toml").write_text('[roles]\nresid_post = "layers.{layer}"\n')
    torch.manual_seed(0)
    from safetensors.torch import save_file

    save_file(nn.Sequential(nn.Linear(9, 8), nn.ReLU(), nn.Linear(8, 1)).state_dict(), str(tmp_path / "small.safetensors"))
    return tmp_path


def test_cli_records_a_user_model(user_files, capsys):
    d = user_files
    code, err = _cli(d, capsys, "--model", f"{d}/m.py:good", "--task", "linear-td", "--d", "4", "--n", "8",
                     "--probe", f"{d}/roles.toml", "--tasks", "8", "--out", f"{d}/r.h5")
    assert code == 0, err
    with Recording(d / "r.h5") as r:
        assert r.hooks() == ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
        assert r.attr("roles")["blocks.1.hook_resid_post"] == "1"
        assert r.array("lens/1").shape == (8, 1)
        assert r.array("outputs/model").shape == (8, 1) and "baseline/outputs/model" in r.f


@pytest.mark.parametrize("argv, fragment", [
    (["--model", "{d}/m.py:not_a_module"], "returned int, not a torch.nn.Module"),
    (["--model", "{d}/m.py:missing"], "has no attribute 'missing'"),
    (["--model", "{d}/nofile.py:good"], "does not exist"),
    (["--model", "{d}/m.py:good", "--weights", "{d}/small.safetensors"], "do not fit the model"),
    (["--model", "{d}/m.py:good", "--probe", "{d}/nothing.toml"], "maps to nothing"),
    (["--model", "{d}/m.py:wide"], "3 value(s) per prompt, the task's output has 1"),
    (["--model", "{d}/m.py:good", "--n-actions", "3"], "not an option of the linear-td task"),
    (["--model", "{d}/m.py:good", "--batch-size", "1000000000"], "GiB"),
    (["--model", "{d}/m.py:good", "--prompt-seed", "-1"], "--prompt-seed must be a non-negative integer"),
])
def test_cli_bad_input_is_one_line_and_leaves_nothing(user_files, capsys, argv, fragment):
    d = user_files
    argv = [a.format(d=d) for a in argv]
    if "--probe" not in argv:
        argv += ["--probe", f"{d}/roles.toml"]
    before = sorted(p.name for p in d.iterdir())
    code, err = _cli(d, capsys, *argv, "--task", "linear-td", "--d", "4", "--n", "8", "--tasks", "1000000000"
                     if "--batch-size" in argv else "8", "--out", f"{d}/x.h5")
    assert code == 2
    assert len(err.splitlines()) == 1 and fragment in err and "Traceback" not in err
    assert sorted(p.name for p in d.iterdir()) == before  # no .partial, no output


def test_prompt_file_with_ten_prompts_per_task_keeps_tasks_whole_and_the_control_honest(tmp_path):
    """The public (c) evaluation format: several prompts per task. Through record -> analyze, every
    held-out task keeps all its prompts, and the shuffled control pairs different tasks (<= 0.05)."""
    from icrl_interp.models import checkpoint
    from icrl_interp.analyzers.analyze import analyze

    out = construct.construct("linear-td", {"d": 3, "n": 8, "layers": 2}, tmp_path / "star")
    config = checkpoint.read(out)[0]
    tasks, per_task = 40, 10
    rng = np.random.default_rng(1)
    z = np.concatenate([config.sample(1, rng).prompt.z for _ in range(tasks)])
    # the same task's prompts: redraw the query column only, the context stays the task's
    z = np.repeat(z, per_task, axis=0)
    z[:, -1, :3] = rng.uniform(-1, 1, size=(tasks * per_task, 3))
    ids = np.repeat(np.arange(tasks), per_task)
    np.savez(tmp_path / "p.npz", z=z, task_id=ids)
    recorder.record(checkpoint.load(out), tmp_path / "r.h5", probe_spec.shipped_spec("linear-td"),
                    prompts.load_prompt_file(tmp_path / "p.npz", config, None), batch_size=50, progress=False)
    r = analyze(tmp_path / "r.h5")
    for layer in r["activations"]["layers"]:
        probe = layer["td_probe"][layer["td_probe_hook"]]
        assert abs(probe["r2_shuffled"]) <= 0.05
        table = probe["per_task"]
        assert table is not None and set(table["n_prompts"]) == {per_task}  # no task split across folds
        assert len(table["task_id"]) == probe["n_test_tasks"] < tasks
