"""The zoo's exact teachers and decoys against their own float64 numpy re-derivations (written here with plain
loops, from the math of docs/concepts.md and docs/verdict.md, not with candidates.py or reference.py), on
random prompts: every layer's residual stream (parameters, errors, output) and the output."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from icrl_interp.models.construct import task_config
from icrl_interp.zoo import decoys, tasks, teachers

TOL = 1e-10
"""Float64 teachers against float64 loops: both sum a few hundred O(1) products (rounding ~1e-14)."""


def _config(algorithm: str, **task):
    return task_config(tasks.family_of(algorithm), task)


def _random_value_prompts(layout, B=5, n=12, seed=0):
    """Random prompts of a value layout: Gaussian phi, gamma*phi', r and query features."""
    g = np.random.default_rng(seed)
    return g.standard_normal((B, n + 1, layout.d_model))


def _sampled(config, B=5, seed=0):
    return config.sample(B, np.random.default_rng(seed)).prompt.z.astype(np.float64)


def _split(z, layout, gamma):
    ctx = z[:, :-1]
    phi = ctx[..., layout.slice("phi")]
    phin = ctx[..., layout.slice("gamma_phi_next")] / gamma
    r = ctx[..., layout.slice("reward")][..., 0]
    return phi, phin, r


def numpy_run(z, layout, gamma, algorithm, steps, alpha=1.0, gp=None, lam=0.0, beta=None, A=None):
    """[B, steps + 1, p] parameters and [B, steps + 1, n] errors of `algorithm` after each step, by loops."""
    gp = gamma if gp is None else gp
    phi, phin, r = _split(z, layout, gamma)
    B, n, d = phi.shape
    names = set(layout.names)
    actor = "lam" in names
    params_all, errs_all = [], []
    for b in range(B):
        w = np.zeros(d) if "w" not in names else z[b, -1, layout.slice("w")].copy()
        lamv = z[b, -1, layout.slice("lam")].copy() if actor else np.zeros(0)
        ps, es = [], []
        for t in range(steps + 1):
            err = np.zeros(n)
            for i in range(n):
                if algorithm == "mc_regression":
                    G = sum(gp ** (j - i) * r[b, j] for j in range(i, n))
                    err[i] = G - phi[b, i] @ w
                    continue
                if algorithm in ("expected_sarsa", "q_learning"):
                    s_next = int(np.argmax(phin[b, i])) // A
                    q = w[s_next * A:(s_next + 1) * A]
                    nxt = q.mean() if algorithm == "expected_sarsa" else q.max()
                else:
                    nxt = phin[b, i] @ w
                err[i] = r[b, i] + gp * nxt - phi[b, i] @ w
            if algorithm == "lstd":
                Am = sum(np.outer(phi[b, i], phi[b, i] - gp * phin[b, i]) for i in range(n)) / n
                bv = sum(r[b, i] * phi[b, i] for i in range(n)) / n
                w = np.linalg.solve(Am, bv)
                err = np.array([r[b, i] + gp * phin[b, i] @ w - phi[b, i] @ w for i in range(n)])
                ps.append(w.copy())
                es.append(err)
                continue
            ps.append(np.concatenate([w, lamv]))
            es.append(err)
            if t == steps:
                break
            trace = np.zeros(d)
            dw, dl = np.zeros(d), np.zeros_like(lamv)
            for i in range(n):
                trace = gp * lam * trace + phi[b, i]
                u = {"td_lambda_0.5": trace, "residual_gradient": phi[b, i] - gp * phin[b, i]}.get(algorithm, phi[b, i])
                dw += err[i] * u
                if actor:
                    dl += err[i] * z[b, i, layout.slice("score")]
            w = w + ((beta if actor else alpha) / n) * dw
            lamv = lamv + (alpha / n) * dl
        params_all.append(ps)
        errs_all.append(es)
    return np.array(params_all), np.array(errs_all)


def streams(model, z):
    """The output and every layer's resid_post of a zoo module on prompts z (float64)."""
    with torch.no_grad():
        out, cache = model.run_with_cache(torch.from_numpy(z))
    return out.numpy(), [cache[f"blocks.{l}.hook_resid_post"].numpy() for l in range(len(model.blocks))]


def check_layers(model, z, P, E, k, value_query=None):
    """Every layer l holds the parameters and errors after (l + 1) k steps; the output is the last layer's."""
    out, resid = streams(model, z)
    for l, x in enumerate(resid):
        t = (l + 1) * k
        np.testing.assert_allclose(x[:, -1, model.W], P[:, t], rtol=0, atol=TOL)
        np.testing.assert_allclose(x[:, :-1, model.ERR], E[:, t], rtol=0, atol=TOL)
    last = P[:, len(resid) * k]
    want = (last * value_query).sum(-1, keepdims=True) if value_query is not None else last
    np.testing.assert_allclose(out, want, rtol=0, atol=TOL)
    return out


