"""Known answers for value errors, VD/SS/IWS and the implicit weight of a linear-attention TD model."""
from __future__ import annotations

import numpy as np
import pytest

from icrl_interp.tasks import reference
from icrl_interp.families import linear_td
from icrl_interp.analyzers import convergence as C
from icrl_interp.core.errors import UserError

from . import analyzer_data as D


def test_state_values_and_value_errors_known_answers():
    v_pos = np.array([[1.0, 3.0, 2.0, 5.0]])
    states = np.array([[0, 0, 1, -1]])  # the last column has no label
    v = C.state_values(v_pos, states, 3)
    np.testing.assert_array_equal(v, [[2.0, 2.0, np.nan]])  # exact here and below: small dyadic numbers
    v_true = np.array([[1.0, 2.5, 7.0]])
    mu = np.array([[0.6, 0.2, 0.2]])
    inf, rms = C.value_errors(v, v_true, mu)
    assert inf[0] == 1.0  # state 2 is not covered, so it does not count
    assert rms[0] == pytest.approx(np.sqrt((0.6 * 1.0 + 0.2 * 0.25) / 0.8))
    inf, rms = C.value_errors(np.full((1, 3), np.nan), v_true, mu)
    assert np.isnan(inf[0]) and np.isnan(rms[0])


def test_teacher_distance():
    dist, rel = C.teacher_distance(np.array([[3.0, 4.0], [1.0, 1.0]]), np.array([[0.0, 0.0], [1.0, 2.0]]))
    np.testing.assert_allclose(dist, [5.0, 1.0])
    assert np.isnan(rel[0]) or np.isinf(rel[0])
    assert rel[1] == pytest.approx(1 / np.sqrt(5))


def test_vd_ss_iws_known_answers(rng):
    B, S, d = 4, 7, 3
    phi = rng.standard_normal((B, S, d))
    mu = rng.dirichlet(np.ones(S), size=B)
    w = rng.standard_normal((B, d))
    v = np.einsum("bsd,bd->bs", phi, w)
    g = np.broadcast_to(w[:, None], (B, S, d))
    m = C.vd_ss_iws(v, v, g, g, phi, mu, w)
    np.testing.assert_allclose(m["VD"], 0.0, atol=1e-28)
    np.testing.assert_allclose(m["SS"], 1.0, atol=1e-14)
    np.testing.assert_allclose(m["IWS"], 1.0, atol=1e-12)
    # v_tf = v_td + eps: VD = eps^2; gradients reversed: SS = -1; v_tf = 2 v_td: IWS = 1 (scale-free)
    m = C.vd_ss_iws(v + 0.1, v, -g, g, phi, mu, w)
    np.testing.assert_allclose(m["VD"], 0.01, rtol=1e-12)
    np.testing.assert_allclose(m["SS"], -1.0, atol=1e-14)
    np.testing.assert_allclose(C.vd_ss_iws(2 * v, v, g, g, phi, mu, w)["IWS"], 1.0, atol=1e-12)
    # the weighted least squares weight is exact for a representable v
    np.testing.assert_allclose(C.wls_weights(phi, mu, v), w, atol=1e-10)


@pytest.mark.parametrize("n_layers", [1, 2, 5])
def test_implicit_weight_of_theta_star_is_the_batch_td_weight(n_layers, rng):
    B, n, d, gamma, alpha = 7, 9, 3, 0.8, 0.3
    lay = linear_td.layout(d)
    phi, phi_next = rng.standard_normal((B, n, d)), rng.standard_normal((B, n, d))
    r, q = rng.standard_normal((B, n)), rng.standard_normal((B, d))
    z = linear_td.prompt(phi, phi_next, r, q, gamma).z
    m = linear_td.theta_star(d, alpha)
    layers = D.wang_forward(z, m["P"], m["Q"], n_layers)
    ctx = [z[:, :n]] + [zz[:, :n] for _, _, zz in layers[:-1]]
    w_tf = C.linear_td_query_weights(ctx, [m["P"]] * n_layers, [m["Q"]] * n_layers, lay)
    trace = reference.batch_td(phi, phi_next, r, q, gamma, alpha, n_layers)
    np.testing.assert_allclose(w_tf, trace.w[:, n_layers], atol=1e-10)


def test_implicit_weight_reproduces_the_output_of_any_linear_model(rng):
    """For arbitrary (untied) P_l, Q_l the query value is w_tf . phi_q exactly."""
    B, n, d, L = 5, 8, 2, 3
    lay = linear_td.layout(d)
    z = linear_td.prompt(rng.standard_normal((B, n, d)), rng.standard_normal((B, n, d)), rng.standard_normal((B, n)),
                          rng.standard_normal((B, d)), 0.9).z
    Ps = [0.3 * rng.standard_normal((lay.d_model,) * 2) for _ in range(L)]
    Qs = [0.3 * rng.standard_normal((lay.d_model,) * 2) for _ in range(L)]
    zz, ctx = z, []
    for P, Q in zip(Ps, Qs):
        ctx.append(zz[:, :n])
        zz = D.wang_forward(zz, P, Q, 1)[0][2]
    w_tf = C.linear_td_query_weights(ctx, Ps, Qs, lay)
    np.testing.assert_allclose((w_tf * z[:, -1, lay.slice("phi")]).sum(-1), lay.readout(zz)[:, 0], atol=1e-10)
    with pytest.raises(UserError, match="one context"):
        C.linear_td_query_weights(ctx, Ps[:1], Qs, lay)


def test_state_bins_are_built_once_per_chunk_and_positions():
    """`StateBins.for_chunk` gives every layer of a chunk the same bins for the same positions (built once), and
    other positions their own; its per-state means are `state_values`'s, bit for bit."""
    rng = np.random.default_rng(0)
    states = rng.integers(-1, 4, size=(6, 9))
    shared: dict = {}
    first, second = np.arange(0, 9, 2), np.arange(1, 9, 2)  # as many positions, other ones
    a = C.StateBins.for_chunk(shared, states[:, first], 4, first.tobytes())
    assert C.StateBins.for_chunk(shared, states[:, first], 4, first.tobytes()) is a
    b = C.StateBins.for_chunk(shared, states[:, second], 4, second.tobytes())
    assert b is not a and len(shared) == 2
    for bins, p in ((a, first), (b, second)):
        v = rng.standard_normal((6, p.size))
        np.testing.assert_array_equal(bins.means(v), C.state_values(v, states[:, p], 4))  # exact: the same bincounts
        np.testing.assert_array_equal(bins.counts, [[(states[i, p] == s).sum() for s in range(4)] for i in range(6)])
