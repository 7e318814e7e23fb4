"""Tabular learning rules on learning histories, in float64 numpy: the candidates of the episode verdict
(`icrl_interp.verdicts.behaviour_fit`) and the source agents of `collect`, one implementation each.

A rule keeps a table Q[n, s, a] per batch row n (a row is one history under one setting of the parameters)
and acts by the softmax policy pi(a | s) = exp(beta Q(s, a)) / sum_b exp(beta Q(s, b)), beta the inverse
temperature. Q starts at 0. Every row is advanced one time step at a time (`Rule.observe`); the loop over
time is the only Python loop, the rows are vectorized.

Episode ends: a step that *terminates* its episode bootstraps nothing (its target is the reward alone); a
step *truncated* by a time limit bootstraps from its next observation s' as if the episode went on. The next
step of the history starts the next episode at its reset observation (`Episodes.next_observations` of the
ending step is s', not the next row's observation). `replay` treats the last valid step of a history that
stops mid-episode as truncated.

The rules (alpha the step size, gamma the discount, lambda the trace decay):

* ``q_learning``: delta_t = r_t + gamma max_b Q(s'_t, b) - Q(s_t, a_t), Q(s_t, a_t) += alpha delta_t,
  applied at step t.
* ``sarsa``: delta_t = r_t + gamma Q(s_{t+1}, a_{t+1}) - Q(s_t, a_t), Q(s_t, a_t) += alpha delta_t. The
  target needs the next action, so the update of step t waits until a_{t+1} has been chosen (the usual
  order: a_{t+1} is chosen from Q before the update of step t). At a truncation there is no next action:
  the target is the expectation sum_b pi(b | s') Q(s', b) under the rule's own policy.
* ``expected_sarsa``: delta_t = r_t + gamma sum_b pi(b | s'_t) Q(s'_t, b) - Q(s_t, a_t), applied at step t.
* ``sarsa_lambda``: TD(lambda) control (SARSA(lambda)) with accumulating traces: at the update of step t
  (when a_{t+1} is chosen, as SARSA; the same truncation target) e(s_t, a_t) += 1, then Q += alpha delta_t e
  for every (s, a), then e *= gamma lambda; e = 0 after an episode's last step. lambda = 0 is SARSA.
* ``mc_control``: every-visit constant-alpha Monte-Carlo control. Nothing changes during an episode; at its
  end, in time order k over the episode's steps, Q(s_k, a_k) += alpha (G_k - Q(s_k, a_k)) with the return
  G_k = sum_{j=k}^{end} gamma^{j-k} r_j. A truncated episode bootstraps nothing either (its returns stop at
  the truncation: the rule has no value estimate of s' it would trust). delta_k = G_k - Q(s_k, a_k).
* ``model_based``: a count-based model of the history so far: each (s, a) seen N(s, a) times has the mean
  reward and the empirical successor distribution of its transitions (terminations lead nowhere). After each
  step, SWEEPS sweeps of value iteration from the current table,
  Q(s, a) <- (1 / N(s, a)) sum_{transitions i of (s, a)} [r_i + gamma (1 - term_i) max_b Q(s'_i, b)]
  (unseen pairs stay 0). delta_t = r_t + gamma (1 - term_t) max_b Q(s'_t, b) - Q(s_t, a_t) before the
  sweeps. No step size.

V(s) is max_b Q(s, b) for the off-policy rules (``q_learning``, ``model_based``) and sum_b pi(b | s) Q(s, b)
for the others.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.errors import UserError

SWEEPS = 10
"""Value-iteration sweeps per step of ``model_based``."""


def amax(x: np.ndarray) -> np.ndarray:
    """max over the (short) last axis, one column at a time: numpy's reduction along a short contiguous axis is
    many times slower."""
    out = x[..., 0].copy()
    for i in range(1, x.shape[-1]):
        np.maximum(out, x[..., i], out=out)
    return out


def asum(x: np.ndarray) -> np.ndarray:
    """sum over the (short) last axis, in index order (as `amax`)."""
    out = x[..., 0].copy()
    for i in range(1, x.shape[-1]):
        out += x[..., i]
    return out


def log_policy(q: np.ndarray, beta) -> np.ndarray:
    """log softmax(beta q) over the last axis (beta broadcast against q's leading axes)."""
    z = np.asarray(beta, dtype=np.float64)[..., None] * q
    z = z - amax(z)[..., None]
    return z - np.log(asum(np.exp(z)))[..., None]


def sample(p: np.ndarray, u: np.ndarray) -> np.ndarray:
    """[N] int64: action of each row drawn from probabilities p [N, A] with the row's uniform u [N] (inverse CDF)."""
    return np.minimum((np.cumsum(p, -1) < u[:, None]).sum(-1), p.shape[1] - 1).astype(np.int64)


def policy(q: np.ndarray, beta) -> np.ndarray:
    """softmax(beta q) over the last axis."""
    return np.exp(log_policy(q, beta))


class Rule:
    """The state of one rule on N batch rows: Q [N, S, A] and what the rule keeps besides. Subclasses
    implement `observe` (one time step of every row)."""

    params: tuple[str, ...] = ("alpha", "gamma", "beta")
    """The parameters the rule has."""
    greedy: bool = False
    """V(s) = max_b Q(s, b) (else the expectation under the policy)."""
    uses_beta: bool = False
    """The policy's beta enters every update (else it only sets the action probabilities; for the deferred SARSA
    rules also their targets at truncations)."""

    def __init__(self, n: int, n_obs: int, n_actions: int, alpha=None, gamma=None, beta=None, lam=None):
        self.n, self.S, self.A = int(n), int(n_obs), int(n_actions)
        self.rows = np.arange(self.n)
        self.alpha, self.gamma, self.beta, self.lam = (
            np.broadcast_to(np.asarray(np.nan if x is None else x, dtype=np.float64), (self.n,)).copy()
            for x in (alpha, gamma, beta, lam))
        self.q = np.zeros((self.n, self.S, self.A))
        self.t = 0

    def values(self, obs: np.ndarray) -> np.ndarray:
        """[N, A] Q(obs_n, .) of every row."""
        return self.q[self.rows, obs]

    def state_value(self, q: np.ndarray) -> np.ndarray:
        """[N, ...] V from the rows' Q-values [N, ..., A]."""
        if self.greedy:
            return amax(q)
        return asum(policy(q, self.beta.reshape((-1,) + (1,) * (q.ndim - 2))) * q)

    def expected(self, obs: np.ndarray) -> np.ndarray:
        """[N] sum_b pi(b | obs) Q(obs, b) under the rows' own policies."""
        q = self.values(obs)
        return asum(policy(q, self.beta) * q)

    def observe(self, obs, actions, rewards, next_obs, terminated, truncated, active=None) -> list:
        """Advance every active row by one step (s_t, a_t, r_t, s'_t, episode end); returns the updates made as
        a list of (rows [N] bool, step [N] int, delta [N]): the TD errors of the steps completed now."""
        active = np.ones(self.n, bool) if active is None else np.asarray(active, bool)
        args = (np.asarray(obs, np.int64), np.asarray(actions, np.int64), np.asarray(rewards, np.float64),
                np.asarray(next_obs, np.int64), np.asarray(terminated, bool), np.asarray(truncated, bool), active)
        out = self._observe(*args)
        self.t += 1
        return out

    def _observe(self, s, a, r, s2, term, trunc, active) -> list:
        raise NotImplementedError

    def _step(self) -> np.ndarray:
        return np.full(self.n, self.t)


class _TD0(Rule):
    """One-step rules updated at once: the target's successor value is `_next`."""

    def _next(self, s2: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _observe(self, s, a, r, s2, term, trunc, active):
        delta = r + self.gamma * np.where(term, 0.0, self._next(s2)) - self.q[self.rows, s, a]
        self.q[self.rows, s, a] += np.where(active, self.alpha * delta, 0.0)
        return [(active, self._step(), delta)]


class QLearning(_TD0):
    greedy = True

    def _next(self, s2):
        return amax(self.values(s2))


class ExpectedSarsa(_TD0):
    uses_beta = True

    def _next(self, s2):
        return self.expected(s2)


class Sarsa(Rule):
    """SARSA: the update of step t waits for a_{t+1} (`_pending`); `_apply` makes an update."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._pending = np.zeros(self.n, bool)
        self._p = {k: np.zeros(self.n, np.int64) for k in ("s", "a", "s2", "t")}
        self._pr = np.zeros(self.n)

    def _apply(self, rows, s, a, delta, done) -> None:
        self.q[self.rows, s, a] += np.where(rows, self.alpha * delta, 0.0)

    def _observe(self, s, a, r, s2, term, trunc, active):
        out = []
        p = self._pending & active
        if p.any():  # the previous step's target: its successor s' with the action a_t chosen there
            P = self._p
            delta = self._pr + self.gamma * self.q[self.rows, P["s2"], a] - self.q[self.rows, P["s"], P["a"]]
            self._apply(p, P["s"], P["a"], delta, np.zeros(self.n, bool))
            out.append((p, P["t"].copy(), delta))
            self._pending &= ~p
        done = (term | trunc) & active
        if done.any():
            delta = r + self.gamma * np.where(term, 0.0, self.expected(s2)) - self.q[self.rows, s, a]
            self._apply(done, s, a, delta, done)
            out.append((done, self._step(), delta))
        wait = active & ~done
        for k, v in (("s", s), ("a", a), ("s2", s2)):
            self._p[k] = np.where(wait, v, self._p[k])
        self._p["t"] = np.where(wait, self.t, self._p["t"])
        self._pr = np.where(wait, r, self._pr)
        self._pending |= wait
        return out


class SarsaLambda(Sarsa):
    params = ("alpha", "gamma", "beta", "lam")

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.e = np.zeros_like(self.q)

    def _apply(self, rows, s, a, delta, done) -> None:
        self.e[self.rows, s, a] += rows
        self.q += np.where(rows, self.alpha * delta, 0.0)[:, None, None] * self.e
        self.e *= np.where(rows, self.gamma * self.lam, 1.0)[:, None, None]
        self.e[done] = 0.0


class MonteCarlo(Rule):
    """Every-visit constant-alpha MC control: the open episodes' steps are kept (`_buf`, one entry per time
    step since the oldest open episode's start) until each row's episode ends."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._buf: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._t0 = 0
        self._start = np.zeros(self.n, np.int64)

    def _observe(self, s, a, r, s2, term, trunc, active):
        self._buf.append((s, a, r))
        end = (term | trunc) & active
        out = []
        if end.any():
            first = int(self._start[end].min())
            steps = range(first, self.t + 1)
            G = np.zeros(self.n)
            ret = {}
            for k in reversed(steps):
                G = np.where(k >= self._start, self._buf[k - self._t0][2] + self.gamma * G, 0.0)
                ret[k] = G
            for k in steps:
                sk, ak, _ = self._buf[k - self._t0]
                rows = end & (k >= self._start)
                delta = ret[k] - self.q[self.rows, sk, ak]
                self.q[self.rows, sk, ak] += np.where(rows, self.alpha * delta, 0.0)
                out.append((rows, np.full(self.n, k), delta))
            self._start[end] = self.t + 1
        keep = int(self._start.min())
        del self._buf[:max(0, keep - self._t0)]
        self._t0 = max(self._t0, keep)
        return out


class ModelBased(Rule):
    """The count-based model kept as its distinct transitions (row, s, a) -> (row, s'), each with the summed
    gamma (1 - term_i) of the transitions it stands for (one flat list for all rows: the index of (row, s, a)
    into Q, of (row, s') into V), and the reward sums and counts per (s, a): a sweep is one gather of max Q at
    every distinct s' and one sum per (s, a)."""

    params = ("gamma", "beta")
    greedy = True

    def __init__(self, *args, sweeps: int = SWEEPS, **kw):
        super().__init__(*args, **kw)
        self.sweeps = int(sweeps)
        self._slot: dict[int, int] = {}
        self._tr = {k: np.zeros(4 * self.n, dt) for k, dt in (("sa", np.int64), ("s2", np.int64), ("c", np.float64))}
        self._rsum = np.zeros(self.n * self.S * self.A)
        self._inv = np.zeros(self.n * self.S * self.A)  # 1 / N(s, a); 0 for unseen pairs (they stay 0)
        self._count = np.zeros(self.n * self.S * self.A)

    def _observe(self, s, a, r, s2, term, trunc, active):
        cont = np.where(term, 0.0, self.gamma)
        delta = r + cont * amax(self.values(s2)) - self.q[self.rows, s, a]
        if active.any():
            n = self.rows[active]
            sa = (n * self.S + s[active]) * self.A + a[active]
            nxt = n * self.S + s2[active]
            j = np.array([self._slot.setdefault(k, len(self._slot)) for k in (sa * self.S + s2[active]).tolist()])
            while len(self._slot) > self._tr["sa"].size:
                self._tr = {k: np.concatenate([v, np.zeros_like(v)]) for k, v in self._tr.items()}
            self._tr["sa"][j], self._tr["s2"][j] = sa, nxt
            self._tr["c"][j] += cont[active]  # one slot per row: no repeats
            self._rsum[sa] += r[active]  # one index per row: no repeats
            self._count[sa] += 1.0
            self._inv[sa] = 1.0 / self._count[sa]
            self._sweep()
        return [(active, self._step(), delta)]

    def _sweep(self) -> None:
        sa, s2, c = (self._tr[k][:len(self._slot)] for k in ("sa", "s2", "c"))
        for _ in range(self.sweeps):
            v = amax(self.q.reshape(-1, self.A))
            back = np.bincount(sa, weights=c * v[s2], minlength=self._inv.size)
            self.q = ((self._rsum + back) * self._inv).reshape(self.q.shape)


RULES: dict[str, type[Rule]] = {}
"""Name -> rule class: the candidates of the episode verdict, in their order."""


def _rule(name_of):
    def add(cls):
        RULES[name_of.__name__] = cls
        return cls
    return add


# The names are the public functions' names below (one spelling; `replay(q_learning.__name__, ...)` works too).
def q_learning(episodes, **params) -> "Replay":
    """Q-learning replayed on `episodes` (`replay`)."""
    return replay(q_learning.__name__, episodes, **params)


def sarsa(episodes, **params) -> "Replay":
    """SARSA replayed on `episodes` (`replay`)."""
    return replay(sarsa.__name__, episodes, **params)


def expected_sarsa(episodes, **params) -> "Replay":
    """Expected SARSA replayed on `episodes` (`replay`)."""
    return replay(expected_sarsa.__name__, episodes, **params)


def sarsa_lambda(episodes, **params) -> "Replay":
    """SARSA(lambda) with accumulating traces replayed on `episodes` (`replay`)."""
    return replay(sarsa_lambda.__name__, episodes, **params)


def mc_control(episodes, **params) -> "Replay":
    """Every-visit constant-alpha Monte-Carlo control replayed on `episodes` (`replay`)."""
    return replay(mc_control.__name__, episodes, **params)


def model_based(episodes, **params) -> "Replay":
    """The count-based model with value iteration replayed on `episodes` (`replay`)."""
    return replay(model_based.__name__, episodes, **params)


for _f, _c in ((q_learning, QLearning), (sarsa, Sarsa), (expected_sarsa, ExpectedSarsa), (sarsa_lambda, SarsaLambda),
               (mc_control, MonteCarlo), (model_based, ModelBased)):
    _rule(_f)(_c)
NAMES = tuple(RULES)


def rule_class(name: str) -> type[Rule]:
    if name not in RULES:
        raise UserError(f"unknown learning rule {name!r} (known: {', '.join(RULES)})")
    return RULES[name]


def check_params(name: str, alpha=None, gamma=None, beta=None, lam=None) -> dict:
    """The rule's parameters as float64 arrays, each in its range: alpha in (0, 1], gamma and lambda in [0, 1],
    beta > 0; a parameter the rule has must be given, one it does not have must not be."""
    cls = rule_class(name)
    given = {"alpha": alpha, "gamma": gamma, "beta": beta, "lam": lam}
    ranges = {"alpha": (0.0, 1.0, False), "gamma": (0.0, 1.0, True), "beta": (0.0, np.inf, False),
              "lam": (0.0, 1.0, True)}
    out = {}
    for k, v in given.items():
        if (v is None) != (k not in cls.params):
            raise UserError(f"{name} {'needs' if v is None else 'has no'} parameter {k}")
        if v is None:
            continue
        x = np.asarray(v, dtype=np.float64)
        lo, hi, closed = ranges[k]
        if np.any(~np.isfinite(x) | (x > hi) | ((x < lo) if closed else (x <= lo))):
            raise UserError(f"{name}: {k} must lie in {'[' if closed else '('}{lo:g}, {hi:g}], got {v}")
        out[k] = x
    return out


def discrete(episodes) -> None:
    if getattr(episodes, "n_observations", None) is None:
        raise UserError("the tabular learning rules need discrete observations (n_observations); these episodes "
                        "have Box observations")


@dataclass
class Replay:
    """A rule replayed on learning histories; batch shape P of the parameters, H histories, T steps, A actions.
    Steps outside a history (valid False) hold NaN."""

    q: np.ndarray
    """[*P, H, T, A] Q(s_t, .) the rule's policy chose a_t from (before the update of step t; for the deferred
    SARSA rules also before that of step t - 1, which waits for a_t)."""
    delta: np.ndarray
    """[*P, H, T] the TD error of step t's update (``mc_control``: G_t - Q(s_t, a_t) at the episode's end)."""
    v: np.ndarray
    """[*P, H, T] V(s_t) from `q`."""
    log_prob: np.ndarray
    """[*P, H, T] log softmax(beta Q(s_t, .))[a_t]."""


def steps(episodes) -> dict:
    """The columns a rule reads, [H, T] each, with the last valid step of every history marked truncated when
    it does not end an episode (the history stops there)."""
    valid = np.asarray(episodes.valid, bool)
    last = valid & ~np.concatenate([valid[:, 1:], np.zeros((valid.shape[0], 1), bool)], 1)
    term = np.asarray(episodes.terminations, bool) & valid
    index = lambda x: np.where(valid, np.asarray(x, np.int64), 0)  # noqa: E731  padding may hold anything
    return {"obs": index(episodes.observations), "actions": index(episodes.actions),
            "rewards": np.where(valid, np.asarray(episodes.rewards, np.float64), 0.0),
            "next_obs": index(episodes.next_observations), "term": term,
            "trunc": ((np.asarray(episodes.truncations, bool) & valid) | last) & ~term, "valid": valid}


def run(name: str, cols: dict, n_obs: int, n_actions: int, params: dict, *, record: bool = True,
        target: np.ndarray | None = None, policy_betas: np.ndarray | None = None):
    """The rule on P parameter settings (params: name -> [P]) times H histories (`steps` columns), without range
    checks (the fit steps just past the bounds for its finite differences). record: per step q [P, H, T, A],
    delta, v. target [H, T, A] (weights of the actions: one-hot of the chosen ones, or a model's action
    probabilities; 0 outside the histories): also the log-likelihood sum_t sum_a target log pi(a | s_t) per
    history, [P, B, H] under each of `policy_betas` [B] (None: each row's own beta, B = 1)."""
    H, T = cols["obs"].shape
    P = next(iter(params.values())).shape[0]
    c = {k: np.tile(v.T, (1, P)) for k, v in cols.items()}  # [T, P * H]: row p * H + h of step t
    rule = rule_class(name)(P * H, n_obs, n_actions, **{k: np.repeat(v, H) for k, v in params.items()})
    out = {}
    if record:
        out = {"q": np.full((P * H, T, n_actions), np.nan), "delta": np.full((P * H, T), np.nan)}
    if target is not None:
        B = 1 if policy_betas is None else len(policy_betas)
        betas = rule.beta[None] if policy_betas is None else \
            np.repeat(np.asarray(policy_betas, np.float64)[:, None], P * H, 1)
        ll = np.zeros((B, P, H))
    for t in range(T):
        active, s = c["valid"][t], c["obs"][t]
        q = rule.values(s)
        if record:
            out["q"][:, t] = np.where(active[:, None], q, np.nan)
        if target is not None:
            ll += asum(log_policy(q[None], betas).reshape(B, P, H, n_actions) * target[None, None, :, t])
        done = rule.observe(s, c["actions"][t], c["rewards"][t], c["next_obs"][t], c["term"][t], c["trunc"][t], active)
        if record:
            for rows, k, delta in done:
                out["delta"][rows, k[rows]] = delta[rows]
    if record:
        out["v"] = rule.state_value(out["q"])  # NaN outside the histories, as q
    if target is not None:
        out["loglik"] = ll
    return out


def replay(name: str, episodes, *, alpha=None, gamma=None, beta=None, lam=None) -> Replay:
    """The rule `name` (one of NAMES) replayed on the episodes' histories under each setting of its parameters:
    alpha, gamma, beta, lam broadcast together to the batch shape P (scalars: P = ()). Returns per step the
    Q-values the policy chose from, the TD errors, V and log pi(a_t | s_t) (`Replay`)."""
    discrete(episodes)
    p = check_params(name, alpha, gamma, beta, lam)
    shape = np.broadcast_shapes(*(v.shape for v in p.values()))
    flat = {k: np.broadcast_to(v, shape).reshape(-1) for k, v in p.items()}
    cols = steps(episodes)
    out = run(name, cols, int(episodes.n_observations), int(episodes.n_actions), flat)
    H, T = cols["obs"].shape
    A = int(episodes.n_actions)
    q = out["q"].reshape(*shape, H, T, A)
    a = np.where(cols["valid"], cols["actions"], 0)
    lp = np.take_along_axis(log_policy(q, np.broadcast_to(p["beta"], shape).reshape(shape + (1, 1))),
                            np.broadcast_to(a, shape + (H, T))[..., None], -1)[..., 0]
    return Replay(q=q, delta=out["delta"].reshape(*shape, H, T), v=out["v"].reshape(*shape, H, T),
                  log_prob=np.where(cols["valid"], lp, np.nan))


class OnlineLearner:
    """A rule acting: `act` samples each environment's action from softmax(beta Q(obs, .)), `observe` makes the
    rule's update of that step (the same code as `replay`, so a history it collects replays to its own Q)."""

    def __init__(self, name: str, n_envs: int, n_obs: int, n_actions: int, *, alpha=None, gamma=None, beta=None,
                 lam=None, seed: int = 0):
        p = check_params(name, alpha, gamma, beta, lam)
        self.name = name
        self.rule = rule_class(name)(n_envs, n_obs, n_actions, **p)
        self.rng = np.random.default_rng(seed)

    @property
    def q(self) -> np.ndarray:
        """[n_envs, S, A] the current tables."""
        return self.rule.q

    def probs(self, obs) -> np.ndarray:
        """[n_envs, A] the policy at obs."""
        return policy(self.rule.values(np.asarray(obs, np.int64)), self.rule.beta)

    def act(self, obs, rng: np.random.Generator | None = None) -> np.ndarray:
        """[n_envs] int64 actions drawn from the policy at obs (with `rng`, else the learner's own generator)."""
        p = self.probs(obs)
        return sample(p, (self.rng if rng is None else rng).random(p.shape[0]))

    def observe(self, obs, actions, rewards, next_obs, terminated, truncated) -> list:
        """Update on one step of every environment; returns the updates made now (`Rule.observe`: a SARSA step's
        waits for the next action, MC's for the episode's end)."""
        return self.rule.observe(obs, actions, rewards, next_obs, terminated, truncated)
