"""The two example models of examples/ (a TransformerLens model and a plain PyTorch one, docs/byom.md)
end to end at tiny size: train -> save -> strict reload -> record -> analyze -> causal test, from Python
(examples/run_all.py) and from the command line (`icrl_interp.cli.main`). Tiny training says nothing
about quality: the trained-vs-random difference is measured by examples/run_all.py, not asserted here."""
from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from icrl_interp import cli
from icrl_interp.models import user
from icrl_interp.recording.format import Recording

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TASK_FLAGS = ["--task", "linear-td", "--d", "4", "--n", "30", "--n-layers", "3"]
TINY_TRAIN = {"batch_size": 32, "held_out_size": 128, "log_every": 0}
N_PROMPTS = 256
CANONICAL = [f"blocks.{l}.{h}" for l in (0, 1) for h in ("hook_resid_post", "attn.hook_pattern")]
WHICH = ("torch", "tl")


def _run_all():
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    return importlib.import_module("run_all")


def _attr(rec, key):
    """A JSON root attribute of a recording, decoded."""
    value = rec.attr(key)
    return json.loads(value) if isinstance(value, (str, bytes)) else value


def _probe_flags(which: str) -> list[str]:
    probe = _run_all().MODELS[which]["probe"]
    return [] if probe is None else ["--probe", str(probe)]


@pytest.fixture(scope="module")
def python_runs(tmp_path_factory):
    """Each example through examples/run_all.py's Python path (train, record, analyze, causal), tiny."""
    run_all = _run_all()
    runs = {}
    for which in WHICH:
        out = tmp_path_factory.mktemp(which)
        torch.manual_seed(0)
        runs[which] = run_all.run_one(which, out, steps=3, tasks=N_PROMPTS, causal_tasks=32, random_draws=2,
                                      bootstrap=20, train_options=TINY_TRAIN, quiet=True)
    return runs


@pytest.mark.parametrize("which", WHICH)
def test_training_saves_weights_that_reload_strictly(python_runs, which):
    run = python_runs[which]
    trained = run["train"]
    assert trained["steps"] == 3 and trained["wall_s"] > 0 and trained["cpu_s"] > 0
    for key in ("before", "after"):
        assert math.isfinite(trained[key]["rmse"]) and trained[key]["rmse"] > 0
    assert math.isfinite(trained["reference"]) and trained["mean_predictor"] > 0
    saved = json.loads(Path(run["paths"]["train"]).read_text())
    assert saved["after"] == pytest.approx(trained["after"])
    # the CLI's loader (strict safetensors) gives back exactly the trained module
    spec = f"{_run_all().MODELS[which]['file']}:make"
    model = user.load(spec, run["paths"]["weights"])
    own = trained["model"].state_dict()
    assert set(model.state_dict()) == set(own)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, own[name], rtol=0, atol=0)
    z = torch.randn(3, 31, 9)
    model.eval(), trained["model"].eval()
    with torch.no_grad():
        assert model(z).shape == (3, 1)
        torch.testing.assert_close(model(z), trained["model"](z))


@pytest.mark.parametrize("which", WHICH)
def test_python_recording_has_canonical_hooks_outputs_lens_and_baseline(python_runs, which):
    run = python_runs[which]
    assert set(CANONICAL) <= set(run["summary"].hooks)
    model = user.load(f"{_run_all().MODELS[which]['file']}:make", run["paths"]["weights"]).eval()
    with Recording(run["paths"]["recording"]) as rec:
        assert rec.n_prompts == N_PROMPTS and rec.task_family == "linear-td"
        assert set(CANONICAL) <= set(rec.hooks())
        assert rec.shape("blocks.0.attn.hook_pattern") == (N_PROMPTS, 4, 31, 31)   # 4 heads, per head
        assert rec.shape("blocks.1.hook_resid_post") == (N_PROMPTS, 31, 32)       # the model's own width
        z = rec.array("prompts/z")
        out = rec.array("outputs/model")
        assert out.shape == (N_PROMPTS, 1)
        with torch.no_grad():
            np.testing.assert_allclose(out, model(torch.from_numpy(z).float()).numpy(), rtol=1e-5, atol=1e-5)
        # logit lens: the model's readout on the last layer's residual stream is its output
        np.testing.assert_allclose(rec.array("lens/1"), out, rtol=1e-5, atol=1e-5)
        assert rec.array("lens/0").shape == (N_PROMPTS, 1)
        assert _attr(rec, "baseline")["kind"] == "random-init"
        assert rec.has("baseline/outputs/model") and rec.has("baseline/acts/blocks.1.hook_resid_post")
        assert np.array_equal(rec.array("prompts/task_id"), np.arange(N_PROMPTS))
        if which == "torch":  # roles from examples/torch_model.toml
            roles = _attr(rec, "roles")
            assert roles["blocks.1.hook_resid_post"] == "blocks.1"
            assert roles["blocks.0.attn.hook_pattern"] == "blocks.0.attn#1"
            assert roles["blocks.0.hook_resid_pre"] == "embed" and roles["blocks.1.hook_resid_pre"] == "blocks.0"
            assert _attr(rec, "readout")["modules"] == ["ln_f", "head"]
        else:  # the HookedTransformer inside the wrapper: its own hooks and readout
            assert _attr(rec, "readout")["modules"] == ["tl.ln_final", "tl.unembed"]


