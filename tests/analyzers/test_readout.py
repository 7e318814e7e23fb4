"""Readouts of foreign models (logit lens, tuned lens, the reference curve, the random-init baseline),
the convergence-with-depth summary, per-task values, independent sections and the `sections` /
status contract, on hand-built recordings with known answers."""
from __future__ import annotations

import json
import math

import h5py
import numpy as np
import pytest

from icrl_interp.analyzers import analyze, convergence, readout
from icrl_interp.analyzers.analyze import status_of
from icrl_interp.analyzers.streams import PerTask
from icrl_interp.cli import main

from . import analyzer_data as D

WIDTH = 16  # the foreign model's residual width (the linear-td layout of d = 3 has d_model 7)
FOREIGN = {"family": None, "architecture": None, "class": "Net"}
LAYERS = D.CONFIGS["linear-td"]["model"]["n_layers"]


def _query_values(data):
    q = data["prompts/state"][:, -1]
    return data["tasks/values"][np.arange(q.size), q]


def foreign_recording(path, n_prompts=96, batch=32, seed=0, lens_offset=lambda l: 0.1 * (l + 1), out_noise=0.3,
                      baseline=True, per_task=1, task="linear-td", lens=True, outputs=True, attention=False):
    """A model of no family on `task` prompts: residual width WIDTH whose last position is an exact
    linear map of the model's output y = v(s_q) + noise (so a tuned lens recovers y); lens/{l} =
    v(s_q) + lens_offset(l) (a logit lens of known error); baseline/lens/{l} = v(s_q) + 1;
    `per_task` prompts per task id."""
    rng = np.random.default_rng(seed)
    k = 1 if task == "linear-td" else D.config_for(task).model.d
    maps = rng.standard_normal((LAYERS, k, WIDTH))
    base_maps = rng.standard_normal((LAYERS, k, WIDTH))
    counter = {"i": 0}

    def transform(data):
        z = data["prompts/z"]
        B, pos = z.shape[:2]
        lo = counter["i"]
        counter["i"] += B
        data["prompts/task_id"] = (np.arange(lo, lo + B) // per_task).astype(np.int64)
        if task == "linear-td":
            v = _query_values(data)
            y = v[:, None] + out_noise * rng.standard_normal((B, 1))
            yb = v[:, None] + 2.0 + rng.standard_normal((B, 1))
        else:  # a parameters task: the teacher's output plus noise
            teacher = data["reference/output"]
            y = teacher + out_noise * rng.standard_normal(teacher.shape)
            yb = teacher + 1.0 + rng.standard_normal(teacher.shape)
        if outputs:
            data["outputs/model"] = y
        for l in range(LAYERS):
            resid = rng.standard_normal((B, pos, WIDTH))
            resid[:, -1] = y @ maps[l] + 0.5 * l
            data[f"acts/blocks.{l}.hook_resid_post"] = resid
            if attention:
                logits = rng.standard_normal((B, 2, pos, pos))
                pat = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
                data[f"acts/blocks.{l}.attn.hook_pattern"] = pat
            if lens and task == "linear-td":
                data[f"lens/{l}"] = v[:, None] + lens_offset(l)
            if baseline:
                base = rng.standard_normal((B, pos, WIDTH))
                base[:, -1] = yb @ base_maps[l]
                data[f"baseline/acts/blocks.{l}.hook_resid_post"] = base
                if lens and task == "linear-td":
                    data[f"baseline/lens/{l}"] = v[:, None] + 1.0
        if baseline and outputs:
            data["baseline/outputs/model"] = yb

    path = D.write_recording(path, task, n_prompts=n_prompts, batch=batch, seed=seed, hooks=(), model=FOREIGN,
                             transform=transform)
    with h5py.File(path, "r+") as f:  # a foreign model: no parameters of a family, no theta*
        for group in ("params", "theta_star"):
            for name in list(f[group]):
                del f[f"{group}/{name}"]
    return path


def _truth(path, layers=LAYERS):
    """Per prompt: |lens_l - v|, |out - v|, |reference_{l+1} - v|, |baseline out - v|, task id, held out."""
    with h5py.File(path) as f:
        q = f["prompts/state"][:, -1]
        v = f["tasks/values"][()][np.arange(q.size), q]
        out = {"lens": [np.abs(f[f"lens/{l}"][:, 0] - v) for l in range(layers) if f"lens/{l}" in f],
               "output": np.abs(f["outputs/model"][:, 0] - v),
               "reference": [np.abs(f["reference/values"][:, k, 0] - v) for k in range(f["reference/values"].shape[1])],
               "baseline_output": np.abs(f["baseline/outputs/model"][:, 0] - v) if "baseline/outputs/model" in f else None,
               "task": f["prompts/task_id"][()]}
    out["held"] = readout.held_out(out["task"], 0, 0.25)
    return out


@pytest.fixture(scope="module")
def foreign(tmp_path_factory):
    path = foreign_recording(tmp_path_factory.mktemp("foreign") / "net.h5")
    return path, analyze(path)


def test_logit_lens_has_the_known_error_and_the_reference_curve(foreign):
    path, r = foreign
    t = _truth(path)
    assert r["family"] == "generic" and r["task_family"] == "linear-td"
    ro = r["activations"]["readouts"]
    assert ro["target"] == "value"
    lens = ro["lenses"]["model-readout"]
    assert lens["lens"] == "model-readout" and lens["description"] == readout.LENSES["model-readout"]
    assert lens["prompts"] == "all" and lens["n_prompts"] == 96
    for l, row in enumerate(lens["layers"]):
        assert row["layer"] == l
        assert row["value_error"] == pytest.approx(0.1 * (l + 1), rel=1e-9)  # lens/l = v + 0.1 (l + 1)
        assert row["random_init_value_error"] == pytest.approx(1.0, rel=1e-9)  # baseline/lens/l = v + 1
        assert row["reference_value_error"] == pytest.approx(t["reference"][l + 1].mean(), rel=1e-12)
    assert lens["reference_value_error"] == pytest.approx([e.mean() for e in t["reference"]], rel=1e-12)
    assert lens["output_value_error"] == pytest.approx(t["output"].mean(), rel=1e-12)
    assert lens["random_init_output_value_error"] == pytest.approx(t["baseline_output"].mean(), rel=1e-12)
    conv = lens["convergence"]
    assert conv["first"] == pytest.approx(0.1) and conv["last"] == pytest.approx(0.4)
    assert conv["decreasing"] == 0.0 and conv["rate"] > 1  # the lens's error grows with depth here (a count: exact)
    assert conv["reference_rate"] < 1  # batch TD's does not
    assert lens["random_init_convergence"]["rate"] == pytest.approx(1.0)


def test_tuned_lens_recovers_an_exact_linear_map_of_the_output(foreign):
    path, r = foreign
    t = _truth(path)
    held = t["held"]
    assert 0 < held.sum() < held.size
    lens = r["activations"]["readouts"]["lenses"]["tuned-linear"]
    assert lens["lens"] == "tuned-linear" and lens["prompts"] == "held-out tasks"
    assert lens["n_prompts"] == held.sum() and lens["n_train"] == (~held).sum() and lens["n_tasks"] == held.sum()
    assert lens["output_value_error"] == pytest.approx(t["output"][held].mean(), rel=1e-12)
    for l, row in enumerate(lens["layers"]):
        # the residual stream's last position is an exact linear map of the output: read back exactly
        assert row["value_error"] == pytest.approx(lens["output_value_error"], rel=1e-6)
        assert row["r2"] == pytest.approx(1.0, abs=1e-9) and row["output_gap"] < 1e-6
        assert row["reference_value_error"] == pytest.approx(t["reference"][l + 1][held].mean(), rel=1e-12)
        # the random-init model's residual stream maps its own output exactly too
        assert row["random_init_r2"] == pytest.approx(1.0, abs=1e-9)
        assert row["random_init_value_error"] == pytest.approx(t["baseline_output"][held].mean(), rel=1e-6)
        per = row["value_error_per_task"]
        assert per["task_id"] == t["task"][held].tolist()
        np.testing.assert_allclose(per["value_error"], t["output"][held], rtol=1e-6)


def test_foreign_model_sections_and_status(foreign):
    _, r = foreign
    s = r["sections"]
    assert s["readouts"] == "ok" and s["probes"] == "ok"
    assert s["value_error"].startswith("not applicable") and "not in the prompt layout" in s["value_error"]
    assert s["weights"].startswith("not applicable")
    assert status_of(r) == ("ok", "")
    assert all(layer["value_error"] is None for layer in r["activations"]["layers"])
    json.dumps(r, allow_nan=False)


def test_readouts_do_not_depend_on_the_chunking(foreign):
    path, r = foreign
    small = analyze(path, chunk_mib=0.05)
    a, b = r["activations"]["readouts"], small["activations"]["readouts"]
    for name in ("model-readout", "tuned-linear"):
        for x, y in zip(a["lenses"][name]["layers"], b["lenses"][name]["layers"]):
            assert x["value_error"] == pytest.approx(y["value_error"], rel=1e-6)
            assert x["value_error_per_task"]["task_id"] == y["value_error_per_task"]["task_id"]


def test_tasks_with_several_prompts_stay_on_one_side_and_average_per_task(tmp_path):
    path = foreign_recording(tmp_path / "rep.h5", n_prompts=96, per_task=4, baseline=False)
    r = analyze(path)
    t = _truth(path)
    lens = r["activations"]["readouts"]["lenses"]["tuned-linear"]
    held = t["held"]
    for task in np.unique(t["task"]):
        assert len(set(held[t["task"] == task])) == 1  # a task is never split
    assert lens["n_tasks"] == len(np.unique(t["task"][held]))
    logit = r["activations"]["readouts"]["lenses"]["model-readout"]["layers"][0]["value_error_per_task"]
    assert logit["task_id"] == list(range(24)) and logit["n_prompts"] == [4] * 24
    assert lens["layers"][0]["random_init_value_error"] is None  # no baseline recorded
    assert "random_init_convergence" in lens and lens["random_init_convergence"] is None


def test_parameters_task_compares_with_the_teacher_and_the_prompt_parameters(tmp_path):
    path = foreign_recording(tmp_path / "sarsa.h5", task="sarsa", n_prompts=64, lens=False, baseline=False)
    r = analyze(path)
    ro = r["activations"]["readouts"]
    assert ro["target"] == "teacher" and "model-readout" not in ro["lenses"]
    assert "lens/{l}" in r["skipped"]["readouts.model-readout"]
    with h5py.File(path) as f:
        teacher, out = f["reference/output"][()], f["outputs/model"][()]
        w0 = f["reference/w"][()]
    lens = ro["lenses"]["tuned-linear"]
    held = readout.held_out(np.arange(64), 0, 0.25)
    assert lens["output_value_error"] == pytest.approx(np.linalg.norm(out - teacher, axis=-1)[held].mean(), rel=1e-12)
    # the reference before its update (the prompt's parameters), and after it (the teacher: 0, exact: its
    # step reads the same reference/output dataset as the target)
    assert lens["reference_value_error"][0] == pytest.approx(np.linalg.norm(w0 - teacher, axis=-1)[held].mean(), rel=1e-9)
    assert lens["reference_value_error"][1] == 0.0
    assert lens["layers"][0]["reference_value_error"] == 0.0 and lens["layers"][1]["reference_value_error"] is None
    assert lens["layers"][0]["value_error"] == pytest.approx(lens["output_value_error"], rel=1e-6)


def test_a_foreign_model_without_outputs_says_why(tmp_path):
    path = foreign_recording(tmp_path / "bare.h5", n_prompts=32, lens=False, outputs=False, baseline=False)
    r = analyze(path)
    assert "readouts" not in r["activations"] or r["activations"].get("readouts") is None
    assert r["sections"]["readouts"].startswith("no outputs/model")
    assert status_of(r)[0] == "partial" and "readouts" in status_of(r)[1]


# ------------------------------------------------------------------ weights, independence, status
def _with_tl_heads(path, width=32, heads=2):
    rng = np.random.default_rng(1)
    with h5py.File(path, "r+") as f:
        for l in range(LAYERS):
            for w, shape in (("W_Q", (heads, width, 8)), ("W_K", (heads, width, 8)), ("W_V", (heads, width, 8)),
                             ("W_O", (heads, 8, width))):
                f[f"params/blocks.{l}.attn.{w}"] = rng.standard_normal(shape)


def test_weights_of_an_embedding_model_are_not_applicable_and_the_rest_stays(tmp_path):
    path = foreign_recording(tmp_path / "tl.h5", n_prompts=48, baseline=False)
    _with_tl_heads(path)
    r = analyze(path, family="linear-td")
    why = r["skipped"]["weights"]
    assert why.startswith("not applicable") and "has shape (32, 32)" in why and "d_model = 7" in why
    assert r["weights"] is None and r["sections"]["weights"] == why
    assert r["activations"]["readouts"]["lenses"]["model-readout"]["layers"][0]["value_error"] == pytest.approx(0.1)
    assert any(layer["td_probe"] for layer in r["activations"]["layers"])
    assert status_of(r)[0] == "ok"


def test_tl_weights_file_of_another_width_is_nothing_analyzed(tmp_path, capsys):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    save_file({f"blocks.0.attn.{w}": rng.standard_normal(s) for w, s in
               (("W_Q", (1, 32, 4)), ("W_K", (1, 32, 4)), ("W_V", (1, 32, 4)), ("W_O", (1, 4, 32)))},
              str(tmp_path / "tl.safetensors"))
    lay = D.layout_of(D.config_for("linear-td"))
    (tmp_path / "layout.json").write_text(lay.to_json())
    r = analyze(tmp_path / "tl.safetensors", layout=lay.to_dict(), family="linear-td")
    assert r["skipped"]["weights"].startswith("not applicable") and r["weights"] is None
    status, why = status_of(r)
    assert status == "nothing analyzed" and "has shape (32, 32)" in why
    rc = main(["analyze", str(tmp_path / "tl.safetensors"), "--layout", str(tmp_path / "layout.json"),
               "--family", "linear-td"])
    captured = capsys.readouterr()
    assert rc == 2 and "nothing analyzed" in captured.err and "status: nothing analyzed" in captured.out


def test_one_failing_analyzer_does_not_lose_the_others(tmp_path, monkeypatch):
    from icrl_interp.analyzers import kernel

    path = D.write_recording(tmp_path / "s.h5", "softmax-td", n_prompts=40, batch=20)

    def boom(self, chunk):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(kernel.KernelStream, "update", boom)
    r = analyze(path)
    assert r["skipped"]["kernel_diagonality.layer0"].startswith("failed (internal error, RuntimeError): kernel exploded")
    assert r["sections"]["kernels"].startswith("failed")
    layers = r["activations"]["layers"]
    assert all(layer["kernel_diagonality"] is None for layer in layers)
    assert all(layer["value_error"] is not None and layer["td_probe_r2"] > 0.99 for layer in layers)
    assert r["weights"]["sign_pattern"] == "+,+,-"
    assert status_of(r)[0] == "partial" and "kernels: failed" in status_of(r)[1]


def test_missing_gamma_is_named_as_such(tmp_path):
    path = D.write_recording(tmp_path / "g.h5", "softmax-td", n_prompts=40, batch=20)
    with h5py.File(path, "r+") as f:
        f.attrs["gamma"] = math.nan
    r = analyze(path)
    why = r["skipped"]["kernel_diagonality"]
    assert "γ" in why and "state labels" not in why
    assert r["activations"]["layers"][0]["label_free_diagonal"]["self"] is not None


def test_layout_alone_serves_a_generic_recording(tmp_path, capsys):
    """Prompts of no known task, the residual stream in the layout: --layout alone gives the value error."""
    path = D.write_recording(tmp_path / "gen.h5", "linear-td", n_prompts=40, batch=20, task_family="",
                             model={"family": None, "architecture": None, "class": "X"})
    lay = D.layout_of(D.config_for("linear-td"))
    with h5py.File(path, "r+") as f:
        del f.attrs["layout"]
    bare = analyze(path)
    assert "no prompt layout" in bare["sections"]["value_error"]
    (tmp_path / "layout.json").write_text(lay.to_json())
    out = tmp_path / "a.json"
    assert main(["analyze", str(path), "--layout", str(tmp_path / "layout.json"), "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    layers = r["activations"]["layers"]
    assert all(layer["value_error"] == pytest.approx(layer["reference_value_error"], abs=1e-9) for layer in layers)
    assert r["sections"]["readouts"].startswith("not applicable") and status_of(r)[0] == "ok"
    assert r["activations"]["convergence"]["rate"] < 1


# ------------------------------------------------------------------ per task, convergence, pieces
def test_per_task_values_of_value_error_kernels_and_wang(tmp_path):
    path = D.write_recording(tmp_path / "lt.h5", "linear-td", n_prompts=40, batch=20)
    r = analyze(path)
    layer = r["activations"]["layers"][1]
    per = layer["value_error_per_task"]
    assert per["task_id"] == list(range(40)) and per["n_prompts"] == [1] * 40
    assert np.mean(per["value_error"]) == pytest.approx(layer["value_error"], rel=1e-12)
    wm = r["activations"]["wang_metrics"]
    assert np.mean(wm["per_task"]["VD"]) == pytest.approx(wm["VD"], rel=1e-9, abs=1e-30)
    assert r["activations"]["convergence"]["rate"] < 1
    capped = analyze(path, per_task_max=10)
    assert capped["activations"]["layers"][1]["value_error_per_task"] is None
    s = analyze(D.write_recording(tmp_path / "sm.h5", "softmax-td", n_prompts=40, batch=20))
    kd = s["activations"]["layers"][0]["kernel_diagonality"]
    assert kd["head"] == 0 and kd["n_heads"] == 1
    assert np.mean(kd["per_task"]["min"]) == pytest.approx(kd["min"], rel=1e-12)


def test_per_task_collector_groups_and_stops_at_its_limit():
    p = PerTask(("e",), 3)
    p.update(np.array([5, 1, 5]), e=np.array([1.0, 2.0, 3.0]))
    p.update(np.array([1, 9]), e=np.array([4.0, np.nan]))
    # exact: means of two small integers
    assert p.result() == {"task_id": [1, 5, 9], "n_prompts": [2, 2, 1], "e": [3.0, 2.0, None]}
    p.update(np.array([2]), e=np.array([0.0]))
    assert p.result() is None


def test_depth_summary_known_answers():
    # exact where compared with ==: ratios of powers of 2, shares of counts and copied inputs
    s = convergence.depth_summary([0, 1, 2], [1.0, 0.5, 0.25], [2.0, 1.0, 0.5])
    assert s["rate"] == pytest.approx(0.5) and s["ratio"] == 0.25 and s["decreasing"] == 1.0
    assert s["reference_rate"] == pytest.approx(0.5) and s["last_over_reference"] == 0.5
    assert convergence.depth_summary([0, 1], [None, None]) is None
    one = convergence.depth_summary([0], [0.3])
    assert one["rate"] is None and one["decreasing"] is None and one["first"] == one["last"] == 0.3


def test_ridge_gcv_is_exact_on_a_linear_map_and_penalises_noise():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 6))
    W = rng.standard_normal((6, 2))
    fit = readout.Ridge(6, 2)
    for i in range(0, 200, 50):
        fit.update(X[i:i + 50], X[i:i + 50] @ W + 3.0)
    coef, intercept, alpha = fit.solve()
    np.testing.assert_allclose(coef, W, atol=1e-8)
    np.testing.assert_allclose(intercept, 3.0, atol=1e-8)
    noise = readout.Ridge(6, 1)
    noise.update(X, rng.standard_normal((200, 1)))
    assert noise.solve()[2] > alpha  # pure noise: a larger penalty


# ------------------------------------------------------------------ report rows and figures
def test_report_rows_say_ok_partial_or_nothing_analyzed_and_carry_per_task_values(tmp_path):
    import csv
    import io

    from icrl_interp.report import batch, figures
    from icrl_interp.report.headline import text_table

    good = foreign_recording(tmp_path / "in" / "net.h5", n_prompts=64, attention=True)
    bare = D.write_recording(tmp_path / "in" / "bare.h5", "linear-td", n_prompts=20, batch=20, hooks=(), model=FOREIGN)
    part = foreign_recording(tmp_path / "in" / "part.h5", n_prompts=32, lens=False, outputs=False, baseline=False)
    results = batch.run_batch(batch.collect_inputs([tmp_path / "in"]), tmp_path / "out", progress=False, control=None)
    by = {r.input.path.name: r for r in results}
    assert by["net.h5"].status == "ok" and by["net.h5"].reasons == ""
    assert by["part.h5"].status == "partial" and "readouts: no outputs/model" in by["part.h5"].reasons
    nothing = by["bare.h5"]
    assert nothing.status == "nothing analyzed" and "no recorded hooks" in nothing.reasons
    assert nothing.failed and not nothing.analyzed and by["part.h5"].analyzed
    summary = json.loads(batch.summary_json(results))
    assert summary["n_failed"] == 1 and summary["n_partial"] == 1
    rows = {row["input"].rsplit("/", 1)[-1]: row for row in summary["rows"]}
    assert rows["bare.h5"]["status"] == "nothing analyzed" and rows["bare.h5"]["reasons"] == nothing.reasons
    key = "activations.readouts.lenses.tuned-linear.layers.0.value_error_per_task.value_error"
    per = rows["net.h5"][key]
    assert isinstance(per, list) and len(per) == rows["net.h5"]["activations.readouts.lenses.tuned-linear.n_tasks"]
    table = list(csv.DictReader(io.StringIO(batch.summary_csv(results))))
    row = next(x for x in table if x["input"].endswith("net.h5"))
    assert json.loads(row[key]) == pytest.approx(per)
    assert "NOTHING ANALYZED" in text_table(results) and "PARTIAL" in text_table(results)
    # cached re-runs give the same statuses
    again = batch.run_batch(batch.collect_inputs([tmp_path / "in"]), tmp_path / "out", progress=False, control=None)
    assert [(r.status, r.cached) for r in again] == [(r.status, True) for r in results]
    # the depth figure draws the lens curves; the attention figure names the head both panels show
    fig = figures.value_error_depth_figure("generic", [by["net.h5"]])
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert any("model-readout lens" in x for x in labels) and any("tuned-linear lens" in x for x in labels)
    assert any("random-init" in x for x in labels) and any("reference algorithm" in x for x in labels)
    assert fig.axes[0].get_ylabel().startswith("mean over prompts of |v̂_l(s_q) − v_π(s_q)|")
    head = by["net.h5"].analysis["activations"]["layers"][0]["kernel_diagonality"]["head"]
    att = figures.attention_figure(by["net.h5"])
    titles = [ax.get_title() for ax in att.axes if ax.get_title()]
    assert any(f"attention (prompt 0), head {head} of 2" in t for t in titles)
    assert any(f"M̂ (task average), head {head} of 2" in t for t in titles)


def test_value_error_axis_says_what_is_averaged():
    from icrl_interp.report import figures

    assert figures.value_error_label("linear-td").startswith("mean over prompts of |v̂_l(s_q) − v_π(s_q)|")
    assert figures.value_error_label("softmax-td").startswith("mean over tasks of ‖v_l − v_π‖_∞")
    assert figures.value_error_label("sarsa").startswith("mean over prompts of the distance to the teacher update")
    trend = next(spec for spec in figures.TREND_METRICS if spec[0].startswith("value error"))
    assert trend[1].startswith("mean value error")
