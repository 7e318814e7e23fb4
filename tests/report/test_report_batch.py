"""Batch machinery of `icrl-interp report`: inputs, hashing, cache, parallel analysis, failures, summaries."""
from __future__ import annotations

import csv
import hashlib
import io
import json
import math

import pytest
import report_fake as F
from helpers import float_tol

from icrl_interp.cli import main
from icrl_interp.report import batch
from icrl_interp.families import sarsa

FAKE = "report_fake:analyze"


@pytest.fixture
def log(tmp_path, monkeypatch):
    path = tmp_path / "analyzer.log"
    monkeypatch.setenv(F.LOG_ENV, str(path))
    return lambda: path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def inputs(tmp_path):
    """Two runs of two seeds, a θ* checkpoint, a recording, and three broken inputs."""
    root = tmp_path / "in"
    F.write_run(root / "runs" / "a", "sarsa", 0, [10, 20])
    F.write_run(root / "runs" / "b", "sarsa", 1, [10, 20])
    F.write_checkpoint(root / "theta", F.make_analysis("sarsa", "theta_star", 1.0),
                       {"family": "sarsa", "origin": {"kind": "theta_star"}, "task": {"n": 64}})
    F.write_recording(root / "rec.h5", F.make_analysis("softmax-td", "trained", 0.7))
    (root / "corrupt.h5").write_bytes(b"\x89HDF\r\n\x1a\n but then garbage")
    half = F.write_recording(root / "half.h5", F.make_analysis("softmax-td", "trained", 0.7), complete=False)
    incomplete = root / "runs" / "b" / "checkpoints" / "step_000030"
    incomplete.mkdir()
    (incomplete / "config.json").write_text("{}")
    return {"root": root, "half": half, "missing": tmp_path / "nope"}


def paths(inputs):
    return [inputs["root"], inputs["half"], inputs["missing"]]


def test_collect_expands_runs_and_keeps_broken_inputs(inputs):
    items = batch.collect_inputs(paths(inputs))
    names = [(i.kind, i.path.relative_to(inputs["root"].parent).as_posix()) for i in items]
    assert names == [
        ("recording", "in/corrupt.h5"),
        ("recording", "in/rec.h5"),
        ("checkpoint", "in/runs/a/checkpoints/step_000010"),
        ("checkpoint", "in/runs/a/checkpoints/step_000020"),
        ("checkpoint", "in/runs/b/checkpoints/step_000010"),
        ("checkpoint", "in/runs/b/checkpoints/step_000020"),
        ("checkpoint", "in/runs/b/checkpoints/step_000030"),
        ("checkpoint", "in/theta"),
        ("recording", "in/half.h5.partial"),
        ("missing", "nope"),
    ]
    by = {i.path.name: i for i in items}
    assert by["nope"].problem == "does not exist"
    step = items[3].meta
    assert (step["run_id"], step["step"], step["seed"], step["family"], step["source"]) == ("a", 20, 0, "sarsa", "trained")
    assert items[6].meta["run_id"] == "b" and items[6].meta["step"] == 30 and items[6].meta["seed"] == 1
    assert by["theta"].meta["context_length"] == 64 and by["theta"].meta["source"] == "theta_star"
    assert by["rec.h5"].meta["gamma"] == 0.9 and by["rec.h5"].meta["context_length"] == 12
    # seeds of one setting share a series; the θ* checkpoint does not
    assert items[2].meta["series"] == items[4].meta["series"] != by["theta"].meta["series"]


def test_empty_directory_and_duplicates(tmp_path):
    (tmp_path / "empty").mkdir()
    ck = F.write_checkpoint(tmp_path / "ck", None, {"family": "sarsa"})
    items = batch.collect_inputs([tmp_path / "empty", ck, ck / ".." / "ck"])
    assert [(i.kind, i.problem) for i in items] == [("missing", "holds no checkpoints or recordings"), ("checkpoint", "")]


