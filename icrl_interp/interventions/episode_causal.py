"""The causal test on a sequence model's actions over learning histories (docs/episodes.md, "The causal test on
actions"): does the model act through the selective part of a candidate's TD error (or another target) at a layer?

A model reads a token tensor of an episode format (`models.episode_tokens`: tokens [N, P, d_token] ->
action logits [N, P, A], or a tuple whose first element they are) and has a hook point
`blocks.{layer}.{hook}` (default `hook_resid_post`) of shape [N, P, d]. The test:

1. runs the model unedited on every history and reads the layer's activations at the action-read positions,
   aligned to steps [H, T, d] (`PositionMap.to_steps`);
2. fits, split by history (`analyzers.episode_probes`), the probe of the target's selective part (the target
   minus its ridge prediction from the step's input features and the immediate reward) and of its
   input-explained part: the *selective* and *input-explained* directions (`selective.direction`);
3. erases (mean-ablates the projection onto) a direction at the layer, at the action-read positions only, on
   the held-out histories, and measures the action distribution's change per step: KL(pi || pi_edit) and the
   change of the probability of the action the model chose (its greedy action under pi), each averaged over a
   history's steps. Directions: the selective one; the input-explained one shrunk to the selective erasure's
   erased variance (and in full, reported); variance-matched random directions (`edits.variance_matched`), as
   `experiment.measure_selective` does for the families;
4. answers yes / no / inconclusive by `conclusion.decide` on the three criteria (the selective probe's
   selectivity over every baseline, the KL's excess over random, the KL minus the input-explained erasure's),
   all on the same bootstrap resamples of the held-out histories.

Hooks are removed in `finally` (`recording.capture`), the model runs in eval mode and gets its own modes back.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..analyzers import episode_probes
from ..core.errors import UserError
from ..models.episode_tokens import encode
from ..models.modes import eval_mode
from . import conclusion, selective
from .edits import Edit, erased_variance, projection_edit, random_directions, unit, variance_matched
from .sites import unchanged_within_rounding
from .statistics import excess, interval, num

SCHEMA = "icrl_interp.episode_causal/1"
UNIT = {"unit": "histories", "flag": "--histories"}
"""What the held-out resamples are here, for the conclusion's text (`conclusion.decide`): `collect --histories`."""
DRAWS = 8
"""Random directions of the control."""
EFFECT = "kl"
"""The effect the conclusion reads: the mean per step of KL(pi || pi_edit) over a history's steps."""


def _logits(y):
    return y[0] if isinstance(y, (tuple, list)) else y


def run_model(model, tokens: np.ndarray, point: str, at: np.ndarray, *, edit: Edit | None = None,
              capture_site: bool = False, batch_size: int = 256):
    """(logits [M, A] float64, activations at `point` [M, d] float64 or None) of `tokens` [N, P, d_token] at the
    M positions where `at` [N, P] is True (the action-read positions, in row-major order), in batches, under
    no_grad and eval mode; `edit` is applied to the activations at `point` at those positions only. Only the read
    positions are kept, so memory grows with the steps, not with the positions (DPT reads one per sequence). Hooks
    are removed in `finally` (`recording.capture`'s capture / intervene)."""
    import torch

    from ..recording.capture import capture, intervene

    p = next(iter(model.parameters()), None)
    own = p is not None and p.is_floating_point()
    dtype, device = (p.dtype, p.device) if own else (torch.float32, torch.device("cpu"))
    outs, acts = [], []
    rows = {}

    def site(t):
        if t.ndim != 3 or tuple(t.shape[:2]) != tuple(rows["mask"].shape):
            raise UserError(f"{point} has shape {tuple(t.shape)}, expected [batch, {at.shape[1]}, width]")
        return torch.as_tensor(rows["mask"], device=t.device)

    def grab(_name, t):
        acts.append(t[site(t)].detach().to("cpu", torch.float64).numpy())

    def edit_fn(t):
        m = site(t)
        out = t.clone()
        out[m] = edit.apply(t[m])
        return out

    with torch.no_grad(), eval_mode(model):
        for lo in range(0, tokens.shape[0], batch_size):
            x = torch.as_tensor(np.ascontiguousarray(tokens[lo:lo + batch_size])).to(device, dtype)
            rows["mask"] = np.asarray(at[lo:lo + batch_size], bool)
            before = len(acts)
            with capture(model, [point] if capture_site else [], grab):
                if edit is None:
                    y = _logits(model(x))
                else:
                    with intervene(model, point, edit_fn):
                        y = _logits(model(x))
            if capture_site and len(acts) != before + 1:
                raise UserError(f"{point} fired {len(acts) - before} times in one forward pass, expected once")
            y = y.detach()[torch.as_tensor(rows["mask"], device=y.device)].to("cpu", torch.float64).numpy()
            if not np.isfinite(y).all():
                raise UserError("the model's action logits hold NaN or Inf" + (" under the edit" if edit else ""))
            outs.append(y)
    return np.concatenate(outs, 0), (np.concatenate(acts, 0) if capture_site else None)


