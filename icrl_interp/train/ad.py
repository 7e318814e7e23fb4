"""Algorithm Distillation (Laskin et al. 2022) on Dark Room, small enough for a CPU: learning histories of a
Q-learning source (`tasks.collect`) on training goals, an `ADTransformer` trained by cross-entropy on the
source's next action over windows of those histories (`ad-step` tokens), and the closed-loop test of
in-context improvement on held-out goals: the model acts in fresh rooms for its context's length, with its
own history as context (`rollout`), and its mean return over the last quarter of the context is compared
with its first episode's, with a 95 % interval over the held-out goals, beside the source agent's curve on
the same goals (`evaluate`). docs/episodes.md, "The shipped AD model", gives the numbers of `data/ad/`.

`python -m icrl_interp.train.ad --out DIR` trains and evaluates the default config (`ADTrainConfig`) and
saves the model with its config, seed and measured numbers in DIR (`models.ad_transformer.save`).
"""
from __future__ import annotations

import argparse
import math
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from ..core import threads
from ..core.errors import UserError
from ..models import episode_tokens as et
from ..models.ad_transformer import ADConfig, ADTransformer
from ..tasks.episodes import Episodes

ENV_ID = "icrl_interp/DarkRoom-v0"


@dataclass(frozen=True)
class ADTrainConfig:
    """The room, the source agent, the split of goals, the model and its training."""

    size: int = 5
    """Dark Room side (the goal is one of size² cells)."""
    horizon: int = 10
    """Steps per episode."""
    episodes: int = 12
    """Episodes per learning history; the model's context is the whole history (episodes x horizon steps)."""
    alpha: float = 0.5
    gamma: float = 0.9
    beta: float = 10.0
    """The Q-learning source: step size, discount, inverse temperature of its softmax policy."""
    held_out: int = 8
    """Goals kept out of training (drawn by split_seed); the closed-loop test runs on them."""
    split_seed: int = 0
    histories_per_goal: int = 60
    """Source learning histories per training goal (different seeds)."""
    d_model: int = 48
    n_layers: int = 2
    n_heads: int = 4
    d_mlp: int = 128
    steps: int = 3000
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.01
    seed: int = 0
    relabel: bool = True
    """Show each training window with its observations relabelled by a random permutation of the cells
    (`relabel`): the model cannot learn where the training goals are, only how to find a goal and return
    to it within its context, which is what a held-out goal asks (without it, the model learned the
    training goals' places and did not improve on held-out ones: docs/episodes.md)."""
    rollouts_per_goal: int = 32
    """Closed-loop runs per held-out goal (and source runs, for its curve)."""

    @property
    def context(self) -> int:
        return self.episodes * self.horizon

    def to_dict(self) -> dict:
        return asdict(self)


