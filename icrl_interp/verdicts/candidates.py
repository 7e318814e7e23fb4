"""Candidate RL algorithms for the algorithm verdict, in float64 numpy (docs/verdict.md).

Every candidate runs on the same data: the transitions a prompt carries (`Transitions`: features
phi_i, next features phi'_i, rewards r_i, the discount, the starting parameters w_0 and what the
output is read from) and returns a `Trace`: its output after every step k = 0..K and its internal
quantities per context column and step (errors, values). Which candidates apply depends on what the
transitions carry (a query, state labels, softmax-kernel features, all actions' next features, policy
scores); `applicable` says why one does not.

Linear candidates iterate w_{k+1} = w_k + (alpha/n) sum_i u_i(w_k), i = 0..n-1 the context columns:

* ``td0`` / ``batch_sarsa`` (control tasks): u_i = delta_i phi_i, delta_i = r_i + gamma w.phi'_i - w.phi_i;
* ``td_lambda_<l>``: u_i = delta_i e_i with the accumulating trace e_i = sum_{j<=i} (gamma l)^{i-j} phi_j
  along the context (the columns are one trajectory); l = 0 is td0;
* ``residual_gradient``: u_i = delta_i (phi_i - gamma phi'_i), the gradient of the squared TD error;
* ``mc_regression``: u_i = (G_i - w.phi_i) phi_i, G_i = sum_{j=i}^{n-1} gamma^{j-i} r_j, the return to
  the end of the context (gradient descent on the Monte-Carlo regression; its fixed point is least squares);
* ``lstd`` (closed form, no steps): w = A^+ b, A = sum_i phi_i (phi_i - gamma phi'_i)^T, b = sum_i r_i phi_i,
  the fixed point of batch TD(0);
* control tasks: ``expected_sarsa`` (phi'_i -> sum_a pi(a|s'_i) phi(s'_i, a)), ``q_learning``
  (phi'_i -> phi(s'_i, argmax_a w_k.phi(s'_i, a))) and ``actor_critic`` (the sarsa critic with step beta
  and the actor lam_{k+1} = lam_k + (alpha/n) sum_i gamma^i delta_i g_i on the policy scores g_i).

Softmax-kernel candidates (transitions with the states' features x(S_0..S_n)): ``softmax_td``
(`reference.weighted_softmax_td`, kernel softmax(score * x^T x)) and ``tabular_td`` (the visit-averaging
kernel on state labels).

Step sizes (and the softmax score scale) are hyperparameters, fitted by `fit` on training tasks to a
target output per layer: a grid search over the step size and the step k, the least squared error wins.
The bootstrapping candidates (`Candidate.discount`) also fit their discount gamma' on `gamma_grid` (0, the
task's gamma and a few between; for the linear candidates then `refined_gammas` between the best and its
grid neighbours): a model may bootstrap with a discount other than the task's, and one with
gamma' = 0 does not bootstrap at all (it regresses on the immediate reward). `fit` refits on bootstrap
resamples of the training tasks (rows of `weights`) for intervals on every fitted parameter; the linear
candidates and actor-critic run the whole step-size grid at once (`Candidate.sweep`), and their step sizes are
polished by Gauss-Newton at every step k (`_runs`): k small steps imitate fewer larger ones, so each k is scored
at its own least-squares step sizes.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from ..core import validate as V
from ..core.errors import UserError
from ..tasks import reference

LAMBDAS = (0.5, 0.9, 1.0)
"""The TD(lambda) grid (lambda = 0 is td0)."""
ALPHA_GRID = np.concatenate([[0.0], np.logspace(-3, 1.5, 55)])
"""Step sizes tried by `fit` (0 = no update; log-spaced 1e-3 .. 10^1.5, 1.0 on the grid)."""
REFINE = 8
"""Step sizes `fit` adds on each side of a `sweep` candidate's best grid step size (geometric, up to the
neighbours on the grid), so that gamma' does not compensate for a step size between grid points."""
GAUSS_NEWTON = 3
"""Gauss-Newton steps on the step sizes after the grid, at every step k (`_gauss_newton`)."""
STEP_SIZES = ("alpha", "beta")
"""The hyperparameters `fit` polishes by Gauss-Newton (where a `sweep` candidate has them): the step sizes."""
POINTS_PER_CHUNK = 32
"""Grid points of a candidate that runs one point at a time, scored together by `fit`."""
REFINE_WITHIN = 10.0
"""A gamma' whose least error on the grid is within this factor of the best gamma''s gets refined step sizes."""
RESOLUTION = float((ALPHA_GRID[2] / ALPHA_GRID[1]) ** (1 / (REFINE + 1)))
"""The ratio of neighbouring refined step sizes (2.2 %): a refined step size's interval reaches this far out."""
SCALE_GRID = np.array([0.5, 1.0, 2.0, 4.0, 8.0, 16.0])
"""Softmax score scales tried by `fit` (beta^2 of one-hot x beta features)."""
GAMMA_GRID = (0.0, 0.25, 0.5, 0.75, 0.9)
"""Discounts gamma' tried by `fit` for the bootstrapping candidates (with the task's own gamma: `gamma_grid`)."""
TIE_RTOL = 1e-9
"""Relative distance of squared errors within which two grid points fit equally well (`Fit.ties`)."""


GAMMA_REFINE = 2
"""Discounts added on each side of a target's best grid gamma', evenly up to its grid neighbours: the grid's
gaps are cut in GAMMA_REFINE + 1, so a gamma' between grid values is fitted to within half of that."""


