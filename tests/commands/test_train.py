"""`icrl-interp train FAMILY`: one sub-command per family with a training recipe, its flags from the
family's TrainConfig fields (old spellings refused: tests/commands/test_vocabulary.py), another family's flags
refused."""
import dataclasses
import json
import subprocess
import sys

import pytest

from icrl_interp import cli
from icrl_interp.commands.train import config_from_args
from icrl_interp.train import config_classes, config_for

SARSA = dict(n_states=2, n_actions=2, n=8, tasks_per_step=4, eval_tasks=4)


def _parse(*argv):
    return cli.build_parser().parse_args(["train", *argv])


def test_cli_trains_exports_and_reports_errors(tmp_path, capsys):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"family": "sarsa", **SARSA, "checkpoint_every": 2}))
    code = cli.main(["train", "sarsa", "--out", str(tmp_path / "run"), "--config", str(cfg), "--steps", "4", "--no-progress",
                     "--export", str(tmp_path / "ship")])
    assert code == 0
    assert sorted(p.name for p in (tmp_path / "ship").iterdir()) == ["config.json", "final_metrics.json", "model.safetensors",
                                                                     "snapshots", "train_config.json"]
    assert json.loads((tmp_path / "ship/train_config.json").read_text())["steps"] == 4
    # the earlier checkpoint is a snapshot (model + config, its own step); the final one is the exported model
    snap = tmp_path / "ship" / "snapshots" / "step_000002"
    assert sorted(p.name for p in (tmp_path / "ship" / "snapshots").iterdir()) == ["step_000002"]
    assert sorted(p.name for p in snap.iterdir()) == ["config.json", "model.safetensors"]
    origin = [json.loads((d / "config.json").read_text())["origin"] for d in (snap, tmp_path / "ship")]
    assert [o["step"] for o in origin] == [2, 4] and origin[0]["run_id"] == origin[1]["run_id"]
    assert (snap / "model.safetensors").read_bytes() != (tmp_path / "ship" / "model.safetensors").read_bytes()
    assert cli.main(["train", "sarsa", "--out", str(tmp_path / "run"), "--config", str(cfg), "--steps", "4", "--no-progress",
                     "--export", str(tmp_path / "ship2"), "--no-snapshots"]) == 0
    assert not (tmp_path / "ship2" / "snapshots").exists()
    capsys.readouterr()
    assert cli.main(["train", "sarsa", "--out", str(tmp_path / "x"), "--steps", "0"]) == 2
    assert "steps must be a positive integer" in capsys.readouterr().err
    cfg.write_text(json.dumps({"family": "linear-td"}))
    assert cli.main(["train", "sarsa", "--out", str(tmp_path / "x"), "--config", str(cfg)]) == 2
    assert "is for another family than sarsa" in capsys.readouterr().err


@pytest.mark.parametrize("family, flag", [("sarsa", "--windows"), ("linear-td", "--w-std"), ("softmax-td", "--lam-std"),
                                          ("actor-critic", "--windows")])
def test_a_flag_of_another_family_is_refused_in_one_line(tmp_path, capsys, family, flag):
    assert _exit_code(["train", family, "--out", str(tmp_path / "x"), flag, "3"]) == 2
    err = capsys.readouterr().err
    assert f"unrecognized arguments: {flag} 3" in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def _exit_code(argv) -> int:
    """cli.main's return value, or the code of the SystemExit argparse raises."""
    try:
        return cli.main(argv)
    except SystemExit as e:
        return e.code


def test_unknown_family_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        _parse("rnn", "--out", "x")
    assert e.value.code == 2 and "invalid choice: 'rnn'" in capsys.readouterr().err


