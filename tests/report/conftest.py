"""One report built per session, shared by the figure, HTML and browser tests (drawing is the slow part)."""
from __future__ import annotations

import pytest
import report_fake as F

from icrl_interp.report import ReportConfig, build_report


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """θ* + two seeds of a sarsa run, softmax recordings at two context lengths, and two broken inputs."""
    root = tmp_path_factory.mktemp("report")
    F.write_run(root / "in" / "s0", "sarsa", 0, [10, 20, 30])
    F.write_run(root / "in" / "s1", "sarsa", 1, [10, 20, 30])
    F.write_checkpoint(root / "in" / "theta", F.make_analysis("sarsa", "theta_star", 1.0),
                       {"family": "sarsa", "origin": {"kind": "theta_star"}})
    for i, n in enumerate((8, 16)):
        F.write_recording(root / "in" / f"rec{n}.h5", F.make_analysis("softmax-td", "trained", 0.6 + 0.2 * i), n=n, seed=i)
    (root / "in" / "corrupt.h5").write_bytes(b"<script>alert(1)</script>")
    config = ReportConfig(workers=1, analyzer="report_fake:analyze", progress=False, title="Test <report>")
    outcome = build_report([root / "in", root / "missing & gone"], root / "out", config)
    return outcome