def refined_gammas(grid: np.ndarray, best: list[int]) -> np.ndarray:
    """GAMMA_REFINE discounts on each side of each grid[j], j in `best`, evenly up to its grid neighbours (not
    grid[j] itself, nor values already on the grid)."""
    t = np.arange(1, GAMMA_REFINE + 1) / (GAMMA_REFINE + 1)
    out = []
    for j in sorted(set(best)):
        for n in (j - 1, j + 1):
            if 0 <= n < grid.size:
                out.append(grid[j] + t * (grid[n] - grid[j]))
    fine = np.unique(np.concatenate(out)) if out else np.zeros(0)
    return fine[~np.isin(fine, grid)]


def gamma_spacing(task_gamma: float) -> float:
    """Half the widest gap between neighbouring discounts tried near a fit (`refined_gammas`): how far a fitted
    gamma' may lie from the true one when the refits all agree."""
    return float(np.diff(gamma_grid(task_gamma)).max() / (GAMMA_REFINE + 1) / 2)


def gamma_grid(task_gamma: float) -> np.ndarray:
    """GAMMA_GRID with the task's discount, sorted (0 first: on an exact tie the fit keeps the first)."""
    return np.unique(np.concatenate([GAMMA_GRID, [float(task_gamma)]]))


@dataclass
class Transitions:
    """What a batch of prompts tells every candidate (B prompts, n context columns)."""

    phi: np.ndarray
    """[B, n, d] features of the source of each transition (state, or state-action for control)."""
    phi_next: np.ndarray
    """[B, n, d] features of its successor (the sampled next action's, for control)."""
    rewards: np.ndarray
    """[B, n] rewards."""
    gamma: float
    """Discount."""
    w0: np.ndarray | None = None
    """[B, d] starting parameters (None: 0, an evaluation task)."""
    phi_query: np.ndarray | None = None
    """[B, d] query features: the output is the value w.phi_query. None: the output is the parameters."""
    next_options: np.ndarray | None = None
    """[B, n, A, d] features phi(s'_i, a) of every action at each successor state (control)."""
    next_policy: np.ndarray | None = None
    """[B, n, A] the behaviour policy at each successor state (expected SARSA)."""
    scores: np.ndarray | None = None
    """[B, n, m] undiscounted policy scores g_i (actor-critic)."""
    lam0: np.ndarray | None = None
    """[B, m] starting policy parameters (actor-critic tasks: part of the output)."""
    x: np.ndarray | None = None
    """[B, n+1, dx] features of the trajectory's states S_0..S_n (softmax-kernel candidates; the output is
    the value of S_n)."""
    states: np.ndarray | None = None
    """[B, n+1] state labels of S_0..S_n (tabular TD)."""

    def __post_init__(self):
        self.phi = V.finite("phi", np.asarray(self.phi, dtype=np.float64))
        B, n, d = V.shape("phi", self.phi, (None, None, None)).shape
        self.phi_next = V.shape("phi_next", V.finite("phi_next", np.asarray(self.phi_next, dtype=np.float64)), (B, n, d))
        self.rewards = V.shape("rewards", V.finite("rewards", np.asarray(self.rewards, dtype=np.float64)), (B, n))
        self.gamma = V.discount(self.gamma)
        self.w0 = np.zeros((B, d)) if self.w0 is None else V.shape("w0", np.asarray(self.w0, dtype=np.float64), (B, d))
        if self.phi_query is not None:
            self.phi_query = V.shape("phi_query", np.asarray(self.phi_query, dtype=np.float64), (B, d))
        if self.next_options is not None:
            self.next_options = V.shape("next_options", np.asarray(self.next_options, dtype=np.float64),
                                        (B, n, None, d))
        if self.next_policy is not None:
            A = None if self.next_options is None else self.next_options.shape[2]
            self.next_policy = V.shape("next_policy", np.asarray(self.next_policy, dtype=np.float64), (B, n, A))
        if (self.scores is None) != (self.lam0 is None):
            raise UserError("actor-critic transitions need both the policy scores and the starting lam")
        if self.scores is not None:
            self.scores = V.shape("scores", np.asarray(self.scores, dtype=np.float64), (B, n, None))
            self.lam0 = V.shape("lam0", np.asarray(self.lam0, dtype=np.float64), (B, self.scores.shape[-1]))
        if self.x is not None:
            self.x = V.shape("x", np.asarray(self.x, dtype=np.float64), (B, n + 1, None))
        if self.states is not None:
            self.states = V.shape("states", np.asarray(self.states), (B, n + 1)).astype(np.int64)

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.phi.shape

    @property
    def control(self) -> bool:
        """Control tasks output parameters (no query) and their TD(0) is SARSA."""
        return self.phi_query is None and self.x is None

    def with_gamma(self, gamma: float) -> "Transitions":
        """The same transitions under another discount (the eligibility traces are recomputed)."""
        return self if float(gamma) == self.gamma else replace(self, gamma=float(gamma))

    def take(self, idx) -> "Transitions":
        """The transitions of a subset of the prompts."""
        sub = {k: (v[idx] if isinstance(v, np.ndarray) else v) for k, v in self.__dict__.items() if k[0] != "_"}
        return Transitions(**sub)

    def returns(self) -> np.ndarray:
        """[B, n] G_i = sum_{j=i}^{n-1} gamma^{j-i} r_j (the return to the end of the context)."""
        G = np.zeros_like(self.rewards)
        acc = np.zeros(self.rewards.shape[0])
        for i in range(self.rewards.shape[1] - 1, -1, -1):
            acc = self.rewards[:, i] + self.gamma * acc
            G[:, i] = acc
        return G

    def traces(self, lam: float) -> np.ndarray:
        """[B, n, d] accumulating eligibility traces e_i = sum_{j<=i} (gamma lam)^{i-j} phi_j (kept per lam)."""
        cache = self.__dict__.setdefault("_traces", {})
        if lam in cache:
            return cache[lam]
        E = np.zeros_like(self.phi)
        e = np.zeros(self.phi.shape[::2])
        for i in range(self.phi.shape[1]):
            e = self.gamma * lam * e + self.phi[:, i]
            E[:, i] = e
        cache[lam] = E
        return E


