"""Exact teachers: torch modules that run a known RL algorithm on the prompt tensor z[batch, pos, D] of a
family's layout, layer by layer, with a residual stream per layer under TransformerLens hook names
(`blocks.{l}.hook_resid_pre`, `blocks.{l}.hook_resid_post`), so recording, the verdict's per-layer readout
(the `unembed` readout, a logit lens) and the causal test work on them as on any TransformerLens model.

They are written from the math of docs/concepts.md and docs/verdict.md, on purpose *not* with
`verdicts/candidates.py` or `tasks/reference.py`: a teacher that called the candidate code would be
recovered by construction, and the zoo would test nothing (tests/zoo/test_teachers.py checks each one
against its own float64 numpy re-derivation).

The residual stream has width F = D + p + 2 (D the prompt's width, p the number of parameters):

* rows 0..D-1: the prompt column, as given;
* rows D..D+p-1 (`W`): the parameters at the last column: w (value tasks, SARSA) or [w; lam] (actor-critic);
* row D+p (`ERR`): at each context column, the error the algorithm updates with at the current parameters
  (delta_i, or G_i - w.phi_i for Monte-Carlo regression);
* row D+p+1 (`OUT`): the value w.phi_q at the last column (value tasks).

A layer runs k steps (`steps`). Its first step takes the errors as it finds them in its input stream, the
following steps recompute them; every step reads the transitions (phi_i, gamma phi'_i, r_i) from the
stream's context columns. So an edit of layer l's context columns reaches the output through layer l + 1,
as in the papers' constructions. The step sizes are parameters (`alpha`, `beta`): the random-init copy
of a teacher (`models.random_init`) sets them to 0, a model that does nothing.
"""
from __future__ import annotations

import torch
from torch import nn

from ..core.errors import UserError
from ..models.hooks import HookedRootModule, HookPoint  # TL's hook API without importing TL (cold start)

ERRORS = ("td", "mc")
"""The quantity a linear teacher updates with: the TD error delta_i, or the Monte-Carlo error G_i - w.phi_i."""
DIRECTIONS = ("phi", "trace", "residual")
"""What the error multiplies: phi_i (TD(0), SARSA), the eligibility trace e_i (TD(lambda)), or
phi_i - gamma' phi'_i (residual gradient)."""
BOOTSTRAPS = ("sample", "expected", "max")
"""The successor value of the TD error: w.phi'_i of the sampled next action, the mean over the next state's
actions (expected SARSA under the uniform behaviour policy), or their max (Q-learning)."""


class HookBlock(nn.Module):
    """The hook points of one layer (the computation lives in the zoo module's `layer`)."""

    def __init__(self):
        super().__init__()
        self.hook_resid_pre = HookPoint()
        self.hook_resid_post = HookPoint()


class Rows(nn.Module):
    """The readout: the given rows of a residual vector (the model's `unembed`, hence its logit lens)."""

    def __init__(self, rows: list[int]):
        super().__init__()
        self.register_buffer("index", torch.tensor(list(rows), dtype=torch.long))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h.index_select(-1, self.index)


