import multiprocessing as mp
import random
import time

import h5py
import numpy as np
import pytest
import torch
from torch import nn

from icrl_interp.models import checkpoint
from icrl_interp.recording import probe_spec, prompts, recorder
from icrl_interp.families import registry
from icrl_interp.recording.capture import attached_hook_count, capture
from icrl_interp.core.errors import ModelFault, UserError
from icrl_interp.models import CheckpointConfig, ModelConfig, theta_star_model
from icrl_interp.recording.format import SCHEMA, Recording, partial_path
from icrl_interp.tasks.sampling import TaskSpec

from . import _slow_child


def _config(model, n=16):
    kind = registry.get(model.config.family).task_kind
    task = {"kind": "mdp", "n": n, "n_states": 3, "n_actions": 2} if kind == "mdp" else {"kind": "boyan", "n": n, "n_states": 6}
    return checkpoint.make_config(model.config, {"task": task, "origin": model.origin})


def _plain_config(family="linear-td", d=3, n_layers=1, n=4) -> CheckpointConfig:
    """A checkpoint config to sample prompts from, for models that are not of a family."""
    return CheckpointConfig(model=ModelConfig(family=family, d=d, n_layers=n_layers, gamma=0.9),
                            task=TaskSpec.from_dict({"n": n}, family, registry.get(family).task_kind))


def _sample(config, n, seed=0):
    return registry.get(config.task.family).sample(config, config.task, n, np.random.default_rng(seed))


def _record(model, path, n_total=40, batch_size=16, spec=None, seed=0, **kw):
    spec = spec or probe_spec.shipped_spec(model.config.family)
    src = recorder.PromptSource(config=_config(model), n_total=n_total, seed=seed)
    return recorder.record(model, path, spec, src, batch_size=batch_size, progress=False, **kw)


FLOAT64_SPEC = probe_spec.parse_spec('[[hooks]]\npattern = "blocks.*.hook_resid_post"\ndtype = "float64"\n'
                                     '[[hooks]]\npattern = "blocks.*.attn.hook_pattern"\n'
                                     '[params]\nnames = ["blocks.*.attn.*"]\n')


def test_linear_td_recording_matches_reference(tmp_path):
    model = theta_star_model("linear-td", d=3, n_layers=4, alpha=0.7)
    s = _record(model, tmp_path / "lin.h5", spec=FLOAT64_SPEC, n_total=40)
    assert s.n_prompts == 40 and attached_hook_count(model) == 0
    with Recording(tmp_path / "lin.h5") as r:
        assert r.attr("complete") is True or r.attr("complete") == 1
        assert r.family == "linear-td" and r.n_prompts == 40
        lay = r.layout
        ref = r.array("/reference/td_errors")  # [N, L+1, n]
        for layer in range(4):
            resid = r.read(f"blocks.{layer}.hook_resid_post")
            # the reward row of context column i after layer l is delta_i(w_{l+1})
            np.testing.assert_allclose(resid[:, :-1, lay.slice("reward")][..., 0], ref[:, layer + 1], atol=1e-10)
        params, star = r.group("params"), r.group("theta_star")
        assert set(params) == set(star) == {"blocks.0.attn.P", "blocks.0.attn.Q"}
        for k in params:
            np.testing.assert_array_equal(params[k], star[k])  # exact: the model's parameters are theta*, copied
        assert r.attr("versions")["torch"] == torch.__version__
        assert r.attr("checkpoint_config")["model"]["family"] == "linear-td"
        assert r.attr("checkpoint_config")["format_version"] == 2 and r.checkpoint_config.task.n == 16
        assert r.schema == SCHEMA and r.task_family == "linear-td"
        assert r.model_info == {"family": "linear-td", "architecture": "linear-attention", "class": type(model).__name__}
        assert r.attr("seed") == 0
        assert r.shape("blocks.0.attn.hook_pattern") == (40, 1, 17, 17)


def test_softmax_and_sarsa_record_with_shipped_specs(tmp_path):
    soft = theta_star_model("softmax-td", d=6, n_layers=3, gamma=0.9)
    cfg = checkpoint.make_config(soft.config, {"task": {"kind": "boyan", "n": 16, "n_states": 6, "features": "onehot"},
                                               "origin": soft.origin})
    recorder.record(soft, tmp_path / "s.h5", FLOAT64_SPEC, recorder.PromptSource(cfg, n_total=20), 8, progress=False)
    with Recording(tmp_path / "s.h5") as r:
        values = r.array("/reference/values")  # [N, L+1, pos]
        resid = r.read("blocks.2.hook_resid_post")
        np.testing.assert_allclose(resid[:, :, r.layout.slice("current_mem")][..., 0], values[:, 3], atol=1e-10)
        pattern = r.read("blocks.0.attn.hook_pattern")
        np.testing.assert_allclose(pattern.sum(-1), 1.0, atol=1e-6)  # sources sum to one per target
    sarsa = theta_star_model("sarsa", d=6, n_layers=1, gamma=0.5, alpha=0.5)
    s = _record(sarsa, tmp_path / "q.h5", n_total=20, batch_size=8)
    assert "blocks.0.attn.hook_attn_scores" in s.hooks