@dataclass
class Trace:
    """A candidate's run: output and internal quantities after each step k = 0..K."""

    outputs: np.ndarray
    """[B, K+1, k] the output after k steps (k = 0: before any update)."""
    internals: dict[str, np.ndarray]
    """name -> [B, K+1, n]: per context column, after k steps (e.g. td_error, value)."""
    closed_form: bool = False
    """A closed form (no steps): every k holds the same output."""


@dataclass(frozen=True)
class Candidate:
    """One candidate algorithm."""

    name: str
    description: str
    run: Callable[[Transitions, dict, int], Trace]
    """run(transitions, hyperparameters, K) -> Trace."""
    grid: dict = field(default_factory=dict)
    """hyperparameter name -> values `fit` tries (empty: nothing to fit)."""
    needs: Callable[[Transitions], str | None] = lambda tr: None
    """None when the candidate applies to the transitions, else why not."""
    discount: bool = False
    """It bootstraps (or discounts) with a gamma' that `fit` chooses on `gamma_grid` (else the task's gamma)."""
    sweep: bool = False
    """`run` takes an array of step sizes at once (hyper["alpha"] [A], and hyper["beta"] [A] or one beta) and returns
    outputs [A, B, K+1, k]; `fit` sweeps "alpha" as the innermost grid name and polishes `STEP_SIZES`."""
    family_lambda: float | None = None
    """Its lambda, for a member of the TD(lambda) family (td0: 0): the verdict's lambda interval is over them."""


def run(c: Candidate, tr: Transitions, hyper: dict, K: int) -> Trace:
    """The candidate at these hyperparameters, with its fitted discount hyper["gamma"] where it has one."""
    if "gamma" in hyper:
        tr = tr.with_gamma(hyper["gamma"])
    return c.run(tr, {k: v for k, v in hyper.items() if k != "gamma"}, K)


# ------------------------------------------------------------------ the linear iteration
def _values(phi: np.ndarray, w: np.ndarray) -> np.ndarray:
    """[..., B, n] phi_i . w per prompt (w [..., B, d]: a batched matrix product; einsum does not use BLAS here)."""
    return (phi @ w[..., None])[..., 0]


def _weighted(u: np.ndarray, phi: np.ndarray) -> np.ndarray:
    """[..., B, d] sum_i u_i phi_i per prompt (u [..., B, n])."""
    return (u[..., None, :] @ phi)[..., 0, :]


def _output(tr: Transitions, w: np.ndarray, lam: np.ndarray | None = None) -> np.ndarray:
    """The output of parameters w [B, d] (and lam [B, m]): the query value, the value of S_n, or [w; lam]."""
    if tr.phi_query is not None:
        return (w * tr.phi_query).sum(-1)[..., None]
    if tr.x is not None:  # the linear candidates on a trajectory S_0..S_n: the value of S_n = phi'_{n-1}
        return (w * tr.phi_next[:, -1]).sum(-1)[..., None]
    if tr.lam0 is not None:
        lam = tr.lam0 if lam is None else lam
        return np.concatenate([w, np.broadcast_to(lam, w.shape[:-1] + lam.shape[-1:])], axis=-1)
    return w


def _iterate(tr: Transitions, K: int, alpha: float | np.ndarray, error, D: np.ndarray, error_name: str = "td_error",
             affine: bool = True) -> Trace:
    """w_{k+1} = w_k + (alpha/n) sum_i e_i(w_k) D_i, with e = error(w, v) (v = w.phi_i: the values, computed
    once per step); internals: the errors e and the values v per column. An array of step sizes alpha [A]
    runs them all at once (outputs [A, B, K+1, k], no internals: the fit needs only outputs); with an error
    `affine` in w, e(w) = c - M w, that is the d-dimensional map w += (alpha/n)(b - G w), b = sum_i c_i D_i,
    G = sum_i D_i M_i^T, read off the error at w = 0 and at the unit vectors (n times fewer operations)."""
    K = V.count("steps", K, 0)
    n = tr.shape[1]
    if np.ndim(alpha) == 1:
        return _sweep(tr, K, np.asarray(alpha, dtype=np.float64), error, D, affine)
    w = tr.w0.copy()
    outs, errs, vals = [], [], []
    for k in range(K + 1):
        v = _values(tr.phi, w)
        e = error(w, v)
        outs.append(_output(tr, w))
        errs.append(e)
        vals.append(v)
        if k < K:
            w = w + (alpha / n) * _weighted(e, D)
    return Trace(np.stack(outs, 1), {error_name: np.stack(errs, 1), "value": np.stack(vals, 1)})


def _sweep(tr: Transitions, K: int, alphas: np.ndarray, error, D: np.ndarray, affine: bool) -> Trace:
    """`_iterate` for every step size in `alphas` at once: outputs [A, B, K+1, k]."""
    B, n, d = tr.shape
    step = alphas[:, None, None] / n
    w = np.broadcast_to(tr.w0, (alphas.size, B, d)).copy()
    if affine:
        zero = np.zeros((B, d))
        c = error(zero, _values(tr.phi, zero))  # [B, n]
        unit = np.broadcast_to(np.eye(d)[:, None, :], (d, B, d))
        M = c - error(unit, _values(tr.phi, unit))  # [d, B, n]: e(u_j) = c - M_j
        b = _weighted(c, D)  # [B, d]
        G = np.einsum("bnd,jbn->bdj", D, M)  # [B, d, d]
    outs = []
    for k in range(K + 1):
        outs.append(_output(tr, w))
        if k < K:
            if affine:
                w = w + step * (b - (G @ w[..., None])[..., 0])
            else:
                w = w + step * _weighted(error(w, _values(tr.phi, w)), D)
    return Trace(np.stack(outs, -2), {})


