"""The causal test's answer (`causal.conclusion`): "yes", "no" or "inconclusive", with the reason
(docs/causal.md, "The conclusion"). The thresholds are frozen here, in one place, before any model is
scored.

Three criteria, each read from a 95% percentile bootstrap interval over held-out tasks (all three on the same
resamples of the same tasks; by default each resample also reads one of the directions refitted on resampled
training tasks, so the intervals hold the fit's variation: `experiment.measure_selective`'s `refits`):

1. **selective probe**: the layer carries the part of delta the prompt does not explain (selectivity), at least
   MIN_SELECTIVITY of it;
2. **beats random**: erasing the selective direction moves the output more than erasing variance-matched random
   directions (the paired per-task excess);
3. **against the input**: erasing the selective direction moves the output at least INPUT_SHARE (1/2) as much as
   erasing the same variance along the input-explained direction (the paired per-task difference
   selective - INPUT_SHARE x input-explained, `against_input`), so the effect is not mostly the reward's.

"yes" needs every lower bound above its bound: the selectivity's above MIN_SELECTIVITY, the other two above 0 (an
intersection of three tests, so no multiplicity correction is needed for a "yes"). "no" needs one criterion whose
whole interval lies at or below its negligible size: the selectivity below NEGLIGIBLE_SELECTIVITY, the excess over
random below NEGLIGIBLE_EXCESS times the random directions' mean effect, the selective effect at or below
INPUT_SHARE times the input-explained one. "no" is checked first, so an interval that is above 0 yet wholly
negligible is a "no". Anything else is "inconclusive", with how many held-out tasks would likely resolve it
(`more_tasks`).
"""
from __future__ import annotations

import math

NEGLIGIBLE_SELECTIVITY = 0.02
"""A selectivity interval wholly below this: the layer carries no selective TD information ("no")."""
MIN_SELECTIVITY = 0.2
"""A "yes" needs the selectivity's interval wholly above this: the layer carries at least a fifth of the variance
of the part of delta the prompt does not explain. A model that runs TD at the layer computes delta there (the
zoo's layer-targeted mimics: 0.48-0.61, lower bounds 0.43 and up, at 512 tasks, seeds 0-5); a decoy that computes
an error without bootstrapping there (the trained reward-regression and last-reward decoys) leaks a little of it,
0.03-0.10 (upper bounds 0.126 at most), and may also beat random directions, so a selectivity merely above 0 does
not separate them. Between the two bounds the answer is "inconclusive". Chosen on zoo seeds 0-4 and kept on seeds
0-5 with INPUT_SHARE and the LEACE default (docs/causal.md, "The erasure: LEACE by default")."""
NEGLIGIBLE_EXCESS = 0.1
"""An excess over random directions whose interval lies wholly below this fraction of the random directions' mean
effect: the selective direction matters no more than a random one of its size ("no")."""
INPUT_SHARE = 0.5
"""The share of the input-explained erasure's effect (the same variance erased) that the selective erasure must
exceed. TD's update reads the whole delta, its reward part and its bootstrapped part alike, so nothing in TD makes
the selective part matter more per unit of variance than the input-explained part: a share of 1 left models that
carry delta selectively but weigh the two parts about alike inconclusive however many tasks they got. A model whose
output moves mostly through the reward falls below. Chosen with experiment.DEFAULT_METHOD (LEACE) on zoo seeds 0-5:
the ratio of the two effects is 0.75-3.63 for the 18 layer-targeted mimics (3/4, the share before, sat on the
lowest); the trained decoys that leak some selectivity reach ratios up to 2.3 under LEACE, so against them the share
is no guard: MIN_SELECTIVITY is. Frozen before the fresh seed 6 was scored (docs/causal.md, "The erasure: LEACE by
default")."""
MAX_FACTOR = 100.0
"""An inconclusive answer that would need more than this many times the held-out tasks gets no estimate."""
THRESHOLDS = {"level": 0.95, "negligible_selectivity": NEGLIGIBLE_SELECTIVITY, "min_selectivity": MIN_SELECTIVITY,
              "negligible_excess_fraction_of_random": NEGLIGIBLE_EXCESS, "input_share": INPUT_SHARE,
              "max_factor": MAX_FACTOR}
"""The frozen thresholds, as the JSON's `conclusion_detail.thresholds` quotes them."""
ANSWERS = ("yes", "no", "inconclusive")


def _fmt(st: dict) -> str:
    ci = st.get("ci")
    m = st.get("mean")
    return ("—" if m is None else f"{m:.3g}") + (f" [{ci[0]:.3g}, {ci[1]:.3g}]" if ci else " (no interval)")


