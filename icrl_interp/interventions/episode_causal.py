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
   all on the same bootstrap resamples of the held-out histories;
5. steers: x -> x + s sigma u at the read position of ONE step t of each held-out history at a time (`steer_steps`
   draws `STEER_STEPS` per history, among the steps whose state repeats the previous one), for each scale s and
   each direction u (selective, input-explained, the same random ones), sigma the std of the selective projection
   on the training histories, so every steering vector has the same norm (the random directions are variance-
   matched, so their own projections have that std too). Read at t: KL(pi || pi_edit) and the signed
   dp_previous = pi_edit(a_{t-1}) - pi(a_{t-1}). A learner that reads delta as an RL rule does raises the action
   just taken when delta_{t-1} is larger (a positive TD error reinforces it, and at a repeat-state step the value
   it updates is the current state's): `sign` says whether the selective steering moves pi(a_{t-1}) toward the
   side of s, at every scale, by more than random directions of its norm move it either way ('as an RL
   learner'), to the other side by more ('opposite'), or neither ('unresolved') (`sign_of`).
   Steering does not enter `conclusion` (its criteria and thresholds are the families' and keep one meaning);
   it is a directional reading beside it. One step at a time, because an edit at t also reaches every later
   position; the price is STEER_STEPS forward passes per direction and scale;
6. optionally (`closed_loop_histories`), lets the model act in closed loop (`closed_loop`) on fresh histories of
   the file's environment (`environment_of`), unedited, with the selective erasure and with each random erasure
   at the read positions of every forward pass (`loop_read_positions`, the site of 3), all paired by seed, and
   reports the return (first episode, last quarter, in-context improvement) per arm and the paired differences
   with intervals over histories.

Hooks are removed in `finally` (`recording.capture`), the model runs in eval mode and gets its own modes back.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..analyzers import episode_probes
from ..core.errors import UserError
from ..core.validate import count
from ..models.episode_tokens import encode
from ..models.modes import eval_mode
from . import conclusion, selective
from .causal import DEFAULT_STEER
from .edits import Edit, erased_variance, projection_edit, random_directions, unit, variance_matched
from .sites import unchanged_within_rounding
from .statistics import excess, interval, num

SCHEMA = "icrl_interp.episode_causal/2"
"""2: `steering`, `closed_loop` and `token_format` added (1: erasure only)."""
UNIT = {"unit": "histories", "flag": "--histories"}
"""What the held-out resamples are here, for the conclusion's text (`conclusion.decide`): `collect --histories`."""
DRAWS = 8
"""Random directions of the control."""
EFFECT = "kl"
"""The effect the conclusion reads: the mean per step of KL(pi || pi_edit) over a history's steps."""
STEER_STEPS = 4
"""Steered steps per held-out history (`steer_steps`): one forward pass each, per direction and scale."""


def _logits(y):
    return y[0] if isinstance(y, (tuple, list)) else y


def run_model(model, tokens: np.ndarray, point: str, at: np.ndarray, *, edit: Edit | None = None,
              edit_at: np.ndarray | None = None, capture_site: bool = False, batch_size: int = 256):
    """(logits [M, A] float64, activations at `point` [M, d] float64 or None) of `tokens` [N, P, d_token] at the
    M positions where `at` [N, P] is True (the action-read positions, in row-major order), in batches, under
    no_grad and eval mode; `edit` is applied to the activations at `point` at the positions where `edit_at` [N, P]
    is True (default: `at`) and nowhere else. Only the read positions are kept, so memory grows with the steps, not
    with the positions (DPT reads one per sequence). Hooks are removed in `finally` (`recording.capture`'s capture /
    intervene)."""
    import torch

    from ..recording.capture import capture, intervene

    p = next(iter(model.parameters()), None)
    own = p is not None and p.is_floating_point()
    dtype, device = (p.dtype, p.device) if own else (torch.float32, torch.device("cpu"))
    outs, acts = [], []
    rows = {}

    def site(t, key="mask"):
        if t.ndim != 3 or tuple(t.shape[:2]) != tuple(rows[key].shape):
            raise UserError(f"{point} has shape {tuple(t.shape)}, expected [batch, {at.shape[1]}, width]")
        return torch.as_tensor(rows[key], device=t.device)

    def grab(_name, t):
        acts.append(t[site(t)].detach().to("cpu", torch.float64).numpy())

    def edit_fn(t):
        m = site(t, "edit")
        out = t.clone()
        out[m] = edit.apply(t[m])
        return out

    with torch.no_grad(), eval_mode(model):
        for lo in range(0, tokens.shape[0], batch_size):
            x = torch.as_tensor(np.ascontiguousarray(tokens[lo:lo + batch_size])).to(device, dtype)
            rows["mask"] = np.asarray(at[lo:lo + batch_size], bool)
            rows["edit"] = rows["mask"] if edit_at is None else np.asarray(edit_at[lo:lo + batch_size], bool)
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


def changes(b: np.ndarray, e: np.ndarray, dtype, actions: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(KL(pi || pi_edit) [M], pi_edit(a) - pi(a) [M]) per step from logits `b` to `e` [M, A], a = `actions` [M]
    (default: the greedy action under pi). A step whose logits moved by no more than the rounding floor counts as
    unchanged (`sites.unchanged_within_rounding`, `dtype` the model's torch dtype): both are 0 exactly there."""
    e = unchanged_within_rounding(e, b, dtype)
    lb, le = _log_softmax(b), _log_softmax(e)
    kl = np.maximum((np.exp(lb) * (lb - le)).sum(-1), 0.0)
    a = (lb.argmax(-1) if actions is None else np.asarray(actions, np.int64))[:, None]
    return kl, (np.exp(np.take_along_axis(le, a, -1)) - np.exp(np.take_along_axis(lb, a, -1)))[:, 0]


def effects(base: np.ndarray, edited: np.ndarray, valid: np.ndarray, dtype) -> dict[str, np.ndarray]:
    """Per history (mean over its valid steps) of the action distribution's change from logits `base` to `edited`
    [H, T, A]: 'kl' KL(pi || pi_edit), 'dp_chosen' pi_edit(a*) - pi(a*) and 'abs_dp_chosen' its size, a* the
    greedy action under pi (`changes`)."""
    kl, dp = changes(base[valid], edited[valid], dtype)
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


def steer_steps(episodes, per_history: int, seed: int) -> np.ndarray:
    """[H, per_history] the steps steered (and read) in each history, -1 in a history that has none to steer: drawn
    with replacement, a pure function of `seed`, among its *repeat-state* steps, t >= 1 with steps t - 1 and t valid
    and o_t = o_{t-1} (every step after the first on a bandit; a wall bump or a no-op in a grid). There a tabular
    learner's delta_{t-1} updates Q(o_t, a_{t-1}) of the state the action is chosen in, so reading a larger
    delta_{t-1} must make a_{t-1} more likely at t (module docstring, 5)."""
    valid = np.asarray(episodes.valid, bool)
    obs = np.asarray(episodes.observations)
    H, T = valid.shape
    ok = np.zeros((H, T), bool)
    ok[:, 1:] = valid[:, 1:] & valid[:, :-1] & (obs[:, 1:] == obs[:, :-1]).reshape(H, T - 1, -1).all(-1)
    rng = np.random.default_rng([int(seed), 0x57EE2])
    out = np.full((H, int(per_history)), -1, np.int64)
    for h in range(H):
        t = np.flatnonzero(ok[h])
        if t.size:
            out[h] = rng.choice(t, out.shape[1])
    return out


def steered(run, pmap, base: np.ndarray, steps: np.ndarray, previous: np.ndarray, dtype) -> dict[str, np.ndarray]:
    """Per history [n] (those with steps: `steps` [H, K] >= 0) the mean over its K steered steps t of 'kl'
    KL(pi || pi_edit) at t and 'dp_previous' pi_edit(a_{t-1}) - pi(a_{t-1}) at t (`previous` [H, T] the actions
    a_{t-1}). Copy k steers step steps[h, k] of every history at its read position only, one pass: `run(edit_at)`
    returns the logits at the read positions under the edit applied where edit_at [N, P] is True."""
    has = steps[:, 0] >= 0
    where = np.full((pmap.n_histories, pmap.n_steps, 2), -1, np.int64)
    where[pmap.read_history, pmap.read_step] = np.stack([pmap.read_seq, pmap.read_pos], 1)
    h = np.flatnonzero(has)
    kl, dp = np.zeros((h.size, steps.shape[1])), np.zeros((h.size, steps.shape[1]))
    for k in range(steps.shape[1]):
        t = steps[h, k]
        edit_at = np.zeros(pmap.history.shape, bool)
        edit_at[where[h, t, 0], where[h, t, 1]] = True
        edited = to_steps(pmap, run(edit_at))
        kl[:, k], dp[:, k] = changes(base[h, t], edited[h, t], dtype, previous[h, t])
    return {"kl": kl.mean(1), "dp_previous": dp.mean(1)}


def sign_of(stats: list[dict]) -> str:
    """'as an RL learner' when at every scale s != 0 the selective steering moves pi(a_{t-1}) toward the side of s by
    more than random directions of its size move it either way (`rl_over_random`'s interval above 0), 'opposite'
    when at every scale it moves it to the other side by more (`against_rl_over_random` above 0), else
    'unresolved'. Random directions are the null of either sign (u and -u are equally likely draws), so the
    comparison is with their size |dp_previous|, not with their few draws' signed mean."""
    def above(st):
        return bool(st["ci"]) and st["ci"][0] > 0

    points = [p["dp_previous"] for p in stats if p["scale"] != 0]
    if points and all(above(p["rl_over_random"]) for p in points):
        return "as an RL learner"
    if points and all(above(p["against_rl_over_random"]) for p in points):
        return "opposite"
    return "unresolved"


def environment_of(episodes) -> tuple[str, dict, int, int]:
    """(env spec, its kwargs, the seed, the first history index not in the file) of histories `icrl-interp collect`
    wrote: what re-makes their environment on fresh tasks. Any other source (a Minari file, a file written by hand)
    is a one-line UserError."""
    meta = episodes.meta
    if meta.get("source") != "collect" or not isinstance(meta.get("env"), str):
        raise UserError(f"the closed loop needs the environment the histories came from, and this episodes file "
                        f"(source {meta.get('source', 'unknown')}) has none to re-make: give histories `icrl-interp "
                        "collect` wrote, or no --closed-loop-histories")
    ids = meta.get("histories") or [episodes.n_histories - 1]
    return meta["env"], dict(meta.get("env_kwargs") or {}), int(meta.get("seed", 0)), int(max(ids)) + 1


def history_returns(episodes) -> dict[str, np.ndarray]:
    """Per history [H]: 'first_episode' its first episode's return, 'last_quarter' the mean return of the last
    quarter of its own episodes (at least one; the last may be cut by the history's end) and 'improvement' their
    difference, the in-context improvement `train.ad.improvement` reports per goal."""
    index = np.where(episodes.valid, episodes.episode_index, -1)
    out = {k: np.zeros(episodes.n_histories) for k in ("first_episode", "last_quarter")}
    for h in range(episodes.n_histories):
        on = index[h] >= 0
        R = np.bincount(index[h][on], weights=episodes.rewards[h][on])
        out["first_episode"][h], out["last_quarter"][h] = R[0], R[len(R) - max(1, len(R) // 4):].mean()
    out["improvement"] = out["last_quarter"] - out["first_episode"]
    return out


def loop_read_positions(fmt, length: int) -> np.ndarray:
    """[length] bool: the read positions of the sequence of `length` positions a model in format `fmt` reads at one
    closed-loop step (`models.closed_loop.ModelPolicy`), whose last position is the current step's read position:
    every position in `ad-step` (each is a step's token), every third counted back from the last in `ad-element`
    (the observation tokens; the action and reward tokens between them are not read), the last alone in `dpt`
    (the query is not a read position once the context holds a transition; the context's transitions never are).
    These hold the tokens `read_mask` marks in an encoded history, where the recorded erasure (3) edits: with the
    default stride a window's every step is read, so every step token (AD) of the window is edited there too."""
    every = {"ad-step": 1, "ad-element": 3}.get(fmt.name, length)
    at = np.zeros(length, bool)
    at[length - 1::-every] = True
    return at


def at_read_positions(edit: Edit, fmt):
    """The hook function (`recording.capture.intervene`) that applies `edit` at the closed-loop read positions of
    each forward pass (`loop_read_positions`) of an activation [n, P, d], and leaves every other position as it is."""
    import torch

    def fn(t):
        if t.ndim != 3 or (fmt.name == "ad-element" and t.shape[1] % 3 != 1):
            raise UserError(f"the edited site has shape {tuple(t.shape)} in closed loop, expected [batch, positions, "
                            f"width] with the positions of the {fmt.name} sequence the model reads")
        m = torch.as_tensor(loop_read_positions(fmt, t.shape[1]), device=t.device)
        out = t.clone()
        out[:, m] = edit.apply(t[:, m])
        return out

    return fn


def closed_loop(model, fmt, point: str, arms: Mapping[str, list[Edit | None]], *, env: str, env_kwargs: dict,
                seed: int, histories, steps: int) -> dict[str, dict[str, np.ndarray]]:
    """Per arm name, the per-history `history_returns` [H] of `model` (reading token format `fmt`) acting in closed
    loop (`models.closed_loop.ModelPolicy` in `tasks.collect.collect`) on `histories` of `env` for `steps` steps,
    with each edit of the arm applied at `point` at the read positions of every forward pass (`at_read_positions`)
    while it acts, averaged over the arm's edits (None: unedited). Every run has the same `seed` and histories:
    the same tasks and the same uniforms for the action draws, so the arms are paired history by history. The
    edit's hook is removed in `finally` (`recording.capture.intervene`)."""
    from ..models.closed_loop import ModelPolicy
    from ..recording.capture import intervene
    from ..tasks.collect import collect

    out = {}
    for name, edits in arms.items():
        runs = []
        for edit in edits:
            def act():
                return collect(env, ModelPolicy(model, fmt), histories=histories, steps=steps, seed=seed,
                               env_kwargs=env_kwargs)
            if edit is None:
                runs.append(history_returns(act()))
            else:
                with intervene(model, point, at_read_positions(edit, fmt)):
                    runs.append(history_returns(act()))
        out[name] = {k: np.mean([r[k] for r in runs], 0) for k in runs[0]}
    return out


def _steering(run, pmap, base, episodes, dtype, scales, per_history, seed, n_boot, cov, units, random_units) -> dict:
    """The `steering` section: each scale s, each direction u (`units` by name, and the random ones) steered by
    x -> x + s sigma u at one step of each history at a time (`steered`); sigma the std of the selective
    projection on the training histories, so every steering vector has the same norm |s| sigma."""
    steps = steer_steps(episodes, per_history, seed)
    previous = np.zeros_like(episodes.actions)
    previous[:, 1:] = episodes.actions[:, :-1]
    sigma = float(np.sqrt(units["selective"] @ cov @ units["selective"]))
    std = lambda u: float(np.sqrt(max(float(u @ cov @ u), 0.0)))  # noqa: E731
    out = {"sigma": sigma, "sigma_input_explained": std(units["input_explained"]),
           "sigma_random": float(np.mean([std(u) for u in random_units])), "steps_per_history": int(per_history),
           "histories": int((steps[:, 0] >= 0).sum()), "points": [], "sign": "unresolved"}
    if out["histories"] == 0:
        return {**out, "note": "no held-out history has a step whose state repeats the previous one: nothing to steer"}
    idx = resamples(out["histories"], n_boot, seed)
    for s in scales:
        def at(u):
            return steered(lambda m: run(s * sigma * u, m), pmap, base, steps, previous, dtype)

        sel, inp, rand = at(units["selective"]), at(units["input_explained"]), [at(u) for u in random_units]
        point = {"scale": s}
        for k in sel:
            rk = np.stack([r[k] for r in rand], 1)
            point[k] = {"selective": bootstrap(sel[k], idx), "input_explained": bootstrap(inp[k], idx),
                        "random": bootstrap(rk.mean(1), idx), "minus_input_explained": bootstrap(sel[k] - inp[k], idx)}
        rand_kl = np.stack([r["kl"] for r in rand], 1)
        point["kl"]["excess_over_random"] = bootstrap(excess(sel["kl"], rand_kl), idx)
        size = np.abs(np.stack([r["dp_previous"] for r in rand], 1))  # the null's size, either sign
        toward = np.sign(s) * sel["dp_previous"]
        point["dp_previous"].update(random_abs=bootstrap(size.mean(1), idx),
                                    rl_over_random=bootstrap(excess(toward, size), idx),
                                    against_rl_over_random=bootstrap(excess(-toward, size), idx))
        out["points"].append(point)
    out["sign"] = sign_of(out["points"])
    return out


def causal_episodes(model, episodes, fmt, targets: Mapping[str, np.ndarray], *, layer: int, target: str = "delta",
                    hook: str = "hook_resid_post", draws: int = DRAWS, seed: int = 0, split_seed: int = 0,
                    test_fraction: float = episode_probes.TEST_FRACTION, n_boot: int = 1000,
                    batch_size: int = 256, random_model=None, steer=DEFAULT_STEER, steer_steps: int = STEER_STEPS,
                    closed_loop_histories: int = 0) -> dict:
    """The causal test of `target` (a key of `targets`, {name: [H, T]}, e.g. `episode_probes.replay_targets`) at
    `blocks.{layer}.{hook}` of `model` reading `episodes` in token format `fmt` (`TokenFormat`). Split by history
    with `split_seed` (as `episode_probes.probe_episodes`); random directions and bootstrap resamples are pure
    functions of `seed`. `random_model` (the random-init model, same architecture): its activations at the site are
    the probes' random-init baseline, which the selectivity criterion must beat too. Returns the JSON (schema
    SCHEMA) with `conclusion` 'yes' / 'no' / 'inconclusive', `reason` and `conclusion_detail` (conclusion.decide).
    `steer` (scales s; empty: none) and `steer_steps`: the steering of the module docstring (5), in `steering`;
    `closed_loop_histories` N > 0: the closed-loop return under the erasures (6), in `closed_loop` (None: not run).
    Holds the site's activations at the read positions [H, T, d] in memory (one layer)."""
    import torch

    if target not in targets:
        raise UserError(f"causal target {target!r} is not among the targets ({', '.join(targets)})")
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 2:
        raise UserError(f"the random control needs at least 2 draws, got {draws!r}")
    scales = [float(x) for x in (steer or ())]
    if not all(np.isfinite(scales)):
        raise UserError(f"steering scales must be finite, got {steer!r}")
    steer_steps = count("steered steps per history", steer_steps)
    n_loop = count("--closed-loop-histories", closed_loop_histories, minimum=0)
    if n_loop:  # refused before any work: a file with no environment to re-make
        env, env_kwargs, env_seed, first = environment_of(episodes)
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
    out = {"schema": SCHEMA, "site": point, "target": target, "layer": int(layer), "token_format": fmt.to_dict(),
           "probe": probes.json["layers"][str(layer)], "split": split.to_json(), "effect": EFFECT,
           "chosen_action": "the model's greedy action under its unedited policy"}
    if dirs["selective"] is None or dirs["input"] is None:
        st = {"mean": None, "ci": None}
        ans, reason, detail = conclusion.decide(conclusion.criteria(sel_stat, st, 0.0, st), test.size, test_fraction,
                                                "inconclusive: the selective or input-explained probe found nothing "
                                                "to read (all its coefficients are 0)", **UNIT)
        return {**out, "steering": None, "closed_loop": None, "conclusion": ans, "reason": reason,
                "conclusion_detail": detail}
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
                  "minus_input_explained": boot(s[k] - i[k]),
                  "against_input": boot(conclusion.against_input(s[k], i[k]))}
    largest = max(float(np.max([s[EFFECT], i[EFFECT], *(e[EFFECT] for e in r)], initial=0.0)), 0.0)
    note = None
    if largest <= 0.0:
        note = (f"inconclusive: no edit at {point} (selective, input-explained or random direction) changes the action "
                "distribution: nothing downstream reads these positions")
    elif X.shape[-1] == 1:
        note = ("inconclusive: the site has one feature, so the selective, input-explained and random directions are "
                "the same direction and cannot be told apart")
    steering = None
    if scales:
        steering = _steering(lambda v, m: run_model(model, tok_t, point, at_t, edit=Edit(v=v), edit_at=m,
                                                    batch_size=batch_size)[0],
                             pmap_t, base_t, sub, dtype, scales, steer_steps, seed, n_boot, cov_x,
                             {"selective": dirs["selective"].u, "input_explained": dirs["input"].u},
                             [np.asarray(r.c) for r in rand_edits])
    loop = None
    if n_loop:
        ids = list(range(first, first + n_loop))
        got = closed_loop(model, fmt, point, {"unedited": [None], "selective": [sel_edit], "random": rand_edits},
                          env=env, env_kwargs=env_kwargs, seed=env_seed, histories=ids, steps=episodes.n_steps)
        idx_loop = resamples(n_loop, n_boot, seed)
        b = lambda a: bootstrap(a, idx_loop)  # noqa: E731
        loop = {"env": env, "env_kwargs": env_kwargs, "seed": env_seed, "histories": [first, first + n_loop],
                "steps": int(episodes.n_steps), "random_draws": len(rand_edits),
                "arms": {arm: {k: b(v) for k, v in m.items()} for arm, m in got.items()}}
        for x, y in (("selective", "unedited"), ("random", "unedited"), ("selective", "random")):
            loop[f"{x}_minus_{y}"] = {k: b(got[x][k] - got[y][k]) for k in got[x]}
    e = per[EFFECT]
    crit = conclusion.criteria(sel_stat, e["excess_over_random"], e["random"]["mean"], e["against_input"])
    ans, reason, detail = conclusion.decide(crit, test.size, test_fraction, note, **UNIT)
    out.update({
        "selectivity": sel_stat, "effects": per,
        "erased_variance": {"selective": size, "input_explained": erased_variance(cov_x, in_edit),
                            "input_explained_full": erased_variance(cov_x, full_in), "input_explained_shrink": shrink,
                            "random": float(np.mean([erased_variance(cov_x, e) for e in rand_edits]))},
        "cosine_selective_input": float(dirs["selective"].u @ dirs["input"].u),
        "histories": {"train": int(split.train.size), "test": int(test.size)}, "draws": int(draws), "seed": int(seed),
        "steering": steering, "closed_loop": loop, "conclusion": ans, "reason": reason, "conclusion_detail": detail})
    return out