def test_content_hash(tmp_path):
    rec = F.write_recording(tmp_path / "r.h5", {"x": 1})
    item = batch.collect_inputs([rec])[0]
    assert batch.content_hash(item) == hashlib.sha256(rec.read_bytes()).hexdigest()
    a = F.write_checkpoint(tmp_path / "a", None, {"family": "sarsa"}, weights=b"12345")
    b = F.write_checkpoint(tmp_path / "b", None, {"family": "sarsa"}, weights=b"12345")
    ha, hb = (batch.content_hash(batch.collect_inputs([p])[0]) for p in (a, b))
    assert ha == hb  # the hash is of the content, not of where it lives
    (b / "model.safetensors").write_bytes(b"12346")
    assert batch.content_hash(batch.collect_inputs([b])[0]) != ha
    (b / "model.safetensors").write_bytes(b"12345")
    (b / "model.safetensors").rename(b / "other.safetensors")  # names count too
    assert batch.content_hash(batch.ReportInput(b, "checkpoint")) != ha


def test_flatten_known_answer():
    analysis = {"a": {"b": 1.5, "c": None}, "m": [[1, 2], [3, 4]],
                "layers": [{"layer": 2, "x": 0.5, "k": {"min": 0.1}}, {"layer": 0, "x": 0.25, "k": None}],
                "items": [{"v": 1}, {"v": 2}], "s": "+,+,-"}
    assert batch.flatten(analysis) == {
        "a.b": 1.5, "a.c": None, "m": [[1, 2], [3, 4]],
        "layers.2.x": 0.5, "layers.2.k.min": 0.1, "layers.0.x": 0.25, "layers.0.k": None,
        "items.0.v": 1, "items.1.v": 2, "s": "+,+,-",
    }


def test_failures_are_rows_and_the_batch_completes(inputs, tmp_path, log):
    out = tmp_path / "out"
    results = batch.run_batch(batch.collect_inputs(paths(inputs)), out, workers=1, analyzer=FAKE, progress=False)
    status = {r.input.path.name: (r.status, r.error) for r in results}
    assert status["corrupt.h5"] == ("failed", "not an HDF5 file (or a corrupt one)")
    assert status["half.h5.partial"] == ("failed", "recording is incomplete (complete=false)")
    assert status["step_000030"] == ("failed", "incomplete checkpoint (no model.safetensors)")
    assert status["nope"] == ("failed", "does not exist")
    ok = [r for r in results if r.status == "ok"]
    assert len(ok) == 6 and all(r.analysis["schema"] == batch.ANALYSIS_SCHEMA for r in ok)
    assert len(log()) == 9  # every input but the missing path reaches the analyzer


def test_analyzer_crash_and_bad_output_fail_that_input_only(tmp_path):
    good = F.write_checkpoint(tmp_path / "good", F.make_analysis("sarsa", "trained", 0.5), {"family": "sarsa"})
    crash = F.write_checkpoint(tmp_path / "crash", None, {"family": "sarsa"})  # no analysis.json: RuntimeError
    wrong = F.write_checkpoint(tmp_path / "wrong", {"schema": "other/9"}, {"family": "sarsa"})
    results = batch.run_batch(batch.collect_inputs([good, crash, wrong]), tmp_path / "out", analyzer=FAKE, progress=False)
    assert [r.status for r in results] == ["ok", "failed", "failed"]
    assert results[1].error == "RuntimeError: fake analyzer crashed"
    assert "expected 'icrl_interp.analysis/1'" in results[2].error


def test_cache_reuse_gives_identical_summary(inputs, tmp_path, log):
    out = tmp_path / "out"
    items = lambda: batch.collect_inputs(paths(inputs))  # noqa: E731
    first = batch.run_batch(items(), out, analyzer=FAKE, progress=False)
    batch.write_summaries(first, out)
    text1, csv1 = (out / "summary.json").read_bytes(), (out / "summary.csv").read_bytes()
    n_calls = len(log())
    second = batch.run_batch(items(), out, analyzer=FAKE, progress=False)
    batch.write_summaries(second, out)
    assert len(log()) == n_calls + 3  # only the three failed inputs are tried again
    assert sum(r.cached for r in second) == 6
    assert (out / "summary.json").read_bytes() == text1 and (out / "summary.csv").read_bytes() == csv1
    # one changed checkpoint is re-analyzed, nothing else
    ck = inputs["root"] / "runs" / "a" / "checkpoints" / "step_000010"
    (ck / "model.safetensors").write_bytes(b"new weights")
    third = batch.run_batch(items(), out, analyzer=FAKE, progress=False)
    assert [r.input.path for r in third if r.status == "ok" and not r.cached] == [ck]
    # a corrupt cache entry is a miss, not a crash; --no-cache ignores the cache
    sha = next(r.sha256 for r in third if r.input.path.name == "theta")
    (out / "cache" / f"{sha}.json").write_text("{ torn")
    fourth = batch.run_batch(items(), out, analyzer=FAKE, progress=False)
    assert next(r for r in fourth if r.input.path.name == "theta").cached is False
    assert not any(r.cached for r in batch.run_batch(items(), out, analyzer=FAKE, use_cache=False, progress=False))


