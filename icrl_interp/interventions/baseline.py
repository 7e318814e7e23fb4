"""The trained model against its random-init copy (docs/causal.md#trained-against-random-init): the
identical test on the same architecture at random initialization (`random_init_baseline`: same tasks,
split, random directions and bootstrap resamples, its own direction), and the two models compared on
the excess output change per held-out task (`compare_models`), which a model whose output barely
moves cannot win by a scale-free ratio.
"""
from __future__ import annotations

import numpy as np

from ..core.errors import UserError
from .experiment import CausalSetup, Measured, measure, model_part, prepare
from .statistics import excess, interval, num

BASELINES = ("random-init", "none")
"""What the identical test also runs on: the same architecture at random initialization
(`models.random_init.random_init_copy`), or nothing."""
MEASURE = ("excess output change: per held-out task, ||out_edited - out||_2 from erasing the TD direction "
           "minus its mean over the random directions of the same size (variance-matched), in the output's own "
           "units (the task's values); "
           "trained minus random-init per task, 95% bootstrap over held-out tasks")
"""What the trained-vs-random-init comparison is based on (docs/causal.md#trained-against-random-init)."""


def versus(a: np.ndarray, b: np.ndarray, idx: np.ndarray) -> dict:
    """Per-task a (trained) and b (random-init) on the same tasks: means, and the paired difference."""
    d = a - b
    return {"trained": {"mean": float(a.mean()), "ci": interval(a[idx].mean(1))},
            "random_init": {"mean": float(b.mean()), "ci": interval(b[idx].mean(1))},
            "difference": {"mean": float(d.mean()), "ci": interval(d[idx].mean(1))}}


def probe_versus(a: np.ndarray, b: np.ndarray, idx: np.ndarray) -> dict:
    """Held-out probe R^2 of each model from per-task sums [N, 4], and the paired difference."""
    from ..analyzers.td_probe import r2_of_sums

    r2 = lambda sums: r2_of_sums(*np.moveaxis(sums, -1, 0))  # noqa: E731
    ra, rb = r2(a[idx].sum(1)), r2(b[idx].sum(1))
    return {"trained": {"mean": num(r2(a.sum(0))), "ci": interval(ra)},
            "random_init": {"mean": num(r2(b.sum(0))), "ci": interval(rb)},
            "difference": {"mean": num(r2(a.sum(0)) - r2(b.sum(0))), "ci": interval(ra - rb)}}


def _g(x) -> str:
    return "—" if x is None else f"{x:.3g}"


def _stat(st: dict) -> str:
    ci = st.get("ci")
    return _g(st.get("mean")) + (f" [{_g(ci[0])}, {_g(ci[1])}]" if ci else " (no interval)")


def verdict(v: dict, what: str) -> str:
    """'yes: ...' when the paired per-task difference (trained minus random-init, the same tasks) has its interval
    above 0 and the trained model's own interval lies above 0 (an excess that random directions match is no effect,
    however low the random-init one); else 'no: ...' with the reason. The two models are measured on the same
    tasks, so the paired interval decides, never the overlap of the two unpaired ones."""
    t, b, d = v["trained"], v["random_init"], v["difference"]
    desc = f"{what}: trained {_stat(t)}, random-init {_stat(b)}; paired difference {_stat(d)}"
    if not t.get("ci") or not d.get("ci"):
        return f"no: no interval to compare ({desc})"
    if d["ci"][1] < 0.0:
        return f"no: the random-init model's is larger, the paired difference lies below 0 ({desc})"
    if d["ci"][0] <= 0.0:
        return f"no: the paired difference's interval includes 0 ({desc})"
    if t["ci"][0] <= 0.0:
        return f"no: the paired difference lies above 0, but the trained model's reaches 0 ({desc})"
    return f"yes: the paired difference lies above 0 ({desc})"


