"""Honest TD probes (issue #12 item 4): every probe R^2 comes with the input, random-init and
shuffled baselines measured the same way on the same task split, and the headline is the
selectivity R^2 - max(baselines) with a bootstrap interval over held-out tasks.

Known answers on recordings of the linear-td task (real prompts and reference TD errors) with
synthetic activations written by hand, each built so that a specific mistake would show: an input
baseline fitted on other columns, a split that leaks prompts of a task, a shuffled control that
pairs prompts of the same task, a selectivity against the smallest baseline."""
from __future__ import annotations

import numpy as np
import pytest

from icrl_interp.analyzers import analyze
from icrl_interp.analyzers import td_probe as T

from . import analyzer_data as D

CFG = D.config_for("linear-td")  # n = 24 context columns, d_model 7, 4 layers: delta_0 .. delta_4
LAYERS = CFG.model.n_layers
FOREIGN = {"family": None, "architecture": None, "class": "synthetic"}


def record(path, acts, n_prompts=400, per_task=1, baseline=None, targets=None, batch=100, seed=0):
    """A linear-td recording of a synthetic (foreign) model. acts(data, task, l) -> the
    activations of blocks.l.hook_resid_post [B, pos, width]; baseline likewise, recorded as the
    random-init copy (`baseline/acts/...`); targets(data, task) -> a replacement
    reference/td_errors. Prompt i belongs to task i // per_task (`prompts/task_id`)."""
    done = [0]

    def transform(data):
        B = data["prompts/z"].shape[0]
        task = (done[0] + np.arange(B)) // per_task
        done[0] += B
        data["prompts/task_id"] = task
        if targets is not None:
            data["reference/td_errors"] = targets(data, task)
        for l in range(LAYERS):
            data[f"acts/blocks.{l}.hook_resid_post"] = acts(data, task, l)
            if baseline is not None:
                data[f"baseline/acts/blocks.{l}.hook_resid_post"] = baseline(data, task, l)

    return D.write_recording(path, "linear-td", n_prompts=n_prompts, batch=batch, seed=seed, cfg=CFG,
                             hooks=("resid_post",), model=FOREIGN, transform=transform)


def random_map(seed, width=17):
    """An untrained model, to first order: a random linear map of the prompt's own column."""
    Ms = [np.random.default_rng([seed, l]).standard_normal((7, width)) for l in range(LAYERS)]
    return lambda data, task, l: data["prompts/z"] @ Ms[l]


def with_delta(seed):
    """A 'trained' stream: a random map of the input and, in one more row, delta^(l+1) (the TD error
    after l + 1 reference steps: it depends on the whole context, so it is not linear in the column)."""
    base = random_map(seed, width=16)

    def acts(data, task, l):
        td = data["reference/td_errors"][:, l + 1]
        extra = np.zeros(data["prompts/z"].shape[:2] + (1,))
        extra[:, : td.shape[1], 0] = td
        return np.concatenate([base(data, task, l), extra], -1)
    return acts


def noise(seed, width=17):
    return lambda data, task, l: np.random.default_rng([seed, int(task[0]), l]).standard_normal(
        data["prompts/z"].shape[:2] + (width,))


