"""`causal.conclusion` from its three criteria (interventions/conclusion.py): the branches, their boundaries and the
estimate of how many more tasks would resolve an inconclusive answer."""
from __future__ import annotations

import math

import pytest

from icrl_interp.interventions import conclusion as C


def st(lo, hi, mean=None):
    return {"mean": (lo + hi) / 2 if mean is None else mean, "ci": [lo, hi]}


def decide(sel, ex, vs, random_mean=1.0, n=100, note=None):
    return C.decide(C.criteria(sel, ex, random_mean, vs), n, 0.5, note)


YES = st(0.3, 0.5)


@pytest.mark.parametrize("sel, ex, vs, answer", [
    (YES, YES, YES, "yes"),
    (st(0.0, 0.5), YES, YES, "inconclusive"),              # a lower bound at 0 is not above 0
    (st(0.2 + 1e-9, 0.5), YES, YES, "yes"),                 # the selectivity's "yes" bound is MIN_SELECTIVITY, 0.2
    (st(0.2, 0.5), YES, YES, "inconclusive"),               # a lower bound on it is not above it
    (st(0.05, 0.15), YES, YES, "inconclusive"),             # a leaky decoy's: between the two bounds
    (st(0.001, 0.019), YES, YES, "no"),                     # above 0 but wholly negligible: "no" is checked first
    (st(0.001, 0.02), YES, YES, "inconclusive"),            # the negligible bound is strict
    (YES, st(0.01, 0.099), YES, "no"),                      # excess below 10% of the random effect (1.0)
    (YES, st(0.01, 0.1), YES, "yes"),
    (YES, YES, st(-0.2, 0.0), "no"),                        # the input-explained erasure moves it as much
    (YES, YES, st(-0.2, 1e-9), "inconclusive"),
    (st(-0.1, 0.5), st(-0.1, 0.5), YES, "inconclusive"),
])
def test_branches_and_boundaries(sel, ex, vs, answer):
    got, reason, detail = decide(sel, ex, vs)
    assert got == answer, reason
    assert reason.startswith(answer + ":")
    assert [r["name"] for r in detail["criteria"]] == ["selective probe", "beats random", "against the input"]


def test_against_the_input_weighs_the_input_explained_erasure_by_one_half():
    """The third criterion's statistic per task is selective - 1/2 x input-explained (the same variance erased): a
    selective effect at 1/2 of the input's sits on the boundary ("no": at or below 0), just above it is "yes"; a
    weight of 3/4 (the rule before it) would call 0.6 of the input's a "no", a weight of 1/4 would call 0.4 a "yes".
    The share is quoted in the JSON's thresholds."""
    import numpy as np

    i = np.array([0.4, 1.0, 2.0])
    np.testing.assert_allclose(C.against_input(0.5 * i, i), 0.0, atol=1e-15)
    np.testing.assert_allclose(C.against_input(np.array([0.9, 0.4]), np.ones(2)), [0.4, -0.1], rtol=1e-14)
    assert C.THRESHOLDS["input_share"] == C.INPUT_SHARE == 0.5
    for ratio, answer in ((0.5, "no"), (0.4, "no"), (0.51, "yes"), (0.6, "yes")):
        d = float(C.against_input(ratio, 1.0))
        assert decide(YES, YES, st(d - 1e-3, d, mean=d - 5e-4) if d <= 0 else st(d / 2, d))[0] == answer, ratio


def test_the_negligible_excess_scales_with_the_random_effect():
    assert decide(YES, st(0.01, 0.15), YES, random_mean=2.0)[0] == "no"  # 0.15 < 0.1 * 2.0
    assert decide(YES, st(0.01, 0.15), YES, random_mean=1.0)[0] == "yes"


def test_a_note_makes_it_inconclusive_whatever_the_intervals():
    got, reason, _ = decide(YES, YES, YES, note="inconclusive: no edit changes the output")
    assert got == "inconclusive" and reason == "inconclusive: no edit changes the output"


def test_more_tasks_from_the_half_width():
    """Half-width shrinks as 1/sqrt(tasks): mean 0.1, lower bound -0.1 (half-width 0.2) needs (0.2/0.1)^2 = 4x the
    held-out tasks to put the lower bound above 0; the slowest open criterion decides; one toward "no" suffices."""
    _, reason, detail = decide(YES, st(-0.1, 0.3, 0.1), YES, n=100)
    assert detail["more_tasks"] == {"held_out": 400, "tasks": 800}  # exact: ceil(100 * 4), / test fraction 0.5
    assert "about 400 held-out tasks" in reason
    _, _, detail = decide(st(0.1, 0.5, 0.3), st(-0.05, 0.35, 0.15), YES, n=100)
    # max(((0.3 - 0.1) / (0.3 - 0.2))^2 = 4 (the selectivity's bound is 0.2), (0.2 / 0.15)^2 = 1.78) x 100; 4 is
    # 4.000000000000001 in floats, so the ceiling is 401
    assert detail["more_tasks"]["held_out"] == math.ceil(100 * ((0.3 - 0.1) / (0.3 - 0.2)) ** 2) == 401
    # a mean below the negligible excess (0.1 * 1.0): toward "no", (hi - m) / (0.1 - m) = (0.2 / 0.05)^2 = 16
    _, _, detail = decide(YES, st(-0.15, 0.25, 0.05), YES, n=10)
    assert detail["more_tasks"]["held_out"] == 160
    _, reason, detail = decide(YES, st(-50.0, 50.1, 0.05), YES, n=10)  # beyond MAX_FACTOR: no estimate
    assert detail["more_tasks"] is None and "unlikely to resolve" in reason
    # on episodes the held-out units are histories, and the flag that collects more of them is named
    _, reason, _ = C.decide(C.criteria(YES, st(-0.1, 0.3, 0.1), 1.0, YES), 100, 0.5, unit="histories",
                            flag="--histories")
    assert "about 400 held-out histories would likely resolve it (--histories ≈ 800)" in reason


