"""A family registered from outside the package (tests/families/mc_eval.py: batch Monte-Carlo value
regression on the linear-attention architecture) runs end to end with no package edit: its theta*
is exact against its own float64 reference, and construct -> record -> analyze -> report work
through the generic stages, in this process and in the report's worker processes."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from icrl_interp.models import checkpoint
from icrl_interp.families import registry
from icrl_interp.cli import main

HERE = Path(__file__).parent


@pytest.fixture
def mc(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setenv(registry.ENV_VAR, "mc_eval")  # the report's worker processes load it from here
    sys.modules.pop("mc_eval", None)
    import mc_eval

    yield mc_eval
    registry.unregister(mc_eval.NAME)


def test_mc_family_theta_star_is_exact_on_random_instances(mc, tmp_path):
    out = tmp_path / "ck"
    assert main(["construct", "mc-eval", "--out", str(out), "--n-layers", "5", "--alpha", "0.3", "--gamma", "0.7"]) == 0
    config, _ = checkpoint.read(out)
    assert config.family == config.task.family == "mc-eval" and config.model.architecture == "linear-attention"
    model = checkpoint.load(out)
    for seed in range(8):
        batch = config.sample(16, seed)
        with torch.no_grad():
            values = model.readout(model(torch.as_tensor(batch.prompt.z)))
        np.testing.assert_allclose(values.numpy(), batch.reference["output"], rtol=0, atol=1e-10)
        # the reference is batch MC regression: its first step from w = 0 is (alpha/n) sum_i G_i phi_i
        z = batch.prompt.z
        phi, G = z[:, :-1, :3], z[:, :-1, -1]
        w1 = 0.3 / phi.shape[1] * np.einsum("bn,bnd->bd", G, phi)
        np.testing.assert_allclose(batch.reference["w"][:, 1], w1, atol=1e-12)
    np.testing.assert_allclose(mc.returns(np.array([[1.0, 2.0, 3.0]]), 0.5), [[2.75, 3.5, 3.0]])


def test_mc_family_records_analyzes_and_reports(mc, tmp_path):
    ck, rec, report = tmp_path / "ck", tmp_path / "rec.h5", tmp_path / "report"
    assert main(["construct", "mc-eval", "--out", str(ck), "--n-layers", "3"]) == 0
    assert main(["record", str(ck), "--out", str(rec), "--tasks", "64", "--batch-size", "32", "--no-progress"]) == 0
    assert main(["analyze", str(rec), "--json", str(tmp_path / "a.json"), "--workers", "1", "--no-progress"]) == 0
    res = json.loads((tmp_path / "a.json").read_text())
    assert res["family"] == "mc-eval" and res["task_family"] == "mc-eval" and res["architecture"] == "linear-attention"
    w = res["weights"]
    assert w["block_sparsity"]["in_support_energy"] == pytest.approx(1.0)
    assert w["manifold"]["scale"] == pytest.approx(1.0) and w["manifold"]["gauge_cosine"] == pytest.approx(1.0)
    for layer in res["activations"]["layers"]:
        assert layer["reference_gap"] < 1e-6  # the recorded (float32) outputs are the reference's, layer by layer
        probe = layer["td_probe"][f"blocks.{layer['layer']}.hook_resid_post"]
        assert probe["r2"] > 0.999 and probe["direction_cosine"] == pytest.approx(1.0, abs=1e-6)
        assert probe["r2_shuffled"] < 0.5  # the control: shuffled targets are not predictable
    assert main(["report", str(ck), str(rec), "--out", str(report), "--workers", "2"]) == 0
    rows = json.loads((report / "summary.json").read_text())
    rows = rows["rows"] if isinstance(rows, dict) else rows
    assert len(rows) == 2 and all(r["status"] == "ok" for r in rows), rows
    assert {r["family"] for r in rows} == {"mc-eval"}
    assert (report / "index.html").is_file()