def goal_split(cfg: ADTrainConfig) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(training goals, held-out goals) as (x, y) cells. The held-out ones are drawn by `split_seed` among the
    cells other than the start (a goal there is found by staying) with no two side by side, so that each is
    surrounded by training goals: a held-out goal tests finding and returning to a cell never rewarded in
    training, not reaching a corner of the room no training goal was ever in."""
    cells = [(x, y) for y in range(cfg.size) for x in range(cfg.size)]
    start = (cfg.size // 2, cfg.size // 2)
    held: list[tuple[int, int]] = []
    for i in np.random.default_rng(cfg.split_seed).permutation(len(cells)):
        x, y = cells[i]
        if (x, y) != start and all(abs(x - a) + abs(y - b) > 1 for a, b in held) and len(held) < cfg.held_out:
            held.append((x, y))
    if len(held) < cfg.held_out or cfg.held_out < 1:
        raise UserError(f"held_out must be in [1, {len(held)}] for a {cfg.size}x{cfg.size} room, got {cfg.held_out}")
    return [c for c in cells if c not in held], sorted(held)


def source_histories(cfg: ADTrainConfig, goals, per_goal: int, seed: int) -> Episodes:
    """Learning histories of the Q-learning source (`tasks.collect`): `per_goal` per goal, each `cfg.episodes`
    episodes; goal i's histories are collect's histories i * per_goal ... (i + 1) * per_goal - 1 of `seed`."""
    from ..tasks.collect import collect

    parts = [collect(ENV_ID, "q-learning", histories=range(i * per_goal, (i + 1) * per_goal), steps=cfg.context,
                     seed=seed, env_kwargs={"size": cfg.size, "horizon": cfg.horizon, "goal": list(g)},
                     alpha=cfg.alpha, gamma=cfg.gamma, beta=cfg.beta) for i, g in enumerate(goals)]
    return concatenate(parts)


def concatenate(parts: list[Episodes]) -> Episodes:
    """The histories of several `Episodes` of one grid length, in order (meta: the first's, with every
    part's `tasks` and `histories`)."""
    from ..tasks.episodes import ARRAYS

    meta = dict(parts[0].meta)
    for key in ("tasks", "histories"):
        meta[key] = [x for p in parts for x in p.meta.get(key, [None] * p.n_histories)]
    return Episodes(**{name: np.concatenate([getattr(p, name) for p in parts]) for name in ARRAYS},
                    n_actions=parts[0].n_actions, n_observations=parts[0].n_observations, meta=meta)


def model_config(cfg: ADTrainConfig, n_observations: int, n_actions: int) -> ADConfig:
    fmt = et.TokenFormat("ad-step", n_observations, n_actions, cfg.context)
    return ADConfig(fmt.to_dict(), d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads, d_mlp=cfg.d_mlp)


def training_windows(episodes: Episodes, fmt: et.TokenFormat) -> tuple[np.ndarray, np.ndarray]:
    """(tokens [N, K, d], targets [N, K]: the action at each position, -1 on padding) of every window."""
    tokens, pmap = et.encode(episodes, fmt)
    on = pmap.history >= 0
    targets = np.full(pmap.history.shape, -1, dtype=np.int64)
    targets[on] = episodes.actions[pmap.history[on], pmap.step[on]]
    return tokens, targets


def relabel(tokens: torch.Tensor, fmt: et.TokenFormat, rng: np.random.Generator) -> torch.Tensor:
    """`ad-step` tokens [B, K, d] with each sequence's observation columns permuted by its own random
    permutation (one relabelling of the cells per sequence, the same at every step of it)."""
    cols = fmt.columns["obs"]
    perm = torch.from_numpy(np.argsort(rng.random((tokens.shape[0], fmt.obs_width)), axis=1))
    out = tokens.clone()
    out[..., cols] = torch.gather(tokens[..., cols], 2, perm[:, None, :].expand(-1, tokens.shape[1], -1))
    return out


def train_model(cfg: ADTrainConfig, episodes: Episodes, progress: bool = False) -> tuple[ADTransformer, dict]:
    """The AD model trained on `episodes` by cross-entropy on the source's next action; (model, log)."""
    # One torch thread unless ICRL_INTERP_THREADS says otherwise: a model this small gains nothing from
    # intra-op threads, and on a loaded 2-core machine two threads made each step 10x slower (measured).
    before = torch.get_num_threads()
    torch.set_num_threads(threads.override() or 1)
    try:
        return _train(cfg, episodes, progress)
    finally:
        torch.set_num_threads(before)


def _train(cfg: ADTrainConfig, episodes: Episodes, progress: bool) -> tuple[ADTransformer, dict]:
    torch.manual_seed(cfg.seed)
    model = ADTransformer(model_config(cfg, episodes.n_observations, episodes.n_actions))
    tokens, targets = training_windows(episodes, model.token_format)
    tokens, targets = torch.from_numpy(tokens), torch.from_numpy(targets)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=cfg.steps, pct_start=0.1)
    rng = np.random.default_rng(cfg.seed)
    t0, losses = time.perf_counter(), []
    model.train()
    for step in range(cfg.steps):
        idx = torch.from_numpy(rng.integers(0, len(tokens), cfg.batch_size))
        batch = relabel(tokens[idx], model.token_format, rng) if cfg.relabel else tokens[idx]
        logits = model(batch)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets[idx].reshape(-1),
                                                 ignore_index=-1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if progress and (step + 1) % 250 == 0:
            print(f"step {step + 1}: loss {np.mean(losses[-250:]):.4f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    model.eval()
    model.origin = {"kind": "trained", "trainer": "icrl_interp.train.ad"}
    return model, {"seconds": time.perf_counter() - t0, "final_loss": float(np.mean(losses[-100:])),
                   "windows": int(len(tokens))}


def rollout(model: ADTransformer, env_kwargs: dict, histories, steps: int, seed: int, greedy: bool = False,
            env: str = ENV_ID) -> Episodes:
    """The model acting in closed loop in fresh environments (`env` made with `env_kwargs`; `histories` a count
    or indices, seeded per history as `tasks.collect.collect` seeds them) for `steps` steps: at each step it
    reads its own history so far (`ad-step` tokens, the last `context` steps) and its action is drawn from
    softmax(logits) (argmax when `greedy`). The one closed loop of the package: `collect` with the model as
    its agent (`models.closed_loop.ModelPolicy`), as `icrl-interp collect --model` runs it."""
    from ..models.closed_loop import ModelPolicy
    from ..tasks.collect import collect

    return collect(env, ModelPolicy(model, greedy=greedy), histories=histories, steps=steps, seed=seed,
                   env_kwargs=env_kwargs)


def episode_returns(episodes: Episodes) -> np.ndarray:
    """[H, E] return of each episode of each history (E: the most episodes any history has; NaN past a
    history's last episode)."""
    index = np.where(episodes.valid, episodes.episode_index, -1)
    E = int(index.max()) + 1
    out = np.full((episodes.n_histories, E), np.nan)
    for e in range(E):
        on = index == e
        out[:, e] = np.where(on.any(1), (episodes.rewards * on).sum(1), np.nan)
    return out


def improvement(returns: np.ndarray, goal_of: np.ndarray) -> dict:
    """In-context improvement from per-run episode returns [R, E] and each run's goal [R]: per goal, the mean
    over its runs of (mean return of the last quarter of the episodes - the first episode's); the mean over
    goals with a 95 % Student-t interval over goals (the goals are the units: runs of one goal are not
    independent evidence of generalization)."""
    from scipy.special import stdtrit  # scipy.stats takes seconds to import

    E = returns.shape[1]
    last = returns[:, E - max(1, E // 4):].mean(1)
    goals = np.unique(goal_of)
    per_goal = np.array([(last - returns[:, 0])[goal_of == g].mean() for g in goals])
    G = len(goals)
    mean = float(per_goal.mean())
    half = float(stdtrit(G - 1, 0.975) * per_goal.std(ddof=1) / math.sqrt(G)) if G > 1 else float("nan")
    return {"first_episode": float(returns[:, 0].mean()), "last_quarter": float(last.mean()),
            "difference": mean, "ci95": [mean - half, mean + half], "goals": G, "runs": int(len(returns)),
            "per_goal": [float(v) for v in per_goal], "curve": [float(v) for v in np.nanmean(returns, 0)]}


def evaluate(model: ADTransformer, cfg: ADTrainConfig, goals, seed: int = 1) -> dict:
    """The closed-loop test on `goals` (`cfg.rollouts_per_goal` runs each): the model's improvement within its
    context, and the Q-learning source's on the same goals, for the same number of episodes."""
    goal_of = np.repeat(np.arange(len(goals)), cfg.rollouts_per_goal)
    t0 = time.perf_counter()
    R = cfg.rollouts_per_goal
    runs = concatenate([rollout(model, {"size": cfg.size, "horizon": cfg.horizon, "goal": list(g)},
                                range(i * R, (i + 1) * R), cfg.context, seed) for i, g in enumerate(goals)])
    seconds = time.perf_counter() - t0
    source = source_histories(cfg, goals, cfg.rollouts_per_goal, seed + 1)
    return {"goals": [list(g) for g in goals], "model": improvement(episode_returns(runs), goal_of),
            "source": improvement(episode_returns(source), goal_of), "rollout_seconds": seconds}


def main(argv=None) -> int:
    from ..models.ad_transformer import save
    from ..models.checkpoint import sha256

    p = argparse.ArgumentParser(description="Train and evaluate the AD model on Dark Room (docs/episodes.md).")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=ADTrainConfig.steps)
    p.add_argument("--histories-per-goal", type=int, default=ADTrainConfig.histories_per_goal)
    p.add_argument("--seed", type=int, default=ADTrainConfig.seed)
    a = p.parse_args(argv)
    cfg = ADTrainConfig(steps=a.steps, histories_per_goal=a.histories_per_goal, seed=a.seed)
    train_goals, test_goals = goal_split(cfg)
    t0 = time.perf_counter()
    data = source_histories(cfg, train_goals, cfg.histories_per_goal, cfg.seed)
    collect_s = time.perf_counter() - t0
    model, log = train_model(cfg, data, progress=True)
    result = evaluate(model, cfg, test_goals, seed=cfg.seed + 1)
    log["collect_seconds"] = collect_s
    print({k: {kk: vv for kk, vv in v.items() if kk not in ("per_goal", "curve")} if isinstance(v, dict) else v
           for k, v in result.items() if k != "goals"})
    save(model, a.out, {"training": {"config": cfg.to_dict(), **log, "train_goals": [list(g) for g in train_goals]},
                        "evaluation": result, "seed": cfg.seed})
    print(f"saved {a.out} (sha256 {sha256(a.out)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
