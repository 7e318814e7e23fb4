"""Regression: files written by icrl_interp 0.1 (checkpoint format 1, recording schema 1) still load
and analyze to the numbers 0.1 gave (tests/fixtures/format_v1: theta* models of the four families).

The expected numbers are those of the 0.1 analyzer on the same files; the family-registry analyzer
reproduces them bit for bit (only the added fields task_family / architecture are new).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from icrl_interp.models import checkpoint
from icrl_interp.families import registry
from icrl_interp.analyzers import analyze
from icrl_interp.recording.format import SCHEMA_V1, Recording

from helpers import float_tol

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "format_v1"
FAMILIES = ["linear-td", "softmax-td", "sarsa", "actor-critic"]

# value_error (and reference_value_error) per layer, td_probe_hook of layer 0, as 0.1 computed them
VALUE_ERRORS = {
    "linear-td": [2.292586245784332, 2.1660292412045234],
    "softmax-td": [2.4544172268968847, 2.1929913384321083, 1.9529080644662427],
    "sarsa": [1.8346184004915686e-08],
    "actor-critic": [3.979287115584469e-08],
}
REFERENCE_VALUE_ERRORS = {
    "linear-td": [2.2925862403859214, 2.166029239512886],
    "softmax-td": [2.4544172268348543, 2.192991330088475, 1.952908068069358],
}
VALUE_RMS = {"linear-td": [2.8012291630473034, 2.6457174815456814],  # root mean squares since 0.2
             "softmax-td": [2.2076012782843994, 1.9881397741455706, 1.7949276831997538]}
PRIMARY_HOOK = {"linear-td": "hook_resid_post", "softmax-td": "hook_resid_post",
                "sarsa": "attn.hook_attn_scores", "actor-critic": "attn.hook_attn_scores"}
KERNEL_MIN = 0.3361268751323223  # softmax-td, every layer (tied theta*)
POPULATION_MIN = {"recording": 0.19162403747946707, "checkpoint": 0.21114708502377305}


def _strict_json(r: dict) -> dict:
    return json.loads(json.dumps(r, allow_nan=False))


@pytest.fixture(scope="module")
def recordings():
    return {fam: _strict_json(analyze(FIXTURES / f"rec-{fam}.h5")) for fam in FAMILIES}


@pytest.fixture(scope="module")
def checkpoints():
    return {fam: _strict_json(analyze(FIXTURES / f"ckpt-{fam}")) for fam in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_format_1_files_still_load(family):
    config, tensors = checkpoint.read(FIXTURES / f"ckpt-{family}")
    assert config.family == config.task.family == family and tensors
    with Recording(FIXTURES / f"rec-{family}.h5") as rec:
        assert rec.schema == SCHEMA_V1 and rec.schema_version == 1
        assert rec.task_family == family and rec.family == family
        assert rec.model_info == {"family": family, "architecture": registry.get(family).architecture, "class": None}
        cfg = rec.checkpoint_config
        assert cfg.family == family and cfg.model.n_layers == int(rec.attr("n_layers"))
        assert rec.layout.to_dict() == cfg.model.layout.to_dict()


@pytest.mark.parametrize("family", FAMILIES)
def test_theta_star_weights_score_perfectly(family, recordings, checkpoints):
    for r in (recordings[family], checkpoints[family]):
        assert r["schema"] == "icrl_interp.analysis/1" and r["family"] == family
        assert r["task_family"] == family and r["architecture"] == registry.get(family).architecture
        w = r["weights"]
        assert w["block_sparsity"]["in_support_energy"] == pytest.approx(1.0, rel=0, abs=float_tol())
        assert w["manifold"]["scale"] == pytest.approx(1.0, abs=1e-15)
        assert w["manifold"]["gauge_cosine"] == pytest.approx(1.0, abs=1e-15)
        assert all(v == pytest.approx(0.0, abs=float_tol()) for v in w["manifold"]["rel_err"].values())
        lazy = registry.get(family).hints.lazy_from is not None
        assert w["block_sparsity"]["lazy_drift"] == (0.0 if lazy else None)  # exact: theta*'s literal zeros
        assert w["sign_pattern"] == ("+,+,-" if family == "softmax-td" else None)
    # the recording's /params and /theta_star are the checkpoint's: same weight section
    strip = lambda w: {k: v for k, v in w.items() if k != "population_kernel"}  # noqa: E731
    assert strip(recordings[family]["weights"]) == strip(checkpoints[family]["weights"])  # exact: the same computation


@pytest.mark.parametrize("family", FAMILIES)
def test_activation_numbers_are_those_of_0_1(family, recordings):
    r = recordings[family]
    layers = r["activations"]["layers"]
    assert r["activations"]["n_prompts"] == 8 and len(layers) == len(VALUE_ERRORS[family])
    for layer in layers:
        l = layer["layer"]
        assert layer["value_error"] == pytest.approx(VALUE_ERRORS[family][l], rel=1e-12)
        if family in REFERENCE_VALUE_ERRORS:
            assert layer["reference_value_error"] == pytest.approx(REFERENCE_VALUE_ERRORS[family][l], rel=1e-12)
            assert layer["value_rms"] == pytest.approx(VALUE_RMS[family][l], rel=1e-12)
        else:
            assert layer["teacher_rel_err"] < 1e-7
        assert layer["reference_gap"] < 1e-7  # float32 activations of a float64 theta* model
        assert layer["td_probe_hook"] == f"blocks.{l}.{PRIMARY_HOOK[family]}"
        # 8 prompts split by task id (issue #12) leave 4 for training: the CV penalty shrinks by ~1e-7
        assert layer["td_probe_r2"] > 1 - 1e-6
        if family == "softmax-td":
            assert layer["kernel_diagonality"]["min"] == pytest.approx(KERNEL_MIN, rel=1e-12)
        else:
            assert layer["kernel_diagonality"] is None


def test_family_specific_sections(recordings, checkpoints):
    wang = recordings["linear-td"]["activations"]["wang_metrics"]
    assert wang["VD"] < 1e-15 and wang["SS"] == pytest.approx(1.0, abs=1e-12)
    # the 8 tasks are split by task id: the step is fitted on the calibration ones, the rest are scored
    assert wang["n_tasks"] + wang["n_calibration_prompts"] == 8 and min(wang["n_tasks"], wang["n_calibration_prompts"]) > 0
    assert "kernel_diagonality" in recordings["linear-td"]["skipped"]  # a linear-attention pattern is no kernel
    for kind, r in (("recording", recordings["softmax-td"]), ("checkpoint", checkpoints["softmax-td"])):
        pk = r["weights"]["population_kernel"]
        assert [p["layer"] for p in pk] == [0, 1, 2]
        assert pk[0]["min"] == pytest.approx(POPULATION_MIN[kind], rel=1e-12)
    for fam in ("sarsa", "actor-critic"):
        assert recordings[fam]["weights"]["block_sparsity"]["lazy_blocks"] == {"P22": 0.0, "V22": 0.0}  # literal zeros
        assert "wang_metrics" not in recordings[fam]["activations"]
