"""Training objectives of the three families, written against the model API.

A model maps prompts `z[batch, pos, d_model]` to `z_out`; `model.readout(z_out)`
reads the output at the last position (the value estimate for the TD families,
the updated parameters for SARSA). Each objective takes a model and a batch from
`icrl_interp.train.tasks` and returns a scalar loss.

* Wang (c), 'mstde': semi-gradient mean squared TD error over sliding windows,
  delta_t = r(s_q^t) + gamma * stopgrad(v(Z_{t+1})) - v(Z_t); 'msve': (v(Z_t) - v_true(s_q^t))^2.
* Xie (a), 'neu' (project definition; the paper's exact J_{L,n} was not available):
  with the query set to each state s under one context,
  dbar(s) = r(s) + gamma sum_s' P(s, s') v(s') - v(s) and J = E_task sum_s mu(s)^2 dbar(s)^2,
  i.e. ||D_mu dbar||^2, the squared norm of the expected TD update E[delta phi] for one-hot phi.
  Gradients flow through both v(s) and v(s'). 'td': the semi-gradient alternative,
  sum_s mu(s) (r(s) + gamma stopgrad(P v)(s) - v(s))^2.
* Liang-Lai (b): teacher mimicking, E ||TF(H) - w_SARSA||^2 (sum over coordinates, mean over prompts).
"""
from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from .tasks import SarsaBatch, StateQueryBatch, WindowBatch


def _values(model, z: Float[Tensor, "*batch pos d_model"]) -> Float[Tensor, "*batch"]:
    """Scalar readout of a TD-family model for prompts with any leading batch axes."""
    lead = z.shape[:-2]
    out = model.readout(model(z.reshape((-1,) + z.shape[-2:])))
    return out.reshape(lead)


def window_values(model, batch: WindowBatch) -> Float[Tensor, "seqs windows"]:
    """v(Z_t) for every window of every sequence, in one forward pass."""
    return _values(model, batch.z)


def mstde(model, batch: WindowBatch) -> Tensor:
    """Wang et al.'s semi-gradient MSTDE over sliding windows (target values detached)."""
    v = window_values(model, batch)
    delta = batch.query_rewards + batch.gamma * v[:, 1:].detach() - v[:, :-1]
    return delta.pow(2).mean()


def msve(model, batch: WindowBatch) -> Tensor:
    """Mean squared error of v(Z_t) against the true value of each window's query."""
    v = window_values(model, batch)
    return (v - batch.query_values).pow(2).mean()


def expected_td_errors(v: Float[Tensor, "batch states"], batch: StateQueryBatch, semi: bool = False) -> Float[Tensor, "batch states"]:
    """dbar(s) = r(s) + gamma (P v)(s) - v(s); with `semi` the bootstrap term carries no gradient."""
    boot = torch.einsum("bst,bt->bs", batch.P, v.detach() if semi else v)
    return batch.r + batch.gamma * boot - v


def neu(model, batch: StateQueryBatch) -> Tensor:
    """Norm of the expected update: mean over tasks of sum_s mu(s)^2 dbar(s)^2 (full gradient)."""
    dbar = expected_td_errors(_values(model, batch.z), batch)
    return (batch.mu * dbar).pow(2).sum(-1).mean()


def expected_td(model, batch: StateQueryBatch) -> Tensor:
    """Semi-gradient expected TD error: mean over tasks of sum_s mu(s) dbar(s)^2, P v detached."""
    dbar = expected_td_errors(_values(model, batch.z), batch, semi=True)
    return (batch.mu * dbar.pow(2)).sum(-1).mean()


def teacher_mimicking(model, batch: SarsaBatch) -> Tensor:
    """Liang-Lai: mean over prompts of ||TF(H) - w_SARSA||^2."""
    out = model.readout(model(batch.z))
    return (out - batch.target).pow(2).sum(-1).mean()


OBJECTIVES = {
    ("linear-td", "mstde"): mstde,
    ("linear-td", "msve"): msve,
    ("softmax-td", "neu"): neu,
    ("softmax-td", "td"): expected_td,
    ("sarsa", "mimic"): teacher_mimicking,
    ("actor-critic", "mimic"): lambda model, batch: _actor_critic().mimicking_loss(model, batch),
}


def _actor_critic():
    from .. import actor_critic

    return actor_critic


def objective_for(cfg):
    """The loss function a config selects."""
    return OBJECTIVES[(cfg.family, getattr(cfg, "objective", "mimic"))]
