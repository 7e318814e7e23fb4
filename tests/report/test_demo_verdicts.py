"""The demo judges each recording's algorithm (`demo.write_verdicts`) so that its summary opens with the answers:
NAME.h5 -> NAME.verdict.json beside it (paired with NAME by `report.answers.model_name`); a verdict that fails is
one printed line and the rest goes on. The verdict itself is stubbed here (it is tested in tests/verdicts/)."""
from __future__ import annotations

import json

from icrl_interp.report import answers, demo
from icrl_interp.report.batch import ReportInput, Result
from icrl_interp.verdicts import causal_evidence


def test_each_recording_gets_its_verdict_beside_it_and_a_failure_is_one_line(tmp_path, monkeypatch, capsys):
    good, bad = tmp_path / "theta_star-linear-td.h5", tmp_path / "trained-sarsa-sarsa.h5"

    def fake_verdict(source, **options):
        if source == bad:
            raise ValueError("too many values to unpack\nsecond line")
        assert options == {"progress": False}
        return {"schema": "icrl_interp.verdict/1", "source": str(source), "verdict": {"text": "td0"}}

    monkeypatch.setattr(causal_evidence, "verdict", fake_verdict)
    written = demo.write_verdicts([good, bad])
    assert written == [tmp_path / "theta_star-linear-td.verdict.json"]
    assert json.loads(written[0].read_text())["source"] == str(good)
    out = capsys.readouterr().out
    assert "verdict: trained-sarsa-sarsa: not reached: ValueError: too many values to unpack\n" in out
    assert not (tmp_path / "trained-sarsa-sarsa.verdict.json").exists()
    # the report pairs the verdict with the recording's model name
    assert answers.model_name(Result(ReportInput(written[0], "verdict"), "ok")) == "theta_star-linear-td"
