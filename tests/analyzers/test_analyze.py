"""End to end on schema-conforming files: the JSON contract, theta* known answers, bad inputs,
batches in parallel processes, the CLI, and no heavy imports."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from icrl_interp.tasks import envs
from icrl_interp.families import registry
from icrl_interp.analyzers import analyze, analyze_many
from icrl_interp.cli import main
from icrl_interp.core.errors import UserError
from icrl_interp.families import actor_critic, softmax_td

from helpers import float_tol

from . import analyzer_data as D

FAMILIES = ["linear-td", "softmax-td", "sarsa"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("analyzer_inputs")
    out = {}
    for fam in FAMILIES:
        out[fam] = D.write_recording(root / f"{fam}.h5", fam, n_prompts=160, batch=40)
        out[f"ck:{fam}"] = D.write_checkpoint(root / f"ck_{fam}", D.config_for(fam), D.theta_params(D.config_for(fam)))
    return out


@pytest.fixture(scope="module")
def results(files):
    return {fam: analyze(files[fam]) for fam in FAMILIES}


def _contract(r: dict, activations: bool) -> None:
    assert r["schema"] == "icrl_interp.analysis/1"
    assert set(r) >= {"family", "source", "weights", "activations"}
    w = r["weights"]
    assert set(w["block_sparsity"]) >= {"in_support_energy", "lazy_drift", "block_norms"}
    assert set(w["manifold"]) >= {"scale", "rel_err", "gauge_cosine"}
    assert "sign_pattern" in w
    if activations:
        for i, layer in enumerate(r["activations"]["layers"]):
            assert layer["layer"] == i
            assert set(layer) >= {"kernel_diagonality", "td_probe_r2", "value_error"}
    else:
        assert r["activations"] is None
    json.dumps(r, allow_nan=False)  # strict JSON: no NaN anywhere


@pytest.mark.parametrize("family", FAMILIES)
def test_theta_star_recording_has_the_known_answers(results, family):
    r = results[family]
    _contract(r, activations=True)
    assert r["family"] == family and r["kind"] == "recording"
    assert r["task_family"] == family and r["architecture"] == registry.get(family).architecture
    w = r["weights"]
    assert w["block_sparsity"]["in_support_energy"] == pytest.approx(1.0, rel=0, abs=float_tol())
    assert all(v == pytest.approx(0.0, abs=float_tol()) for v in w["manifold"]["rel_err"].values())
    assert w["manifold"]["gauge_cosine"] == pytest.approx(1.0, abs=1e-12)
    # exact: theta*'s lazy blocks are literal zeros
    assert w["block_sparsity"]["lazy_drift"] == (0.0 if family == "sarsa" else None)
    assert w["sign_pattern"] == ("+,+,-" if family == "softmax-td" else None)
    layers = r["activations"]["layers"]
    assert len(layers) == D.CONFIGS[family]["model"]["n_layers"]
    for layer in layers:
        assert layer["td_probe_r2"] > 0.99
        probe = layer["td_probe"][layer["td_probe_hook"]]
        assert abs(probe["r2_shuffled"]) < 0.05 and layer["td_probe_r2_shuffled"] == probe["r2_shuffled"]  # a copy
        assert layer["reference_gap"] < 1e-9  # the model runs the reference algorithm
        if family != "sarsa":
            assert probe["direction_cosine"] == pytest.approx(1.0, abs=1e-6)
            assert layer["value_error"] == pytest.approx(layer["reference_value_error"], abs=1e-9)
    if family == "sarsa":
        assert layers[0]["td_probe_hook"] == "blocks.0.attn.hook_attn_scores"
        assert layers[0]["value_error"] < 1e-12 and layers[0]["teacher_rel_err"] < 1e-12
    else:
        errs = [layer["value_error"] for layer in layers]
        assert all(a > b for a, b in zip(errs, errs[1:])), errs  # decreasing with depth, like the reference


def test_wang_metrics_of_theta_star(results):
    m = results["linear-td"]["activations"]["wang_metrics"]
    assert m["VD"] < 1e-20 and m["SS"] == pytest.approx(1.0, abs=1e-12) and m["IWS"] == pytest.approx(1.0, abs=1e-9)
    assert m["query_map_residual"] < 1e-12


def test_softmax_kernel_diagonality_and_population_kernel(results):
    r = results["softmax-td"]
    k = r["activations"]["layers"][0]["kernel_diagonality"]
    assert 0.9 < k["min"] <= k["mean"] <= 1.0
    assert k["margin"] == pytest.approx(k["min"] - 0.95)
    M = np.array(k["M_hat"], dtype=float)
    np.testing.assert_allclose(M.sum(-1), 1.0, atol=1e-9)
    # tied theta*: every layer has the same kernel
    assert all(L["kernel_diagonality"]["min"] == pytest.approx(k["min"]) for L in r["activations"]["layers"])
    free = r["activations"]["layers"][0]["label_free_diagonal"]
    assert free["same_features"] > 0.9 and 0 < free["self"] < free["same_features"]
    pk = r["weights"]["population_kernel"]
    assert len(pk) == 6 and pk[0]["tasks"] == "recorded tasks" and pk[0]["min"] > 0.9


def test_chunk_size_does_not_change_the_result(files, results):
    small = analyze(files["softmax-td"], chunk_mib=0.15)  # many chunks instead of one
    _approx_equal(small, results["softmax-td"])


def _approx_equal(a, b, path=""):
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            if k != "alpha":  # CV errors of an exact fit are all ~1e-20: the chosen penalty is arbitrary
                _approx_equal(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _approx_equal(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-7, abs=1e-9), path
    else:
        assert a == b, path


def test_checkpoints_give_the_weight_section(files):
    for fam in FAMILIES:
        r = analyze(files[f"ck:{fam}"])
        _contract(r, activations=False)
        assert r["kind"] == "checkpoint"
        assert r["weights"]["block_sparsity"]["in_support_energy"] == pytest.approx(1.0, rel=0, abs=float_tol())
        assert r["task_family"] == fam and r["architecture"] == registry.get(fam).architecture
        assert "activations" in r["skipped"]


def test_checkpoint_population_kernel_in_closed_form(files):
    """One-hot x beta features with A = 8 I: M_pi(s, s) = mu e^8 / (mu e^8 + 1 - mu) on the sampled tasks."""
    r = analyze(files["ck:softmax-td"])
    pk = r["weights"]["population_kernel"]
    task = D.CONFIGS["softmax-td"]["task"]
    mrp = envs.sample_boyan_chains(256, task["n_states"], 5, 0.9, 0, "onehot", 1.0, "uniform")
    mu = mrp.stationary()
    diag = mu * math.exp(8) / (mu * math.exp(8) + 1 - mu)
    assert pk[0]["min"] == pytest.approx(diag.min(-1).mean(), rel=1e-12)
    assert pk[0]["mean"] == pytest.approx(diag.mean(-1).mean(), rel=1e-12)
    assert pk[0]["frac_tasks_contracting"] == pytest.approx(np.mean(diag.min(-1) > 0.95))


def test_bfloat16_and_position_slices(tmp_path):
    p = D.write_recording(tmp_path / "bf.h5", "softmax-td", n_prompts=80, batch=40, bf16=True)
    r = analyze(p)
    for layer in r["activations"]["layers"]:
        assert layer["td_probe_r2"] > 0.99
        assert layer["value_error"] == pytest.approx(layer["reference_value_error"], rel=0.02)
    p = D.write_recording(tmp_path / "sl.h5", "softmax-td", n_prompts=80, batch=40, positions="0:-1")
    r = analyze(p)
    assert all(layer["td_probe_r2"] > 0.99 and layer["kernel_diagonality"] is not None for layer in r["activations"]["layers"])
    p = D.write_recording(tmp_path / "sl_td.h5", "linear-td", n_prompts=80, batch=40, positions="0:-1")
    r = analyze(p)
    assert r["activations"]["layers"][0]["value_error"] is None
    assert "last" in r["skipped"]["value_error.layer0"] and "wang_metrics" in r["skipped"]


def test_a_model_off_the_construction_is_measured_as_such(tmp_path, rng):
    cfg = D.config_for("softmax-td")
    params = D.theta_params(cfg)
    V = params["blocks.0.attn.V"].copy()
    lay = D.layout_of(cfg)
    V[lay.slice("current_mem").start, lay.slice("reward").start] = 0.5  # value row (0.5, 1, -1)
    noisy = {**params, "blocks.0.attn.V": V}
    r = analyze(D.write_recording(tmp_path / "off.h5", "softmax-td", n_prompts=80, batch=40, params=noisy))
    assert r["weights"]["manifold"]["value_row_cosine"] == pytest.approx(2.5 / math.sqrt(3 * 2.25), rel=1e-12)
    assert r["weights"]["sign_pattern"] == "+,+,-"
    assert all(layer["reference_gap"] > 1e-3 for layer in r["activations"]["layers"])


# ------------------------------------------------------------------ bad input
def test_incomplete_recording_is_refused(tmp_path):
    partial = D.write_recording(tmp_path / "x.h5", "sarsa", n_prompts=40, batch=20, finish=False)
    bad = tmp_path / "incomplete.h5"
    shutil.copy(partial, bad)
    with pytest.raises(UserError, match="incomplete"):
        analyze(bad)


def test_foreign_and_wrong_schema_files_are_refused(tmp_path):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f.attrs["schema"] = "someone.else/2"
        f.attrs["complete"] = True
    with pytest.raises(UserError, match="not an icrl_interp recording"):
        analyze(other)
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"hello world")
    with pytest.raises(UserError, match="neither a checkpoint"):
        analyze(junk)
    with pytest.raises(UserError, match="no such file"):
        analyze(tmp_path / "missing.h5")
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(UserError, match="not a checkpoint"):
        analyze(tmp_path / "emptydir")


def test_missing_hook_is_a_clear_reason_and_the_rest_is_analyzed(tmp_path):
    p = D.write_recording(tmp_path / "m.h5", "linear-td", n_prompts=40, batch=20, drop=("blocks.2.hook_resid_post",))
    r = analyze(p)
    assert "lacks hook blocks.2.hook_resid_post" in r["skipped"]["value_error.layer2"]
    layers = r["activations"]["layers"]
    assert layers[2]["value_error"] is None and layers[1]["value_error"] is not None
    assert layers[2]["td_probe"]
    assert r["weights"]["block_sparsity"]["in_support_energy"] == pytest.approx(1.0, rel=0, abs=float_tol())
    assert r["sections"]["value_error"] == "ok" and r["sections"]["wang_metrics"].startswith("needs hook_resid_post")
    from icrl_interp.analyzers.analyze import status_of

    assert status_of(r)[0] == "partial" and "wang_metrics" in status_of(r)[1]


def test_layout_that_does_not_fit_and_mismatched_theta_star(tmp_path):
    cfg = D.config_for("sarsa")
    wrong = D.theta_params(D.config_for("sarsa", d=4))
    p = D.write_recording(tmp_path / "fit.h5", "sarsa", n_prompts=40, batch=20)
    with h5py.File(p, "r+") as f:  # parameters of another size than the recorded layout
        for name, value in wrong.items():
            del f[f"params/{name}"], f[f"theta_star/{name}"]
            f[f"params/{name}"] = value
            f[f"theta_star/{name}"] = value
    # the weights fail with their reason; the activation analysis is kept
    r = analyze(p)
    assert r["weights"] is None and r["skipped"]["weights"].startswith("failed") and "does not fit" in r["skipped"]["weights"]
    assert r["activations"]["layers"][0]["td_probe_r2"] > 0.99 and r["sections"]["weights"].startswith("failed")
    star = D.theta_params(cfg)
    p = D.write_recording(tmp_path / "mis.h5", "sarsa", n_prompts=40, batch=20,
                          theta={"blocks.0.attn.P": star["blocks.0.attn.P"][:-1, :-1], "blocks.0.attn.V": star["blocks.0.attn.V"]})
    r = analyze(p)
    assert "mismatched theta" in r["skipped"]["weights"] and r["activations"]["layers"][0]["value_error"] < 1e-12


# ------------------------------------------------------------- batches, CLI
def test_analyze_many_in_parallel_keeps_order_and_survives_bad_inputs(files, tmp_path):
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"not hdf5")
    rows = analyze_many([files["sarsa"], junk, tmp_path / "nope", files["ck:linear-td"]], workers=2)
    assert [r["source"] for r in rows] == [str(files["sarsa"]), str(junk), str(tmp_path / "nope"), str(files["ck:linear-td"])]
    assert "error" not in rows[0] and "error" not in rows[3]
    assert "neither a checkpoint" in rows[1]["error"] and "no such file" in rows[2]["error"]
    assert rows[0]["activations"]["layers"][0]["td_probe_r2"] > 0.99


def test_a_directory_expands_to_its_checkpoints_and_recordings(files, tmp_path):
    d = tmp_path / "run"
    (d / "checkpoints").mkdir(parents=True)
    shutil.copytree(files["ck:sarsa"], d / "checkpoints" / "step_000010")
    shutil.copytree(files["ck:sarsa"], d / "checkpoints" / "step_000020")
    shutil.copy(files["sarsa"], d / "rec.h5")
    rows = analyze_many([d], workers=1)
    # walk order (inputs.discover): a directory's recordings, then its subdirectories, each sorted
    assert [Path(r["source"]).name for r in rows] == ["rec.h5", "step_000010", "step_000020"]
    assert not any("error" in r for r in rows)


def test_cli_prints_a_table_and_writes_json_atomically(files, tmp_path, capsys):
    out = tmp_path / "sub" / "a.json"
    out.parent.mkdir()  # commands create no missing parent directories
    assert main(["analyze", str(files["softmax-td"]), "--json", str(out), "--workers", "1"]) == 0
    text = capsys.readouterr().out
    assert "softmax-td (recording)" in text and "+,+,-" in text and "probe R2" in text
    data = json.loads(out.read_text())
    assert data["schema"] == "icrl_interp.analysis/1" and data["weights"]["sign_pattern"] == "+,+,-"
    assert [p.name for p in out.parent.iterdir()] == ["a.json"]  # no temporary left behind
    rc = main(["analyze", str(files["ck:sarsa"]), str(tmp_path / "nope"), "--json", str(out), "--workers", "1"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "nope: " in err and "no such file" in err
    rows = json.loads(out.read_text())
    assert isinstance(rows, list) and len(rows) == 2 and "error" in rows[1]
    assert main(["analyze", str(files["sarsa"]), "--workers", "0"]) == 2


def test_cli_analyzes_transformerlens_weights_with_a_layout(tmp_path, capsys):
    from safetensors.numpy import save_file

    d = 3
    lay = softmax_td.layout(d)
    s = softmax_td.theta_star(d, 1.0, 0.9, 4.0)
    Dm = lay.d_model
    W_Q = np.zeros((1, Dm, d))
    W_Q[0, :d] = 4.0 * np.eye(d)
    W_K = np.zeros((1, Dm, d))
    W_K[0, :d] = np.eye(d)
    tensors = {"blocks.0.attn.W_Q": W_Q, "blocks.0.attn.W_K": W_K, "blocks.0.attn.W_V": s["V"].T[None].copy(),
               "blocks.0.attn.W_O": np.eye(Dm)[None].copy()}
    save_file(tensors, str(tmp_path / "tl.safetensors"))
    (tmp_path / "layout.json").write_text(lay.to_json())
    out = tmp_path / "tl.json"
    rc = main(["analyze", str(tmp_path / "tl.safetensors"), "--layout", str(tmp_path / "layout.json"),
               "--family", "softmax-td", "--json", str(out)])
    assert rc == 0, capsys.readouterr().err
    r = json.loads(out.read_text())
    assert r["kind"] == "tl-weights" and r["weights"]["sign_pattern"] == "+,+,-"
    assert r["weights"]["manifold"]["scale"] == pytest.approx(4.0)
    assert r["weights"]["block_sparsity"]["in_support_energy"] == pytest.approx(1.0, rel=0, abs=float_tol())
    with pytest.raises(UserError, match="--layout"):
        analyze(tmp_path / "tl.safetensors")


def test_analyzers_import_neither_torch_nor_transformer_lens(files):
    code = ("import sys; from icrl_interp.analyzers import analyze; import icrl_interp.commands.analyze; "
            f"analyze({str(files['softmax-td'])!r}); analyze({str(files['ck:sarsa'])!r}); "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformer_lens')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_probe_task_cap_uses_a_subset_and_all_on_request(files):
    capped = analyze(files["linear-td"], probe_max_tasks=40)["activations"]["layers"][0]
    full = analyze(files["linear-td"], probe_max_tasks=0)["activations"]["layers"][0]
    hook = "blocks.0.hook_resid_post"
    n = D.CONFIGS["linear-td"]["task"]["n"]
    # every prompt but the first (no earlier partner for the shuffled control)
    assert full["td_probe"][hook]["n_train"] + full["td_probe"][hook]["n_test"] == (160 - 1) * n
    assert 10 * n <= capped["td_probe"][hook]["n_train"] + capped["td_probe"][hook]["n_test"] <= 80 * n
    # exact: the cap changes only the probe; the value error is the same computation on the same prompts
    assert capped["td_probe_r2"] > 0.99 and capped["value_error"] == full["value_error"]


def test_memory_does_not_grow_with_the_number_of_prompts(tmp_path, monkeypatch):
    """Flat apart from the probes' held-out rows, which are kept up to their own fixed budget (set to 0 here;
    tests/analyzers/test_td_probe_honest.py tests that budget)."""
    import tracemalloc

    from icrl_interp.analyzers import probes as P

    monkeypatch.setattr(P, "FILE_HELD_OUT_CACHE_BYTES", 0)
    peaks = []
    cfg = D.config_for("softmax-td", n_layers=2)
    for n in (64, 512):
        p = D.write_recording(tmp_path / f"m{n}.h5", "softmax-td", n_prompts=n, batch=128, cfg=cfg)
        tracemalloc.start()
        analyze(p, chunk_mib=0.5, probe_max_tasks=0)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[1] < 1.3 * peaks[0], peaks  # 8x the prompts, (about) the same peak


# ------------------------------------------------- registry-driven choices
def test_cli_family_accepts_every_registered_family(tmp_path, capsys):
    """TL weights of actor-critic's theta* (moved along the gauge) analyzed with --family actor-critic
    (0.1 refused the choice although the analyzer supports it)."""
    from safetensors.numpy import save_file

    d, m = 4, 2
    lay = actor_critic.layout(d, m)
    star = actor_critic.theta_star(d, m, 1.0, 1.0, c=-2.0)
    eye = np.eye(lay.d_model)[None]
    # TL: score = (W_Q W_K^T)^T = W_K W_Q^T and value = (W_V W_O)^T; W_Q = I, W_K = P, W_V = V^T, W_O = I
    tensors = {"blocks.0.attn.W_Q": eye.copy(), "blocks.0.attn.W_K": star["P"][None].copy(),
               "blocks.0.attn.W_V": star["V"].T[None].copy(), "blocks.0.attn.W_O": eye.copy()}
    save_file(tensors, str(tmp_path / "ac.safetensors"))
    (tmp_path / "layout.json").write_text(lay.to_json())
    out = tmp_path / "ac.json"
    rc = main(["analyze", str(tmp_path / "ac.safetensors"), "--layout", str(tmp_path / "layout.json"),
               "--family", "actor-critic", "--json", str(out)])
    assert rc == 0, capsys.readouterr().err
    r = json.loads(out.read_text())
    assert r["family"] == "actor-critic" and r["architecture"] == "lsa" and r["task_family"] is None
    assert r["weights"]["manifold"]["scale"] == pytest.approx(-2.0, rel=1e-12)
    assert r["weights"]["block_sparsity"]["in_support_energy"] == pytest.approx(1.0, rel=0, abs=float_tol())
    # exact: the heads are theta* times the identity, which keeps its literal zeros
    assert r["weights"]["block_sparsity"]["lazy_drift"] == 0.0
    from icrl_interp.commands import analyze as command

    parser = __import__("argparse").ArgumentParser()
    command.add_arguments(parser)
    choices = next(a.choices for a in parser._actions if a.dest == "family")
    assert list(choices) == registry.names()


def _state_kernel(data, sharpness=4.0):
    """A softmax pattern over sources (query column masked) that prefers sources of the target's state."""
    s = data["prompts/state"]
    n = s.shape[1] - 1
    logits = sharpness * (s[:, :, None] == s[:, None, :]).astype(float)
    logits[:, :, n] = -np.inf
    w = np.exp(logits - logits.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True))[:, None]


