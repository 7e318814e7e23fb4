"""interchange.agreement on known numbers: R^2 without refit, correlation, relative error, their intervals over the
given resamples, and the undefined cases."""
from __future__ import annotations

import numpy as np
import pytest

from icrl_interp.core.errors import UserError
from icrl_interp.interventions import interchange


def test_agreement_on_known_numbers():
    pred = np.array([[1.0], [2.0], [3.0], [4.0]])
    idx = np.random.default_rng(0).integers(0, 4, size=(200, 4))
    same = interchange.agreement(pred, pred, idx)
    assert same["r2"]["mean"] == 1.0 and same["relative_error"]["mean"] == 0.0  # exact: obs - pred = 0
    assert same["correlation"]["mean"] == pytest.approx(1.0, abs=1e-15)
    half = interchange.agreement(pred / 2, pred, idx)  # half the predicted change transferred
    # R^2 = 1 - sum((p/2 - p)^2) / sum((p/2 - mean)^2) = 1 - (30/4) / (5/4) = -5; relative error (30/4) / 30 = 1/4
    assert half["r2"]["mean"] == pytest.approx(-5.0, rel=1e-14)
    assert half["relative_error"]["mean"] == pytest.approx(0.25, rel=1e-14)
    assert half["correlation"]["mean"] == pytest.approx(1.0, abs=1e-15)  # scale-free
    flipped = interchange.agreement(-pred, pred, idx)
    assert flipped["correlation"]["mean"] == pytest.approx(-1.0, abs=1e-15)
    assert flipped["relative_error"]["mean"] == pytest.approx(4.0, rel=1e-14)
    o, p = np.array([[0.5], [1.0], [4.0], [2.0]]), pred
    got = interchange.agreement(o, p, idx)
    sse, sst = ((o - p) ** 2)[idx].sum((1, 2)), ((o[idx] - o[idx].mean(1, keepdims=True)) ** 2).sum((1, 2))
    ok = sst > 0
    r2 = 1 - sse[ok] / sst[ok]
    np.testing.assert_allclose(got["r2"]["ci"], np.percentile(r2, [2.5, 97.5]), rtol=1e-12)
    oc, pc = o[idx, 0] - o[idx, 0].mean(1, keepdims=True), p[idx, 0] - p[idx, 0].mean(1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        corr = (oc * pc).sum(1) / np.sqrt((oc ** 2).sum(1) * (pc ** 2).sum(1))
    np.testing.assert_allclose(got["correlation"]["ci"], np.percentile(corr[np.isfinite(corr)], [2.5, 97.5]),
                               rtol=1e-12)
    assert got["both_unchanged"] is False


def test_agreement_undefined_cases():
    idx = np.zeros((20, 3), dtype=np.int64)
    z = np.zeros((3, 1))
    none_moved = interchange.agreement(z, np.ones((3, 1)), idx)  # nothing transferred
    assert none_moved["r2"]["mean"] is None and none_moved["relative_error"]["mean"] == 1.0
    both = interchange.agreement(z, z, idx)
    assert both["both_unchanged"] is True and both["relative_error"]["mean"] is None
    with pytest.raises(UserError, match="predicted change has shape"):
        interchange.agreement(z, np.zeros((3, 2)), idx)