def td_error(tr: Transitions, w: np.ndarray, next_values: np.ndarray | None = None,
             values: np.ndarray | None = None) -> np.ndarray:
    """[B, n] delta_i = r_i + gamma v'_i - w.phi_i with v'_i = w.phi'_i (or the given successor values)."""
    nxt = _values(tr.phi_next, w) if next_values is None else next_values
    return tr.rewards + tr.gamma * nxt - (_values(tr.phi, w) if values is None else values)


def _td(tr: Transitions):
    return lambda w, v: td_error(tr, w, values=v)


def td_lambda(tr: Transitions, alpha: float | np.ndarray, K: int, lam: float = 0.0) -> Trace:
    """Batch TD(lambda) with accumulating traces along the context; lam = 0 is batch TD(0)."""
    return _iterate(tr, K, alpha, _td(tr), tr.phi if lam == 0 else tr.traces(lam))


def residual_gradient(tr: Transitions, alpha: float | np.ndarray, K: int) -> Trace:
    """Residual-gradient TD: descent on (1/2n) sum_i delta_i^2, u_i = delta_i (phi_i - gamma phi'_i)."""
    return _iterate(tr, K, alpha, _td(tr), tr.phi - tr.gamma * tr.phi_next)


def mc_regression(tr: Transitions, alpha: float | np.ndarray, K: int) -> Trace:
    """Gradient descent on the Monte-Carlo regression (1/2n) sum_i (G_i - w.phi_i)^2."""
    G = tr.returns()
    trace = _iterate(tr, K, alpha, lambda w, v: G - v, tr.phi, "mc_error")
    if trace.internals:
        trace.internals["return"] = np.broadcast_to(G[:, None], trace.internals["value"].shape).copy()
    return trace


def lstd_weights(tr: Transitions) -> np.ndarray:
    """[B, d] the LSTD solution A^+ b, A = (1/n) sum_i phi_i (phi_i - gamma phi'_i)^T, b = (1/n) sum_i r_i phi_i
    (the minimum-norm least-squares solution where A is singular)."""
    n = tr.shape[1]
    A = np.einsum("bnd,bne->bde", tr.phi, tr.phi - tr.gamma * tr.phi_next) / n
    b = np.einsum("bn,bnd->bd", tr.rewards, tr.phi) / n
    return np.stack([np.linalg.lstsq(A[i], b[i], rcond=1e-12)[0] for i in range(A.shape[0])])


def lstd(tr: Transitions, hyper: dict, K: int) -> Trace:
    """LSTD's closed form, repeated at every step k (it has none)."""
    w = lstd_weights(tr)
    K = V.count("steps", K, 0)
    rep = lambda a: np.repeat(a[:, None], K + 1, axis=1)  # noqa: E731
    return Trace(rep(_output(tr, w)), {"td_error": rep(td_error(tr, w)), "value": rep(_values(tr.phi, w))},
                 closed_form=True)


# ------------------------------------------------------------------ control
def expected_next(tr: Transitions) -> np.ndarray:
    """[B, n, d] sum_a pi(a|s'_i) phi(s'_i, a): expected SARSA's successor features."""
    return np.einsum("bna,bnad->bnd", tr.next_policy, tr.next_options)


def greedy_values(tr: Transitions, w: np.ndarray) -> np.ndarray:
    """[..., B, n] max_a w.phi(s'_i, a): Q-learning's successor values (w [..., B, d])."""
    B, n, A, d = tr.next_options.shape
    opts = tr.__dict__.get("_options_by_action")
    if opts is None:  # [B, A n, d], action-major: the max runs over whole rows of n values, not a short last axis
        opts = tr.__dict__["_options_by_action"] = np.ascontiguousarray(
            tr.next_options.transpose(0, 2, 1, 3)).reshape(B, A * n, d)
    q = opts @ w[..., None]
    return q.reshape(q.shape[:-3] + (B, A, n)).max(-2)


def expected_sarsa(tr: Transitions, alpha: float | np.ndarray, K: int) -> Trace:
    return td_lambda(replace(tr, phi_next=expected_next(tr)), alpha, K)


def q_learning(tr: Transitions, alpha: float | np.ndarray, K: int) -> Trace:
    return _iterate(tr, K, alpha, lambda w, v: td_error(tr, w, greedy_values(tr, w), v), tr.phi, affine=False)


def actor_critic(tr: Transitions, alpha: float | np.ndarray, beta: float | np.ndarray, K: int) -> Trace:
    """Critic w += (beta/n) sum_i delta_i phi_i; actor lam += (alpha/n) sum_i gamma^i delta_i g_i (as
    `reference.actor_critic_update`, iterated K times with the scores of the prompt). Arrays of step sizes
    (alpha [A] and/or beta [A], broadcast to pairs) run every pair at once (`_actor_critic_sweep`)."""
    K = V.count("steps", K, 0)
    if np.ndim(alpha) == 1 or np.ndim(beta) == 1:
        alphas, betas = np.broadcast_arrays(np.asarray(alpha, np.float64), np.asarray(beta, np.float64))
        return _actor_critic_sweep(tr, alphas, betas, K)
    w, lam = tr.w0.copy(), tr.lam0.copy()
    outs, errs, vals = [], [], []
    for k in range(K + 1):
        outs.append(_output(tr, w, lam))
        errs.append(td_error(tr, w))
        vals.append(_values(tr.phi, w))
        if k < K:
            w, lam = reference.actor_critic_update(tr.phi, tr.phi_next, tr.rewards, tr.scores, w, lam, tr.gamma,
                                                   alpha, beta)
    return Trace(np.stack(outs, 1), {"td_error": np.stack(errs, 1), "value": np.stack(vals, 1)})


