"""The family registry: lookups with one-line errors, registration checks that catch hints naming
blocks or parameters a family does not have, and families loaded from $ICRL_INTERP_FAMILIES."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from icrl_interp.families import registry
from icrl_interp.families import linear_td, sarsa

from helpers import raises_user

FAMILIES_DIR = Path(__file__).parent.parent / "families"


def test_builtin_families_and_their_architectures():
    assert registry.names()[:4] == ["linear-td", "softmax-td", "sarsa", "actor-critic"]
    assert {n: registry.get(n).architecture for n in registry.names()[:4]} == {
        "linear-td": "linear-attention", "softmax-td": "softmax-ictd", "sarsa": "lsa", "actor-critic": "lsa"}
    assert registry.where(lambda f: f.control is not None)[:2] == ["sarsa", "actor-critic"]
    assert registry.architecture("softmax-ictd").parameter_names("dual") == ("A", "V", "V_target")
    assert registry.architecture("softmax-ictd").parameter_names("tsm") == ("A", "V")


@pytest.mark.parametrize("bad", ["gpt2", None, 3])
def test_unknown_names_are_one_line_errors(bad):
    with raises_user("unknown family", "linear-td", "actor-critic") as info:
        registry.get(bad)
    assert "\n" not in str(info.value)
    assert registry.find(bad) is None
    with raises_user("unknown model architecture", "lsa"):
        registry.architecture("rnn")


def _copy(family, **changes):
    return dataclasses.replace(family, name="test-copy", **changes)


@pytest.mark.parametrize("changes, words", [
    ({"architecture": "rnn"}, ["unknown architecture 'rnn'"]),
    ({"hints": registry.Hints(output="query", td_direction={"rewards": 1.0})}, ["blocks rewards", "layout lacks"]),
    ({"hints": registry.Hints(output="positions")}, ["value_block"]),
    ({"hints": registry.Hints(output="parameters")}, ["output_blocks"]),
    ({"hints": registry.Hints(output="scalar")}, ["hints.output"]),
    ({"hints": registry.Hints(output="query", weight_fit=registry.BlockFit(("P", ":", ":"), ("K", ":", ":"), ("P", "K")))},
     ["parameters K", "linear-attention"]),
    ({"hints": registry.Hints(output="query", weight_fit=registry.BlockFit(("P", "phi", ":"), ("Q", ":", ":"), ("P", "Q")))},
     ["block range"]),
    ({"hints": registry.Hints(output="query", lazy_from="param_one")}, ["param_one"]),
])
def test_registration_checks_hints_against_layout_and_architecture(changes, words):
    with raises_user(*words):
        registry.register(_copy(linear_td.FAMILY, **changes))
    assert "test-copy" not in registry.names()


def test_register_replace_and_unregister():
    fam = _copy(sarsa.FAMILY)
    try:
        registry.register(fam)
        assert registry.get("test-copy") is fam
        registry.register(fam)  # the same object again is fine
        with raises_user("already registered"):
            registry.register(dataclasses.replace(fam, summary="other"))
        other = registry.register(dataclasses.replace(fam, summary="other"), replace=True)
        assert registry.get("test-copy") is other
    finally:
        registry.unregister("test-copy")
    assert registry.find("test-copy") is None


def _python(code: str, env_families: str):
    env = {**os.environ, registry.ENV_VAR: env_families,
           "PYTHONPATH": os.pathsep.join([str(FAMILIES_DIR), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_families_from_the_environment_are_loaded_on_first_lookup():
    res = _python("from icrl_interp import registry; print(registry.names())", "mc_eval")
    assert res.returncode == 0, res.stderr
    assert "'mc-eval'" in res.stdout and "'linear-td'" in res.stdout


def test_a_missing_family_module_is_a_one_line_error():
    res = _python("from icrl_interp.cli import main; import sys; sys.exit(main(['construct', '--help']))",
                  "no_such_family_module")
    assert res.returncode == 2
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and "no_such_family_module" in err[0] and registry.ENV_VAR in err[0], res.stderr
