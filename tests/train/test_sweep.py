"""Sweep grid files (icrl_interp/train/sweep.py): the points they make, and one-line errors naming the field."""
from __future__ import annotations

import json

import pytest

from icrl_interp.core.errors import UserError
from icrl_interp.train import config_for
from icrl_interp.train.sweep import config_hash, is_finished, parse_sweep, read_sweep

BASE = {"d": 2, "n_states": 4, "n": 6, "steps": 5}


def grid(**over) -> dict:
    data = {"family": "linear-td", "seeds": [0, 3], "base": dict(BASE), "grid": {"lr": [0.01, 0.003], "n_layers": [1, 2]}}
    data.update(over)
    return data


def test_points_are_the_product_of_the_lists_times_the_seeds_in_file_order():
    s = parse_sweep(grid())
    assert [p.swept for p in s.points] == [
        {"lr": lr, "n_layers": nl, "seed": seed} for lr in (0.01, 0.003) for nl in (1, 2) for seed in (0, 3)]
    for p in s.points:
        want = config_for("linear-td", **BASE, **p.swept)
        assert p.config == want  # base fields, swept fields and the seed, nothing else
        assert p.name.endswith("_" + config_hash(want))
    assert s.points[0].name.startswith("lr-0.01_n_layers-1_seed-0_")
    assert len({p.name for p in s.points}) == 8


def test_an_integer_is_taken_for_a_float_field_and_seeds_default_to_zero():
    data = grid(grid={"lr": [1]})
    del data["seeds"]
    s = parse_sweep(data)
    assert [(p.config.lr, p.config.seed) for p in s.points] == [(1.0, 0)]
    assert isinstance(s.points[0].config.lr, float)


def test_the_run_name_ignores_steps_only():
    a = config_for("linear-td", **BASE)
    assert config_hash(a) == config_hash(config_for("linear-td", **{**BASE, "steps": 50}))
    assert config_hash(a) != config_hash(config_for("linear-td", **{**BASE, "checkpoint_every": 2}))
    assert config_hash(a) != config_hash(config_for("linear-td", **{**BASE, "seed": 1}))


@pytest.mark.parametrize("change, fragment", [
    ({"colour": "red"}, "colour: unknown top-level key"),
    ({"family": "rnn"}, "family: 'rnn' has no training recipe"),
    ({"family": 3}, "family: expected a string"),
    ({"seeds": []}, "seeds: expected a non-empty list"),
    ({"seeds": [0, -1]}, "seeds[1]: expected a non-negative integer"),
    ({"seeds": [1, 1]}, "seeds: [1, 1] repeats a seed"),
    ({"base": {**BASE, "depth": 3}}, "base.depth: unknown linear-td training field"),
    ({"base": {**BASE, "seed": 3}}, "base.seed: seed is not a field of [base] or [grid]; list the seeds in `seeds`"),
    ({"base": {**BASE, "steps": "5"}}, "base.steps: expected an integer, got a string '5'"),
    ({"base": {**BASE, "steps": 2.5}}, "base.steps: expected an integer, got a float 2.5"),
    ({"base": {**BASE, "tied": 1}}, "base.tied: expected true or false, got an integer 1"),
    ({"base": [1]}, "base: expected a table [base]"),
    ({"grid": {}}, "grid: the grid is empty"),
    ({"grid": {"lr": []}}, "grid.lr: the list of values is empty"),
    ({"grid": {"lr": 0.01}}, "grid.lr: expected a list of values, got a float 0.01"),
    ({"grid": {"lr": [0.01, "fast"]}}, "grid.lr[1]: expected a number, got a string 'fast'"),
    ({"grid": {"lr": [0.01, True]}}, "grid.lr[1]: expected a number, got a boolean True"),
    ({"grid": {"lr": [0.01, 0.01]}}, "grid.lr: [0.01, 0.01] repeats a value"),
    ({"grid": {"steps": [1, 2]}}, "grid.steps: also set in [base]"),
    ({"grid": {"lr": [0.01, -1.0]}}, "the point lr=-1.0, seed=0 is not a valid config: lr must be positive"),
    ({"report": {"colour": 1}}, "report.colour: unknown report field"),
    ({"report": {"control_mdps": "2"}}, "report.control_mdps: expected an integer"),
    ({"grid": {"lr": [0.01, float("inf")]}}, "grid.lr[1]: expected a finite number, got inf"),
    ({"base": {**BASE, "lr": float("nan")}}, "base.lr: expected a finite number, got nan"),
    ({"grid": {"init_gain": [10**400]}}, "grid.init_gain[0]: expected a finite number, got 1000"),
    ({"seeds": [0, 2**63]}, "seeds[1]: 9223372036854775808 is larger than the largest seed, 9223372036854775807"),
])
def test_bad_grids_are_one_line_errors_naming_the_field(change, fragment):
    with pytest.raises(UserError) as e:
        parse_sweep(grid(**change))
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_read_sweep_names_the_file(tmp_path):
    path = tmp_path / "g.toml"
    path.write_text('family = "linear-td"\n[grid]\nlr = [0.01,\n')
    with pytest.raises(UserError, match="g.toml is not valid TOML"):
        read_sweep(path)
    path.write_text('family = "linear-td"\n[grid]\nlrr = [0.01]\n')
    with pytest.raises(UserError, match=r"g.toml: grid.lrr: unknown linear-td training field"):
        read_sweep(path)
    with pytest.raises(UserError, match="cannot read the grid file"):
        read_sweep(tmp_path / "nope.toml")


