"""`icrl-interp inspect` prints a checkpoint's config and parameter shapes (text or JSON) and refuses
anything that is not a checkpoint in one line."""
from __future__ import annotations

import json

from icrl_interp.models import checkpoint
from icrl_interp import cli


def _cli(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_inspect_prints_config_and_parameters(tmp_path, capsys):
    out = tmp_path / "ck"
    assert _cli(capsys, "construct", "softmax-td", "--out", str(out), "--no-tied", "--n-layers", "2", "--form", "dual")[0] == 0
    rc, text, _ = _cli(capsys, "inspect", str(out))
    assert rc == 0
    for word in ("softmax-td", "dual", checkpoint.sha256(out), "current_mem [7, 8)", "blocks.1.attn.V_target", "8x8"):
        assert word in text
    rc, text, _ = _cli(capsys, "inspect", str(out), "--json", str(tmp_path / "i.json"))
    data = json.loads((tmp_path / "i.json").read_text())
    assert rc == 0 and "current_mem [7, 8)" in text  # the text is printed too
    assert data["parameters"]["blocks.0.attn.A"]["shape"] == [8, 8] and data["parameters"]["blocks.0.attn.A"]["nonzeros"] == 5
    assert data["config"]["model"]["form"] == "dual" and data["sha256"] == checkpoint.sha256(out)


def test_inspect_refuses_non_checkpoints(tmp_path, capsys):
    (tmp_path / "weights.pt").write_bytes(b"\x80\x04\x95\x00")
    rc, _, err = _cli(capsys, "inspect", str(tmp_path / "weights.pt"))
    assert rc == 2 and "pickle" in err and err.count("\n") == 1
    rc, _, err = _cli(capsys, "inspect", str(tmp_path))
    assert rc == 2 and "weights.pt" in err
    rc, _, err = _cli(capsys, "construct", "gpt2", "--out", str(tmp_path / "x"))
    assert rc == 2 and "gpt2" in err and err.count("\n") == 1
