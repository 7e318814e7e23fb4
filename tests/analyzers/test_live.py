"""Live analysis (docs/analyzers.md, "Live analysis"): the analyzers fed from the forward pass give the
JSON of the recording of the same prompts, for every family and for a user's own model; the batch
cache stays bounded; `record --also-analyze` writes the same file `record` writes."""
from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

from icrl_interp.models import checkpoint
from icrl_interp import cli
from icrl_interp.recording import probe_spec, recorder
from icrl_interp.families import registry
from icrl_interp.analyzers.analyze import CHUNK_MIB, AnalyzeOptions, analyze, analyze_model
from icrl_interp.recording.capture import attached_hook_count
from icrl_interp.recording.live import open_live

from helpers import ROLES, TASK, Net

VARYING = ("source", "kind", "live")


def same(a: dict, b: dict) -> bool:
    """Equal analyses, up to the fields that name the input (exact: the same forward passes on the same
    batches, analyzed in the same chunks)."""
    strip = lambda d: json.dumps({k: v for k, v in d.items() if k not in VARYING}, sort_keys=True)  # noqa: E731
    return strip(a) == strip(b)



@pytest.mark.parametrize("family", registry.names())
def test_live_equals_recording_for_every_family(family, tmp_path):
    ck = tmp_path / "ck"
    assert cli.main(["construct", family, "--out", str(ck)]) == 0
    model, config = checkpoint.load(ck), checkpoint.read(ck)[0]
    # a small chunk budget: many chunks, batches dropped from the cache and recomputed in pass 2
    opts = AnalyzeOptions(chunk_mib=0.05)
    recorder.record_model(model, config, tmp_path / "r.h5", tasks=90, batch_size=16, seed=5, progress=False)
    recorded = analyze(tmp_path / "r.h5", opts)
    live = analyze_model(model, config, tasks=90, batch_size=16, seed=5, options=opts)
    assert recorded["activations"] is not None and recorded["sections"]["probes"] == "ok"
    assert same(recorded, live)
    assert live["kind"] == "live" and live["live"]["batches"] == 6
    assert live["live"]["forward_batches"] >= 6  # every batch ran at least once


def test_live_equals_recording_for_a_users_model_and_restores_it(tmp_path):
    torch.manual_seed(0)
    model = Net(dropout=0.1).train()
    recorder.record_model(model, "linear-td", tmp_path / "r.h5", task_options=TASK, probe=ROLES, tasks=64,
                          batch_size=16, progress=False)
    recorded = analyze(tmp_path / "r.h5")
    live = analyze_model(model, "linear-td", task_options=TASK, probe=ROLES, tasks=64, batch_size=16)
    assert recorded["sections"]["readouts"] == "ok" and recorded["sections"]["probes"] == "ok"
    assert same(recorded, live)
    assert model.training and all(m.training for m in model.modules())  # its mode is restored
    assert attached_hook_count(model) == 0
    other = analyze_model(model, "linear-td", task_options=TASK, probe=ROLES, tasks=64, batch_size=16, seed=1)
    assert not same(recorded, other)  # the prompt seed is honoured: the comparison can fail


@pytest.mark.parametrize("held_budget", [0, None])
def test_cache_is_bounded_and_pass_two_recomputes(tmp_path, monkeypatch, held_budget):
    """The batch cache stays small; the probes' held-out rows are kept from the first pass (no second
    forward pass) unless they outgrow their budget (0 here): then pass 2 runs the forward again."""
    from icrl_interp.analyzers import probes
    from icrl_interp.analyzers.analyze import analyze_open

    if held_budget is not None:
        monkeypatch.setattr(probes, "HELD_OUT_CACHE_BYTES", held_budget)
    ck = tmp_path / "ck"
    assert cli.main(["construct", "linear-td", "--out", str(ck)]) == 0
    model, config = checkpoint.load(ck), checkpoint.read(ck)[0]
    spec = probe_spec.shipped_spec(config.family)
    source = recorder.PromptSource(config=config, n_total=400, seed=0)
    with open_live(model, spec, source, batch_size=8) as rec:
        seen = []
        update = rec.f._batch

        def spy(index, need_model, path=None):
            out = update(index, need_model, path)
            seen.append(len(rec.f._full))
            return out

        rec.f._batch = spy
        result = analyze_open(rec, AnalyzeOptions(chunk_mib=0.02), kind="live")
        n_batches = rec.f.run.n_batches
        assert result["activations"]["layers"][0]["td_probe_r2"] is not None
        assert max(seen) <= rec.f.capacity < n_batches // 4  # far fewer batches held than the run has
        if held_budget == 0:
            assert rec.forward_batches + 1 > n_batches  # the held-out pass ran the forward pass again
        else:  # one forward pass per batch (batch 0 ran on opening), scoring from pass 1's rows
            assert rec.forward_batches + 1 == n_batches