def test_a_softmax_pattern_is_a_kernel_whatever_the_task(tmp_path):
    """A foreign softmax model recorded on linear-td prompts: its pattern is analyzed as a kernel (the
    prompts' family does not matter); declared as the linear-attention model, the same pattern is not."""
    def soften(data):
        for key in [k for k in data if k.endswith("attn.hook_pattern")]:
            data[key] = _state_kernel(data)

    foreign = {"family": None, "architecture": None, "class": "SoftmaxFromElsewhere"}
    p = D.write_recording(tmp_path / "foreign.h5", "linear-td", n_prompts=40, batch=20, model=foreign, transform=soften)
    r = analyze(p)
    assert r["family"] == "generic" and r["task_family"] == "linear-td" and r["architecture"] is None
    assert r["weights"] is None and "no construction" in r["skipped"]["weights"]
    for layer in r["activations"]["layers"]:
        kd = layer["kernel_diagonality"]
        assert kd is not None and 0.5 < kd["min"] <= kd["mean"] <= 1.0
        # the prompts are linear-td's: the value error is read where that task puts it
        assert layer["value_error"] == pytest.approx(layer["reference_value_error"], abs=1e-9)
        assert layer["td_probe_r2"] > 0.99
    assert "wang_metrics" in r["skipped"]  # VD/SS/IWS need the model's own P and Q
    q = D.write_recording(tmp_path / "linear.h5", "linear-td", n_prompts=40, batch=20, transform=soften)
    r = analyze(q)
    assert all(layer["kernel_diagonality"] is None for layer in r["activations"]["layers"])
    assert "not a softmax kernel" in r["skipped"]["kernel_diagonality"]


