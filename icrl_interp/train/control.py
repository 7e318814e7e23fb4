"""In-context control (Liang & Lai, paper (b), Algorithm 1) and its evaluation on held-out random MDPs.

Closed loop, vectorized over MDPs (axis 0): starting from parameters 0, repeat `iterations`
times: sample n steps of the current policy (epsilon-greedy on w . phi for SARSA, pi_lam for
actor-critic), build the prompt, set the parameters to the update (the transformer's output,
or the reference algorithm's for the analytic teacher), continue from the last state.
After every update the *exact* discounted return of the current policy from the MDP's start
distribution is computed from (P, R, pi) (`envs.MDPBatch.discounted_return`), never sampled.

Baselines: the uniform random policy and the optimal policy (value iteration). Teacher
tracking is measured along the transformer's own loop: at each update the teacher's step on
the very same prompt is computed, and we report the share of states where the transformer's
greedy action is one of the teacher's greedy actions, and ||theta_tf - theta_teacher|| / ||theta_teacher||.
The teacher and transformer loops draw from the same random stream, so a model that tracks the
teacher exactly (theta*) reproduces the teacher's trajectory.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from jaxtyping import Float, Int

from ..core import files
from ..core.errors import check
from ..core.outputs import check_fits
from ..families import registry
from ..tasks import envs

Array = np.ndarray
REWARDS = ("uniform", "normal")
FEATURE_STREAM = 2
"""Held-out MDPs' random feature maps come from numpy.random.default_rng([seed, FEATURE_STREAM])."""


@dataclass
class ControlConfig:
    """How the closed loop is evaluated (the MDP shape and discount come from the checkpoint)."""

    mdps: int = 100
    """Held-out random MDPs (the batch axis)."""
    iterations: int = 1000
    """t: closed-loop updates per MDP (each consumes n environment steps)."""
    n: int | None = None
    """Context length (steps per update); None = the checkpoint's n (64 if it has none)."""
    epsilon: float = 0.1
    """SARSA exploration: epsilon-greedy on w . phi (actor-critic acts with pi_lam)."""
    seed: int = field(default=0, metadata={"flag": "--prompt-seed"})
    """Seeds the MDP draw and the (shared) sampling stream of the teacher and transformer loops."""
    rewards: str = field(default="uniform", metadata={"choices": REWARDS})
    """'uniform': R(s, a) ~ U(-1, 1) (envs.sample_tabular_mdps, the training distribution); 'normal': N(0, 1)."""
    concentration: float = 1.0
    """Dirichlet concentration of the transition rows."""

    def validate(self) -> "ControlConfig":
        for name in ("mdps", "iterations"):
            value = getattr(self, name)
            check(not isinstance(value, bool) and isinstance(value, (int, np.integer)) and value >= 1,
                  f"{name} must be a positive integer, got {value!r}")
        check(self.n is None or (isinstance(self.n, (int, np.integer)) and self.n >= 1),
              f"n must be a positive integer, got {self.n!r}")
        check(0.0 <= self.epsilon <= 1.0, f"epsilon must lie in [0, 1], got {self.epsilon}")
        check(self.rewards in REWARDS, f"unknown reward distribution {self.rewards!r} (use {', '.join(REWARDS)})")
        check(self.concentration > 0, f"concentration must be positive, got {self.concentration}")
        return self


# -------------------------------------------------------------- algorithms
def control_families() -> list[str]:
    """Families with an in-context control rule (registry.Family.control)."""
    return registry.where(lambda f: f.control is not None)


def algorithm_for(config, epsilon: float = 0.1):
    """The control rule a checkpoint config mimics (its family's `control`, e.g. SARSA's or actor-critic's):
    MDP shape, gamma, steps, and how parameters act and update."""
    family = registry.get(config.family)
    check(family.control is not None, f"in-context control needs a checkpoint of a control family "
                                      f"({', '.join(control_families())}), got family {config.family!r}")
    return family.control(config, epsilon)


# ------------------------------------------------------------------ MDPs
def draw_mdps(cfg: ControlConfig, algo) -> envs.MDPBatch:
    """The held-out MDPs (stream 0 of the seed): Dirichlet rows, uniform or normal rewards, uniform start;
    with a random feature map (the rule's `draw_features`), one fresh map per MDP from stream 2 of the seed,
    so the MDPs themselves are the same for every feature map."""
    rng = np.random.default_rng([cfg.seed, 0])
    mdp = envs.sample_tabular_mdps(cfg.mdps, algo.n_states, algo.n_actions, algo.gamma, rng, cfg.concentration)
    if cfg.rewards == "normal":
        mdp = envs.MDPBatch(P=mdp.P, R=rng.standard_normal(mdp.R.shape), start=mdp.start, gamma=mdp.gamma)
    draw = getattr(algo, "draw_features", None)
    phi = None if draw is None else draw(cfg.mdps, np.random.default_rng([cfg.seed, FEATURE_STREAM]))
    return mdp if phi is None else mdp.with_features(phi)