def _actor_critic_sweep(tr: Transitions, alphas: np.ndarray, betas: np.ndarray, K: int) -> Trace:
    """`actor_critic` for every pair (alphas[j], betas[j]) at once: outputs [A, B, K+1, d + m]. The critic (and so
    every delta) depends on beta alone, and the actor is linear in alpha: lam_k = lam_0 + alpha S_k with
    S_k = sum_{j<k} (1/n) sum_i gamma^i delta_i(w_j) g_i, so one critic run per distinct beta serves every alpha."""
    B, n, d = tr.shape
    ub, inv = np.unique(betas, return_inverse=True)
    w = np.broadcast_to(tr.w0, (ub.size, B, d)).copy()
    g = (tr.gamma ** np.arange(n))[:, None] * tr.scores  # [B, n, m]: the discounted scores
    S = np.zeros((ub.size, B, g.shape[-1]))
    ws, ss = [w], [S]
    for _ in range(K):
        delta = td_error(tr, w)  # [u, B, n]
        w = w + (ub[:, None, None] / n) * _weighted(delta, tr.phi)
        S = S + _weighted(delta, g) / n
        ws.append(w)
        ss.append(S)
    lam = tr.lam0[:, None] + alphas[:, None, None, None] * np.stack(ss, -2)[inv]  # [A, B, K+1, m]
    return Trace(np.concatenate([np.stack(ws, -2)[inv], lam], -1), {})


# ------------------------------------------------------------------ softmax kernels
def _kernel_trace(t: reference.SoftmaxTDTrace) -> Trace:
    return Trace(t.values[:, :, -1:], {"td_error": t.td_errors, "value": t.values[:, :, :-1]})


def softmax_td(tr: Transitions, alpha: float, scale: float, K: int) -> Trace:
    rewards = tr.rewards
    return _kernel_trace(reference.weighted_softmax_td(tr.x, rewards, tr.gamma, alpha, K,
                                                       A11=scale * np.eye(tr.x.shape[-1])))


def tabular_td(tr: Transitions, alpha: float, K: int) -> Trace:
    return _kernel_trace(reference.tabular_td(tr.states, tr.rewards, tr.gamma, alpha, K))


# ------------------------------------------------------------------ the candidate set
def _need(field_name: str, why: str):
    return lambda tr: None if getattr(tr, field_name) is not None else why


def _evaluation(tr: Transitions) -> str | None:
    return None if not tr.control else "a control task (the output is parameters): see batch_sarsa and its kin"


def _control(tr: Transitions) -> str | None:
    return None if tr.control else "not a control task (the output is a value)"


def _all(*checks):
    def need(tr):
        for check in checks:
            why = check(tr)
            if why:
                return why
        return None
    return need


ALPHA = {"alpha": ALPHA_GRID}


def _linear_set() -> list[Candidate]:
    lin = {"discount": True, "sweep": True}  # fitted gamma', the step-size grid run at once and refined
    out = [
        Candidate("td0", "batch TD(0): w += (alpha/n) sum_i delta_i phi_i",
                  lambda tr, h, K: td_lambda(tr, h["alpha"], K), ALPHA, _evaluation, **lin, family_lambda=0.0),
        Candidate("batch_sarsa", "batch semi-gradient SARSA: w += (alpha/n) sum_i delta_i phi(s_i, a_i), "
                  "delta_i bootstrapping on the sampled next action",
                  lambda tr, h, K: td_lambda(tr, h["alpha"], K), ALPHA, _control, **lin),
    ]
    for lam in LAMBDAS:
        out.append(Candidate(f"td_lambda_{lam:g}", f"batch TD(lambda = {lam:g}) with accumulating traces "
                             "along the context", lambda tr, h, K, lam=lam: td_lambda(tr, h["alpha"], K, lam), ALPHA,
                             **lin, family_lambda=lam))
    out += [
        Candidate("residual_gradient", "residual-gradient TD: w += (alpha/n) sum_i delta_i (phi_i - gamma phi'_i)",
                  lambda tr, h, K: residual_gradient(tr, h["alpha"], K), ALPHA, **lin),
        Candidate("mc_regression", "Monte-Carlo return regression: w += (alpha/n) sum_i (G_i - w.phi_i) phi_i",
                  lambda tr, h, K: mc_regression(tr, h["alpha"], K), ALPHA, **lin),
        Candidate("lstd", "LSTD closed form w = A^+ b (the fixed point of batch TD(0))", lstd, discount=True),
        Candidate("expected_sarsa", "batch expected SARSA: bootstraps on sum_a pi(a|s') w.phi(s', a)",
                  lambda tr, h, K: expected_sarsa(tr, h["alpha"], K), ALPHA,
                  _all(_control, _need("next_options", "no features of every action at the next state"),
                       _need("next_policy", "no behaviour policy at the next state")), **lin),
        Candidate("q_learning", "batch Q-learning: bootstraps on max_a w.phi(s', a)",
                  lambda tr, h, K: q_learning(tr, h["alpha"], K), ALPHA,
                  _all(_control, _need("next_options", "no features of every action at the next state")), **lin),
        Candidate("actor_critic", "actor-critic: SARSA critic (step beta) and policy-gradient actor (step alpha)",
                  lambda tr, h, K: actor_critic(tr, h["alpha"], h["beta"], K),
                  {"beta": ALPHA_GRID, "alpha": ALPHA_GRID},  # alpha innermost: one critic run per beta (`sweep`)
                  _all(_control, _need("scores", "no policy scores (not an actor-critic task)")), sweep=True),
        Candidate("softmax_td", "weighted softmax TD: v(S_j) += alpha sum_k softmax_k(scale x_{k-1}.x_j) delta_k",
                  lambda tr, h, K: softmax_td(tr, h["alpha"], h["scale"], K), {**ALPHA, "scale": SCALE_GRID},
                  _need("x", "no features of the trajectory's states (not a softmax-kernel task)")),
        Candidate("tabular_td", "batch tabular TD: weighted TD with the visit-averaging kernel",
                  lambda tr, h, K: tabular_td(tr, h["alpha"], K), ALPHA,
                  _all(_need("x", "not a softmax-kernel task"), _need("states", "no state labels"))),
    ]
    return out


