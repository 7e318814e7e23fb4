"""Causal test of the TD-error direction: erase it, or steer along it, at one layer and measure what
the model's output does, against the same edit along random directions (docs/causal.md).

At layer l the direction that carries the reference TD error is fitted on *training* tasks (a ridge
probe, as `analyzers.td_probe`, from the activation at each context column k to delta_k of the same
prompt), or taken from the construction (`Hints.td_direction`), or given. On *held-out* tasks (split
by task) every context column of that layer's activation is then edited:

* **erase**: mean-ablation of the projection on the unit direction u, x -> x - u (u.x - mu) (mu: the
  mean of u.x on training columns); zero-ablation (mu = 0); or LEACE, the least-squares concept eraser
  (Belrose et al., 2023), whose closed form for one scalar concept is the oblique rank-one projection
  x -> x - c b.(x - mean_x), c = Cov(x, delta), b = Cov(x)^+ c / (c^T Cov(x)^+ c);
* **steer**: x -> x + s sigma u for a few s (sigma: the std of u.x on training columns).

Every edit is x -> x - c (b.x - m) + v (`Edit`). The same edit along random directions (seeded draws
g, bent toward the top or bottom of Cov(x) as Cov(x)^p g) is the control, each draw of the same size
as the TD edit: an erasure removes as much variance as the TD erasure does (`variance_matched`), a
steering shifts by the same vector norm. Output and value-error changes are compared per held-out
task, with paired effect sizes and bootstrap intervals. Every erasure also reports how much of delta a
ridge probe refitted on the edited features still reads (`r2_after`): mean-ablating the probe's
direction removes its readout, not necessarily delta; LEACE leaves none linearly.

By default the identical test also runs on the same architecture at random initialization
(`models.random_init.random_init_copy`: same tasks, split, random directions and resamples, its own direction),
and the two models are compared on the excess output change (TD minus random directions, in output
units, per task), which a model whose output barely moves cannot win by a scale-free ratio.

Works for the package's models (TransformerLens hook names) and for any torch module through the
[roles] of a probe spec (`capture.role_points`); the residual stream may have its own width.

This module is the test's entry (`causal_test`) and holds its public names; the parts live beside it:
`edits` (directions and edits), `sites` (where on the model, and its forward with an edit), `experiment`
(one model: fit on training tasks, measure on held-out ones), `statistics` (TD against random directions)
and `baseline` (the trained model against its random-init copy).
"""
from __future__ import annotations

import math

from ..core.errors import UserError
from ..families import registry
from .baseline import BASELINES, MEASURE, compare_models, random_init_baseline, scale_note, verdict
from .edits import (MATCH_POWER, Edit, erased_variance, leace_edit, pinv_psd, projection_edit, random_directions,
                    variance_matched)
from .conclusion import ANSWERS, THRESHOLDS
from .experiment import (DEFAULT_METHOD, DIRECTIONS, ERASED, FOLDS, METHODS, MIN_TASKS, CausalSetup, Measured,
                         conclude, measure, measure_selective, model_part, prepare, probe_iteration, reach_note, refit,
                         training_resamples)
from .sites import (ROUNDING_ULPS, SITES, Runner, Site, check_int, default_hook, eval_mode, own_model, rounding_floor,
                    site_of, unchanged_within_rounding)
from .statistics import compare, excess

__all__ = ["SCHEMA", "DEFAULT_STEER", "DEFAULT_REFITS", "causal_test", "BASELINES", "MEASURE", "compare_models",
           "scale_note", "verdict", "MATCH_POWER", "Edit", "erased_variance", "leace_edit", "pinv_psd",
           "projection_edit", "random_directions", "variance_matched", "ANSWERS", "THRESHOLDS", "DIRECTIONS", "ERASED",
           "DEFAULT_METHOD", "FOLDS", "METHODS", "MIN_TASKS", "CausalSetup", "Measured", "conclude", "measure",
           "measure_selective", "refit", "training_resamples", "prepare", "probe_iteration", "reach_note",
           "ROUNDING_ULPS", "SITES", "Runner", "Site", "default_hook", "eval_mode", "rounding_floor", "site_of",
           "unchanged_within_rounding", "compare", "excess"]
"""The test's public names, wherever they live (docs/causal.md names them as `causal.NAME`)."""

SCHEMA = "icrl_interp.causal/2"
DEFAULT_STEER = (-2.0, -1.0, 1.0, 2.0)
DEFAULT_REFITS = 8
"""Refits of the selective test's directions on resampled training tasks (`causal_test`'s `refits`)."""


