"""The real thing: theta* models of icrl_interp.models, recorded by icrl_interp.recording.recorder with the
shipped probe specs, analyzed. The synthetic-file tests cover the same code without torch."""
from __future__ import annotations

import pytest

pytest.importorskip("transformer_lens")

from icrl_interp.models import checkpoint  # noqa: E402
from icrl_interp.analyzers import analyze  # noqa: E402

from helpers import float_tol  # noqa: E402

CASES = [
    ("linear-td", dict(d=3, n_layers=3, alpha=0.5), {"kind": "boyan", "n": 16, "n_states": 6, "rewards": "representable"}),
    ("softmax-td", dict(d=5, n_layers=3, score_scale=8.0), {"kind": "boyan", "n": 24, "n_states": 5, "features": "onehot"}),
    ("sarsa", dict(d=6, c=-2.5), {"kind": "mdp", "n": 16, "n_states": 3, "n_actions": 2}),
    ("actor-critic", dict(d=6, m=6, c=-2.5, beta=0.5), {"kind": "mdp", "n": 16, "n_states": 3, "n_actions": 2}),
]


@pytest.mark.parametrize("family,kw,task", CASES, ids=[c[0] for c in CASES])
def test_recorded_theta_star_models_score_perfectly(family, kw, task, tmp_path):
    from icrl_interp.models import theta_star_model
    from icrl_interp.recording.probe_spec import shipped_spec
    from icrl_interp.recording.recorder import PromptSource, record

    model = theta_star_model(family, **kw)
    ck = checkpoint.save(model, {"task": task, "n": task["n"], "seed": 0}, tmp_path / "ck")
    config, _ = checkpoint.read(ck)
    rec = record(model, tmp_path / "rec.h5", shipped_spec(family), PromptSource(config=config, n_total=96, seed=1),
                 batch_size=32, progress=False).path
    r = analyze(rec)
    w = r["weights"]
    assert w["block_sparsity"]["in_support_energy"] == pytest.approx(1.0, rel=0, abs=float_tol())
    assert max(w["manifold"]["rel_err"].values()) < 1e-12
    assert w["manifold"]["gauge_cosine"] == pytest.approx(1.0, abs=1e-12)
    assert r["family"] == r["task_family"] == family
    if family in ("sarsa", "actor-critic"):
        assert w["manifold"]["scale"] == pytest.approx(-2.5, rel=1e-12)
        assert w["block_sparsity"]["lazy_drift"] == 0.0  # exact: theta*'s lazy blocks are literal zeros
    if family == "softmax-td":
        assert w["sign_pattern"] == "+,+,-"
    for layer in r["activations"]["layers"]:
        assert layer["td_probe_r2"] > 0.99
        assert abs(layer["td_probe"][layer["td_probe_hook"]]["r2_shuffled"]) < 0.1
        assert layer["reference_gap"] < 1e-5  # float32 recordings of a float64 model
    if family == "linear-td":
        m = r["activations"]["wang_metrics"]
        assert m["VD"] < 1e-10 and m["SS"] > 1 - 1e-9 and m["IWS"] > 1 - 1e-6
    # the checkpoint alone gives the same weight section
    assert analyze(ck)["weights"]["manifold"]["rel_err"] == w["manifold"]["rel_err"]  # exact: the same computation