# Every flag of the earlier hand-written table (in the vocabulary's spelling), with the field it sets.
FLAGS = {
    "--steps": ("steps", "7"), "--seed": ("seed", "3"), "--lr": ("lr", "0.5"), "--lr-decay": ("lr_decay", "0.5"),
    "--lr-decay-every": ("lr_decay_every", "4"), "--weight-decay": ("weight_decay", "0.25"),
    "--init-gain": ("init_gain", "0.3"), "--dtype": ("dtype", "float64"), "--checkpoint-every": ("checkpoint_every", "5"),
    "--log-every": ("log_every", "2"), "--eval-tasks": ("eval_tasks", "9"), "--d": ("d", "3"),
    "--n-states": ("n_states", "4"), "--n-actions": ("n_actions", "3"), "--n": ("n", "11"),
    "--n-layers": ("n_layers", "2"), "--gamma": ("gamma", "0.25"), "--alpha": ("alpha", "0.75"), "--beta": ("beta", "1.5"),
    "--critic-step": ("critic_step", "0.625"), "--form": ("form", "dual"), "--objective": ("objective", "td"),
    "--tasks-per-step": ("tasks_per_step", "6"),
    "--windows": ("windows", "7"), "--trajectories-per-task": ("trajectories_per_task", "2"),
    "--w-std": ("w_std", "0.125"), "--lam-std": ("lam_std", "0.375"), "--epsilon": ("epsilon", "0.5"),
}
BOOLS = {"--tied": "tied", "--masks": "masks", "--lazy-ablation": "lazy_ablation", "--span-projection": "span_projection"}
OBJECTIVES = {"linear-td": "msve", "softmax-td": "td"}


@pytest.mark.parametrize("family", ["linear-td", "softmax-td", "sarsa", "actor-critic"])
def test_every_flag_sets_its_field(family):
    fields = {f.name for f in dataclasses.fields(config_classes()[family])}
    argv, want = [family, "--out", "x"], {}
    for flag, (name, value) in FLAGS.items():
        if name in fields:
            value = OBJECTIVES.get(family, value) if name == "objective" else value
            argv += [flag, value]
            want[name] = value
    args = _parse(*argv)
    for name, value in want.items():
        assert str(getattr(args, name)) == value, (family, name)
    for flag, name in BOOLS.items():
        if name in fields and not (family == "actor-critic" and name == "span_projection"):
            assert getattr(_parse(family, "--out", "x", flag), name) is True
            assert getattr(_parse(family, "--out", "x", "--no-" + flag[2:]), name) is False
    assert set(want) <= fields


def test_config_file_precedence_and_its_old_field_names(tmp_path):
    """Flags override the --config file; a file written before a field was renamed (`batch`, now
    `tasks_per_step`) is read under the new name."""
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"family": "sarsa", "n_states": 5, "batch": 7, "run_id": "ignored"}))
    args = _parse("sarsa", "--out", "x", "--config", str(path), "--n-states", "3", "--n-actions", "2", "--lazy-ablation")
    cfg = config_from_args(args, args.config)
    assert cfg == config_for("sarsa", n_states=3, n_actions=2, tasks_per_step=7, lazy_ablation=True)
    assert cfg.tasks_per_step == 7 and "batch" not in cfg.to_dict()


def test_help_shows_only_the_family_fields_with_their_docstrings():
    out = subprocess.run([sys.executable, "-m", "icrl_interp.cli", "train", "sarsa", "--help"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "--lazy-ablation" in text and "--w-std" in text and "--out" in text and "--n-states" in text
    assert "Ablation: Xavier-initialise the lazy blocks P22 and V22 too" in text  # the field docstring
    assert "Adam learning rate at step 0. (default: 0.001)" in text  # inherited docstring, the family's default
    for other in ("--windows", "--trajectories-per-task", "--lam-std", "--masks", "--form", "--family", "--states"):
        assert other not in text
    families = subprocess.run([sys.executable, "-m", "icrl_interp.cli", "train", "--help"], capture_output=True,
                              text=True, timeout=120)
    assert families.returncode == 0 and all(f in families.stdout for f in config_classes())


def test_building_the_cli_imports_no_torch():
    code = ("import argparse, sys; from icrl_interp.commands import train; p = argparse.ArgumentParser(); "
            "train.add_arguments(p); p.format_help(); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


def test_an_exported_run_with_snapshots_counts_as_the_packages_own_output(tmp_path):
    """--force may replace an exported checkpoint (snapshots included), never a folder with foreign files in it."""
    from icrl_interp.core import outputs

    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"family": "sarsa", **SARSA, "checkpoint_every": 1}))
    assert cli.main(["train", "sarsa", "--out", str(tmp_path / "run"), "--config", str(cfg), "--steps", "2", "--no-progress",
                     "--export", str(tmp_path / "ship")]) == 0
    ship = tmp_path / "ship"
    assert (ship / "snapshots" / "step_000001").is_dir() and outputs.is_ours(ship)
    (ship / "snapshots" / "notes.txt").write_text("mine")
    assert not outputs.is_ours(ship)
    (ship / "snapshots" / "notes.txt").unlink()
    (ship / "snapshots" / "step_000001" / "notes.txt").write_text("mine")
    assert not outputs.is_ours(ship)