def test_recording_is_reproducible(tmp_path):
    model = theta_star_model("linear-td", d=3, n_layers=2)
    _record(model, tmp_path / "a.h5", seed=5)
    _record(model, tmp_path / "b.h5", seed=5)
    _record(model, tmp_path / "c.h5", seed=6)
    with h5py.File(tmp_path / "a.h5") as a, h5py.File(tmp_path / "b.h5") as b, h5py.File(tmp_path / "c.h5") as c:
        for key in ("acts/blocks.1.attn.hook_v", "prompts/z", "reference/td_errors", "tasks/P"):
            np.testing.assert_array_equal(a[key][()], b[key][()])  # exact: the same computation rerun
        assert not np.array_equal(a["prompts/z"][()], c["prompts/z"][()])


class Boom(Exception):
    pass


def test_raising_hook_or_forward_leaves_no_hooks_and_no_final_file(tmp_path):
    model = theta_star_model("linear-td", d=3, n_layers=2)

    def explode(name, t):
        raise Boom(name)

    with pytest.raises(Boom):
        with capture(model, ["blocks.0.hook_resid_post", "blocks.1.attn.hook_v"], explode), torch.no_grad():
            model(torch.zeros(2, 5, 7, dtype=torch.float64))
    assert attached_hook_count(model) == 0

    class Exploding(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(7, 7)

        def forward(self, x):
            self.lin(x)
            raise Boom("forward")

    bad = Exploding().double()
    spec = probe_spec.parse_spec('[[hooks]]\npattern = "lin"\n')
    src = recorder.PromptSource(config=_plain_config(d=3, n=4), n_total=8)
    with pytest.raises(ModelFault, match="the model raised Boom: forward") as caught:  # a user's model: one line
        recorder.record(bad, tmp_path / "x.h5", spec, src, batch_size=4, progress=False)
    assert isinstance(caught.value.__cause__, Boom)
    assert attached_hook_count(bad) == 0
    assert not (tmp_path / "x.h5").exists()
    # the first batch runs before the file is created: a refused run leaves no .partial behind
    assert not partial_path(tmp_path / "x.h5").exists()


def test_plain_module_and_tuple_outputs(tmp_path):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(9, 1, batch_first=True).double()

    class Wrapper(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = mha

        def forward(self, x):
            return self.attn(x, x, x, need_weights=True)[0]

    model = Wrapper()
    spec = probe_spec.parse_spec('[[hooks]]\npattern = "attn#1"\ndtype = "float64"\n[params]\nnames = ["attn.in_proj_weight"]\n')
    src = recorder.PromptSource(config=_plain_config(d=4, n=8), n_total=10)
    recorder.record(model, tmp_path / "m.h5", spec, src, batch_size=4, progress=False)
    with Recording(tmp_path / "m.h5") as r:
        w = r.read("attn#1")
        z = torch.from_numpy(r.array("/prompts/z"))
        np.testing.assert_allclose(w, mha(z, z, z, need_weights=True)[1].detach().numpy(), atol=1e-12)
        assert r.group("params")["attn.in_proj_weight"].shape == (27, 9)
        # the prompts are linear-td's; the model is not of a family
        assert r.task_family == "linear-td" and r.family is None
        assert r.model_info == {"family": None, "architecture": None, "class": "Wrapper"}
        assert r.group("theta_star") == {} and r.attr("n_layers") == 0
    with pytest.raises(UserError, match="no hook point 'nope'"):
        with capture(model, ["nope"], lambda n, t: None):
            pass


def test_hooked_transformer_from_config_matches_run_with_cache(tmp_path):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=12, d_head=8, n_heads=2, d_vocab=11, attn_only=True,
                                  act_fn="relu", seed=0)
    model = HookedTransformer(cfg)
    tokens = np.random.default_rng(0).integers(0, 11, size=(10, 12))
    np.savez(tmp_path / "tokens.npz", input=tokens)
    source = prompts.load_prompt_file(tmp_path / "tokens.npz", None, None)
    spec = probe_spec.shipped_spec("generic")
    s = recorder.record(model, tmp_path / "tl.h5", spec, source, batch_size=4, progress=False)
    assert attached_hook_count(model) == 0
    _, cache = model.run_with_cache(torch.from_numpy(tokens), names_filter=list(s.hooks))
    with Recording(tmp_path / "tl.h5") as r:
        assert set(r.hooks()) == set(s.hooks)
        for name in s.hooks:
            np.testing.assert_allclose(r.read(name), cache[name].float().numpy(), atol=1e-6)
        assert r.attr("task_data").startswith("absent")
        assert r.group("params")["blocks.0.attn.W_Q"].shape == (2, 16, 8)


def test_bfloat16_is_stored_exactly(tmp_path):
    model = theta_star_model("linear-td", d=3, n_layers=1)
    spec = probe_spec.parse_spec('[[hooks]]\npattern = "blocks.0.hook_resid_post"\ndtype = "bfloat16"\n'
                                 '[[hooks]]\npattern = "blocks.0.hook_resid_pre"\ndtype = "float64"\n')
    _record(model, tmp_path / "b.h5", spec=spec, n_total=8, batch_size=8)
    with Recording(tmp_path / "b.h5") as r:
        got = r.read("blocks.0.hook_resid_post")
        assert got.dtype == np.float32 and r.f["acts/blocks.0.hook_resid_post"].attrs["dtype"] == "bfloat16"
        with torch.no_grad():
            want = model(torch.from_numpy(r.array("/prompts/z")), stop_at_layer=1).to(torch.bfloat16).float().numpy()
        np.testing.assert_array_equal(got, want)  # exact: the same forward on the same prompts, then the same cast


def test_position_slice(tmp_path):
    model = theta_star_model("linear-td", d=3, n_layers=1)
    spec = probe_spec.parse_spec('[[hooks]]\npattern = "blocks.0.attn.hook_pattern"\npositions = "-1:"\n'
                                 '[[hooks]]\npattern = "blocks.0.hook_resid_post"\npositions = "0:3"\n')
    s = _record(model, tmp_path / "p.h5", spec=spec, n_total=8, batch_size=8)
    assert s.hooks["blocks.0.attn.hook_pattern"] == (1, 1, 17)
    assert s.hooks["blocks.0.hook_resid_post"] == (3, 7)


def test_user_prompts_npz(tmp_path):
    model = theta_star_model("linear-td", d=3, n_layers=2)
    batch = _sample(_config(model), 12)
    np.savez(tmp_path / "ok.npz", z=batch.prompt.z, state=batch.prompt.states)
    src = prompts.load_prompt_file(tmp_path / "ok.npz", _config(model), model.layout)
    recorder.record(model, tmp_path / "u.h5", FLOAT64_SPEC, src, batch_size=5, progress=False)
    with Recording(tmp_path / "u.h5") as r:
        np.testing.assert_allclose(r.array("/reference/td_errors"), batch.reference["td_errors"], atol=1e-12)
        assert r.attr("task_data").startswith("absent")
    bad = batch.prompt.z.copy()
    bad[0, 0, 0] = np.nan
    np.savez(tmp_path / "nan.npz", z=bad)
    with pytest.raises(UserError, match="NaN"):
        prompts.load_prompt_file(tmp_path / "nan.npz", _config(model), model.layout)
    np.savez(tmp_path / "wide.npz", z=np.zeros((2, 5, 8)))
    with pytest.raises(UserError, match="d_model 8"):
        prompts.load_prompt_file(tmp_path / "wide.npz", _config(model), model.layout)
    np.savez(tmp_path / "labels.npz", z=np.zeros((2, 5, 7)), state=np.zeros((2, 4)))
    with pytest.raises(UserError, match="state has shape"):
        prompts.load_prompt_file(tmp_path / "labels.npz", _config(model), model.layout)
    np.savez(tmp_path / "none.npz", x=np.zeros(3))
    with pytest.raises(UserError, match="unknown arrays x"):
        prompts.load_prompt_file(tmp_path / "none.npz", None, None)


def test_refuses_to_overwrite_and_to_resume_with_other_settings(tmp_path):
    model = theta_star_model("linear-td", d=3, n_layers=1)
    _record(model, tmp_path / "a.h5")
    with pytest.raises(UserError, match="exists"):
        _record(model, tmp_path / "a.h5")
    with pytest.raises(UserError, match="nothing to resume"):
        _record(model, tmp_path / "b.h5", resume=True)


SIGKILL_N = 320  # 20 batches of 16
FORK = mp.get_context("fork")


@pytest.fixture(scope="module")
def sigkill_reference(tmp_path_factory):
    """The uninterrupted recording, made once here: the same computation as the killed run's."""
    ref = tmp_path_factory.mktemp("sigkill-ref") / "ref.h5"
    _slow_child.main(str(ref), SIGKILL_N, False)
    return ref


def _progress(path):
    try:
        with h5py.File(path, "r", libver="latest", swmr=True) as f:
            return int(f["progress"][0])
    except (OSError, KeyError):
        return -1


@pytest.mark.parametrize("trial", range(2))
def test_sigkill_then_resume_is_identical(sigkill_reference, tmp_path, trial):
    """The run is a forked child of this process (as in test_shard_kills.py: a real process, SIGKILLed,
    without a fresh interpreter's imports); the reference and the resume run here."""
    out = tmp_path / "k.h5"
    proc = FORK.Process(target=_slow_child.main, args=(str(out), SIGKILL_N, False))
    proc.start()
    deadline = time.time() + 120
    while _progress(partial_path(out)) < 16 * (1 + trial) and proc.is_alive() and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(random.Random(trial).uniform(0, 0.2))
    proc.kill()
    proc.join()
    if not out.exists():  # killed before the end: nothing at the final path, finished work kept
        assert partial_path(out).exists()
        done = _progress(partial_path(out))
        assert done >= 16 and done % 16 == 0
        _slow_child.main(str(out), SIGKILL_N, True)
    assert not partial_path(out).exists()
    with h5py.File(sigkill_reference) as a, h5py.File(out) as b:
        assert b.attrs["complete"]
        for key in ("acts/0.soft", "acts/1.q", "prompts/z", "reference/td_errors", "tasks/values"):
            np.testing.assert_array_equal(a[key][()], b[key][()])  # exact: the same batches computed again


@pytest.mark.parametrize("family, kw", [("actor-critic", dict(d=6, m=6, alpha=0.5, beta=0.25)),
                                        ("softmax-td", dict(d=6, n_layers=2, score_scale=3.0)),
                                        ("sarsa", dict(d=6, alpha=0.5))])
def test_prompt_files_of_every_family_get_the_reference(tmp_path, family, kw):
    """User prompts are run through the task family's reference algorithm (0.1 left actor-critic
    prompt files without one), with the checkpoint's constants (beta, score_scale)."""
    model = theta_star_model(family, **kw)
    config = _config(model)
    batch = _sample(config, 10, seed=4)
    np.savez(tmp_path / "p.npz", z=batch.prompt.z, state=batch.prompt.states)
    src = prompts.load_prompt_file(tmp_path / "p.npz", config, model.layout)
    assert src.task_family == family
    recorder.record(model, tmp_path / "p.h5", FLOAT64_SPEC, src, batch_size=5, progress=False)
    with Recording(tmp_path / "p.h5") as r:
        assert set(batch.reference) <= {k.split("/")[-1] for k in r.f["reference"]}
        for key, want in batch.reference.items():
            np.testing.assert_allclose(r.array(f"/reference/{key}"), want, atol=1e-12, err_msg=key)
        assert r.task_family == family and r.family == family
        star = r.group("theta_star")
        assert star and all(np.array_equal(star[k], r.group("params")[k]) for k in star)  # exact: copies
    from icrl_interp.analyzers import analyze

    for layer in analyze(tmp_path / "p.h5")["activations"]["layers"]:  # theta* runs that reference
        assert layer["reference_gap"] < 1e-9
    with pytest.raises(UserError, match="d_model"):
        np.savez(tmp_path / "wide.npz", z=np.zeros((2, 5, model.layout.d_model + 1)))
        prompts.load_prompt_file(tmp_path / "wide.npz", config, None)


def test_record_writes_schema_2_and_samples_through_the_registry(tmp_path):
    """The recorder samples with the task family's registered sampler: a family registered under
    another name records the same prompts under its own name."""
    model = theta_star_model("sarsa", d=6, alpha=0.5)
    config = _config(model)
    _record(model, tmp_path / "a.h5", n_total=8, batch_size=8)
    base = registry.get("sarsa")
    registry.register(registry.Family(**{**base.__dict__, "name": "test-sarsa-prompts"}))
    try:
        alias = CheckpointConfig(model=config.model, task=TaskSpec(**{**config.task.to_dict(), "family": "test-sarsa-prompts"}),
                                 origin=config.origin)
        src = recorder.PromptSource(config=alias, n_total=8)
        recorder.record(model, tmp_path / "b.h5", probe_spec.shipped_spec("sarsa"), src, batch_size=8, progress=False)
    finally:
        registry.unregister("test-sarsa-prompts")
    with Recording(tmp_path / "a.h5") as a, Recording(tmp_path / "b.h5") as b:
        assert a.task_family == "sarsa" and b.task_family == "test-sarsa-prompts"
        assert a.model_info == b.model_info == {"family": "sarsa", "architecture": "lsa", "class": "LSAModel"}
        np.testing.assert_array_equal(a.array("/prompts/z"), b.array("/prompts/z"))  # exact: the same sampling rerun
        assert b.attr("checkpoint_config")["task"]["family"] == "test-sarsa-prompts"
    with pytest.raises(UserError, match="needs a checkpoint config"):
        recorder.PromptSource(n_total=3)