def test_schema_2_is_read_and_1_is_refused(tmp_path):
    """causal/2 added `conclusion`, `selective` (and `interchange`); a /1 file has neither, so readers refuse it with
    one line naming the schema they read, and a directory scan skips it."""
    import json

    from icrl_interp.analyzers import inputs
    from icrl_interp.core.errors import UserError
    from icrl_interp.interventions import causal
    from icrl_interp.report.batch import read_causal

    assert causal.SCHEMA == inputs.CAUSAL_SCHEMA == "icrl_interp.causal/2"
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps({"schema": "icrl_interp.causal/1", "causal": {}}))
    new.write_text(json.dumps({"schema": "icrl_interp.causal/2", "causal": {}}))
    assert inputs.is_causal_json(new) and not inputs.is_causal_json(old)
    assert read_causal(new)["schema"] == "icrl_interp.causal/2"
    with pytest.raises(UserError, match="its schema is 'icrl_interp.causal/1', expected .*causal/2"):
        read_causal(old)
    assert [f.path.name for f in inputs.discover([tmp_path], causal=True)] == ["new.json"]


def test_conclude_reads_the_site_first():
    """experiment.conclude: a one-feature site (sarsa's scores) and a site no edit reaches are inconclusive with
    their reason; a model without selective directions is inconclusive and says so."""
    from types import SimpleNamespace

    import numpy as np

    from icrl_interp.interventions import experiment

    def setup(width):  # only the fields conclude reads (a real CausalSetup: the signature is type-checked)
        st = object.__new__(experiment.CausalSetup)
        st.test_index, st.direction = np.arange(10), np.ones(width)
        st.site = SimpleNamespace(layer=0, n_layers=2, canonical="blocks.0.hook_resid_post")
        return st

    def measured(largest, sel):
        return experiment.Measured(erasure={}, steering=[], per_task={}, largest=largest, selective=sel)

    sel = {"selectivity": YES, "erasure": {"excess_over_random": YES, "random": {"mean": 1.0},
                                           "against_input": YES}}
    assert experiment.conclude(setup(5), measured(1.0, sel), 0.5)[0] == "yes"
    got, reason, _ = experiment.conclude(setup(1), measured(1.0, sel), 0.5)
    assert got == "inconclusive" and "one feature" in reason
    got, reason, _ = experiment.conclude(setup(5), measured(0.0, sel), 0.5)
    assert got == "inconclusive" and "no edit at this site changes the output" in reason
    assert "does not depend on the context columns of blocks.0.hook_resid_post" in reason  # the site's own note
    got, reason, _ = experiment.conclude(setup(5), measured(1.0, None), 0.5)
    assert got == "inconclusive" and "found nothing to read" in reason


def test_the_estimate_at_its_edges():
    """The factor at a yes bound other than 0; the resolved criteria carry none; a lower bound exactly on 0 needs one
    more task, not none; a fractional need rounds up; the "no" side decides when it is quicker, and a mean exactly
    on the negligible bound points to "yes" only."""
    assert C._factor(st(0.1, 0.5, 0.3), 0.2, -1.0) == pytest.approx(4.0, rel=1e-14)  # ((0.3 - 0.1) / (0.3 - 0.2))^2
    _, _, detail = decide(YES, st(-0.1, 0.3, 0.1), YES, n=100)
    assert [r["factor"] is None for r in detail["criteria"]] == [True, False, True]
    assert decide(YES, st(0.0, 0.5), YES, n=100)[2]["more_tasks"]["held_out"] == 101  # factor 1: one more
    # factor (0.4 / 0.3)^2 = 1.78: 17.8 held-out tasks round up to 18
    assert decide(YES, st(-0.1, 0.7, 0.3), YES, n=10)[2]["more_tasks"]["held_out"] == 18
    # the excess points to "no" (mean 0.05 below 0.1 x the random effect 1.0: ((0.15 - 0.05) / (0.1 - 0.05))^2 = 4),
    # the selectivity to "yes" (((0.3 + 0.3) / (0.3 - 0.2))^2 = 36): one "no" suffices, 4 x 10
    got = decide(st(-0.3, 0.9, 0.3), st(-0.1, 0.15, 0.05), YES, n=10)
    assert got[0] == "inconclusive" and got[2]["more_tasks"]["held_out"] == 40
    # a selectivity mean between its bounds (0.02 and 0.2), or exactly on the negligible one, points nowhere: more
    # tasks would narrow the interval around it but never past a bound, so no estimate, whatever the others need
    for mean in (0.1, 0.02):
        got = decide(st(mean - 0.05, mean + 0.05, mean), st(-4.5, 5.5, 0.5), YES, n=1)
        assert got[2]["more_tasks"] is None and "between a criterion's two" in got[1]
    assert C._factor(st(0.05, 0.15, 0.1), 0.2, 0.02) is None


def test_an_absent_mean_reads_as_a_dash():
    got, reason, _ = decide({"mean": None, "ci": None}, YES, YES)
    assert got == "inconclusive" and "selective probe: — (no interval)" in reason
