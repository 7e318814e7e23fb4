"""Checkpoint checks given the inputs they exist to refuse, beyond tests/models/test_checkpoint.py's table of
damaged directories: saving a dict of tensors without the model's fields, hashing a directory that
lacks one of the two files.

Mutants caught (tests/mutation.py): `"family" not in fields or "d" not in fields` -> `and`; the
`raise` of `sha256` for a missing file removed (it hashed what was there).
"""
from __future__ import annotations

import numpy as np
import pytest

from icrl_interp.models import checkpoint
from icrl_interp.core.errors import UserError


@pytest.mark.parametrize("extras", [{"family": "linear-td"}, {"d": 3}, {}, None])
def test_saving_a_dict_of_tensors_needs_the_model_fields(tmp_path, extras):
    with pytest.raises(UserError, match="saving a dict of tensors needs the model fields"):
        checkpoint.save({"blocks.0.attn.P": np.eye(5)}, extras, tmp_path / "ck")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("missing", ["config.json", "model.safetensors"])
def test_the_hash_of_a_directory_without_both_files_is_refused(tmp_path, missing):
    from icrl_interp import cli

    ck = tmp_path / "ck"
    assert cli.main(["construct", "linear-td", "--out", str(ck)]) == 0
    whole = checkpoint.sha256(ck)
    (ck / missing).unlink()
    with pytest.raises(UserError, match=f"is not a checkpoint: no {missing}"):
        checkpoint.sha256(ck)
    assert len(whole) == 64