CANDIDATES: dict[str, Candidate] = {c.name: c for c in _linear_set()}
"""Every candidate, by name."""


def applicable(tr: Transitions, names=None) -> tuple[list[Candidate], dict[str, str]]:
    """(the candidates that apply to these transitions, {name: why not} for the others)."""
    names = list(CANDIDATES) if names is None else list(names)
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        raise UserError(f"unknown candidate(s) {', '.join(unknown)} (known: {', '.join(CANDIDATES)})")
    ok, why = [], {}
    for name in names:
        reason = CANDIDATES[name].needs(tr)
        if reason is None:
            ok.append(CANDIDATES[name])
        else:
            why[name] = reason
    return ok, why


# ------------------------------------------------------------------ fitting
def outward_interval(samples: np.ndarray) -> list | None:
    """[2.5 %, 97.5 %] quantiles of refits' values, taken outward to values that occur (a grid's own values)."""
    s = np.asarray(samples, dtype=np.float64)
    s = s[np.isfinite(s)]
    return None if s.size == 0 else [float(np.quantile(s, 0.025, method="lower")),
                                     float(np.quantile(s, 0.975, method="higher"))]


@dataclass
class Fit:
    """The hyperparameters and step k of one candidate that best match one target on training tasks."""

    hyper: dict
    step: int | None
    """Best k (None for a closed form)."""
    sse: float
    """Sum of squared errors on the training prompts at the fit."""
    sst: float
    """Sum of squares of the target about its mean on the training prompts."""
    samples: dict = field(default_factory=dict)
    """Refits on bootstrap resamples of the training tasks: name -> [R] values ('step' and each
    hyperparameter; empty without resamples)."""
    boot_sse: np.ndarray | None = None
    """[R] the least squared error of each refit (to compare candidates on the same resample)."""
    ties: dict = field(default_factory=dict)
    """hyperparameter -> [low, high] of the grid values that fit as well as the best (within TIE_RTOL): e.g.
    every gamma' after one TD step from w_0 = 0, where every TD error is the reward."""
    resolution: float | None = None
    """Ratio of neighbouring step sizes tried near the fit (refined ones): the alpha (and beta) interval reaches
    this far."""
    gamma_spacing: float | None = None
    """Half the spacing of the discounts tried near the fit (`gamma_spacing`): the gamma' interval reaches this
    far (0 < gamma' = 0 stays 0: the interval is clipped to [0, 1])."""

    def interval(self, name: str):
        """[low, high] of a fitted parameter: the 2.5 % and 97.5 % grid values over the refits (the nearest
        grid values outward, so the interval is on the grid), widened to every exactly tied value and, for the
        step size, by the spacing of the step sizes tried (`resolution`)."""
        s = self.samples.get(name)
        point = self.step if name == "step" else self.hyper.get(name)
        ci = None if point is None or s is None else outward_interval(s)
        if ci is None:
            return None
        lo, hi = ci
        if name == "gamma" and self.gamma_spacing:  # the discounts tried are this far apart
            lo, hi = max(0.0, lo - self.gamma_spacing), min(1.0, hi + self.gamma_spacing)
        if name in self.ties:
            lo, hi = min(lo, self.ties[name][0]), max(hi, self.ties[name][1])
        lo, hi = min(lo, float(point)), max(hi, float(point))
        if name in STEP_SIZES and self.resolution:
            lo, hi = lo / self.resolution, hi * self.resolution  # the step sizes tried are this far apart
        return [lo, hi]

    def to_json(self) -> dict:
        r2 = 1.0 - self.sse / self.sst if self.sst > 0 else None
        return {"hyperparameters": {k: float(v) for k, v in self.hyper.items()}, "step": self.step,
                "train_sse": self.sse, "train_r2": r2,
                "hyperparameter_ci": {k: self.interval(k) for k in self.hyper},
                "step_ci": self.interval("step") if self.step is not None else None}


def grid_points(c: Candidate, gamma: float | None = None) -> list[dict]:
    """Every combination of the candidate's hyperparameter grid (one empty dict when it has none), with
    gamma' on `gamma_grid(gamma)` first for a discounting candidate when the task's `gamma` is given."""
    points = [{"gamma": float(g)} for g in gamma_grid(gamma)] if c.discount and gamma is not None else [{}]
    for name, values in c.grid.items():
        points = [{**p, name: float(v)} for p in points for v in values]
    return points


def refined(alphas: np.ndarray, best: list[int]) -> np.ndarray:
    """REFINE geometric step sizes on each side of each alphas[j], j in `best`, up to its grid neighbours (not
    alphas[j] itself: an exact grid value keeps winning its ties); none around 0."""
    t = np.arange(1, REFINE + 1) / (REFINE + 1)
    out = []
    for j in sorted(set(best)):
        if alphas[j] <= 0:
            continue
        if j + 1 < alphas.size:
            out.append(alphas[j] * (alphas[j + 1] / alphas[j]) ** t)
        if j - 1 >= 0 and alphas[j - 1] > 0:
            out.append(alphas[j] * (alphas[j - 1] / alphas[j]) ** t)
    return np.concatenate(out) if out else np.zeros(0)