def test_batch_zero_runs_its_prompt_source_once(monkeypatch):
    """Batch 0 as `prepare` ran it serves the reads of its prompt paths before the analysis reaches its
    activations (the recording's checks read prompts/state first): the prompt source is not run for it again."""
    drawn = []
    batch = recorder.PromptSource.batch
    monkeypatch.setattr(recorder.PromptSource, "batch", lambda self, index, *a: drawn.append(index) or batch(self, index, *a))
    out = analyze_model(Net(), "linear-td", task_options=TASK, probe=ROLES, tasks=64, batch_size=16)
    assert out["activations"]["layers"][0]["td_probe_r2"] is not None
    assert drawn.count(0) == 1 and sorted(set(drawn)) == [0, 1, 2, 3]


def test_record_also_analyze_writes_the_recording_and_its_analysis(tmp_path):
    ck = tmp_path / "ck"
    assert cli.main(["construct", "sarsa", "--out", str(ck)]) == 0
    base = ["record", str(ck), "--tasks", "40", "--batch-size", "16", "--prompt-seed", "2", "--no-progress"]
    assert cli.main([*base, "--out", str(tmp_path / "plain.h5")]) == 0
    assert cli.main([*base, "--out", str(tmp_path / "both.h5"), "--also-analyze", "--json",
                     str(tmp_path / "a.json")]) == 0
    with h5py.File(tmp_path / "plain.h5") as f, h5py.File(tmp_path / "both.h5") as g:
        names: list = []
        f.visit(names.append)
        data = [n for n in names if isinstance(f[n], h5py.Dataset)]
        assert data and all(np.array_equal(f[n][()], g[n][()]) for n in data)  # exact: the same run again
        assert {k for k in f.attrs if k != "created"} == {k for k in g.attrs if k != "created"}
    # exact in the live chunk default (CHUNK_MIB: smaller than a file's; in a file's 128 MiB chunks the two
    # agree within float64 rounding and choose the same penalties: test_td_probe_ties.py)
    in_live_chunks = analyze(tmp_path / "plain.h5", chunk_mib=CHUNK_MIB["live"])
    assert same(json.loads((tmp_path / "a.json").read_text()), in_live_chunks)
    assert cli.main(["analyze", str(ck), "--live", "--tasks", "40", "--batch-size", "16", "--prompt-seed", "2",
                     "--json", str(tmp_path / "b.json")]) == 0
    assert same(json.loads((tmp_path / "b.json").read_text()), in_live_chunks)


@pytest.mark.parametrize("case", ["default", "chunk-mib given", "batch over the cap", "file"])
def test_a_live_analysis_reads_whole_forward_batches_by_default(tmp_path, monkeypatch, case):
    """Without --chunk-mib a live chunk smaller than a forward batch is rounded up to the batch when the batch's
    rows fit `LIVE_BATCH_MIB` (what one forward pass computed is analyzed in one piece); a chunk budget the user
    gives, a batch over the cap and a recording file keep the budget's rows."""
    import importlib

    from icrl_interp.analyzers import inputs

    analyze_mod = importlib.import_module("icrl_interp.analyzers.analyze")  # the module (the package exports the function)

    seen, real = [], inputs.iter_chunks
    monkeypatch.setattr(inputs, "iter_chunks", lambda rec, paths, rows, *a, **k: seen.append(rows) or real(rec, paths, rows, *a, **k))
    monkeypatch.setitem(CHUNK_MIB, "live", 0.02)  # the budget alone: a few prompts per chunk, fewer than a batch
    monkeypatch.setattr(analyze_mod, "DEFAULT_CHUNK_MIB", 0.02)  # the same for a file
    if case == "batch over the cap":
        monkeypatch.setattr(analyze_mod, "LIVE_BATCH_MIB", 0.02)
    opts = AnalyzeOptions(chunk_mib=0.02 if case == "chunk-mib given" else None)
    if case == "file":
        out = tmp_path / "r.h5"
        spec, source = recorder.spec_and_source(Net(), "linear-td", task_options=TASK, probe=ROLES, tasks=48)
        recorder.record(Net(), out, spec, source, batch_size=16, progress=False)
        analyze(out, opts)
    else:
        analyze_model(Net(), "linear-td", task_options=TASK, probe=ROLES, tasks=48, batch_size=16, options=opts)
    assert seen and 1 <= seen[0] < 48
    assert (seen[0] == 16) == (case == "default")