VALUE_CASES = [("td0", 3, 1, 1.0, None, 0.0), ("td0", 2, 2, 0.5, 0.5, 0.0), ("td0", 2, 4, 0.3, 0.7, 0.0),
               ("td_lambda_0.5", 3, 1, 1.0, None, 0.5), ("mc_regression", 3, 1, 0.8, None, 0.0),
               ("residual_gradient", 2, 2, 0.7, 0.5, 0.0), ("lstd", 2, 1, 1.0, 0.6, 0.0)]


@pytest.mark.parametrize("algorithm, layers, k, alpha, gp, lam", VALUE_CASES)
def test_value_teacher_matches_its_numpy_rederivation_at_every_layer(algorithm, layers, k, alpha, gp, lam):
    config = _config("td0", d=3, n=12, gamma=0.9)
    lay = config.model.layout
    z = _random_value_prompts(lay)
    params = {"alpha": alpha, "steps_per_layer": k, **({"gamma": gp} if gp is not None else {})}
    model = teachers.build(algorithm, lay, 0.9, layers, **params)
    P, E = numpy_run(z, lay, 0.9, algorithm, layers * k, alpha=alpha, gp=gp, lam=lam)
    check_layers(model, z, P, E, k, value_query=z[:, -1, lay.slice("phi")])


def test_discount_and_step_size_are_applied_not_ignored():
    """The mutants 'gamma' ignored' and 'alpha misapplied' (alpha/n dropped, alpha squared): the teacher with
    gamma' 0.5 on gamma 0.9 prompts differs from TD(0) at 0.9 by far more than the tolerance, and so does alpha 0.5
    from alpha 1, while each matches its own re-derivation (the test above)."""
    config = _config("td0", d=3, n=12, gamma=0.9)
    lay = config.model.layout
    z = _random_value_prompts(lay, seed=1)
    run = lambda **p: streams(teachers.build("td0", lay, 0.9, 2, **p), z)[0]  # noqa: E731
    assert np.abs(run(alpha=1.0, gamma=0.5) - run(alpha=1.0)).max() > 1e3 * TOL
    assert np.abs(run(alpha=0.5) - run(alpha=1.0)).max() > 1e3 * TOL
    P, _ = numpy_run(z, lay, 0.9, "td0", 2, alpha=0.5, gp=0.5)
    np.testing.assert_allclose(run(alpha=0.5, gamma=0.5)[:, 0], (P[:, 2] * z[:, -1, lay.slice("phi")]).sum(-1),
                               rtol=0, atol=TOL)


@pytest.mark.parametrize("algorithm, layers, k, alpha", [("batch_sarsa", 2, 2, 0.5), ("expected_sarsa", 1, 1, 1.0),
                                                         ("q_learning", 2, 1, 0.7)])
def test_control_teacher_matches_its_numpy_rederivation(algorithm, layers, k, alpha):
    config = _config("batch_sarsa", n_states=3, n_actions=2, n=10)
    lay, gamma = config.model.layout, float(config.model.gamma)
    z = _sampled(config)
    z[:, -1, lay.slice("w")] = np.random.default_rng(3).standard_normal((z.shape[0], lay.size("w")))  # w0 != 0
    model = teachers.build(algorithm, lay, gamma, layers, n_actions=2, alpha=alpha, steps_per_layer=k)
    P, E = numpy_run(z, lay, gamma, algorithm, layers * k, alpha=alpha, A=2)
    check_layers(model, z, P, E, k)


def test_expected_sarsa_and_q_learning_differ_from_sarsa():
    """The bootstraps are not the sampled next action's (a mutant that ignored `bootstrap` would pass above only
    if all three coincided; they do not on these prompts)."""
    config = _config("batch_sarsa", n_states=3, n_actions=2, n=10)
    lay, gamma = config.model.layout, float(config.model.gamma)
    z = _sampled(config, seed=2)
    z[:, -1, lay.slice("w")] = np.random.default_rng(4).standard_normal((z.shape[0], lay.size("w")))
    outs = [streams(teachers.build(a, lay, gamma, 1, n_actions=2), z)[0]
            for a in ("batch_sarsa", "expected_sarsa", "q_learning")]
    assert np.abs(outs[0] - outs[1]).max() > 1e-3 and np.abs(outs[0] - outs[2]).max() > 1e-3
    assert np.abs(outs[1] - outs[2]).max() > 1e-3


def test_actor_critic_teacher_matches_its_numpy_rederivation():
    config = _config("actor_critic", n_states=3, n_actions=2, n=10)
    lay, gamma = config.model.layout, float(config.model.gamma)
    z = _sampled(config)
    model = teachers.build("actor_critic", lay, gamma, 2, alpha=2.0, beta=0.5)
    P, E = numpy_run(z, lay, gamma, "actor_critic", 2, alpha=2.0, beta=0.5)
    check_layers(model, z, P, E, 1)
    assert np.abs(P[:, 2, lay.size("w"):] - P[:, 0, lay.size("w"):]).max() > 1e-3  # the actor moved