def _sse(out: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """[A, L, K+1] squared error of outputs [A, B, K+1, k] against every target [L, B, k] (inf where not finite),
    expanded as |o|^2 - 2 o.t + |t|^2: it only chooses where to refine (`fit` scores the differences)."""
    with np.errstate(all="ignore"):
        sse = (np.einsum("abkc,abkc->ak", out, out)[:, None] - 2 * np.einsum("abkc,lbc->alk", out, targets)
               + (targets ** 2).sum((1, 2))[None, :, None])
    return np.where(np.isfinite(sse), sse, np.inf)


def _gauss_newton(c: Candidate, tr: Transitions, outer: dict, K: int, targets: np.ndarray, start: np.ndarray,
                  names: tuple = ("alpha",)):
    """Gauss-Newton steps on the step sizes `names` of each (target l, step k) from start [M, P + 2] (the P step
    sizes, l, k per row): the output is smooth in them, so x += (J^T J)^+ J^T r with J = d output / d x (forward
    differences) reaches the least-squares step sizes of that k to rounding in a few steps (a zero-residual fit
    converges quadratically; actor-critic's output is linear in alpha and beta at k = 1: one step). Yields
    (step sizes [M, P], outputs [M, B, K+1, k]) of every iterate."""
    x, l, k = start[:, :-2].copy(), start[:, -2].astype(int), start[:, -1].astype(int)
    rows = np.arange(x.shape[0])

    def at(v):
        return run(c, tr, {**outer, **{name: v[:, j] for j, name in enumerate(names)}}, K).outputs

    for it in range(GAUSS_NEWTON + 1):
        out = at(x)
        yield x, out
        if it == GAUSS_NEWTON:
            return
        o = out[rows, :, k].reshape(rows.size, -1)  # [M, B k]
        r = targets[l].reshape(rows.size, -1) - o
        J = []
        for j in range(x.shape[1]):
            h = x[:, j] * 1e-6
            xh = x.copy()
            xh[:, j] += h
            J.append((at(xh)[rows, :, k].reshape(rows.size, -1) - o) / h[:, None])
        J = np.stack(J, -1)  # [M, B k, P]
        A, g = J.transpose(0, 2, 1) @ J, (J.transpose(0, 2, 1) @ r[..., None])[..., 0]
        ok = np.isfinite(A).all((1, 2)) & np.isfinite(g).all(1)
        step = (np.linalg.pinv(np.where(ok[:, None, None], A, 0.0)) @ np.where(ok[:, None], g, 0.0)[..., None])[..., 0]
        new = np.clip(x + step, x / 2, x * 2)  # a trust region: never past a factor of 2
        x = np.where(np.isfinite(new), new, x)


def _best_per_step(tried: list, polish: tuple, L: int, K: int, least: np.ndarray):
    """Where Gauss-Newton starts: for each group of sweeps that share their outer values not polished (gamma'),
    and each target l whose least error in the group is within REFINE_WITHIN of `least` [L], every step k >= 1 from
    its best tried point (over the group's polished outer values, e.g. beta, and its step sizes). Yields (the
    group's fixed outer dict, start rows [M, P + 2])."""
    groups: dict = {}
    for outer, a_all, sse in tried:
        fixed = {k_: v for k_, v in outer.items() if k_ not in polish}
        groups.setdefault(tuple(sorted(fixed.items())), (fixed, []))[1].append((outer, a_all, sse))
    for fixed, members in groups.values():
        err = np.stack([sse.min(0) for _, _, sse in members])  # [members, L, K+1]
        arg = np.stack([np.argmin(sse, 0) for _, _, sse in members])
        near = err.min((0, 2)) <= REFINE_WITHIN * least  # [L]
        start = []
        for l_ in np.nonzero(near)[0]:
            for k_ in range(1, K + 1):
                m = int(np.argmin(err[:, l_, k_]))
                outer, a_all, _ = members[m]
                a = a_all[arg[m, l_, k_]]
                if a > 0 and np.isfinite(err[m, l_, k_]) and all(outer.get(p, 1.0) > 0 for p in polish[1:]):
                    start.append([a] + [outer[p] for p in polish[1:]] + [l_, k_])
        if start:
            yield fixed, np.array(start, dtype=np.float64)


def _runs(c: Candidate, tr: Transitions, K: int, targets: np.ndarray):
    """(points, outputs [P, B, K+1, k], closed form?) over the grid, a chunk at a time: for a `sweep` candidate
    the step-size grid in one run per outer value (gamma', or actor-critic's critic step beta); then the outer
    values refined between the best and its grid neighbours (`refined_gammas`, `refined`); then, for each outer
    value within REFINE_WITHIN of a target's least error, the step sizes `refined` around that target's best; then
    Gauss-Newton on the step sizes (alpha, and beta) at *every* step k from its best point so far, for each gamma'
    near the best: alpha and k trade off (k small steps imitate fewer larger ones), and a step size between the
    tried ones would let another k or gamma' win, so each k is scored at its own least-squares step sizes (a
    profile over k). One run per point otherwise."""
    points = grid_points(c, tr.gamma)
    if c.sweep:
        alphas = c.grid["alpha"]
        polish = tuple(p for p in STEP_SIZES if p in c.grid)
        tried = []  # per outer value: [outer, step sizes tried, sse [A, L, K+1]]

        def sweep(outer: dict):
            with np.errstate(all="ignore"):
                out = run(c, tr, {**outer, "alpha": alphas}, K).outputs
            tried.append([outer, alphas, _sse(out, targets)])
            return [{**outer, "alpha": float(a)} for a in alphas], out, False

        for lo in range(0, len(points), alphas.size):  # alpha is the innermost grid name
            yield sweep({k: v for k, v in points[lo].items() if k != "alpha"})
        for key, between in (("gamma", refined_gammas), ("beta", refined)):  # outer values between the grid's
            if tried and key in tried[0][0]:
                grid = np.array([t[0][key] for t in tried])
                best = [int(j) for j in np.argmin(np.stack([t[2].min((0, 2)) for t in tried]), 0)]  # [L]
                for v in between(grid, best):
                    yield sweep({**tried[0][0], key: float(v)})
        least = np.min([t[2].min((0, 2)) for t in tried], 0)  # [L]: the least error over every outer value
        for t in tried:
            outer, _, sse = t
            near = sse.min((0, 2)) <= REFINE_WITHIN * least  # [L]
            fine = refined(alphas, [int(j) for j in np.argmin(sse.min(-1), 0)[near]])
            if fine.size:
                with np.errstate(all="ignore"):
                    out = run(c, tr, {**outer, "alpha": fine}, K).outputs
                yield [{**outer, "alpha": float(a)} for a in fine], out, False
                t[1:] = [np.r_[alphas, fine], np.concatenate([sse, _sse(out, targets)])]
        least = np.min([t[2].min((0, 2)) for t in tried], 0)
        # every gamma' within REFINE_WITHIN of the best before polishing: a grid alpha may favour a neighbouring
        # gamma' and k that the polished alpha at the true gamma' beats
        for fixed, start in _best_per_step(tried, polish, targets.shape[0], K, least):
            with np.errstate(all="ignore"):
                for x, o in _gauss_newton(c, tr, fixed, K, targets, start, polish):
                    yield [{**fixed, **{p: float(v) for p, v in zip(polish, row)}} for row in x], o, False
        return
    for lo in range(0, len(points), POINTS_PER_CHUNK):  # a few points at a time: one weighted sum for them all
        with np.errstate(all="ignore"):
            traces = [run(c, tr, p, K) for p in points[lo: lo + POINTS_PER_CHUNK]]
        yield points[lo: lo + POINTS_PER_CHUNK], np.stack([t.outputs for t in traces]), traces[0].closed_form


def fit(c: Candidate, tr: Transitions, targets: np.ndarray, K: int, weights: np.ndarray | None = None) -> list[Fit]:
    """Per target l (targets [L, B, k]): the grid point and step k <= K whose output has the least squared
    error against target l on these (training) prompts. `weights` [R, B]: bootstrap resamples (each prompt's
    count: its task's draws); each row is refitted the same way, and the refits' parameters are the
    `Fit.samples`. The squared error of every grid point and step is computed once per prompt, so a refit is
    one weighted sum and an argmin."""
    targets = np.asarray(targets, dtype=np.float64)
    L, B = targets.shape[:2]
    W = np.ones((1, B)) if weights is None else np.concatenate([np.ones((1, B)), np.asarray(weights, float)])
    sst = ((targets - targets.mean(1, keepdims=True)) ** 2).sum((1, 2))
    best = np.full((L, W.shape[0]), np.inf)
    where = np.zeros((L, W.shape[0], 2), dtype=np.int64)  # (grid point, step) of the best
    points: list[dict] = []
    closed = False
    gamma_best: dict[float, np.ndarray] = {}  # gamma' -> [L] least error of the point fit
    for chunk, out, closed in _runs(c, tr, K, targets):
        with np.errstate(all="ignore"):
            for l in range(L):
                d = out - targets[l][None, :, None]
                sse = d[..., 0] ** 2 if d.shape[-1] == 1 else np.einsum("pbkc,pbkc->pbk", d, d)  # [P, B, K+1]
                ok = np.isfinite(sse)
                tot = np.matmul(W, np.where(ok, sse, 0.0))  # [P, R, K+1]: one BLAS product per grid point
                tot = np.where(ok.all(1)[:, None], tot, np.inf).transpose(1, 0, 2)  # diverged somewhere: out
                flat = tot.reshape(W.shape[0], -1)
                j = np.argmin(flat, 1)  # first of ties: the earlier grid point, then the smaller k
                v = flat[np.arange(W.shape[0]), j]
                margin = np.where(np.isfinite(best[l]), TIE_RTOL * (best[l] + 1e-3 * sst[l]), 0.0)
                better = v < best[l] - margin  # a near-tie (rounding) keeps the earlier point
                best[l] = np.where(better, v, best[l])
                where[l, better] = np.stack([len(points) + j // tot.shape[2], j % tot.shape[2]], 1)[better]
                if "gamma" in chunk[0]:
                    for p, e in zip(chunk, tot[0].min(-1)):  # the least error of each gamma' (ties: `Fit.ties`)
                        g = gamma_best.setdefault(p["gamma"], np.full(L, np.inf))
                        g[l] = min(g[l], float(e))
        points += chunk
    fits = []
    for l in range(L):
        if best[l, 0] == np.inf:
            raise UserError(f"candidate {c.name} diverges for every step size on these tasks")
        p, k = where[l, 0]
        samples = {}
        if W.shape[0] > 1:
            samples = {name: np.array([points[q][name] for q in where[l, 1:, 0]]) for name in points[p]}
            if not closed:
                samples["step"] = where[l, 1:, 1].astype(np.float64)
        tol = TIE_RTOL * (best[l, 0] + 1e-3 * sst[l])
        tied = [g for g, e in gamma_best.items() if e[l] <= best[l, 0] + tol]
        fits.append(Fit(dict(points[p]), None if closed else int(k), float(best[l, 0]), float(sst[l]), samples,
                        best[l, 1:].copy() if W.shape[0] > 1 else None,
                        {"gamma": [min(tied), max(tied)]} if len(tied) > 1 else {}, RESOLUTION if c.sweep else None,
                        gamma_spacing(tr.gamma) if c.discount and "gamma" in points[p] else None))
    return fits