def test_parallel_processes_match_serial(inputs, tmp_path):
    serial = batch.run_batch(batch.collect_inputs(paths(inputs)), tmp_path / "a", workers=1, analyzer=FAKE, progress=False)
    parallel = batch.run_batch(batch.collect_inputs(paths(inputs)), tmp_path / "b", workers=2, analyzer=FAKE, progress=False)
    assert batch.summary_json(serial) == batch.summary_json(parallel)  # exact: the stand-in analyzer copies numbers


def test_summary_rows_json_and_csv_agree(inputs, tmp_path):
    results = batch.run_batch(batch.collect_inputs(paths(inputs)), tmp_path / "out", analyzer=FAKE, progress=False)
    # a NaN metric becomes null / an empty cell, never invalid JSON
    results[1].analysis["weights"]["manifold"]["scale"] = math.nan
    data = json.loads(batch.summary_json(results))
    assert data["schema"] == batch.SUMMARY_SCHEMA and data["n_inputs"] == 10 and data["n_failed"] == 4
    rows = data["rows"]
    rec = next(r for r in rows if r["input"].endswith("rec.h5"))
    assert rec["weights.manifold.scale"] is None
    assert rec["activations.layers.2.td_probe_r2"] == pytest.approx(0.2 + 0.79 * 0.7)
    assert rec["weights.block_sparsity.block_norms.P.transition.parameter"] == 2.0  # exact: copied from the input
    assert rec["activations.layers.0.kernel_diagonality.M_hat"][0][0] == pytest.approx(0.5 + 0.49 * 0.7)
    assert (rec["family"], rec["source"], rec["status"], rec["error"]) == ("softmax-td", "trained", "ok", "")
    failed = next(r for r in rows if r["input"].endswith("nope"))
    assert failed["status"] == "failed" and failed["error"] == "does not exist"
    table = list(csv.DictReader(io.StringIO(batch.summary_csv(results))))
    assert len(table) == len(rows)
    for row_json, row_csv in zip(rows, table):
        assert set(row_json) <= set(row_csv)
        for key, value in row_json.items():
            expect = "" if value is None else json.dumps(value, separators=(",", ":")) if isinstance(value, list) else str(value)
            assert row_csv[key] == expect, key
    assert list(table[0])[: len(batch.META_COLUMNS)] == list(batch.META_COLUMNS)


