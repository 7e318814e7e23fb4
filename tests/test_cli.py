"""The `icrl-interp` console script: help, version, `envs`, errors, and a light import."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import icrl_interp
from icrl_interp import cli
from icrl_interp.tasks import envs

SCRIPT = Path(sys.executable).with_name("icrl-interp")


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)


def test_console_script_help_and_version():
    if not SCRIPT.exists():
        pytest.skip("console script not installed in this environment")
    out = _run(str(SCRIPT), "--help")
    assert out.returncode == 0 and "usage: icrl-interp" in out.stdout
    for name in cli.COMMANDS:
        assert name in out.stdout
    ver = _run(str(SCRIPT), "--version")
    assert ver.returncode == 0 and ver.stdout.strip() == f"icrl-interp {icrl_interp.__version__}"


def test_importing_the_package_and_building_the_cli_stays_light():
    code = (
        "import sys, icrl_interp, icrl_interp.cli; icrl_interp.cli.build_parser(); "
        "heavy = [m for m in ('transformer_lens',) if m in sys.modules]; print(heavy)"
    )
    out = _run(sys.executable, "-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_main_without_a_command_prints_help(capsys):
    assert cli.main([]) == 2
    assert "usage: icrl-interp" in capsys.readouterr().out


def test_envs_boyan_prints_the_exact_values(capsys):
    assert cli.main(["envs", "boyan", "--tasks", "2", "--n-states", "5", "--prompt-seed", "3"]) == 0
    out = capsys.readouterr().out
    mrp = envs.sample_boyan_chains(2, 5, gamma=0.9, rng=3)
    v, mu = mrp.values(), mrp.stationary()
    lines = out.strip().splitlines()
    assert len(lines) == 4 and lines[0].startswith("task 0: v = ") and "mu = " in lines[1]
    printed_v = np.array(lines[2].split("[")[1].rstrip("]").split(), dtype=float)
    printed_mu = np.array(lines[3].split("[")[1].rstrip("]").split(), dtype=float)
    np.testing.assert_allclose(printed_v, v[1], atol=5e-4)
    np.testing.assert_allclose(printed_mu, mu[1], atol=5e-4)


def test_envs_mdp_prints_returns(capsys):
    assert cli.main(["envs", "mdp", "--tasks", "2", "--n-states", "3", "--n-actions", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    mdp = envs.sample_tabular_mdps(2, 3, 2, 0.5, rng=0)
    _, _, best = mdp.optimal()
    for b, line in enumerate(lines):
        assert line.startswith(f"task {b}:") and f"optimal {best[b]:+.4f}" in line


@pytest.mark.parametrize(
    "argv, words",
    [
        (["envs", "boyan", "--gamma", "1.5"], ["gamma", "[0, 1)"]),
        (["envs", "boyan", "--n-states", "2"], ["at least 3 states"]),
        (["envs", "mdp", "--gamma", "-0.1"], ["gamma"]),
        (["envs", "boyan", "--tasks", "0"], ["number of tasks", ">= 1"]),
    ],
)
def test_user_errors_exit_2_with_one_line(capsys, argv, words):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("icrl-interp envs: error:") and "\n" not in err
    assert all(w in err for w in words), err


def test_unknown_kind_is_a_one_line_usage_error(capsys):
    assert cli.main(["envs", "gridworld"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice" in err and err.count("\n") == 1 and "--help" in err