def test_probe_and_readout_choices_come_from_the_hints(tmp_path):
    """A family registered under another name: its hints, not its name, pick the headline probe."""
    import dataclasses

    base = registry.get("sarsa")
    hints = dataclasses.replace(base.hints, primary_probe=("attn.hook_v", "hook_resid_post"))
    alias = registry.Family(**{**base.__dict__, "name": "test-sarsa-alias", "hints": hints})
    registry.register(alias)
    try:
        model = {"family": "test-sarsa-alias", "architecture": "lsa", "class": "numpy-forward"}
        p = D.write_recording(tmp_path / "alias.h5", "sarsa", n_prompts=40, batch=20, model=model,
                              task_family="test-sarsa-alias")
        r = analyze(p)
        assert r["family"] == r["task_family"] == "test-sarsa-alias"
        layer = r["activations"]["layers"][0]
        assert layer["td_probe_hook"] == "blocks.0.attn.hook_v"
        assert layer["value_error"] < 1e-12 and layer["teacher_rel_err"] < 1e-12
        assert r["weights"]["block_sparsity"]["lazy_drift"] == 0.0  # exact: theta*'s lazy blocks are literal zeros
        assert r["weights"]["manifold"]["scale"] == pytest.approx(1.0, rel=0, abs=float_tol())
    finally:
        registry.unregister("test-sarsa-alias")