def compare_models(trained: Measured, base: Measured, setup: CausalSetup, base_setup: CausalSetup,
                   seed: int, n_boot: int) -> dict:
    """The trained model against its random-init copy on the same held-out tasks and random draws.

    Per task and model, the excess of the TD direction's effect over the random directions' (`excess`);
    the bootstrap resamples of the tasks are the first of each model's own statistics, so the
    `erasure.output_change` intervals here equal the models' own `difference` intervals."""
    N = setup.z_test.shape[0]
    idx = np.random.default_rng([int(seed), 0xB007]).integers(0, N, size=(n_boot, N))
    ex = lambda pair: excess(*pair)  # noqa: E731
    t, b = trained.per_task, base.per_task
    ratio = lambda m: m.erasure["output_change"].get("ratio")  # noqa: E731
    out = {
        "measure": MEASURE,
        "erasure": {"output_change": versus(ex(t["output"]), ex(b["output"]), idx),
                    "value_error_change": versus(ex(t["value_error"]), ex(b["value_error"]), idx),
                    "td_output_change": versus(t["output"][0], b["output"][0], idx),
                    "random_output_change": versus(t["output"][1].mean(1), b["output"][1].mean(1), idx)},
        "ratio": {"trained": ratio(trained), "random_init": ratio(base)},
        "steering": [{"scale": p["scale"], **versus(ex(ts), ex(bs), idx)}
                     for p, ts, bs in zip(trained.steering, t["steer"], b["steer"])],
        "probe_r2_test": probe_versus(setup.probe_sums, base_setup.probe_sums, idx),
        "scale": {"trained": rms(setup.base), "random_init": rms(base_setup.base), "target": rms(setup.truth)},
    }
    for point in out["steering"]:
        point["exceeds_random_init"] = verdict(point, f"excess output change, steering s={point['scale']:g}")
    out["exceeds_random_init"] = verdict(out["erasure"]["output_change"], "excess output change")
    out["probe_exceeds_random_init"] = verdict(out["probe_r2_test"], "held-out probe R²")
    return out


def rms(out: np.ndarray) -> float:
    """Root mean square over held-out tasks of ||out||_2."""
    return float(np.sqrt(np.mean(np.sum(np.asarray(out, dtype=np.float64) ** 2, -1))))


def scale_note(comparison: dict, factor: float = 10.0) -> str | None:
    """A note when the two models' outputs differ in scale by more than `factor`: absolute effects of a
    model whose output is much larger than the task's values are large and noisy whatever it uses."""
    sc = comparison["scale"]
    t, b = sc["trained"], sc["random_init"]
    if t > 0 and b > 0 and max(t / b, b / t) <= factor:
        return None
    return (f"the random-init copy's output (rms {b:.3g}) and the trained model's (rms {t:.3g}; the target's "
            f"{sc['target']:.3g}) differ in scale by more than {factor:g}x: absolute effects scale with the "
            f"output, so read the comparison with the ratio and the scale")


def random_init_baseline(model, config, layer, setup, measured, method, direction, G, scales, seeds, base_seed, n_boot,
                         common) -> dict:
    """The `baseline` section: the identical test on `random_init_copy(model, base_seed)`, compared (`seeds`:
    the tasks' prompt_seed and split_seed; the split seed draws the bootstrap resamples)."""
    from ..models.random_init import random_init_copy

    copy, info = random_init_copy(model, base_seed)
    out = {"kind": info["kind"], "seed": info["seed"], "reset_modules": info["reset_modules"],
           "redrawn": list(info["redrawn"])}
    own = direction if isinstance(direction, str) else "probe"
    try:
        bset = prepare(copy, config, layer, direction=own, **common)
        if not (np.array_equal(bset.z_test, setup.z_test) and np.array_equal(bset.train_index, setup.train_index)):
            raise AssertionError("the random-init baseline drew other tasks")  # prepare is a pure function of seed
        if bset.width != setup.width:
            raise UserError(f"the random-init copy's features at {bset.site.canonical} have width {bset.width}, "
                            f"the model's {setup.width}")
        bm = measure(bset, method, G, scales, seeds["split_seed"], n_boot)
    except UserError as e:
        out["error"] = str(e)
        return out
    part = model_part(bset, bm, seeds)
    if not isinstance(direction, str):
        part["notes"].insert(0, "the model's direction was given: the random-init copy uses its own probe direction")
    out.update(part)
    out["comparison"] = compare_models(measured, bm, setup, bset, seeds["split_seed"], n_boot)
    note = scale_note(out["comparison"])
    if note:
        out["notes"].append(note)
    return out