def read_mask(pmap) -> np.ndarray:
    """[N, P] bool: the positions where an action is read (one per valid step)."""
    m = np.zeros(pmap.history.shape, bool)
    m[pmap.read_seq, pmap.read_pos] = True
    return m


def to_steps(pmap, values: np.ndarray) -> np.ndarray:
    """values [M, ...] at the read positions in row-major order (`run_model`) aligned to steps [H, T, ...], NaN
    where a step is not valid."""
    index = np.full(pmap.history.shape, -1, np.int64)
    index[pmap.read_seq, pmap.read_pos] = np.arange(pmap.read_seq.size)
    order = index[index >= 0]  # read index of each row-major read position
    out = np.full((pmap.n_histories, pmap.n_steps, *values.shape[1:]), np.nan)
    out[pmap.read_history[order], pmap.read_step[order]] = values
    return out


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def effects(base: np.ndarray, edited: np.ndarray, valid: np.ndarray, dtype) -> dict[str, np.ndarray]:
    """Per history (mean over its valid steps) of the action distribution's change from logits `base` to `edited`
    [H, T, A]: 'kl' KL(pi || pi_edit), 'dp_chosen' pi_edit(a*) - pi(a*) and 'abs_dp_chosen' its size, a* the
    greedy action under pi. A step whose logits moved by no more than the rounding floor counts as unchanged
    (`sites.unchanged_within_rounding`, `dtype` the model's torch dtype)."""
    b, e = base[valid], edited[valid]
    e = unchanged_within_rounding(e, b, dtype)
    lb, le = _log_softmax(b), _log_softmax(e)
    kl = np.maximum((np.exp(lb) * (lb - le)).sum(-1), 0.0)
    a = lb.argmax(-1)[:, None]
    dp = (np.exp(np.take_along_axis(le, a, -1)) - np.exp(np.take_along_axis(lb, a, -1)))[:, 0]
    hist = np.nonzero(valid)[0]
    n = np.bincount(hist, minlength=valid.shape[0])
    mean = lambda v: np.bincount(hist, weights=v, minlength=valid.shape[0]) / np.maximum(n, 1)  # noqa: E731
    return {"kl": mean(kl), "dp_chosen": mean(dp), "abs_dp_chosen": mean(np.abs(dp))}


def _shrunk(edit: Edit, size: float, cov: np.ndarray) -> tuple[Edit, float]:
    """The erasure scaled to remove `size` variance (x -> x - t c (b.x - m) removes t^2 its variance), and t."""
    full = erased_variance(cov, edit)
    t = float(np.sqrt(size / full)) if full > 0 else 1.0
    return Edit(c=t * np.asarray(edit.c), b=edit.b, m=edit.m), t


def directions(X: np.ndarray, probes, layer, target: str):
    """({'selective', 'input'}: `selective.Direction` or None, mean, covariance) of the features X [H, T, d] on the
    training histories' probed steps only, from the probes of `target`'s two parts at `layer`."""
    train = probes.mask & (probes.split.fold < probes.split.k)[:, None]
    Xt = X[train]
    mean_x = Xt.mean(0)
    cov_x = (Xt - mean_x).T @ (Xt - mean_x) / Xt.shape[0]
    dirs = {}
    for part in ("selective", "input"):
        name = f"{target}_{part}"
        dirs[part] = selective.direction(probes.coef[(layer, name)][0], Xt, probes.targets[name][train])
    return dirs, mean_x, cov_x


def resamples(n: int, n_boot: int, seed: int) -> np.ndarray:
    """[n_boot, n] bootstrap resamples (with replacement) of n held-out histories, a pure function of `seed`: every
    effect and the selectivity are read on the same ones (paired)."""
    return np.random.default_rng([int(seed), 0x5E1EC7]).integers(0, n, size=(n_boot, n))


def bootstrap(a: np.ndarray, idx: np.ndarray) -> dict:
    """{'mean', 'ci'}: the mean of a per-history statistic a [n] and its percentile interval over resamples idx."""
    return {"mean": float(a.mean()), "ci": interval(a[idx].mean(1))}