class ZooModule(HookedRootModule):
    """A stack of `n_layers` layers over the residual stream described in the module docstring."""

    def __init__(self, layout, gamma: float, n_layers: int, p: int, value_output: bool):
        super().__init__()
        if int(n_layers) < 1:
            raise UserError(f"a zoo model needs at least one layer, got {n_layers}")
        self.task_layout, self.gamma = layout, float(gamma)
        self.D, self.p = layout.d_model, int(p)
        self.W = slice(self.D, self.D + self.p)
        self.ERR, self.OUT = self.D + self.p, self.D + self.p + 1
        self.width = self.D + self.p + 2
        self.value_output = bool(value_output)
        self.blocks = nn.ModuleList(HookBlock() for _ in range(int(n_layers)))
        self.unembed = Rows([self.OUT] if value_output else list(range(self.D, self.D + self.p)))
        self.setup()

    # ---- the prompt rows of a stream x [B, pos, F] (or of the prompt z itself)
    def block(self, x: torch.Tensor, name: str, context: bool = True) -> torch.Tensor:
        s = self.task_layout.slice(name)
        return x[:, :-1, s] if context else x[:, -1, s]

    def transitions(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(phi [B, n, d], phi' [B, n, d], r [B, n]) of the context columns (phi' unscaled by the task's gamma)."""
        return self.block(x, "phi"), self.block(x, "gamma_phi_next") / self.gamma, self.block(x, "reward")[..., 0]

    def embed(self, z: torch.Tensor) -> torch.Tensor:
        x = z.new_zeros(z.shape[0], z.shape[1], self.width)
        x[..., : self.D] = z
        return x

    def layer(self, l: int, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = self.embed(z)
        for l, block in enumerate(self.blocks):
            x = block.hook_resid_post(self.layer(l, block.hook_resid_pre(x)))
        return self.unembed(x[:, -1])


def discount_matrix(n: int, factor: float, dtype, device, upper: bool) -> torch.Tensor:
    """[n, n] factor^(j - i) for j >= i (upper: returns G = M r) or factor^(i - j) for j <= i (lower: traces
    e = M phi); 0 elsewhere. 0^0 = 1, so factor 0 gives the identity."""
    i = torch.arange(n, device=device)
    gap = (i[None, :] - i[:, None]) if upper else (i[:, None] - i[None, :])
    keep = gap >= 0
    return torch.where(keep, torch.tensor(float(factor), dtype=dtype, device=device) ** gap.clamp(min=0).to(dtype),
                       torch.zeros((), dtype=dtype, device=device))


class LinearTeacher(ZooModule):
    """w_{t+1} = w_t + (alpha/n) sum_i e_i(w_t) u_i, k steps per layer (docs/zoo.md, "Exact teachers").

    `error` 'td': e_i = r_i + gamma' v'_i - w.phi_i (v'_i by `bootstrap`), or 'mc': e_i = G_i - w.phi_i with
    G_i = sum_{j >= i} gamma'^(j - i) r_j. `direction`: u_i = phi_i, the trace sum_{j <= i} (gamma' lam)^(i - j) phi_j,
    or phi_i - gamma' phi'_i. Parameters start at 0 (value tasks) or at the prompt's w (control tasks); with
    `actor` (actor-critic tasks) the critic steps by `beta` and the actor lam += (alpha/n) sum_i delta_i s_i with
    s_i the prompt's discounted score gamma^i g_i."""

    def __init__(self, layout, gamma: float, n_layers: int, *, alpha: float, gamma_prime: float | None = None,
                 steps: int = 1, error: str = "td", direction: str = "phi", lam: float = 0.0,
                 bootstrap: str = "sample", n_actions: int | None = None, actor: bool = False,
                 beta: float | None = None):
        names = set(layout.names)
        value = "w" not in names
        d = layout.size("phi")
        m = layout.size("lam") if actor else 0
        super().__init__(layout, gamma, n_layers, d + m, value)
        if error not in ERRORS or direction not in DIRECTIONS or bootstrap not in BOOTSTRAPS:
            raise UserError(f"unknown teacher kind {(error, direction, bootstrap)}")
        if bootstrap != "sample" and not n_actions:
            raise UserError("expected-SARSA and Q-learning teachers need the number of actions")
        self.alpha = nn.Parameter(torch.tensor(float(alpha), dtype=torch.float64), requires_grad=False)
        self.beta = nn.Parameter(torch.tensor(float(alpha if beta is None else beta), dtype=torch.float64),
                                 requires_grad=False)
        self.gamma_prime = float(gamma if gamma_prime is None else gamma_prime)
        self.steps, self.error, self.direction, self.lam = int(steps), error, direction, float(lam)
        self.bootstrap, self.n_actions, self.actor, self.d = bootstrap, n_actions, bool(actor), d

    # ---- the algorithm
    def successor_values(self, phi_next: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """[B, n] the bootstrap value of each transition's successor."""
        if self.bootstrap == "sample":
            return (phi_next * w[:, None]).sum(-1)
        B, n, d = phi_next.shape
        A = int(self.n_actions)
        at_state = phi_next.reshape(B, n, d // A, A).sum(-1)  # one-hot state-action features: the next state
        q = w.reshape(B, d // A, A)
        per_state = q.mean(-1) if self.bootstrap == "expected" else q.max(-1).values
        return (at_state * per_state[:, None]).sum(-1)

    def errors(self, x: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        phi, phi_next, r = self.transitions(x)
        w = params[:, : self.d]
        v = (phi * w[:, None]).sum(-1)
        if self.error == "mc":
            G = discount_matrix(r.shape[1], self.gamma_prime, r.dtype, r.device, upper=True)
            return r @ G.T - v
        return r + self.gamma_prime * self.successor_values(phi_next, w) - v

    def update(self, x: torch.Tensor, params: torch.Tensor, err: torch.Tensor) -> torch.Tensor:
        phi, phi_next, _ = self.transitions(x)
        n = phi.shape[1]
        if self.direction == "trace":
            u = discount_matrix(n, self.gamma_prime * self.lam, phi.dtype, phi.device, upper=False) @ phi
        elif self.direction == "residual":
            u = phi - self.gamma_prime * phi_next
        else:
            u = phi
        step = self.beta if self.actor else self.alpha
        w = params[:, : self.d] + (step.to(phi.dtype) / n) * (err[:, :, None] * u).sum(1)
        if not self.actor:
            return w
        lam = params[:, self.d:] + (self.alpha.to(phi.dtype) / n) * (err[:, :, None] * self.block(x, "score")).sum(1)
        return torch.cat([w, lam], -1)

    def start(self, z: torch.Tensor) -> torch.Tensor:
        """[B, p] the parameters before any step: 0, or the prompt's w (and lam)."""
        if self.value_output:
            return z.new_zeros(z.shape[0], self.p)
        parts = [self.block(z, "w", context=False)] + ([self.block(z, "lam", context=False)] if self.actor else [])
        return torch.cat(parts, -1)

    # ---- the stream
    def write(self, x: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
        out = x.clone()
        out[:, -1, self.W] = params
        out[:, :-1, self.ERR] = self.errors(x, params)
        if self.value_output:
            out[:, -1, self.OUT] = (self.block(x, "phi", context=False) * params).sum(-1)
        return out

    def embed(self, z: torch.Tensor) -> torch.Tensor:
        return self.write(super().embed(z), self.start(z))

    def layer(self, l: int, x: torch.Tensor) -> torch.Tensor:
        params = x[:, -1, self.W]
        err = x[:, :-1, self.ERR]
        for s in range(self.steps):
            if s:
                err = self.errors(x, params)
            params = self.update(x, params, err)
        return self.write(x, params)


class LSTDTeacher(LinearTeacher):
    """Every layer writes the LSTD solution w = A^+ b, A = (1/n) sum_i phi_i (phi_i - gamma' phi'_i)^T,
    b = (1/n) sum_i r_i phi_i (the fixed point of batch TD(0) with discount gamma')."""

    def __init__(self, layout, gamma: float, n_layers: int, *, gamma_prime: float | None = None):
        super().__init__(layout, gamma, n_layers, alpha=1.0, gamma_prime=gamma_prime)

    def layer(self, l: int, x: torch.Tensor) -> torch.Tensor:
        phi, phi_next, r = self.transitions(x)
        n = phi.shape[1]
        A = phi.transpose(1, 2) @ (phi - self.gamma_prime * phi_next) / n
        b = (phi * r[..., None]).sum(1) / n
        w = (torch.linalg.pinv(A) @ b[..., None])[..., 0] * self.alpha.to(phi.dtype)  # alpha: 0 at random init
        return self.write(x, w)


# ------------------------------------------------------------------ by name
KINDS = {
    "td0": {}, "batch_sarsa": {}, "residual_gradient": {"direction": "residual"}, "mc_regression": {"error": "mc"},
    "expected_sarsa": {"bootstrap": "expected"}, "q_learning": {"bootstrap": "max"}, "actor_critic": {"actor": True},
}
"""Candidate name -> the `LinearTeacher` that runs it (plus `td_lambda_<l>`: traces with lambda l; `lstd`)."""


def build(algorithm: str, layout, task_gamma: float, n_layers: int = 1, *, n_actions: int | None = None,
          **params) -> ZooModule:
    """The teacher running `algorithm` (a verdict candidate name) on prompts of `layout` whose discount is
    `task_gamma`. `params`: alpha, gamma (gamma', default the task's), lambda, steps (or steps_per_layer), beta."""
    known = {"alpha", "gamma", "lambda", "steps", "steps_per_layer", "beta"}
    if set(params) - known:
        raise UserError(f"teacher parameters {sorted(set(params) - known)} unknown (known: {sorted(known)})")
    gamma_prime = params.get("gamma")
    if algorithm == "lstd":
        return LSTDTeacher(layout, task_gamma, n_layers, gamma_prime=gamma_prime)
    kw = dict(KINDS.get(algorithm, {}))
    lam = params.get("lambda", 0.0)
    if algorithm.startswith("td_lambda_"):
        kw["direction"], lam = "trace", float(algorithm.removeprefix("td_lambda_"))
    elif algorithm not in KINDS:
        raise UserError(f"no teacher runs {algorithm!r} (known: {', '.join([*KINDS, 'td_lambda_<l>', 'lstd'])})")
    return LinearTeacher(layout, task_gamma, n_layers, alpha=params.get("alpha", 1.0), gamma_prime=gamma_prime,
                         steps=params.get("steps_per_layer", params.get("steps", 1)), lam=lam,
                         beta=params.get("beta"), n_actions=n_actions, **kw)


def make(algorithm: str, *, n_layers: int = 1, task: dict | None = None, **params) -> ZooModule:
    """`build` on the task a teacher of `algorithm` runs on (`zoo.tasks.config_for`), in float64."""
    from .tasks import config_for

    config = config_for(algorithm, task)
    return build(algorithm, config.model.layout, float(config.model.gamma), n_layers,
                 n_actions=config.task.n_actions, **params)