def test_cli_exit_codes(inputs, tmp_path, capsys, no_figures):
    good = [inputs["root"] / "theta", inputs["root"] / "rec.h5"]
    assert main(["report", *map(str, good), "--out", str(tmp_path / "ok"), "--analyzer", FAKE, "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "θ* (theta)" in out and "2 inputs: 2 analyzed" in out
    code = main(["report", *map(str, good), str(inputs["missing"]), "--out", str(tmp_path / "bad"),
                 "--analyzer", FAKE, "--workers", "1"])
    assert code == 2  # a path that does not exist is refused before anything is written
    assert "nope does not exist" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    assert main(["report", str(good[0]), "--workers", "0", "--out", str(tmp_path / "x")]) == 2
    assert "--workers must be at least 1" in capsys.readouterr().err


def test_real_analyzer_on_a_theta_star_checkpoint(tmp_path, capsys):
    """End to end with the real analyzer: θ* scores perfectly, a corrupt checkpoint fails with its reason."""
    from icrl_interp.models import checkpoint

    theta, d = tmp_path / "theta", 3
    star = sarsa.theta_star(d, c=-2.5)  # a point on the scaling manifold, written without torch
    checkpoint.save({"blocks.0.attn.P": star["P"], "blocks.0.attn.V": star["V"]},
                    {"family": "sarsa", "d": d, "n_layers": 1, "gamma": 0.5, "alpha": 1.0, "tied": True,
                     "dtype": "float64", "n": 16, "origin": {"kind": "theta_star", "c": -2.5}}, theta)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((theta / "config.json").read_text())
    (broken / "model.safetensors").write_bytes(b"\x00" * 16)
    out = tmp_path / "out"
    assert main(["report", str(theta), str(broken), "--out", str(out), "--workers", "1", "--live-tasks", "0"]) == 1
    rows = {r["input"]: r for r in json.loads((out / "summary.json").read_text())["rows"]}
    good, bad = rows[str(theta)], rows[str(broken)]
    assert (good["status"], good["family"], good["source"]) == ("ok", "sarsa", "theta_star")
    assert good["weights.block_sparsity.in_support_energy"] == pytest.approx(1.0, rel=0, abs=float_tol())
    assert good["weights.block_sparsity.lazy_drift"] == 0.0  # exact: theta*'s lazy blocks are literal zeros
    assert good["weights.manifold.gauge_cosine"] == pytest.approx(1.0, abs=1e-12)
    assert good["weights.manifold.scale"] == pytest.approx(-2.5, abs=1e-12)
    assert bad["status"] == "failed" and bad["error"]
    assert (out / "figures" / "sarsa-block-norms.png").is_file()
    # by default a checkpoint's activations are analyzed live; this one's task (d = 3 against 36
    # one-hot state-actions) cannot be sampled: its row keeps the weights and says why it is partial
    again = tmp_path / "again"
    assert main(["report", str(theta), "--out", str(again), "--workers", "1"]) == 0
    row = json.loads((again / "summary.json").read_text())["rows"][0]
    assert row["status"] == "partial" and row["weights.manifold.scale"] == pytest.approx(-2.5, abs=1e-12)
    assert "the live run on the checkpoint's own task failed" in row["reasons"]


def test_checkpoints_are_analyzed_live_by_default_and_cached_by_their_setting(tmp_path, no_figures):
    from icrl_interp.analyzers.analyze import analyze

    star = tmp_path / "star"
    assert main(["construct", "linear-td", "--out", str(star)]) == 0
    out = tmp_path / "out"
    assert main(["report", str(star), "--out", str(out), "--workers", "1", "--live-tasks", "48"]) == 0
    row = json.loads((out / "summary.json").read_text())["rows"][0]
    live = analyze(star, live_tasks=48)  # the analysis of the recording of 48 prompts, run live
    assert live["kind"] == "checkpoint" and live["activations"]["n_prompts"] == 48
    assert row["activations.layers.0.td_probe_r2"] == pytest.approx(live["activations"]["layers"][0]["td_probe_r2"])
    assert row["activations.layers.0.value_error"] == pytest.approx(live["activations"]["layers"][0]["value_error"])
    plain = tmp_path / "plain"
    assert main(["report", str(star), "--out", str(plain), "--workers", "1", "--live-tasks", "0"]) == 0
    row0 = json.loads((plain / "summary.json").read_text())["rows"][0]
    assert row0.get("activations.layers.0.td_probe_r2") is None  # weights only
    # the setting is part of the cache key: a cached weights-only analysis is not reused for a live one
    assert main(["report", str(star), "--out", str(plain), "--workers", "1", "--live-tasks", "48"]) == 0
    again = json.loads((plain / "summary.json").read_text())["rows"][0]
    assert again["activations.layers.0.td_probe_r2"] == pytest.approx(row["activations.layers.0.td_probe_r2"])


def test_report_modules_import_neither_torch_nor_transformer_lens():
    import subprocess
    import sys

    code = ("import sys, icrl_interp.report, icrl_interp.report.html, icrl_interp.report.figures, "
            "icrl_interp.commands.report; print(sorted(m for m in ('torch', 'transformer_lens') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