def test_a_run_is_finished_only_with_its_config_last_checkpoint_and_final_metrics(tmp_path):
    cfg = config_for("linear-td", **BASE)
    run = tmp_path / "run"
    (run / "checkpoints" / "step_000005").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({**cfg.to_dict(), "run_id": "x"}))
    (run / "final_metrics.json").write_text(json.dumps({"step": 5}))
    assert not is_finished(run, cfg)  # the last checkpoint is not complete (no trainer_state.json)
    (run / "checkpoints" / "step_000005" / "trainer_state.json").write_text("{}")
    assert is_finished(run, cfg)
    assert not is_finished(run, config_for("linear-td", **{**BASE, "steps": 6}))  # more steps: not finished
    assert not is_finished(run, config_for("linear-td", **{**BASE, "lr": 0.5}))  # another config
    (run / "final_metrics.json").write_text(json.dumps({"step": 4}))
    assert not is_finished(run, cfg) and is_finished(run, cfg, evaluate=False)


def test_the_largest_seed_is_taken_exactly_and_one_more_is_refused():
    from icrl_interp.train.config import MAX_SEED

    assert MAX_SEED == 2**63 - 1  # torch.Generator takes up to 2**64 - 1; int64 attributes up to this
    s = parse_sweep(grid(seeds=[MAX_SEED], grid={"lr": [0.01]}))
    assert s.points[0].config.seed == MAX_SEED  # exact: no round trip through a float
    assert config_for("linear-td", seed=MAX_SEED).seed == MAX_SEED
    with pytest.raises(UserError, match=f"seed must be at most {MAX_SEED}"):
        config_for("linear-td", seed=MAX_SEED + 1)


def test_a_grid_of_more_runs_than_the_limit_is_refused_with_its_size(monkeypatch):
    from icrl_interp.train import sweep

    monkeypatch.setattr(sweep, "MAX_RUNS", 8)
    assert len(parse_sweep(grid()).points) == 8  # 2 x 2 values x 2 seeds: at the limit
    monkeypatch.setattr(sweep, "MAX_RUNS", 7)
    with pytest.raises(UserError) as e:
        parse_sweep(grid())
    assert str(e.value) == ("grid: 2 x 2 values x 2 seeds = 8 runs, ~40 training steps; a sweep runs at most 7: "
                            "split it into smaller sweeps")
    with pytest.raises(UserError, match=r"grid: 2 x 2 values x 2 seeds = 8 runs, ~28 training steps;"):
        parse_sweep(grid(grid={"lr": [0.01, 0.003], "steps": [2, 5]}, base={k: v for k, v in BASE.items() if k != "steps"}))


def test_a_grid_of_a_trillion_points_is_refused_in_seconds_before_torch_is_imported(tmp_path):
    import subprocess
    import sys
    import time

    lists = "".join(f"{k} = {list(range(1, 1001))}\n" for k in ("lr", "n_layers", "init_gain", "eval_tasks"))
    (tmp_path / "g.toml").write_text(f'family = "linear-td"\nseeds = [0, 1]\n[grid]\n{lists}')
    code = ("import sys\nfrom icrl_interp.core.errors import UserError\nfrom icrl_interp.train.sweep import read_sweep\n"
            "try:\n    read_sweep(sys.argv[1])\nexcept UserError as e:\n    print(e)\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "g.toml")], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert time.monotonic() - t0 < 10
    assert "1000 x 1000 x 1000 x 1000 values x 2 seeds = 2,000,000,000,000 runs; a sweep runs at most 10000" in out


def test_a_sweep_directory_is_marked_by_its_lock_file_first_and_its_leftovers_go(tmp_path):
    """A sweep killed before its sweep.json exists left a directory that is still the sweep's own."""
    from icrl_interp.train.sweep import SWEEP_LOCK, is_sweep_dir, writing_sweep

    out = tmp_path / "sw"
    with writing_sweep(out):
        (out / ".sweep.json.abcd_123.tmp").write_text("half")  # killed while writing its plan
    assert {p.name for p in out.iterdir()} == {".sweep.json.abcd_123.tmp", SWEEP_LOCK}
    assert is_sweep_dir(out)
    with writing_sweep(out):  # the next sweep removes what the killed one left
        pass
    assert sorted(p.name for p in out.iterdir()) == [SWEEP_LOCK]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "sweep.json").write_text(json.dumps({"schema": "mine"}))
    assert not is_sweep_dir(tmp_path / "mine")