@pytest.mark.parametrize("which", WHICH)
def test_python_analysis_and_causal_test(python_runs, which):
    run = python_runs[which]
    analysis = run["analysis"]
    assert analysis["schema"] == "icrl_interp.analysis/1" and analysis["task_family"] == "linear-td"
    assert analysis["kind"] == "recording" and analysis["n_layers"] == 2
    layers = analysis["activations"]["layers"]
    assert [entry["layer"] for entry in layers] == [0, 1]
    skipped = analysis.get("skipped", {})
    sections = analysis["sections"]
    # every analysis either ran or says why not, in words
    assert set(sections) >= {"weights", "value_error", "kernels", "probes", "readouts"}
    assert all(isinstance(v, str) and v for v in sections.values())
    assert sections["kernels"] == "ok" and sections["readouts"] == "ok"
    assert sections["weights"].startswith("not applicable")   # no construction to compare a foreign model with
    assert sections["value_error"].startswith("not applicable") and "see readouts" in sections["value_error"]
    if which == "torch":
        assert sections["probes"] == "ok"
    lenses = analysis["activations"]["readouts"]["lenses"]
    assert set(lenses) == {"model-readout", "tuned-linear"}
    assert [x["layer"] for x in lenses["model-readout"]["layers"]] == [0, 1]
    assert math.isfinite(lenses["model-readout"]["output_value_error"])
    for entry in layers:
        # the residual stream (width 32) is not in the prompt layout: no direct value read-off, said why
        assert entry["value_error"] is None
        assert "not the layout's d_model" in skipped[f"value_error.layer{entry['layer']}"]
        assert entry["kernel_diagonality"]["n_tasks"] == N_PROMPTS
        r2 = entry["td_probe_r2"]
        assert (r2 is not None and math.isfinite(r2)) or "td_probe" in skipped
    assert json.loads(Path(run["paths"]["analysis"]).read_text())["task_family"] == "linear-td"

    section = run["causal"]
    assert section["layer"] == 0 and section["hook"] == "blocks.0.hook_resid_post"
    assert section["module"] == ("blocks.0" if which == "torch" else "blocks.0.hook_resid_post")
    assert section["value_error"]["target"] == "true value"
    assert section["tasks"]["train"] + section["tasks"]["test"] == 32
    change = section["erasure"]["output_change"]["td"]["mean"]
    assert math.isfinite(change) and change >= 0
    saved = json.loads(Path(run["paths"]["causal"]).read_text())
    assert saved["schema"] == "icrl_interp.causal/2" and saved["causal"]["layer"] == 0


@pytest.mark.parametrize("which", WHICH)
def test_cli_record_analyze_causal(python_runs, which, tmp_path, capsys):
    weights = str(python_runs[which]["paths"]["weights"])
    model = [f"{_run_all().MODELS[which]['file']}:make", "--weights", weights]
    h5, js, cj = tmp_path / "r.h5", tmp_path / "a.json", tmp_path / "c.json"
    assert cli.main(["record", "--model", *model, *TASK_FLAGS, *_probe_flags(which), "--tasks", "64",
                     "--batch-size", "32", "--baseline", "none", "--out", str(h5), "--no-progress"]) == 0
    with Recording(h5) as rec:
        assert set(CANONICAL) <= set(rec.hooks()) and rec.n_prompts == 64
        assert rec.array("outputs/model").shape == (64, 1)
        assert rec.attr("baseline") is None and not rec.has("baseline/outputs/model")
    assert cli.main(["analyze", str(h5), "--json", str(js)]) == 0
    analysis = json.loads(js.read_text())
    assert analysis["task_family"] == "linear-td" and len(analysis["activations"]["layers"]) == 2
    assert cli.main(["causal", "--model", *model, *TASK_FLAGS, *_probe_flags(which), "--layer", "0",
                     "--tasks", "32", "--random-draws", "2", "--bootstrap", "20", "--steer", "1",
                     "--json", str(cj)]) == 0
    causal = json.loads(cj.read_text())["causal"]
    assert causal["hook"] == "blocks.0.hook_resid_post" and [p["scale"] for p in causal["steering"]] == [1.0]
    assert "causal test at blocks.0.hook_resid_post" in capsys.readouterr().out


def test_cli_refuses_the_torch_model_without_its_probe_spec(python_runs, tmp_path, capsys):
    weights = str(python_runs["torch"]["paths"]["weights"])
    code = cli.main(["record", "--model", f"{EXAMPLES / 'torch_model.py'}:make", "--weights", weights, *TASK_FLAGS,
                     "--tasks", "8", "--out", str(tmp_path / "r.h5"), "--no-progress"])
    assert code != 0 and not (tmp_path / "r.h5").exists()
    assert "not a TransformerLens model" in capsys.readouterr().err


def test_tl_random_init_baseline_is_not_degenerate(python_runs):
    with Recording(python_runs["tl"]["paths"]["recording"]) as rec:
        assert float(np.std(rec.array("baseline/outputs/model"))) > 1e-3


def test_report_over_both_examples_fills_or_explains_every_section(python_runs, tmp_path, capsys):
    """record -> analyze -> causal -> report: the recordings and the causal JSONs of both examples in one
    report; every row is analyzed, and every section that is not computed says why."""
    inputs = [str(python_runs[w]["paths"][k]) for k in ("recording", "causal") for w in WHICH]
    out = tmp_path / "report"
    # --workers 1: the analyses run in this process (the Dask path is tests/core/test_cluster.py's and
    # tests/report/test_report_batch.py::test_parallel_processes_match_serial's; a recording needs no model code)
    assert cli.main(["report", *inputs, "--out", str(out), "--no-progress", "--workers", "1"]) == 0
    capsys.readouterr()
    rows = json.loads((out / "summary.json").read_text())["rows"]
    assert sorted(r["kind"] for r in rows) == ["causal", "causal", "recording", "recording"]
    for row in rows:
        assert row["status"] in ("ok", "partial"), row
        if row["status"] == "partial":
            assert row["reasons"], row  # what is missing is said
    assert "Causal tests" in (out / "index.html").read_text()
