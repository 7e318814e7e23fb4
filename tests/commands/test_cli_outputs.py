"""What the commands print, return and write on success: exit codes, the terminal tables and lines a
user reads, one JSON row against a list of rows (the refusals are in test_bad_inputs.py)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from icrl_interp import cli
from icrl_interp.commands.analyze import table
from icrl_interp.commands.train import run_bytes

DATA = Path(__file__).resolve().parents[2] / "data" / "checkpoints"


def test_the_analyze_table_shows_each_layers_kernel_diagonality():
    row = {"source": "x", "family": "softmax-td", "kind": "checkpoint", "n_layers": 2, "gamma": 0.9,
           "activations": {"layers": [{"layer": 0, "kernel_diagonality": {"mean": 0.625, "min": 0.125, "margin": 0.375}},
                                      {"layer": 1}]}}
    lines = table([row]).splitlines()
    first = next(line for line in lines if line.split()[:1] == ["0"])
    assert first.split()[1:4] == ["0.625", "0.125", "0.375"]
    second = next(line for line in lines if line.split()[:1] == ["1"])
    assert "0.625" not in second  # a layer without the section shows no numbers of another


def test_analyze_writes_one_row_for_one_checkpoint_and_a_list_for_a_directory(tmp_path, capsys):
    one = tmp_path / "one.json"
    assert cli.main(["analyze", str(DATA / "sarsa"), "--json", str(one)]) == 0
    assert isinstance(json.loads(one.read_text()), dict)
    both = tmp_path / "dir"
    both.mkdir()
    for name in ("sarsa", "linear-td"):
        shutil.copytree(DATA / name, both / name)
    many = tmp_path / "many.json"
    assert cli.main(["analyze", str(both), "--json", str(many)]) == 0  # one INPUT, two checkpoints in it
    rows = json.loads(many.read_text())
    assert isinstance(rows, list) and sorted(r["family"] for r in rows) == ["linear-td", "sarsa"]


def test_analyze_live_of_a_checkpoint_writes_the_live_rows(tmp_path, capsys):
    out = tmp_path / "live.json"
    assert cli.main(["analyze", str(DATA / "linear-td"), "--live", "--tasks", "8", "--no-progress",
                     "--json", str(out)]) == 0
    row = json.loads(out.read_text())
    assert row["kind"] != "checkpoint" or row.get("activations")  # analyzed on prompts, not from the weights alone
    assert row["activations"]["layers"], row.get("skipped")


def test_a_negative_probe_task_limit_is_refused(capsys):
    assert cli.main(["analyze", str(DATA / "sarsa"), "--live", "--probe-max-tasks", "-1"]) == 2
    assert "--probe-max-tasks must be >= 0" in capsys.readouterr().err


def test_causal_needs_a_layer(capsys):
    assert cli.main(["causal", str(DATA / "linear-td"), "--tasks", "8"]) == 2
    assert "required: --layer" in capsys.readouterr().err


def test_causal_prints_its_conclusions_with_the_paired_comparison(tmp_path, capsys):
    code = cli.main(["causal", str(DATA / "linear-td"), "--layer", "0", "--tasks", "32", "--random-draws", "2",
                     "--bootstrap", "20", "--steer", "1", "--json", str(tmp_path / "c.json")])
    out = capsys.readouterr().out
    assert code == 0
    result = json.loads((tmp_path / "c.json").read_text())
    line = next(x for x in out.splitlines() if x.startswith("probe exceeds random init:"))
    said = result["causal"]["baseline"]["comparison"]["probe_exceeds_random_init"]
    assert line == f"probe exceeds random init: {said}"


def test_construct_help_shows_the_family_construct_doc(capsys):
    from icrl_interp.families import registry

    try:
        code = cli.main(["construct", "sarsa", "--help"])
    except SystemExit as e:
        code = e.code
    assert code == 0
    doc = registry.get("sarsa").construct.__doc__
    first = " ".join(doc.strip().split()[:6])
    assert first in " ".join(capsys.readouterr().out.split())


def test_record_exits_0_on_success(tmp_path, capsys):
    assert cli.main(["record", str(DATA / "sarsa"), "--tasks", "4", "--no-progress",
                     "--out", str(tmp_path / "r.h5")]) == 0


def test_run_bytes_counts_model_and_two_adam_moments_in_float64_per_checkpoint():
    from icrl_interp.train import config_for

    cfg = config_for("sarsa", steps=10, checkpoint_every=5, log_every=1, n=8, n_states=2, n_actions=2)
    from icrl_interp.train.recipe import recipe_of

    params = sum(a * b for a, b in recipe_of(cfg).model_config(cfg).parameter_shapes().values())
    checkpoints, log_lines = 10 // 5 + 1, 10 // 1 + 1
    assert run_bytes(cfg) == checkpoints * (3 * 8 * params + 8 * 1024) + log_lines * 256


def test_train_says_where_it_resumed(tmp_path, capsys):
    run = tmp_path / "run"
    base = ["train", "sarsa", "--out", str(run), "--n-states", "2", "--n-actions", "2", "--n", "8",
            "--tasks-per-step", "4", "--eval-tasks", "4", "--checkpoint-every", "2", "--no-progress", "--no-eval"]
    assert cli.main([*base, "--steps", "2"]) == 0
    assert "resumed from" not in capsys.readouterr().out
    assert cli.main([*base, "--steps", "4"]) == 0
    assert "resumed from step 2" in capsys.readouterr().out