def causal_test(model, config, layer: int, *, method: str = DEFAULT_METHOD, hook: str | None = None,
                roles: dict | None = None, probe=None, direction="probe", tasks: int = 256,
                test_fraction: float = 0.5, seed: int = 0, random_draws: int = 32, steer=DEFAULT_STEER,
                bootstrap: int = 1000, batch_size: int = 256, baseline: str = "random-init",
                baseline_seed: int | None = None, prompt_seed: int | None = None, split_seed: int | None = None,
                direction_seed: int | None = None, crossfit: bool = False, refits: int = DEFAULT_REFITS) -> dict:
    """Erase / steer the TD-error direction at `layer` and compare with random directions (docs/causal.md).

    `model`: one of the package's models or any torch module (with `roles` or a `probe` spec path whose
    [roles] map resid_post etc. to its modules, unless it is a TransformerLens model). `config`: the task
    (a CheckpointConfig, a checkpoint directory, or a family name with its default options).
    `baseline='random-init'` runs the identical test (same held-out tasks and split, same random
    directions, same bootstrap resamples, its own direction fitted the same way) on the same architecture
    at random initialization (`models.random_init.random_init_copy(model, baseline_seed)`) and compares the
    two; 'none' does not. Seeds: `prompt_seed` draws the tasks, `split_seed` splits them and draws the
    bootstrap resamples, `direction_seed` draws the random directions, `baseline_seed` the random-init copy;
    each one not given is `seed` (the command line gives each: --prompt-seed, --split-seed, ...).
    `crossfit=True` (not the default; no flag): the selective test and the conclusion are cross-fitted over the
    split and its swap (docs/causal.md, "Cross-fitting"): the directions are fitted on each part and measured on
    the other, and the statistics pooled over all tasks (`selective.crossfit`); the other fields are the split's.
    `refits` R (docs/causal.md, "Refitting"): the selective and input-explained directions (and the selectivity's
    probes) are refitted on R resamples of the training tasks (drawn from `split_seed`), each measured on the held-out
    tasks, and the bootstrap resamples both, so the conclusion's intervals hold how the fitted directions vary
    (`selective.refits`; 0: directions fitted once, intervals over held-out tasks only). The random-init baseline's
    selective test is not refitted.
    Returns the `causal` section of the causal JSON (docs/formats.md#causal-json)."""
    if method not in METHODS:
        raise UserError(f"--method {method!r}: expected one of {', '.join(METHODS)}")
    if baseline not in BASELINES:
        raise UserError(f"--baseline {baseline!r}: expected one of {', '.join(BASELINES)}")
    draws = check_int("--random-draws", random_draws, 2)
    n_boot = check_int("--bootstrap", bootstrap, 10)
    base_seed = check_int("--baseline-seed", seed if baseline_seed is None else baseline_seed)
    prompt_seed, split_seed = (seed if s is None else s for s in (prompt_seed, split_seed))
    direction_seed = check_int("--direction-seed", seed if direction_seed is None else direction_seed)
    refits = check_int("--refits", refits, 0)
    scales = [float(s) for s in (steer or ())]
    if not all(math.isfinite(s) for s in scales):
        raise UserError(f"steering scales must be finite, got {steer!r}")
    if probe is not None and roles is None:
        from ..recording.probe_spec import spec_for

        roles = dict(spec_for(model, probe).roles) or None
    common = dict(hook=hook, roles=roles, tasks=tasks, test_fraction=test_fraction, seed=prompt_seed,
                  split_seed=split_seed, batch_size=batch_size)
    setup = prepare(model, config, layer, direction=direction, **common)
    seeds = {"prompt_seed": prompt_seed, "split_seed": split_seed}
    G = random_directions(setup.width, draws, direction_seed, setup.site.layer)
    others = (prepare(model, config, layer, direction=direction, fold=1, **common),) if crossfit else ()
    measured = measure(setup, method, G, scales, split_seed, n_boot, others=others, refits=refits)
    fam = registry.get(setup.family)
    section = {
        "model": {"class": type(model).__name__,
                  "family": model.config.family if own_model(model) else None},
        "task": {"family": setup.family, "n": int(setup.z_test.shape[1] - 1), "output": fam.hints.output,
                 "output_width": int(setup.base.shape[1])},
        "layer": setup.site.layer, "n_layers": setup.site.n_layers, "hook": setup.site.canonical,
        "module": setup.site.point, "method": method,
        "random_draws": draws, "direction_seed": direction_seed, "bootstrap": n_boot,
    }
    part = model_part(setup, measured, seeds)
    notes = part.pop("notes")
    section.update(part)
    section["conclusion"], section["conclusion_reason"], section["conclusion_detail"] = conclude(
        setup, measured, 1.0 if crossfit else test_fraction)
    section["notes"] = notes
    if baseline == "random-init":
        section["baseline"] = random_init_baseline(model, config, layer, setup, measured, method, direction, G,
                                                   scales, seeds, base_seed, n_boot, common)
    return section