def _factor(st: dict, yes_at: float, no_at: float) -> float | None:
    """How many times the held-out tasks would likely move the interval past the threshold its mean points to
    (the half-width shrinks as 1/sqrt(tasks)); None when the mean sits on the threshold or no interval exists."""
    m, ci = st.get("mean"), st.get("ci")
    if m is None or not ci:
        return None
    f = ([((m - ci[0]) / (m - yes_at)) ** 2] if m > yes_at else []) + ([((ci[1] - m) / (no_at - m)) ** 2]
                                                                      if m < no_at else [])
    return min(f) if f else None


def against_input(selective, input_explained):
    """Per task: |Δ output| of the selective erasure minus INPUT_SHARE times that of the size-matched input-explained
    erasure (arrays of the same shape); the third criterion's statistic."""
    return selective - INPUT_SHARE * input_explained


def criteria(selectivity: dict, excess: dict, random_mean: float, versus_input: dict) -> list[dict]:
    """The three criteria: name, the statistic ({'mean', 'ci'}), the value its lower bound must exceed for
    "yes" and the value its upper bound must stay below (or at, for the input) for "no"."""
    return [
        {"name": "selective probe", "what": "selectivity of the residual's probe", "stat": selectivity,
         "yes_above": MIN_SELECTIVITY, "no_below": NEGLIGIBLE_SELECTIVITY},
        {"name": "beats random", "what": "excess |Δ output| of the selective erasure over variance-matched random "
         "directions", "stat": excess, "yes_above": 0.0, "no_below": NEGLIGIBLE_EXCESS * max(random_mean, 0.0)},
        {"name": "against the input", "what": f"|Δ output| of the selective erasure minus {INPUT_SHARE:g} x the "
         "size-matched input-explained erasure's", "stat": versus_input, "yes_above": 0.0, "no_below": 0.0},
    ]


def decide(crit: list[dict], n_test: int, test_fraction: float, note: str | None = None, unit: str = "tasks",
           flag: str = "--tasks") -> tuple[str, str, dict]:
    """(answer, reason, detail) from the criteria of `criteria`. `n_test`: held-out tasks (or what `unit` names:
    'histories' on episodes, whose count `flag` sets); `note`: a reason the site cannot answer at all (every edit
    leaves the output unchanged; a one-feature site), which makes the answer "inconclusive" whatever the intervals
    say."""
    rows = []
    for c in crit:
        st, ci = c["stat"], c["stat"].get("ci")
        yes = bool(ci) and ci[0] > c["yes_above"]
        no = bool(ci) and (ci[1] <= c["no_below"] if c["no_below"] == 0.0 else ci[1] < c["no_below"])
        rows.append({"name": c["name"], "what": c["what"], "mean": st.get("mean"), "ci": ci,
                     "yes_above": c["yes_above"], "no_below": c["no_below"],
                     "state": "no" if no else "yes" if yes else "open",
                     "factor": None if (yes or no) else _factor(st, c["yes_above"], c["no_below"])})
    detail = {"criteria": rows, "thresholds": THRESHOLDS, "held_out_tasks": int(n_test), "more_tasks": None}
    if note:
        return "inconclusive", note, detail
    said = "; ".join(f"{r['name']}: {_fmt(r)}" for r in rows)
    nos = [r for r in rows if r["state"] == "no"]
    if nos:
        why = ", ".join(f"{r['name']} {'≤' if r['no_below'] == 0.0 else '<'} {r['no_below']:.3g}" for r in nos)
        return "no", f"no: {why} over the whole interval ({said})", detail
    if all(r["state"] == "yes" for r in rows):
        return "yes", f"yes: every interval lies above its bound ({said})", detail
    open_ = [r for r in rows if r["state"] == "open"]
    factors = [r["factor"] for r in open_]
    toward_no = [r["factor"] for r in open_ if r["mean"] is not None and r["mean"] < r["no_below"]
                 and r["factor"] is not None]
    if toward_no:
        factor = min(toward_no)  # one "no" suffices
    elif all(f is not None for f in factors):
        factor = max(factors)  # every open criterion must reach "yes"
    else:
        factor = None
    more = ""
    if factor is not None and factor <= MAX_FACTOR:
        need = max(int(math.ceil(n_test * factor)), n_test + 1)
        detail["more_tasks"] = {"held_out": need, "tasks": int(math.ceil(need / test_fraction))}
        more = (f"; about {need} held-out {unit} would likely resolve it ({flag} ≈ "
                f"{detail['more_tasks']['tasks']})")
    else:
        more = (f"; more {unit} are unlikely to resolve it (over {MAX_FACTOR:g}x the held-out {unit}, or a mean on "
                "a threshold or between a criterion's two)")
    names = ", ".join(r["name"] for r in open_)
    return "inconclusive", f"inconclusive: the interval of {names} is not decisive ({said}){more}", detail