# ------------------------------------------------------------ closed loop
@dataclass
class LoopTrace:
    """One agent's closed loop on every MDP."""

    returns: Float[Array, "batch iters_plus_one"]
    """Exact discounted return of the acting policy after each update (index 0: before any)."""
    greedy_returns: Float[Array, " batch"]
    """Exact return of the greedy policy of the final parameters."""
    params: Float[Array, "batch p"]
    """Final parameters."""
    agreement: Float[Array, "batch iters"] | None = None
    """Share of states where the agent's greedy action is a greedy action of the teacher's step on the same prompt."""
    rel_distance: Float[Array, "batch iters"] | None = None
    """||theta_agent - theta_teacher|| / ||theta_teacher|| at each update (same prompt)."""
    diverged_at: Int[Array, " batch"] | None = None
    """Update at which the agent's output first had NaN/Inf (-1: never); from then on its parameters are
    frozen at their last finite value and its tracking entries are NaN."""


def closed_loop(mdp: envs.MDPBatch, algo, n: int, iterations: int, rng: np.random.Generator,
                step=None, progress: bool = False, desc: str = "teacher") -> LoopTrace:
    """Algorithm 1 on every MDP at once. `step(z) -> params` is the transformer; None runs the teacher."""
    from tqdm import tqdm

    algo = algo.bind(mdp) if hasattr(algo, "bind") else algo  # random feature maps: act on the MDPs' own features
    B = mdp.batch
    params = np.zeros((B, algo.size))
    s = envs.sample_categorical(mdp.start, rng)
    returns = np.empty((B, iterations + 1))
    returns[:, 0] = mdp.discounted_return(algo.policy(params))
    track = step is not None
    agreement = np.empty((B, iterations)) if track else None
    dist = np.empty((B, iterations)) if track else None
    diverged_at = np.full(B, -1)
    rows = np.arange(B)[:, None]
    for t in tqdm(range(iterations), desc=desc, disable=not progress, leave=False):
        traj = mdp.sample(algo.policy(params), n, rng, start_states=s)
        z, teacher = algo.prompt_and_teacher(mdp, traj, params)
        if track:
            new = np.asarray(step(z), dtype=np.float64)
            bad = ~np.all(np.isfinite(new), axis=-1)
            diverged_at[bad & (diverged_at < 0)] = t + 1
            frozen = diverged_at >= 0
            new[frozen] = params[frozen]  # a diverged MDP keeps its last finite parameters
            agreement[:, t] = algo.greedy_sets(teacher)[rows, np.arange(algo.n_states), algo.greedy(new)].mean(-1)
            norm = np.linalg.norm(teacher, axis=-1)
            dist[:, t] = np.linalg.norm(new - teacher, axis=-1) / np.where(norm > 0, norm, 1.0)
            agreement[frozen, t] = dist[frozen, t] = np.nan
            params = new
        else:
            params = teacher
        s = traj.states[:, -1]
        returns[:, t + 1] = mdp.discounted_return(algo.policy(params))
    greedy = envs.epsilon_greedy(algo.action_values(params), 0.0)
    return LoopTrace(returns, mdp.discounted_return(greedy), params, agreement, dist, diverged_at if track else None)