def test_first_step_of_a_layer_reads_the_errors_from_the_stream():
    """The layer uses the error row it is given (so a causal edit there reaches the output): zeroing it at
    layer 0's output leaves layer 1 with no update from its first step."""
    config = _config("td0", d=3, n=12, gamma=0.9)
    lay = config.model.layout
    z = torch.from_numpy(_random_value_prompts(lay))
    model = teachers.build("td0", lay, 0.9, 2)

    def zero_err(x, hook):
        x = x.clone()
        x[:, :-1, model.ERR] = 0
        return x

    with torch.no_grad():
        edited = model.run_with_hooks(z, fwd_hooks=[("blocks.0.hook_resid_post", zero_err)])
        _, cache = model.run_with_cache(z)
    one_step = cache["blocks.0.hook_resid_post"][:, -1, model.OUT]
    np.testing.assert_allclose(edited[:, 0].numpy(), one_step.numpy(), rtol=0, atol=TOL)


# ------------------------------------------------------------------ decoys
def test_decoys_compute_what_they_claim():
    config = _config("td0", d=3, n=12, gamma=0.8)
    lay = config.model.layout
    z = _sampled(config, B=6)
    phi, _, r = _split(z, lay, 0.8)
    q = z[:, -1, lay.slice("phi")]
    dist = ((phi - q[:, None]) ** 2).sum(-1)
    nearest = np.array([r[b][np.isclose(dist[b], dist[b].min(), rtol=0, atol=1e-9)].mean() for b in range(len(z))])
    want = {"LastReward": r[:, -1], "MeanReward": r.mean(1) / 0.2,
            "DiscountedSum": np.array([sum(0.8 ** i * r[b, i] for i in range(r.shape[1])) for b in range(len(z))]),
            "NearestReward": nearest}
    for name, expected in want.items():
        model = getattr(decoys, name)(lay, 0.8, 2)
        out, resid = streams(model, z)
        np.testing.assert_allclose(out[:, 0], expected, rtol=0, atol=TOL, err_msg=name)
        for x in resid:  # every layer writes it
            np.testing.assert_allclose(x[:, -1, model.OUT], expected, rtol=0, atol=TOL, err_msg=name)
    assert not np.allclose(want["NearestReward"], want["LastReward"])


def test_input_ridge_decoy_is_the_least_squares_fit_of_the_value_on_the_summary():
    config = _config("td0", d=3, n=12, gamma=0.9)
    lay = config.model.layout
    batch = config.sample(200, np.random.default_rng(5))
    z = batch.prompt.z.astype(np.float64)
    target = batch.tasks["values"][np.arange(200), batch.prompt.states[:, -1]]
    coef, icpt = decoys.fit_ridge(z, target, penalty=1e-3)
    S = np.concatenate([z[:, :-1].mean(1), z[:, -1]], -1)
    resid = target - (S @ coef + icpt)
    # the normal equations of the centred ridge: S_c^T resid = penalty * coef, and the residual has mean 0
    np.testing.assert_allclose((S - S.mean(0)).T @ resid, 1e-3 * coef, rtol=0, atol=1e-8)
    assert abs(resid.mean()) < 1e-10
    model = decoys.InputRidge(lay, 0.9, coef, icpt)
    np.testing.assert_allclose(streams(model, z)[0][:, 0], S @ coef + icpt, rtol=0, atol=TOL)


def test_immediate_reward_decoy_is_td_with_gamma_prime_zero():
    """Reward regression: the TD teacher with gamma' = 0 equals LMS on the rewards (no successor term)."""
    config = _config("td0", d=3, n=12, gamma=0.9)
    lay = config.model.layout
    z = _random_value_prompts(lay, seed=7)
    phi, _, r = _split(z, lay, 0.9)
    w = np.zeros((z.shape[0], 3))
    for _ in range(2):
        w = w + np.einsum("bn,bnd->bd", r - np.einsum("bnd,bd->bn", phi, w), phi) / 12
    out = streams(teachers.build("td0", lay, 0.9, 2, gamma=0.0), z)[0][:, 0]
    np.testing.assert_allclose(out, (w * z[:, -1, lay.slice("phi")]).sum(-1), rtol=0, atol=TOL)


def test_random_init_copy_of_a_teacher_does_nothing():
    from icrl_interp.models.random_init import random_init_copy

    config = _config("td0", d=3, n=12, gamma=0.9)
    lay = config.model.layout
    z = _random_value_prompts(lay)
    copy, _ = random_init_copy(teachers.build("td0", lay, 0.9, 2), 0)
    assert np.all(streams(copy, z)[0] == 0.0)  # alpha redrawn to 0: exactly no update from w0 = 0