def test_recording_without_theta_star_rebuilds_it_from_its_config(tmp_path):
    p = D.write_recording(tmp_path / "no_theta.h5", "softmax-td", n_prompts=20, batch=20, theta={})
    r = analyze(p)
    assert r["weights"]["block_sparsity"]["in_support_energy"] == pytest.approx(1.0, rel=0, abs=float_tol())
    assert r["weights"]["sign_pattern"] == "+,+,-"


def test_a_foreign_models_transformerlens_heads_are_read_as_the_given_family(tmp_path):
    cfg = D.config_for("sarsa")
    star = D.theta_params(cfg)
    P, V = star["blocks.0.attn.P"], star["blocks.0.attn.V"]
    eye = np.eye(P.shape[0])[None]
    tl = {"blocks.0.attn.W_Q": eye, "blocks.0.attn.W_K": P[None], "blocks.0.attn.W_V": V.T[None],
          "blocks.0.attn.W_O": eye}
    foreign = {"family": None, "architecture": None, "class": "HookedTransformer"}
    p = D.write_recording(tmp_path / "tl.h5", "sarsa", n_prompts=20, batch=20, params=star, theta={}, model=foreign)
    import h5py

    with h5py.File(p, "r+") as f:  # the recorded parameters are the TL heads
        for name in list(f["params"]):
            del f[f"params/{name}"]
        for name, value in tl.items():
            f[f"params/{name}"] = value
    assert "no construction" in analyze(p)["skipped"]["weights"]
    r = analyze(p, family="sarsa")
    assert r["family"] == "generic" and r["task_family"] == "sarsa"
    w = r["weights"]
    assert w["block_sparsity"]["in_support_energy"] == pytest.approx(1.0, rel=0, abs=float_tol())
    assert w["manifold"]["scale"] == pytest.approx(1.0)
    # exact: the heads are theta* times the identity, which keeps its literal zeros
    assert w["block_sparsity"]["lazy_drift"] == 0.0