def causal_episodes(model, episodes, fmt, targets: Mapping[str, np.ndarray], *, layer: int, target: str = "delta",
                    hook: str = "hook_resid_post", draws: int = DRAWS, seed: int = 0, split_seed: int = 0,
                    test_fraction: float = episode_probes.TEST_FRACTION, n_boot: int = 1000,
                    batch_size: int = 256, random_model=None) -> dict:
    """The causal test of `target` (a key of `targets`, {name: [H, T]}, e.g. `episode_probes.replay_targets`) at
    `blocks.{layer}.{hook}` of `model` reading `episodes` in token format `fmt` (`TokenFormat`). Split by history
    with `split_seed` (as `episode_probes.probe_episodes`); random directions and bootstrap resamples are pure
    functions of `seed`. `random_model` (the random-init model, same architecture): its activations at the site are
    the probes' random-init baseline, which the selectivity criterion must beat too. Returns the JSON (schema
    SCHEMA) with `conclusion` 'yes' / 'no' / 'inconclusive', `reason` and `conclusion_detail` (conclusion.decide).
    Holds the site's activations at the read positions [H, T, d] in memory (one layer)."""
    import torch

    if target not in targets:
        raise UserError(f"causal target {target!r} is not among the targets ({', '.join(targets)})")
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 2:
        raise UserError(f"the random control needs at least 2 draws, got {draws!r}")
    point = f"blocks.{int(layer)}.{hook}"
    tokens, pmap = encode(episodes, fmt)
    at = read_mask(pmap)
    logits, acts = run_model(model, tokens, point, at, capture_site=True, batch_size=batch_size)
    X, base = to_steps(pmap, acts), to_steps(pmap, logits)
    random_layers = None
    if random_model is not None:
        random_layers = {layer: to_steps(pmap, run_model(random_model, tokens, point, at, capture_site=True,
                                                         batch_size=batch_size)[1])}
    probes = episode_probes.probe_episodes(episodes, {layer: X}, {target: targets[target]}, selective=(target,),
                                           random_layers=random_layers, seed=split_seed,
                                           test_fraction=test_fraction, n_boot=n_boot)
    split = probes.split
    dirs, mean_x, cov_x = directions(X, probes, layer, target)
    test = split.test
    sums = probes.sums[(layer, f"{target}_selective")]
    idx = resamples(test.size, n_boot, seed)
    boot = lambda a: bootstrap(a, idx)  # noqa: E731
    sel_stat = {"mean": num(episode_probes.selectivity_of_sums(sums.sum(0))),
                "ci": interval(episode_probes.selectivity_of_sums(sums[idx].sum(1)))}
    out = {"schema": SCHEMA, "site": point, "target": target, "layer": int(layer),
           "probe": probes.json["layers"][str(layer)], "split": split.to_json(), "effect": EFFECT,
           "chosen_action": "the model's greedy action under its unedited policy"}
    if dirs["selective"] is None or dirs["input"] is None:
        st = {"mean": None, "ci": None}
        ans, reason, detail = conclusion.decide(conclusion.criteria(sel_stat, st, 0.0, st), test.size, test_fraction,
                                                "inconclusive: the selective or input-explained probe found nothing "
                                                "to read (all its coefficients are 0)", **UNIT)
        return {**out, "conclusion": ans, "reason": reason, "conclusion_detail": detail}
    sub = episodes.select(test)
    tok_t, pmap_t = encode(sub, fmt)
    at_t = read_mask(pmap_t)
    base_t = base[test]
    valid_t = np.asarray(sub.valid, bool)
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)

    def effect(edit: Edit) -> dict[str, np.ndarray]:
        y, _ = run_model(model, tok_t, point, at_t, edit=edit, batch_size=batch_size)
        return effects(base_t, to_steps(pmap_t, y), valid_t, dtype)

    sel_edit = projection_edit(dirs["selective"].u, dirs["selective"].mean)
    size = erased_variance(cov_x, sel_edit)
    full_in = projection_edit(dirs["input"].u, dirs["input"].mean)
    in_edit, shrink = _shrunk(full_in, size, cov_x)
    rand_edits = []
    for g in random_directions(X.shape[-1], draws, seed, layer):
        u = unit(variance_matched(cov_x, g, size), "random direction")
        rand_edits.append(projection_edit(u, float(mean_x @ u)))
    s, i, i_full = effect(sel_edit), effect(in_edit), effect(full_in)
    r = [effect(e) for e in rand_edits]
    per = {}
    for k in s:
        rk = np.stack([e[k] for e in r], 1)
        per[k] = {"selective": boot(s[k]), "input_explained": boot(i[k]), "input_explained_full": boot(i_full[k]),
                  "random": boot(rk.mean(1)), "excess_over_random": boot(excess(s[k], rk)),
                  "minus_input_explained": boot(s[k] - i[k])}
    largest = max(float(np.max([s[EFFECT], i[EFFECT], *(e[EFFECT] for e in r)], initial=0.0)), 0.0)
    note = None
    if largest <= 0.0:
        note = (f"inconclusive: no edit at {point} (selective, input-explained or random direction) changes the action "
                "distribution: nothing downstream reads these positions")
    elif X.shape[-1] == 1:
        note = ("inconclusive: the site has one feature, so the selective, input-explained and random directions are "
                "the same direction and cannot be told apart")
    e = per[EFFECT]
    crit = conclusion.criteria(sel_stat, e["excess_over_random"], e["random"]["mean"], e["minus_input_explained"])
    ans, reason, detail = conclusion.decide(crit, test.size, test_fraction, note, **UNIT)
    out.update({
        "selectivity": sel_stat, "effects": per,
        "erased_variance": {"selective": size, "input_explained": erased_variance(cov_x, in_edit),
                            "input_explained_full": erased_variance(cov_x, full_in), "input_explained_shrink": shrink,
                            "random": float(np.mean([erased_variance(cov_x, e) for e in rand_edits]))},
        "cosine_selective_input": float(dirs["selective"].u @ dirs["input"].u),
        "histories": {"train": int(split.train.size), "test": int(test.size)}, "draws": int(draws), "seed": int(seed),
        "conclusion": ans, "reason": reason, "conclusion_detail": detail})
    return out