def model_step(model, algo):
    """z -> the model's parameter output (the rule's readout, e.g. [w] or [w; lam]) as float64."""
    import torch

    def step(z: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            out = model(model.as_input(z))
            params = algo.readout(out, model.layout)
        return params.double().cpu().numpy()

    return step


# -------------------------------------------------------------- evaluation
def _stats(x: np.ndarray) -> dict:
    """Mean and std over MDPs, ignoring NaN (diverged); None when every entry is NaN."""
    x = np.asarray(x, dtype=np.float64)
    if np.all(np.isnan(x)):
        return {"mean": None, "std": None}
    return {"mean": float(np.nanmean(x)), "std": float(np.nanstd(x))}


def _nan_extreme(x: np.ndarray, fn) -> float | None:
    return None if np.all(np.isnan(x)) else float(fn(x))


def evaluate(model, config, cfg: ControlConfig, progress: bool = True, source: str | None = None) -> dict:
    """Returns of random / teacher / transformer / oracle at the last update, tracking, and curves (JSON-ready)."""
    cfg.validate()
    algo = algorithm_for(config, cfg.epsilon)
    n = cfg.n or int(config.task.n or 64)
    mdp = draw_mdps(cfg, algo)
    uniform = np.full(mdp.R.shape, 1.0 / algo.n_actions)
    random_ret = mdp.discounted_return(uniform)
    _, _, oracle_ret = mdp.optimal()
    teacher = closed_loop(mdp, algo, n, cfg.iterations, np.random.default_rng([cfg.seed, 1]), None, progress, "teacher")
    tf = closed_loop(mdp, algo, n, cfg.iterations, np.random.default_rng([cfg.seed, 1]), model_step(model, algo),
                     progress, "transformer")
    origin = config.origin
    return {
        "schema": "icrl_interp.control/1",
        "checkpoint": source,
        "family": algo.family,
        "origin": origin.get("kind", "unknown"),
        "settings": {**asdict(cfg), "n": n, "n_states": algo.n_states, "n_actions": algo.n_actions, "gamma": algo.gamma,
                     "alpha": algo.alpha, "beta": algo.beta},
        "returns": {"random": _stats(random_ret), "teacher": _stats(teacher.returns[:, -1]),
                    "transformer": _stats(tf.returns[:, -1]), "oracle": _stats(oracle_ret)},
        "greedy_returns": {"teacher": _stats(teacher.greedy_returns), "transformer": _stats(tf.greedy_returns)},
        # paired over MDPs: both loops share the MDP and the random stream
        "transformer_minus_teacher": _stats(tf.returns[:, -1] - teacher.returns[:, -1]),
        "divergence": {"mdps": int(np.sum(tf.diverged_at >= 0)), "updates": tf.diverged_at.tolist(),
                       "note": "updates: first update with NaN/Inf output per MDP (-1 never); parameters then stay frozen"},
        "per_mdp": {"random": random_ret.tolist(), "teacher": teacher.returns[:, -1].tolist(),
                    "transformer": tf.returns[:, -1].tolist(), "oracle": oracle_ret.tolist()},
        "tracking": {
            "greedy_agreement": _stats(_nan_mean_rows(tf.agreement)),
            "greedy_agreement_min": _nan_extreme(tf.agreement, np.nanmin),
            "rel_param_distance": _stats(_nan_mean_rows(tf.rel_distance)),
            "rel_param_distance_max": _nan_extreme(tf.rel_distance, np.nanmax),
            "final_param_distance": float(np.mean(np.linalg.norm(tf.params - teacher.params, axis=-1)
                                                  / np.maximum(np.linalg.norm(teacher.params, axis=-1), 1e-300))),
        },
        "curves": {
            "iteration": list(range(cfg.iterations + 1)),
            "teacher": {"mean": teacher.returns.mean(0).tolist(), "std": teacher.returns.std(0).tolist()},
            "transformer": {"mean": tf.returns.mean(0).tolist(), "std": tf.returns.std(0).tolist()},
            "random": _stats(random_ret),
            "oracle": _stats(oracle_ret),
        },
    }


def _nan_mean_rows(x: np.ndarray) -> np.ndarray:
    """Per-MDP mean over updates, ignoring the NaN entries after a divergence."""
    counts = np.sum(~np.isnan(x), -1)
    return np.where(counts > 0, np.nansum(x, -1) / np.maximum(counts, 1), np.nan)


@contextmanager
def torch_threads(n: int | None):
    """Limit torch's intra-op threads to n inside the block (None: leave them); restored after.
    The loop's forward passes are tiny ([MDPs, n+1, D]), and on a busy machine thread hand-offs
    cost more than they save: 20 MDPs x 200 updates took 1.1 s on one thread, 2.5-11 s on two."""
    if n is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def check_size(cfg: ControlConfig, config, algo) -> None:
    """Refuse --mdps / --iterations / --n whose closed loops do not fit in memory (before any work)."""
    S, A, D = algo.n_states, algo.n_actions, config.model.D
    sizes = {"mdps": cfg.mdps, "iterations": cfg.iterations, "n": cfg.n or int(config.task.n or 64)}

    def estimate(v: dict) -> int:
        B, T, n = v["mdps"], v["iterations"], v["n"]
        curves = 2 * 8 * B * (T + 1) + 2 * 8 * B * T + 4 * 32 * (T + 1)  # returns, tracking, curve lists
        prompts = B * (n + 1) * (4 * 8 + 4 * 8 * D)  # trajectories; the prompt and the model's activations
        mdps = 4 * 8 * B * S * A * S  # P, its cumulative sum, value-iteration temporaries
        return curves + prompts + mdps

    check_fits(estimate, sizes, {"mdps": "--mdps", "iterations": "--iterations", "n": "--n"}, "the closed loops")


def run_checkpoint(path, cfg: ControlConfig, progress: bool = True, threads: int | None = None, device="cpu") -> dict:
    """Load a checkpoint of a control family and evaluate it in closed loop (`threads`: see torch_threads;
    `device`: where the model's forward passes run, `icrl_interp.core.devices`; the environments stay numpy)."""
    from ..core import devices
    from ..models import checkpoint

    config, _ = checkpoint.read(path)
    check(registry.get(config.family).control is not None,
          f"{path} is a {config.family} checkpoint; in-context control needs one of {', '.join(control_families())}")
    cfg.validate()
    check_size(cfg, config, algorithm_for(config, cfg.epsilon))  # refuse an unusable config before loading torch
    target = devices.resolve(device)
    model = checkpoint.load(path).to(target)
    with torch_threads(threads):
        return evaluate(model, config, cfg, progress, str(path))


# ----------------------------------------------------------------- output
ROWS = (("random", "random policy"), ("teacher", "analytic teacher"), ("transformer", "transformer"),
        ("oracle", "oracle (value iteration)"))


def format_table(result: dict) -> str:
    """Plain-text table: returns (mean +- std over MDPs) and teacher tracking."""
    s = result["settings"]
    head = (f"{result['family']} ({result['origin']}), {s['mdps']} MDPs, n_S={s['n_states']}, n_A={s['n_actions']}, "
            f"gamma={s['gamma']}, t={s['iterations']} updates of n={s['n']} steps, rewards {s['rewards']}")
    lines = [head, f"{'policy':<26}{'return (mean +- std)':>24}"]
    for key, label in ROWS:
        r = result["returns"][key]
        lines.append(f"{label:<26}{r['mean']:>14.4f} +- {r['std']:.4f}")
    diff = result["transformer_minus_teacher"]
    lines.append(f"{'transformer - teacher':<26}{diff['mean']:>14.4f} +- {diff['std']:.4f}")
    tr = result["tracking"]
    if tr["greedy_agreement"]["mean"] is not None:
        lines.append(f"{'greedy-action agreement':<26}{100 * tr['greedy_agreement']['mean']:>13.2f}% "
                     f"(min {100 * tr['greedy_agreement_min']:.1f}%)")
        lines.append(f"{'rel. parameter distance':<26}{tr['rel_param_distance']['mean']:>14.2e} "
                     f"(max {tr['rel_param_distance_max']:.2e})")
    div = result["divergence"]
    if div["mdps"]:
        first = min(u for u in div["updates"] if u >= 0)
        lines.append(f"{'diverged (NaN/Inf output)':<26}{div['mdps']:>7d} of {s['mdps']} MDPs, first at update {first}; "
                     "their parameters stay frozen at the last finite value")
    return "\n".join(lines)


def write_json(result: dict, path) -> Path:
    """Write the result atomically (temporary sibling, fsync, rename)."""
    return files.write_json(path, result)


def plot_returns(results: list[dict], path, labels: list[str] | None = None) -> Path:
    """Return vs update: random, oracle (flat), teacher and transformer (mean +- std band) per result."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    cols = min(2, len(results))
    rows = -(-len(results) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4 * rows), squeeze=False)
    for ax in axes.ravel()[len(results):]:
        ax.set_visible(False)
    for ax, res, label in zip(axes.ravel(), results, labels or [None] * len(results)):
        c = res["curves"]
        it = np.asarray(c["iteration"])
        for key, color in (("teacher", "tab:blue"), ("transformer", "tab:orange")):
            mean, std = np.asarray(c[key]["mean"]), np.asarray(c[key]["std"])
            ax.plot(it, mean, color=color, lw=1.5, ls="-" if key == "teacher" else "--", label=key)
            ax.fill_between(it, mean - std, mean + std, color=color, alpha=0.12)
        for key, color in (("oracle", "tab:green"), ("random", "tab:gray")):
            ax.axhline(c[key]["mean"], color=color, lw=1.2, ls=":", label=key)
        ax.set_xlabel("update (iteration of Algorithm 1)")
        ax.set_ylabel("exact discounted return")
        ax.set_title(label or f"{res['family']} ({res['origin']})", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    try:
        with files.atomic_path(path, suffix=".png") as tmp:
            fig.savefig(tmp, dpi=110, format="png")
    finally:
        plt.close(fig)
    return path