def probes(result) -> list[dict]:
    return [layer["td_probe"][layer["td_probe_hook"]] for layer in result["activations"]["layers"]]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The same prompts through an untrained model (a random map of the input, its random-init copy
    another one) and through a 'trained' one that carries delta^(l+1)."""
    root = tmp_path_factory.mktemp("honest")
    untrained = analyze(record(root / "untrained.h5", random_map(1), baseline=random_map(2)))
    trained = analyze(record(root / "trained.h5", with_delta(1), baseline=random_map(2)))
    return untrained, trained


def test_untrained_model_has_zero_selectivity_and_a_later_td_error_is_clearly_selective(pair):
    untrained, trained = pair
    for layer, p in zip(untrained["activations"]["layers"], probes(untrained)):
        # raw R^2 looks "good" (0.4 .. 0.93): delta is mostly the reward, which is in the input
        assert p["r2"] > 0.3 and p["baselines"] == ["input", "random_init", "shuffled"]
        assert abs(p["selectivity"]) < 0.01
        lo, hi = p["selectivity_ci"]
        assert lo - 1e-3 <= 0.0 <= hi + 1e-3 and hi - lo < 0.05
        assert layer["td_probe_selectivity"] == p["selectivity"] and layer["td_probe_selectivity_ci"] == [lo, hi]  # copies
    for l, p in enumerate(probes(trained)):
        assert p["r2"] > 0.999 and p["target"] == f"td_error_{l + 1}"
        assert p["selectivity"] == pytest.approx(p["r2"] - max(p["r2_input"], p["r2_random_init"], p["r2_shuffled"]))
        assert p["selectivity"] > 0.05 and p["selectivity_ci"][0] > 0.03  # clearly above 0
        assert p["selectivity_ci"][0] <= p["selectivity"] <= p["selectivity_ci"][1]
    # deeper layers carry a TD error further from the input: more selective
    sel = [p["selectivity"] for p in probes(trained)]
    assert sel == sorted(sel)


def test_the_input_baseline_reads_the_probed_columns(pair):
    """delta_0 = r_c (w_0 = 0) sits in the reward row of column c itself: the input baseline at the same
    columns predicts it exactly, so an untrained model's selectivity for it is 0 (fitting the baseline
    on other columns would give R^2 ~ 0 and a spurious selectivity ~ 1)."""
    untrained, trained = pair
    for p in probes(untrained) + probes(trained):
        t0 = p["targets"]["td_error_0"]
        assert t0["r2_input"] > 1 - 1e-9 and t0["r2"] > 1 - 1e-9
        assert abs(t0["selectivity"]) < 1e-6
        assert set(p["targets"]) == {f"td_error_{k}" for k in range(LAYERS + 1)}  # every reference step


def test_the_selectivity_is_against_the_largest_baseline(tmp_path):
    # random-init copy = noise: baselines input ~0.9, random init ~0, shuffled ~0
    r = analyze(record(tmp_path / "a.h5", with_delta(1), baseline=noise(3)))
    for p in probes(r):
        assert p["max_baseline"] == "input" and p["r2_random_init"] < 0.05
        assert p["selectivity"] == pytest.approx(p["r2"] - p["r2_input"], abs=1e-12)
        assert p["selectivity"] < p["r2"] - 0.3  # not against the smallest baseline
    # a random-init copy that already carries delta: the model is not selective at all
    r = analyze(record(tmp_path / "b.h5", with_delta(1), baseline=with_delta(2)))
    for layer, p in zip(r["activations"]["layers"], probes(r)):
        assert p["max_baseline"] == "random_init" and layer["td_probe_baseline"] == "random_init"
        assert abs(p["selectivity"]) < 1e-3


def test_prompts_of_a_task_never_straddle_the_split(tmp_path):
    """10 prompts per task; the activations are a task code (48 numbers per task) and the targets one
    number per task. A ridge can memorise 30-odd training tasks with 48 features, so a split that put
    prompts of one task on both sides would score R^2 ~ 1; split by task it cannot beat the mean."""
    codes = np.random.default_rng(5).standard_normal((40, 48))
    values = np.random.default_rng(6).standard_normal(40)

    def acts(data, task, l):
        return np.broadcast_to(codes[task][:, None], data["prompts/z"].shape[:2] + (48,)).copy()

    def targets(data, task):
        td = data["reference/td_errors"]
        return np.broadcast_to(values[task][:, None, None], td.shape) + 0.01 * td

    r = analyze(record(tmp_path / "leak.h5", acts, per_task=10, targets=targets))
    for p in probes(r):
        assert p["r2"] < 0.3
        assert p["n_test_tasks"] >= 5 and all(k == 10 for k in p["per_task"]["n_prompts"])
        assert p["n_test"] == p["n_test_tasks"] * 10 * 24


def test_the_shuffled_control_pairs_prompts_of_different_tasks(tmp_path):
    """10 prompts per task whose targets are mostly the task's; the activations hold the target. A
    partner of the same task (as pairing prompt i with i XOR 1 gave) would make the control reproduce
    the real R^2; partners of other tasks leave it at ~0."""
    level = np.random.default_rng(7).standard_normal((40, 5, 24))

    def targets(data, task):
        return level[task] + 0.05 * np.random.default_rng(int(task[0])).standard_normal(data["reference/td_errors"].shape)

    def acts(data, task, l):
        out = np.zeros(data["prompts/z"].shape[:2] + (2,))
        out[:, :24, 0] = data["reference/td_errors"][:, l + 1]
        return out

    r = analyze(record(tmp_path / "tasks.h5", acts, per_task=10, targets=targets))
    for layer, p in zip(r["activations"]["layers"], probes(r)):
        assert p["r2"] > 0.99
        assert abs(p["r2_shuffled"]) <= 0.05 and abs(layer["td_probe_r2_shuffled"]) <= 0.05
        assert abs(p["r2_shuffled"]) <= 0.05


def test_split_partners_and_intervals_do_not_depend_on_the_chunk_size(tmp_path):
    path = record(tmp_path / "c.h5", with_delta(1), baseline=random_map(2), per_task=3)
    small = analyze(path, chunk_mib=0.02)
    big = analyze(path, chunk_mib=64.0)
    for a, b in zip(probes(small), probes(big)):
        assert a["n_train"] == b["n_train"] and a["n_test"] == b["n_test"]
        assert a["per_task"]["task_id"] == b["per_task"]["task_id"]
        for key in ("r2", "r2_input", "r2_random_init", "r2_shuffled", "selectivity"):
            assert a[key] == pytest.approx(b[key], rel=1e-9, abs=1e-12)
        np.testing.assert_allclose(a["selectivity_ci"], b["selectivity_ci"], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("budget", [0, 40_000])
def test_held_out_rows_kept_from_pass_one_score_exactly_as_a_second_read(tmp_path, monkeypatch, budget):
    """Scoring from the rows pass 1 kept gives the sums a second read of the file gives, bit for bit (the
    same rows in the same order: exact equality is by construction); 40 kB overflows midway, after some
    chunks were kept, and must fall back whole."""
    from icrl_interp.analyzers import probes as P

    path = record(tmp_path / "h.h5", with_delta(1), baseline=random_map(2), per_task=3)
    kept = analyze(path, chunk_mib=0.05)
    monkeypatch.setattr(P, "FILE_HELD_OUT_CACHE_BYTES", budget)
    reread = analyze(path, chunk_mib=0.05)
    for a, b in zip(probes(kept), probes(reread)):
        assert a["per_task"] == b["per_task"] and a["selectivity_ci"] == b["selectivity_ci"]
        assert a["per_task"]["sse_random_init"] is not None and a["per_task"]["sse_input"] is not None


@pytest.mark.parametrize("budget", [None, 0])
def test_held_out_scoring_side_by_side_equals_one_core(tmp_path, monkeypatch, budget):
    """With 2 cores the held-out prompts are scored in the spread threads, probe by probe (`threads.spread`; from pass
    1's kept rows, or, budget 0, from a second read); the per-task sums and intervals are those of one core, bit for
    bit."""
    import threading

    from icrl_interp.analyzers import probes as P
    from icrl_interp.core import threads

    monkeypatch.delenv(threads.ENV, raising=False)
    if budget is not None:
        monkeypatch.setattr(P, "FILE_HELD_OUT_CACHE_BYTES", budget)
    path = record(tmp_path / "s.h5", with_delta(1), baseline=random_map(2), per_task=3)
    where, score = [], P.ProbeStream.score
    monkeypatch.setattr(P.ProbeStream, "score",
                        lambda self, *a: where.append(threading.current_thread().name) or score(self, *a))
    runs = {}
    for cores in (2, 1):
        monkeypatch.setattr(threads, "allowed_cores", lambda cores=cores: cores)
        where.clear()
        runs[cores] = analyze(path, chunk_mib=0.05)
        assert where and all(n.startswith("icrl-interp-spread") == (cores > 1) for n in where)
    for a, b in zip(probes(runs[2]), probes(runs[1])):
        assert a["per_task"] == b["per_task"] and a["selectivity_ci"] == b["selectivity_ci"]  # exact
        assert a["per_task"]["sse_random_init"] is not None and a["selectivity_ci"][0] is not None


def test_pattern_probes_score_from_their_query_row_alone(tmp_path, monkeypatch):
    """Scoring a pattern probe reads the last query row only (`ProbeStream.held_select`): the features of the
    selected part are those of the whole rows, and the sums from pass 1's kept rows equal those of a second read
    of the file, which reads that row alone, bit for bit."""
    import h5py

    from icrl_interp.analyzers import probes as P, streams

    path = D.write_recording(tmp_path / "s.h5", "softmax-td", n_prompts=96, batch=32,
                             cfg=D.config_for("softmax-td", n_layers=2))
    hook = "blocks.1.attn.hook_pattern"
    with h5py.File(path) as f:
        ds, n = f[f"acts/{hook}"], f["reference/td_errors"].shape[-1]
        p = P.ProbeStream(hook, 1, ds, ds.shape[-1], n, 5, None)
        full = ds[:8]
    assert p.q_last > 0  # another row than the first: a selection that ignores q_last reads the wrong one
    np.testing.assert_array_equal(p.features({"a": full[(slice(None), *p.held_select)]}, "a", held=True),
                                  p.features({"a": full}, "a"))
    kept = analyze(path, chunk_mib=0.05)
    shapes, read = [], streams._read
    monkeypatch.setattr(streams, "_read", lambda handles, idx: shapes.append({h[0]: h[3] for h in handles}) or
                        read(handles, idx))
    monkeypatch.setattr(P, "FILE_HELD_OUT_CACHE_BYTES", 0)
    reread = analyze(path, chunk_mib=0.05)
    pass2 = [s[f"acts/{hook}"] for s in shapes if f"acts/{hook}" in s]  # (the partners' targets are read alone)
    assert pass2 and all(sel == p.held_select for sel in pass2)  # pass 2 ran, reading the row alone
    a = kept["activations"]["layers"][1]["td_probe"][hook]
    b = reread["activations"]["layers"][1]["td_probe"][hook]
    assert a["per_task"] == b["per_task"] and a["selectivity_ci"] == b["selectivity_ci"] and a["n_test_tasks"] > 5


def test_held_out_rows_that_will_not_fit_are_not_kept_from_the_first_chunk_on(tmp_path, monkeypatch):
    """The keep-or-read decision is projected from the first chunk to the whole recording: a held-out set
    twice the budget keeps nothing at all (not a cache that fills up and is dropped at the peak)."""
    from icrl_interp.analyzers import probes as P

    path = record(tmp_path / "p.h5", with_delta(1), per_task=3)
    states, keep = [], P.ProbeSet._keep_held

    def spy(self, *args):
        keep(self, *args)
        states.append((self.held is not None, self.held_bytes))
    monkeypatch.setattr(P.ProbeSet, "_keep_held", spy)
    analyze(path, chunk_mib=0.05)
    total = states[-1][1]
    assert len(states) > 4 and all(kept for kept, _ in states)  # under the default budget: every chunk kept
    states.clear()
    monkeypatch.setattr(P, "FILE_HELD_OUT_CACHE_BYTES", total // 2)
    analyze(path, chunk_mib=0.05)
    assert states[0][1] < total // 2 and not states[0][0]  # the first chunk fits, the projection does not


def test_json_fields_and_the_bounded_per_task_table(pair, tmp_path):
    _, trained = pair
    layer = trained["activations"]["layers"][2]
    p = layer["td_probe"][layer["td_probe_hook"]]
    assert {"r2", "r2_input", "r2_random_init", "r2_shuffled", "selectivity", "selectivity_ci", "max_baseline",
            "baselines", "n_test_tasks", "per_task", "targets", "target", "target_iteration"} <= set(p)
    assert layer["td_probe_r2"] == p["r2"] and layer["td_probe_selectivity"] == p["selectivity"]  # copies
    table = p["per_task"]
    assert len(table["task_id"]) == p["n_test_tasks"] == len(table["sse"]) == len(table["sst"]) == len(table["r2"])
    assert table["task_id"] == sorted(table["task_id"]) and sum(table["n_samples"]) == p["n_test"]
    # one prompt per task: the held-out tasks are the test fold's task ids (but prompt 0: no earlier partner)
    fold = T.task_folds(np.arange(400), 0, 0.25, 5)
    assert table["task_id"] == [t for t in np.nonzero(fold == 5)[0].tolist() if t != 0]
    few = analyze(record(tmp_path / "few.h5", with_delta(1)), per_task_max=10)
    assert all(q["per_task"] is None and q["n_test_tasks"] > 10 for q in probes(few))
    assert all(q["baselines"] == ["input", "shuffled"] and q["r2_random_init"] is None for q in probes(few))


def test_bootstrap_helpers_known_answers(rng):
    M = np.column_stack([np.ones(50), np.arange(50.0)])
    sums = np.concatenate(list(T.resampled_sums(M, seed=0, resamples=3000)))
    assert sums.shape == (3000, 2) and np.all(sums[:, 0] == 50)  # each resample draws 50 tasks
    assert sums[:, 1].mean() == pytest.approx(M[:, 1].sum(), rel=0.01)
    assert sums[:, 1].std() == pytest.approx(np.sqrt(50) * M[:, 1].std(), rel=0.1)
    lo, hi = T.percentile_interval(rng.standard_normal((20000, 1)))[:, 0]
    assert lo == pytest.approx(-1.96, abs=0.06) and hi == pytest.approx(1.96, abs=0.06)
    base = np.array([[0.2, np.nan, np.nan], [0.5, 0.1, np.nan]])
    np.testing.assert_array_equal(T.max_baseline(base), [0.5, 0.1, np.nan])  # exact: maxima of the inputs
    y = rng.standard_normal(30)
    assert T.r2_of_sums(np.sum((y - 0.3 * y) ** 2), 30, y.sum(), (y * y).sum()) == pytest.approx(
        1 - np.sum((0.7 * y) ** 2) / np.sum((y - y.mean()) ** 2))


@pytest.mark.parametrize("with_baseline", [True, False])
def test_the_bootstrap_leaves_out_the_sums_selectivity_does_not_read(tmp_path, monkeypatch, with_baseline):
    """The bootstrap's product has no columns for the prompt counts, nor for a baseline a probe has not got (the
    random-init residuals without a random-init baseline); the intervals are the same, bit for bit, as with every
    sum in the product (what stands in for a missing baseline is masked)."""
    from icrl_interp.analyzers import probes as P

    path = record(tmp_path / "b.h5", with_delta(1), baseline=random_map(2) if with_baseline else None, per_task=3)
    widths, real = [], T.resampled_sums
    monkeypatch.setattr(T, "resampled_sums", lambda M, *a, **k: widths.append(M.shape[1]) or real(M, *a, **k))
    lean = analyze(path)
    monkeypatch.setattr(P, "unread", lambda owner: set())
    full = analyze(path)
    n_probes, targets = LAYERS, len(probes(lean)[0]["targets"])
    unread = 1 + (0 if with_baseline else n_probes * targets)  # one group's prompt counts; the probes' missing baseline
    assert widths[1] - widths[0] == unread
    for a, b in zip(probes(lean), probes(full)):
        assert a["selectivity_ci"] == b["selectivity_ci"] and a["selectivity"] == b["selectivity"]  # exact
        assert (a["r2_random_init"] is not None) == with_baseline
