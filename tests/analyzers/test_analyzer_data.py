"""The test fixtures' numpy forwards are theta*-exact: they reproduce the reference algorithms."""
from __future__ import annotations

import numpy as np
import pytest

from . import analyzer_data as D


@pytest.mark.parametrize("family", ["linear-td", "softmax-td", "sarsa"])
def test_fixture_forward_runs_the_reference_algorithm(family):
    cfg = D.config_for(family)
    lay = D.layout_of(cfg)
    pb = D.sample(cfg, 16, 3)
    layers = D.forward(cfg, pb.prompt.z, D.theta_params(cfg))
    ref = pb.reference
    n = pb.prompt.z.shape[1] - 1
    for l, (_, _, z) in enumerate(layers):
        if family == "linear-td":
            np.testing.assert_allclose(z[:, :n, lay.slice("reward")][..., 0], ref["td_errors"][:, l + 1], atol=1e-12)
            np.testing.assert_allclose(lay.readout(z)[:, 0], ref["values"][:, l + 1, 0], atol=1e-12)
        elif family == "softmax-td":
            np.testing.assert_allclose(z[:, :, lay.slice("current_mem").start], ref["values"][:, l + 1], atol=1e-12)
        else:
            np.testing.assert_allclose(lay.readout(z), ref["output"], atol=1e-12)
    if family == "sarsa":  # the query row of the scores is c * delta (c = 1 here)
        scores = layers[0][0]
        np.testing.assert_allclose(scores[:, 0, -1, :n], ref["td_errors"][:, 0], atol=1e-12)
