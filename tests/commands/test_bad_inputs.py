"""Bad inputs, one table: every user error is ONE line on stderr, exit status 2, no traceback, and
nothing on disk changes (no file replaced, deleted or added; no .partial / .tmp / .old debris).

Each row: an id, the argv (`{t}` is the row's own temporary directory), what to put there first,
and a fragment of the expected message. The rows run in process (`cli.main`), with the machine's
memory fixed at 16 GiB so the size checks say the same everywhere; the few rows whose point is
what reaches the terminal (warnings) run as a subprocess.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from icrl_interp import cli
from icrl_interp.core import outputs

SHIPPED = Path(__file__).resolve().parents[2] / "data" / "checkpoints"
CK = SHIPPED / "sarsa"  # a checkpoint of a control family, a few KiB
TINY = ["--n-states", "2", "--n-actions", "2", "--n", "8", "--tasks-per-step", "4", "--eval-tasks", "4"]
NOT_WRITABLE = Path("/proc")  # exists, and nobody (not even root) can create a file in it


# ------------------------------------------------------------------ setups: what a row's directory holds
def ck(t: Path, name: str = "ck") -> None:
    shutil.copytree(CK, t / name)


def rec(t: Path) -> None:
    import h5py
    import numpy as np

    with h5py.File(t / "good.h5", "w") as f:  # the user's recording (any HDF5 file will do here)
        f["x"] = np.arange(4.0)


def thesis(t: Path, where: str = "mine") -> None:
    (t / where).mkdir(parents=True, exist_ok=True)
    (t / where / "thesis.txt").write_text("three years of work\n")


def ck_and_thesis(t: Path) -> None:
    ck(t, "mine")
    thesis(t)


def plain_file(t: Path) -> None:
    (t / "file").write_text("not a directory\n")


def report_with_user_figure(t: Path) -> None:
    ck(t)
    (t / "rep" / "figures").mkdir(parents=True)
    (t / "rep" / "summary.json").write_text(json.dumps({"schema": "icrl_interp.report/1", "rows": []}))
    (t / "rep" / "figures" / "manifest.json").write_text(
        json.dumps({"schema": "icrl_interp.report-figures/1", "files": ["sarsa-control.png"]}))
    (t / "rep" / "figures" / "sarsa-control.png").write_bytes(b"the report's own")
    (t / "rep" / "figures" / "my-plot.png").write_bytes(b"the user's own")


def demo_with_user_files(t: Path) -> None:
    (t / "demo" / "inputs" / "theta_star-linear-td").mkdir(parents=True)
    (t / "demo" / "summary.json").write_text(json.dumps({"schema": "icrl_interp.report/1", "rows": []}))
    (t / "demo" / "inputs" / "theta_star-linear-td" / "thesis.txt").write_text("mine\n")


def demo_with_user_figure(t: Path) -> None:
    (t / "demo" / "figures").mkdir(parents=True)
    (t / "demo" / "figures" / "keep.svg").write_text("<svg/>")


def ck_and_report_inputs(t: Path) -> None:
    ck(t)
    (t / "empty").mkdir()


def export_dir_with_keep(t: Path) -> None:
    (t / "ship").mkdir()
    (t / "ship" / "keep.txt").write_text("keep me\n")


def user_json(t: Path) -> None:
    ck(t)
    (t / "notes.json").write_text(json.dumps({"mine": True}))


def user_png(t: Path) -> None:
    ck(t)
    (t / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 32)


def deep_config(t: Path) -> None:
    (t / "deep.json").write_text("[" * 100_000 + "]" * 100_000)


def deep_run_config(t: Path) -> None:
    (t / "run").mkdir()
    (t / "run" / "config.json").write_text("{\"a\": " * 50_000 + "1" + "}" * 50_000)


def corrupt_state(t: Path) -> None:
    shutil.copytree(RUN, t / "run")
    (t / "run" / "checkpoints" / "step_000002" / "trainer_state.json").write_text("{\"step\": ")


def corrupt_optimizer(t: Path) -> None:
    shutil.copytree(RUN, t / "run")
    (t / "run" / "checkpoints" / "step_000002" / "optimizer.safetensors").write_bytes(b"\x08\0\0\0\0\0\0\0{}garbage")


def corrupt_metrics(t: Path) -> None:
    shutil.copytree(RUN, t / "run")
    with open(t / "run" / "metrics.jsonl", "a") as f:
        f.write("{\"step\": 3, \"loss\n")


SWEEP_BASE = 'family = "linear-td"\n[base]\nd = 2\nn_states = 4\nn = 6\nsteps = 2\n'


def sweep_grid(grid: str, base: str = SWEEP_BASE):
    """A setup writing {t}/g.toml: the base of a tiny sweep and the given [grid] table."""
    return lambda t: (t / "g.toml").write_text(base + grid)


GOOD_GRID = sweep_grid("[grid]\nlr = [0.01, 0.02]\n")
HUGE_GRID = sweep_grid("[grid]\n" + "".join(f"{k} = {list(range(1, 1001))}\n" for k in ("lr", "n_layers", "init_gain", "eval_tasks")))
"""1000^4 points: refused by its size alone (tests/train/test_sweep.py: before torch is imported)."""


def sweep_with_user_report(t: Path) -> None:
    """A sweep directory of ours whose report/ holds the user's file."""
    GOOD_GRID(t)
    thesis(t, "sw/report")
    (t / "sw" / "sweep.json").write_text(json.dumps({"schema": "icrl_interp.sweep/1"}))


RUN: Path = Path()  # a finished tiny run, made once by the `tiny_run` fixture
RESUME = ["train", "sarsa", "--out", "{t}/run", *TINY, "--steps", "4", "--checkpoint-every", "2", "--no-progress",
          "--no-eval"]

BIG = str(10**12)
ROWS = [
    # --- live analysis (analyze --live, record --also-analyze)
    ("analyze-live-nothing", ["analyze", "--live"], None, "--live needs checkpoint directories"),
    ("analyze-no-input", ["analyze"], None, "give at least one INPUT"),
    ("analyze-task-without-live", ["analyze", "--task", "linear-td"], None, "add --live"),
    ("analyze-live-recording", ["analyze", "{t}/good.h5", "--live"], rec, "--live runs checkpoint directories"),
    ("analyze-live-task-option-alone", ["analyze", "{t}/ck", "--live", "--gamma", "0.5"], ck, "is a task option"),
    ("analyze-live-zero-tasks", ["analyze", "{t}/ck", "--live", "--tasks", "0"], ck, "--tasks must be a positive"),
    ("record-json-without-analyze", ["record", "{t}/ck", "--out", "{t}/r.h5", "--json", "{t}/a.json"], ck,
     "--json goes with --also-analyze"),
    ("record-also-analyze-resume", ["record", "{t}/ck", "--out", "{t}/r.h5", "--also-analyze", "--resume"], ck,
     "--also-analyze records a new file"),
    ("record-also-analyze-shards", ["record", "{t}/ck", "--out", "{t}/r.h5", "--also-analyze", "--shards", "2"], ck,
     "--also-analyze writes one file"),
    ("report-negative-live-tasks", ["report", "{t}/ck", "--out", "{t}/rep", "--live-tasks", "-1"], ck,
     "live-tasks must be a non-negative integer"),
    ("analyze-live-bad-device", ["analyze", "{t}/ck", "--live", "--device", "tpu"], ck,
     "--device must be one of auto, cpu, cuda, got 'tpu'"),
    # --- A: the user's data is never replaced, and no output lands on an input
    ("analyze-json-onto-input", ["analyze", "{t}/good.h5", "--json", "{t}/good.h5"], rec, "is an input of this command"),
    ("analyze-json-into-checkpoint", ["analyze", "{t}/ck", "--json", "{t}/ck/config.json"], ck, "lies inside the input"),
    ("analyze-json-over-user-file", ["analyze", "{t}/ck", "--json", "{t}/notes.json"], user_json,
     "exists and was not written by icrl-interp"),
    ("control-json-into-checkpoint", ["control", "{t}/ck", "--json", "{t}/ck/config.json"], ck, "lies inside the input"),
    ("control-figure-into-checkpoint", ["control", "{t}/ck", "--figure", "{t}/ck/x.png"], ck, "lies inside the input"),
    ("control-figure-over-user-png", ["control", "{t}/ck", "--figure", "{t}/photo.png"], user_png,
     "exists and was not written by icrl-interp"),
    ("control-json-and-figure-same", ["control", "{t}/ck", "--json", "{t}/a.png", "--figure", "{t}/a.png"], ck,
     "name the same file"),
    ("construct-force-over-user-dir", ["construct", "linear-td", "--out", "{t}/mine", "--force"], thesis,
     "not a checkpoint directory icrl-interp wrote"),
    ("construct-force-over-checkpoint-with-user-file", ["construct", "linear-td", "--out", "{t}/mine", "--force"],
     ck_and_thesis, "not a checkpoint directory icrl-interp wrote"),
    ("construct-force-over-plain-file", ["construct", "linear-td", "--out", "{t}/file", "--force"], plain_file,
     "is a file, not a directory"),
    ("construct-over-own-checkpoint-needs-force", ["construct", "linear-td", "--out", "{t}/ck"], ck, "pass --force"),
    ("report-over-user-figures", ["report", "{t}/ck", "--out", "{t}/rep"], report_with_user_figure,
     "my-plot.png is not a figure this report wrote"),
    ("report-into-user-dir", ["report", "{t}/ck", "--out", "{t}/mine"], lambda t: (ck(t), thesis(t)),
     "holds files that are not a report"),
    ("report-out-is-input-checkpoint", ["report", "{t}/ck", "--out", "{t}/ck"], ck, "is an input of this command"),
    ("report-out-inside-input-checkpoint", ["report", "{t}/ck", "--out", "{t}/ck/rep"], ck, "lies inside the input"),
    ("demo-over-user-inputs", ["demo", "--out", "{t}/demo"], demo_with_user_files, "is not a file the demo wrote"),
    ("demo-over-user-figures", ["demo", "--out", "{t}/demo"], demo_with_user_figure, "holds files that are not a report"),
    ("train-export-over-user-dir", ["train", "sarsa", "--out", "{t}/run", *TINY, "--export", "{t}/ship"],
     export_dir_with_keep, "holds files that are not a checkpoint directory"),
    ("train-export-onto-run", ["train", "sarsa", "--out", "{t}/run", *TINY, "--export", "{t}/run"], None,
     "is the run directory (--out)"),
    ("train-export-inside-run", ["train", "sarsa", "--out", "{t}/run", *TINY, "--export", "{t}/run/ship"], None,
     "lies inside the input"),
    ("train-export-around-run", ["train", "sarsa", "--out", "{t}/run", *TINY, "--export", "{t}"], None,
     "would replace the directory holding the input"),
    ("train-out-is-a-checkpoint", ["train", "sarsa", "--out", "{t}/ck", *TINY], ck,
     "not a training run directory"),
    # --- B: no silent exits, no silent directories
    ("report-missing-input", ["report", "{t}/nope", "--out", "{t}/rep"], None, "does not exist"),
    ("report-empty-directory", ["report", "{t}/empty", "--out", "{t}/rep"], ck_and_report_inputs,
     "holds no checkpoints or recordings"),
    ("control-figure-unknown-suffix", ["control", "{t}/ck", "--figure", "{t}/x.xyz"], ck, "unknown file suffix '.xyz'"),
    ("demo-workers-zero", ["demo", "--out", "{t}/demo", "--workers", "0"], None, "--workers must be a positive integer"),
    ("demo-prompts-zero", ["demo", "--out", "{t}/demo", "--tasks", "0"], None, "--tasks must be a positive integer"),
    ("analyze-head-out-of-range", ["analyze", "{t}/ck", "--head", "99"], ck, "1 attention head"),
    ("analyze-head-one-of-one", ["analyze", "{t}/ck", "--head", "1"], ck, "--head 1 does not exist"),  # heads count from 0
    ("analyze-head-negative", ["analyze", "{t}/ck", "--head", "-1"], ck, "--head must be a non-negative"),
    ("train-refused-leaves-no-run", ["train", "sarsa", "--out", "{t}/run", "--n-states", "100000"], None,
     "--n-states 100000 needs ~"),
    ("analyze-json-missing-parent", ["analyze", "{t}/ck", "--json", "{t}/no/such/a.json"], ck, "does not exist; create it"),
    ("control-json-missing-parent", ["control", "{t}/ck", "--json", "{t}/no/a.json"], ck, "does not exist; create it"),
    ("control-figure-missing-parent", ["control", "{t}/ck", "--figure", "{t}/no/a.png"], ck, "does not exist; create it"),
    ("construct-missing-parent", ["construct", "linear-td", "--out", "{t}/no/such/ck"], None, "does not exist; create it"),
    ("report-missing-parent", ["report", "{t}/ck", "--out", "{t}/no/rep"], ck, "does not exist; create it"),
    ("train-missing-parent", ["train", "sarsa", "--out", "{t}/no/run", *TINY], None, "does not exist; create it"),
    ("train-export-missing-parent", ["train", "sarsa", "--out", "{t}/run", *TINY, "--export", "{t}/no/ship"], None,
     "does not exist; create it"),
    ("demo-missing-parent", ["demo", "--out", "{t}/no/demo"], None, "does not exist; create it"),
    # --- C: one line instead of a traceback
    ("construct-not-writable", ["construct", "linear-td", "--out", f"{NOT_WRITABLE}/ck"], None, "cannot write in"),
    ("analyze-not-writable", ["analyze", "{t}/ck", "--json", f"{NOT_WRITABLE}/a.json"], ck, "cannot write in"),
    ("report-not-writable", ["report", "{t}/ck", "--out", f"{NOT_WRITABLE}/rep"], ck, "cannot write in"),
    ("train-not-writable", ["train", "sarsa", "--out", f"{NOT_WRITABLE}/run", *TINY], None, "cannot write in"),
    ("control-not-writable", ["control", "{t}/ck", "--json", f"{NOT_WRITABLE}/a.json"], ck, "cannot write in"),
    ("demo-not-writable", ["demo", "--out", f"{NOT_WRITABLE}/demo"], None, "cannot write in"),
    ("construct-empty-out", ["construct", "linear-td", "--out", ""], None, "--out is empty"),
    ("analyze-empty-json", ["analyze", "{t}/ck", "--json", ""], ck, "--json is empty"),
    ("report-empty-out", ["report", "{t}/ck", "--out", ""], ck, "--out is empty"),
    ("train-empty-out", ["train", "sarsa", "--out", "", *TINY], None, "--out is empty"),
    ("train-empty-export", ["train", "sarsa", "--out", "{t}/run", *TINY, "--export", " "], None, "--export is empty"),
    ("control-empty-json", ["control", "{t}/ck", "--json", ""], ck, "--json is empty"),
    ("control-empty-figure", ["control", "{t}/ck", "--figure", ""], ck, "--figure is empty"),
    ("demo-empty-out", ["demo", "--out", ""], None, "--out is empty"),
    ("analyze-json-is-a-directory", ["analyze", "{t}/ck", "--json", "{t}"], ck, "is a directory; give a file name"),
    ("report-out-is-a-plain-file", ["report", "{t}/ck", "--out", "{t}/file"], lambda t: (ck(t), plain_file(t)),
     "is a file, not a directory"),
    ("train-out-is-a-file", ["train", "sarsa", "--out", "{t}/file", *TINY], plain_file, "is a file, not a directory"),
    ("train-export-is-a-file", ["train", "sarsa", "--out", "{t}/run", *TINY, "--export", "{t}/file"], plain_file,
     "is a file, not a directory"),
    ("demo-out-is-a-file", ["demo", "--out", "{t}/file"], plain_file, "is a file, not a directory"),
    ("construct-d-absurd", ["construct", "linear-td", "--out", "{t}/ck", "--d", "100000"], None,
     "--d 100000 needs ~2.33 TiB of memory for the parameters of theta*; "
     "this machine has 16 GiB: at most --d 8191 fits"),
    ("construct-layers-absurd", ["construct", "linear-td", "--out", "{t}/ck", "--n-layers", str(10**6)], None,
     f"--n-layers {10**6} needs ~"),
    ("construct-states-absurd", ["construct", "sarsa", "--out", "{t}/ck", "--n-states", str(10**6)], None,
     f"--n-states {10**6} needs ~"),
    ("train-d-absurd", ["train", "linear-td", "--out", "{t}/run", "--d", "100000"], None, "--d 100000 needs ~"),
    ("train-layers-absurd", ["train", "linear-td", "--out", "{t}/run", "--n-layers", str(10**6)], None,
     f"--n-layers {10**6} needs ~"),
    ("train-batch-absurd", ["train", "sarsa", "--out", "{t}/run", "--tasks-per-step", BIG], None,
     f"--tasks-per-step {BIG} needs ~"),
    ("train-n-absurd", ["train", "sarsa", "--out", "{t}/run", "--n", str(10**9)], None, f"--n {10**9} needs ~"),
    ("train-eval-tasks-absurd", ["train", "sarsa", "--out", "{t}/run", "--eval-tasks", BIG], None,
     f"--eval-tasks {BIG} needs ~"),
    ("train-steps-absurd", ["train", "sarsa", "--out", "{t}/run", *TINY, "--steps", str(10**18)], None,
     "of checkpoints and metrics"),
    ("control-steps-absurd", ["control", "{t}/ck", "--iterations", BIG], ck, f"--iterations {BIG} needs ~"),
    ("control-mdps-absurd", ["control", "{t}/ck", "--mdps", BIG], ck, f"--mdps {BIG} needs ~"),
    ("control-n-absurd", ["control", "{t}/ck", "--n", BIG], ck, f"--n {BIG} needs ~"),
    ("envs-tasks-absurd", ["envs", "boyan", "--tasks", BIG], None, f"--tasks {BIG} needs ~"),
    ("envs-states-absurd", ["envs", "mdp", "--n-states", "100000"], None, "--n-states 100000 needs ~"),
    ("construct-negative-seed", ["construct", "linear-td", "--out", "{t}/ck", "--prompt-seed", "-1"], None,
     "--prompt-seed must be a non-negative integer"),
    ("control-negative-seed", ["control", "{t}/ck", "--prompt-seed", "-1"], ck,
     "--prompt-seed must be a non-negative integer"),
    ("train-negative-seed", ["train", "sarsa", "--out", "{t}/run", *TINY, "--seed", "-1"], None,
     "--seed must be a non-negative integer"),
    ("envs-negative-seed", ["envs", "boyan", "--prompt-seed", "-1"], None,
     "--prompt-seed must be a non-negative integer"),
    ("demo-negative-seed", ["demo", "--out", "{t}/demo", "--prompt-seed", "-1"], None,
     "--prompt-seed must be a non-negative integer"),
    ("analyze-negative-seed", ["analyze", "{t}/ck", "--split-seed", "-1"], ck, "--split-seed must be a non-negative integer"),
    ("record-negative-seed", ["record", "{t}/ck", "--out", "{t}/r.h5", "--prompt-seed", "-1"], ck,
     "--prompt-seed must be a non-negative integer"),
    ("causal-negative-split-seed", ["causal", "{t}/ck", "--layer", "0", "--split-seed", "-1"], ck,
     "--split-seed must be an integer >= 0, got -1"),
    ("causal-negative-direction-seed", ["causal", "{t}/ck", "--layer", "0", "--direction-seed", "-1"], ck,
     "--direction-seed must be an integer >= 0, got -1"),
    ("analyze-negative-wang-alpha", ["analyze", "{t}/ck", "--wang-alpha", "-0.5"], ck,
     "--wang-alpha must be a non-negative TD step"),
    ("analyze-nan-wang-alpha", ["analyze", "{t}/ck", "--wang-alpha", "nan"], ck,
     "--wang-alpha must be a non-negative TD step"),
    ("train-threads-zero", ["train", "sarsa", "--out", "{t}/run", *TINY, "--threads", "0"], None,
     "--threads must be between 1 and"),
    ("train-dtype-float16", ["train", "sarsa", "--out", "{t}/run", *TINY, "--dtype", "float16"], None,
     "dtype must be 'float32' or 'float64'"),
    ("construct-dtype-float16", ["construct", "linear-td", "--out", "{t}/ck", "--dtype", "float16"], None,
     "invalid choice: 'float16'"),
    ("train-deeply-nested-config", ["train", "sarsa", "--out", "{t}/run", "--config", "{t}/deep.json"], deep_config,
     "nested too deeply"),
    ("train-deeply-nested-run-config", ["train", "sarsa", "--out", "{t}/run", *TINY], deep_run_config,
     "not a training run directory"),
    ("train-resume-corrupt-state", RESUME, corrupt_state, "trainer_state.json is corrupt"),
    ("train-resume-corrupt-optimizer", RESUME, corrupt_optimizer, "optimizer.safetensors is corrupt"),
    ("train-resume-corrupt-metrics", RESUME, corrupt_metrics, "is not a metrics line"),
    ("train-lr-inf", ["train", "sarsa", "--out", "{t}/run", *TINY, "--lr", "inf"], None, "--lr inf must be a finite"),
    ("train-config-overflow", ["train", "sarsa", "--out", "{t}/run", "--config", "{t}/big.json"],
     lambda t: (t / "big.json").write_text('{"steps": 1e400}'), "out of range"),
    ("control-concentration-nan", ["control", "{t}/ck", "--concentration", "nan"], ck,
     "--concentration nan must be a finite"),
    ("analyze-chunk-inf", ["analyze", "{t}/ck", "--chunk-mib", "inf"], ck, "--chunk-mib inf must be a finite"),
    ("construct-scale-inf", ["construct", "linear-td", "--out", "{t}/ck", "--scale", "inf"], None,
     "--scale inf must be a finite number"),
    # --- sharded recordings and --device (docs/formats.md#sharded-recordings, docs/cli.md#devices)
    ("record-shards-zero", ["record", "{t}/ck", "--out", "{t}/r.h5", "--tasks", "8", "--shards", "0", "--no-progress"], ck,
     "--shards must be a positive integer, got 0"),
    ("record-shards-more-than-batches", ["record", "{t}/ck", "--out", "{t}/r.h5", "--tasks", "8", "--batch-size", "4",
                                         "--shards", "3", "--no-progress"], ck, "splits into 1 to 2 shards"),
    ("record-shards-resume-nothing", ["record", "{t}/ck", "--out", "{t}/r.h5", "--tasks", "8", "--batch-size", "4",
                                      "--shards", "2", "--resume", "--no-progress"], ck, "nothing to resume"),
    ("record-device-bogus", ["record", "{t}/ck", "--out", "{t}/r.h5", "--device", "bogus"], ck,
     "--device must be one of auto, cpu, cuda, got 'bogus'"),
    ("train-device-bogus", ["train", "sarsa", "--out", "{t}/run", *TINY, "--device", "gpu"], None,
     "--device must be one of auto, cpu, cuda, got 'gpu'"),
    ("control-device-bogus", ["control", "{t}/ck", "--device", "tpu"], ck,
     "--device must be one of auto, cpu, cuda, got 'tpu'"),
    ("causal-device-bogus", ["causal", "{t}/ck", "--layer", "0", "--device", "bogus"], ck,
     "--device must be one of auto, cpu, cuda, got 'bogus'"),
    # --- verdict (docs/verdict.md)
    ("verdict-nothing", ["verdict"], None, "give a recording (.h5), a checkpoint directory, or --model"),
    ("verdict-not-a-recording", ["verdict", "{t}/good.h5"], rec, "not an icrl_interp recording"),
    ("verdict-bootstrap-small", ["verdict", "{t}/good.h5", "--bootstrap", "3"], rec, "--bootstrap must be at least 10"),
    ("verdict-test-fraction", ["verdict", "{t}/good.h5", "--test-fraction", "1.5"], rec,
     "--test-fraction must lie in (0, 1)"),
    ("verdict-unknown-candidate", ["verdict", "{t}/good.h5", "--candidates", "td9"], rec, "--candidates: unknown td9"),
    ("verdict-min-r2-nan", ["verdict", "{t}/good.h5", "--min-r2", "nan"], rec, "--min-r2 must be a number"),
    ("verdict-task-without-model", ["verdict", "{t}/good.h5", "--task", "linear-td"], rec,
     "--task and --weights go with --model"),
    ("verdict-json-over-input", ["verdict", "{t}/good.h5", "--json", "{t}/good.h5"], rec, "good.h5"),
    # --- schedulers and sweeps (docs/cluster.md)
    ("analyze-bad-scheduler", ["analyze", "{t}/ck", "--scheduler", "udp://x:1"], ck, "is not a scheduler"),
    ("analyze-unreachable-scheduler", ["analyze", "{t}/ck", "--scheduler", "tcp://127.0.0.1:1"], ck,
     "cannot reach a Dask scheduler"),
    ("report-bad-scheduler", ["report", "{t}/ck", "--out", "{t}/rep", "--scheduler", "local:0"], ck,
     "the number of local workers must be a positive integer"),
    ("report-scheduler-without-port", ["report", "{t}/ck", "--out", "{t}/rep", "--scheduler", "tcp://host"], ck,
     "tcp://HOST:PORT"),
    ("sweep-missing-grid", ["sweep", "{t}/nope.toml", "--out", "{t}/sw"], None, "cannot read the grid file"),
    ("sweep-not-toml", ["sweep", "{t}/g.toml", "--out", "{t}/sw"], sweep_grid("[grid\n"), "is not valid TOML"),
    ("sweep-unknown-field", ["sweep", "{t}/g.toml", "--out", "{t}/sw"], sweep_grid("[grid]\nlrr = [0.1]\n"),
     "grid.lrr: unknown linear-td training field"),
    ("sweep-wrong-type", ["sweep", "{t}/g.toml", "--out", "{t}/sw"], sweep_grid('[grid]\nlr = [0.1, "fast"]\n'),
     "grid.lr[1]: expected a number, got a string 'fast'"),
    ("sweep-empty-grid", ["sweep", "{t}/g.toml", "--out", "{t}/sw"], sweep_grid("[grid]\n"), "grid: the grid is empty"),
    ("sweep-empty-list", ["sweep", "{t}/g.toml", "--out", "{t}/sw"], sweep_grid("[grid]\nlr = []\n"),
     "grid.lr: the list of values is empty"),
    ("sweep-seed-in-grid", ["sweep", "{t}/g.toml", "--out", "{t}/sw"], sweep_grid("[grid]\nseed = [1, 2]\n"),
     "list the seeds in `seeds`"),
    ("sweep-bad-report-field", ["sweep", "{t}/g.toml", "--out", "{t}/sw"],
     sweep_grid("[grid]\nlr = [0.1]\n[report]\ncontrol_mdps = -1\n"), "report.control-mdps must be a non-negative"),
    ("sweep-layers-absurd", ["sweep", "{t}/g.toml", "--out", "{t}/sw"], sweep_grid(f"[grid]\nn_layers = [1, {10**6}]\n"),
     f"--n-layers {10**6} needs ~"),
    ("sweep-bad-scheduler", ["sweep", "{t}/g.toml", "--out", "{t}/sw", "--scheduler", "slurm"], GOOD_GRID,
     "is not a scheduler"),
    ("sweep-unreachable-scheduler", ["sweep", "{t}/g.toml", "--out", "{t}/sw", "--scheduler", "tcp://127.0.0.1:1"],
     GOOD_GRID, "cannot reach a Dask scheduler"),
    ("sweep-zero-workers", ["sweep", "{t}/g.toml", "--out", "{t}/sw", "--workers", "0"], GOOD_GRID,
     "--workers must be at least 1"),
    ("sweep-into-user-dir", ["sweep", "{t}/g.toml", "--out", "{t}/mine"], lambda t: (GOOD_GRID(t), thesis(t)),
     "holds files that are not a sweep directory"),
    ("sweep-out-is-the-grid", ["sweep", "{t}/g.toml", "--out", "{t}/g.toml"], GOOD_GRID, "is an input of this command"),
    ("sweep-lr-inf", ["sweep", "{t}/g.toml", "--out", "{t}/sw"], sweep_grid("[grid]\nlr = [0.01, inf]\n"),
     "grid.lr[1]: expected a finite number, got inf"),
    ("sweep-base-nan", ["sweep", "{t}/g.toml", "--out", "{t}/sw"], sweep_grid("[grid]\nn_layers = [1]\n", SWEEP_BASE + "lr = nan\n"),
     "base.lr: expected a finite number, got nan"),
    ("sweep-seed-too-large", ["sweep", "{t}/g.toml", "--out", "{t}/sw"],
     sweep_grid("[grid]\nlr = [0.01]\n", SWEEP_BASE.replace("[base]", "seeds = [99999999999999999999]\n[base]")),
     "seeds[0]: 99999999999999999999 is larger than the largest seed, 9223372036854775807"),
    ("sweep-1000^4-points", ["sweep", "{t}/g.toml", "--out", "{t}/sw"], HUGE_GRID,
     "grid: 1000 x 1000 x 1000 x 1000 values x 1 seed = 1,000,000,000,000 runs, ~2e+12 training steps; a sweep runs "
     "at most 10000"),
    ("sweep-steps-beyond-the-disk", ["sweep", "{t}/g.toml", "--out", "{t}/sw"],
     sweep_grid("[grid]\nlr = [0.01]\n", SWEEP_BASE.replace("steps = 2", f"steps = {10**15}")),
     "of checkpoints and metrics; the disk of"),
    ("sweep-report-of-the-user", ["sweep", "{t}/g.toml", "--out", "{t}/sw"], sweep_with_user_report,
     "report holds files that are not a report icrl-interp wrote"),
]
# --- options a command would ignore, damaged inputs, reports that would leave an empty --out (issue 23, 5)
REC: Path = Path()  # a complete tiny recording (linear-td theta*, d 2, n 6, 12 prompts), made once by `tiny_rec`
USER_NET = f"{Path(__file__).resolve().parents[1] / 'helpers.py'}:Net"  # a plain torch model: no TL hooks


def recording(t: Path) -> None:
    shutil.copy(REC, t / "r.h5")


def damaged(edit):
    """A setup writing {t}/r.h5: the tiny recording with `edit(h5py.File)` applied (its damage)."""
    def setup(t: Path) -> None:
        import h5py

        recording(t)
        with h5py.File(t / "r.h5", "r+") as f:
            edit(f)
    return setup


def _wide(f) -> None:
    import numpy as np

    z = f["prompts/z"][:]
    del f["prompts/z"]
    f["prompts/z"] = np.concatenate([z, z], -1)


def truncated(t: Path) -> None:
    (t / "r.h5").write_bytes(REC.read_bytes()[:50_000])


def pickled(t: Path) -> None:
    import pickle  # the input under test: a pickle the report must refuse, never load

    (t / "model.pkl").write_bytes(pickle.dumps({"weights": [1.0, 2.0]}))


ROWS += [
    ("analyze-tasks-without-live", ["analyze", "{t}/ck", "--tasks", "8"], ck, "--tasks: an option of --live"),
    ("analyze-live-options-without-live", ["analyze", "{t}/r.h5", "--batch-size", "4", "--prompt-seed", "1",
                                           "--device", "cuda"], recording,
     "--batch-size, --prompt-seed, --device: options of --live"),
    ("analyze-recording-without-z", ["analyze", "{t}/r.h5"], damaged(lambda f: f.__delitem__("prompts/z")),
     "damaged recording: no /prompts/z"),
    ("analyze-recording-unknown-family", ["analyze", "{t}/r.h5"],
     damaged(lambda f: f.attrs.__setitem__("task_family", "nope")), "task family 'nope' is not a registered family"),
    ("analyze-recording-z-wrong-width", ["analyze", "{t}/r.h5"], damaged(_wide),
     "damaged recording: its prompts have width 10 but its layout has d_model 5"),
    ("analyze-recording-junk-config", ["analyze", "{t}/r.h5"],
     damaged(lambda f: f.attrs.__setitem__("checkpoint_config", '{"junk": 1}')), "unreadable checkpoint_config"),
    ("verdict-recording-tasks", ["verdict", "{t}/r.h5", "--tasks", "16"], recording,
     "--tasks: not used on a recording"),
    ("verdict-recording-model-and-task", ["verdict", "{t}/r.h5", "--model", USER_NET, "--task", "linear-td", "--d", "4"],
     recording, "r.h5 brings its own task"),
    ("verdict-recording-causal-options-without-model", ["verdict", "{t}/r.h5", "--random-draws", "4", "--probe",
                                                        "{t}/p.toml", "--direction-seed", "1"], recording,
     "--probe, --random-draws, --direction-seed: not used without the model"),
    ("verdict-model-not-editable", ["verdict", "{t}/r.h5", "--model", USER_NET, "--bootstrap", "10"], recording,
     "cannot edit the model for the causal evidence: Net is not a TransformerLens model"),
    ("report-truncated-recording", ["report", "{t}/r.h5", "--out", "{t}/rep"], truncated, "truncated HDF5 file"),
    ("report-pickled-input", ["report", "{t}/model.pkl", "--out", "{t}/rep"], pickled,
     "neither a checkpoint directory, an HDF5 recording nor a .safetensors file"),
    ("report-unreachable-scheduler", ["report", "{t}/ck", "--out", "{t}/rep", "--scheduler", "tcp://127.0.0.1:1"], ck,
     "cannot reach a Dask scheduler"),
    ("report-unresolvable-scheduler", ["report", "{t}/ck", "--out", "{t}/rep", "--scheduler",
                                       "tcp://no-such-host.invalid:8786"], ck, "cannot reach a Dask scheduler"),
]
# --- bad models: one line naming what the model did, nothing left behind (issue 23, 3)
BAD_MODELS = '''
import sys
import torch
from torch import nn


class Net(nn.Module):
    """linear-td prompts (d 4: width 9) -> [batch, 1]; from its forward call `at` on, it misbehaves (`fail`)."""

    def __init__(self, fail=None, at=1):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(9, 16), nn.Linear(16, 1)
        self.fail, self.at, self.calls = fail, at, 0

    def forward(self, z):
        self.calls += 1
        y = self.b(torch.relu(self.a(z)))[:, -1]
        if self.fail is None or self.calls < self.at:
            return y
        if self.fail == "exit":
            sys.exit(0)
        if self.fail == "raise":
            raise ValueError("boom")
        return {"nan": torch.full_like(y, float("nan")), "inf": torch.full_like(y, float("inf")), "tuple": (y, y)}[self.fail]


def good(): return Net()
def nan(): return Net("nan")
def inf(): return Net("inf")
def pair(): return Net("tuple")
def leaves(): return Net("exit")
def raises(): return Net("raise")
def late_nan(): return Net("nan", at=3)
def quits(): sys.exit(5)
def nan_weights():
    net = Net()
    with torch.no_grad():
        net.a.weight.fill_(float("nan"))
    return net
'''


def bad_models(t: Path) -> None:
    """{t}/bad.py (the models above), {t}/exits.py (sys.exit(3) on import), {t}/roles.toml (their probe spec)
    and {t}/nan.safetensors (weights of `good`'s shapes, all NaN)."""
    import numpy as np
    from safetensors.numpy import save_file

    (t / "bad.py").write_text(BAD_MODELS)
    (t / "exits.py").write_text("import sys\nsys.exit(3)\n\ndef good():\n    pass\n")
    (t / "roles.toml").write_text('[roles]\nresid_post = ["a"]\n')
    shapes = {"a.weight": (16, 9), "a.bias": (16,), "b.weight": (1, 16), "b.bias": (1,)}
    save_file({k: np.full(s, np.nan, dtype=np.float32) for k, s in shapes.items()}, str(t / "nan.safetensors"))


def user_model(command: str, func: str, *extra: str, file: str = "bad.py") -> list[str]:
    """argv running {t}/FILE:FUNC on 16 linear-td prompts (d 4, n 8) in batches of 4 (`extra` last: it wins)."""
    out = {"record": ["--out", "{t}/r.h5", "--no-progress"], "causal": ["--layer", "0"]}.get(command, [])
    return [command, *(["--live"] if command == "analyze" else []), "--model", f"{{t}}/{file}:{func}", "--task",
            "linear-td", "--d", "4", "--n", "8", "--probe", "{t}/roles.toml", *out,
            *(["--tasks", "16", "--batch-size", "4"] if command != "verdict" else []), *extra]


def long_prompt(t: Path) -> None:
    """The softmax-td checkpoint (6 layers) and one prompt of 20,000 positions: its attention patterns alone,
    recorded for the model and its random-init copy, are 2 x 6 x 20000^2 float32 = 19 GB."""
    import numpy as np

    shutil.copytree(SHIPPED / "softmax-td", t / "sm")
    np.savez(t / "long.npz", z=np.zeros((1, 20_000, 8)))


ROWS += [
    ("record-model-nan-output", user_model("record", "nan"), bad_models,
     "non-finite output: the model's output holds NaN in batch 1 of 4 (prompts 0..3)"),
    ("record-model-inf-output", user_model("record", "inf"), bad_models,
     "non-finite output: the model's output holds Inf in batch 1 of 4"),
    ("record-model-nan-in-a-later-batch", user_model("record", "late_nan"), bad_models,
     "the model's output holds NaN in batch 3 of 4 (prompts 8..11)"),
    ("record-model-tuple-output", user_model("record", "pair"), bad_models,
     "the model's output is a tuple of 2, not a tensor: return the prediction as one tensor [batch, k]"),
    ("record-model-nan-weights-file", user_model("record", "good", "--weights", "{t}/nan.safetensors"), bad_models,
     "nan.safetensors: parameter a.weight is not finite (144 of 144 values NaN or Inf)"),
    ("record-model-nan-parameters", user_model("record", "nan_weights"), bad_models,
     "bad.py:nan_weights': parameter a.weight is not finite (144 of 144 values NaN or Inf)"),
    ("record-model-exits-in-forward", user_model("record", "leaves"), bad_models,
     "the model called sys.exit(0) during its forward pass"),
    ("record-model-file-exits-on-import", user_model("record", "good", file="exits.py"), bad_models,
     "exits.py exited with status 3 on import"),
    ("record-model-func-exits", user_model("record", "quits"), bad_models, "bad.py:quits': quits() exited with status 5"),
    ("record-model-raises", user_model("record", "raises"), bad_models,
     "the model raised ValueError: boom (its input: prompts z of shape (4, 9, 9), float32)"),
    ("record-also-analyze-model-nan-later", user_model("record", "late_nan", "--also-analyze"), bad_models,
     "holds NaN in batch 3 of 4"),
    ("record-shards-model-nan-later", user_model("record", "late_nan", "--shards", "2", "--tasks", "32"), bad_models,
     "holds NaN in batch"),  # each shard's third batch
    ("analyze-live-model-nan-later", user_model("analyze", "late_nan"), bad_models,  # the run fails, not each analyzer
     "icrl-interp analyze: error: non-finite output: the model's output holds NaN in batch 3 of 4"),
    ("analyze-live-model-exits", user_model("analyze", "leaves"), bad_models, "the model called sys.exit(0)"),
    ("causal-model-raises", user_model("causal", "raises"), bad_models, "the model raised ValueError: boom"),
    ("causal-model-nan-later", user_model("causal", "late_nan"), bad_models, "holds NaN in batch 3 of 4"),
    ("verdict-model-raises", user_model("verdict", "raises"), bad_models, "the model raised ValueError: boom"),
    ("verdict-model-file-exits-on-import", user_model("verdict", "good", file="exits.py"), bad_models,
     "exits.py exited with status 3 on import"),
]
# --- absurd sizes: refused before torch is imported (issue 23, 4; BEFORE_TORCH below)
ROWS += [
    ("record-tasks-float", ["record", "{t}/ck", "--out", "{t}/r.h5", "--tasks", "1e12"], ck,
     "argument --tasks: expected int, got '1e12'"),
    ("record-tasks-absurd", ["record", "{t}/ck", "--out", "{t}/r.h5", "--tasks", BIG], ck,
     f"--tasks {BIG} would write ~"),
    ("record-model-tasks-absurd", user_model("record", "good", "--tasks", BIG), bad_models,
     f"--tasks {BIG} would write ~"),
    ("analyze-live-tasks-absurd", ["analyze", "{t}/ck", "--live", "--tasks", BIG], ck,
     f"--tasks {BIG} would take ~"),
    ("analyze-live-model-tasks-absurd", user_model("analyze", "good", "--tasks", BIG), bad_models,
     f"--tasks {BIG} would take ~"),
    ("construct-layers-untied-absurd", ["construct", "linear-td", "--out", "{t}/ck", "--n-layers", str(10**8),
                                        "--no-tied"], None, f"--n-layers {10**8} needs ~"),
    ("record-prompts-long", ["record", "{t}/sm", "--prompts", "{t}/long.npz", "--out", "{t}/r.h5"], long_prompt,
     "a prompt length (--prompts) of 20000 needs ~20.9 GiB of memory for one batch of the model and its "
     "random-init copy (prompts, task data, activations, attention patterns); this machine has 16 GiB: at most a "
     "prompt length (--prompts) of 17506 fits"),
    ("analyze-recording-progress-absurd", ["analyze", "{t}/r.h5"], damaged(lambda f: f["progress"].__setitem__(0, 10**9)),
     "corrupt recording (/progress says 1000000000 prompts, its n_prompts attribute 12)"),
    ("analyze-recording-progress-and-attribute-absurd", ["analyze", "{t}/r.h5"],
     damaged(lambda f: (f["progress"].__setitem__(0, 10**9), f.attrs.__setitem__("n_prompts", 10**9))),
     "/progress says 1000000000 prompts, but acts/blocks.0.attn.hook_v holds 12 rows"),
]
BEFORE_TORCH = {"record-tasks-absurd", "record-model-tasks-absurd", "analyze-live-tasks-absurd",
                "analyze-live-model-tasks-absurd", "construct-layers-untied-absurd", "record-prompts-long",
                "analyze-recording-progress-absurd", "analyze-recording-progress-and-attribute-absurd"}
"""Size refusals: they come before torch is imported, so they cost no start-up (`test_..._before_torch`)."""
SUBPROCESS = {"construct-scale-inf"}
"""Rows run as a subprocess: their point is everything that reaches the terminal (a numpy warning too)."""


def snapshot(root: Path) -> dict[str, str]:
    """Every path below `root` (hidden ones too) -> the sha256 of its bytes, or 'dir'."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = "dir"
        for f in filenames:
            path = os.path.join(dirpath, f)
            out[os.path.relpath(path, root)] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A finished two-step run (one checkpoint with its resume state), for the resume rows."""
    global RUN
    RUN = tmp_path_factory.mktemp("tiny") / "run"
    argv = ["train", "sarsa", "--out", str(RUN), *TINY, "--steps", "2", "--checkpoint-every", "2", "--no-progress",
            "--no-eval"]
    assert cli.main(argv) == 0
    return RUN


@pytest.fixture(autouse=True)
def sixteen_gib(monkeypatch):
    monkeypatch.setattr(outputs, "memory_bytes", lambda: 16 * 2**30)


@pytest.fixture(scope="module")
def tiny_rec(tmp_path_factory):
    """A complete tiny recording of a linear-td theta* (the damaged-recording rows copy and edit it)."""
    global REC
    t = tmp_path_factory.mktemp("tiny-rec")
    assert cli.main(["construct", "linear-td", "--out", str(t / "ck"), "--d", "2", "--n", "6", "--n-layers", "2"]) == 0
    REC = t / "r.h5"
    assert cli.main(["record", str(t / "ck"), "--out", str(REC), "--tasks", "12", "--batch-size", "6", "--no-progress"]) == 0
    return REC


@pytest.mark.parametrize("name, argv, setup, fragment", ROWS, ids=[r[0] for r in ROWS])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(name, argv, setup, fragment, tmp_path, monkeypatch,
                                                          capfd, tiny_run, tiny_rec):
    if NOT_WRITABLE.as_posix() in " ".join(argv) and not NOT_WRITABLE.is_dir():
        pytest.skip(f"no {NOT_WRITABLE} on this platform")
    t = tmp_path / "t"
    t.mkdir()
    if setup is not None:
        setup(t)
    monkeypatch.chdir(t)
    before = snapshot(t)
    argv = [a.replace("{t}", str(t)) for a in argv]
    if name in SUBPROCESS:
        proc = subprocess.run([sys.executable, "-m", "icrl_interp.cli", *argv], capture_output=True, text=True,
                              timeout=120, cwd=t)
        code, err = proc.returncode, proc.stderr
    else:
        code = cli.main(argv)
        err = capfd.readouterr().err
    lines = err.splitlines()
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("icrl-interp ") and fragment in lines[0], lines[0]
    assert snapshot(t) == before


NO_TORCH = """import sys
from icrl_interp import cli, outputs
outputs.memory_bytes = lambda: 16 * 2**30  # as the table's rows: the same refusal on every machine
code = cli.main(sys.argv[1:])
print("torch imported" if "torch" in sys.modules else "no torch")
sys.exit(code)
"""


@pytest.mark.parametrize("name", sorted(BEFORE_TORCH))
def test_size_refusals_come_before_torch_is_imported(name, tmp_path, tiny_rec):
    """A size refusal costs no start-up: in a fresh process, the command refuses (one line, exit 2) and
    torch was never imported (what makes it come within seconds; no timing in the test)."""
    _, argv, setup, fragment = next(r for r in ROWS if r[0] == name)
    t = tmp_path / "t"
    t.mkdir()
    if setup is not None:
        setup(t)
    argv = [a.replace("{t}", str(t)) for a in argv]
    proc = subprocess.run([sys.executable, "-c", NO_TORCH, *argv], capture_output=True, text=True, timeout=120, cwd=t)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and fragment in proc.stderr, proc.stderr
    assert proc.stdout.splitlines()[-1] == "no torch"


# ------------------------------------------------------------------ what the rule still allows
def test_own_outputs_are_replaced_and_user_files_beside_them_survive(tmp_path, capsys):
    """Re-running a command over its own JSON, PNG and report works; files the user keeps beside them stay."""
    ck(tmp_path)
    a, png, rep = tmp_path / "a.json", tmp_path / "c.png", tmp_path / "rep"
    control = ["control", str(tmp_path / "ck"), "--mdps", "2", "--iterations", "2", "--no-progress", "--json", str(a),
               "--figure", str(png)]
    assert cli.main(control) == 0 and cli.main(control) == 0
    assert outputs.is_ours(png) and outputs.is_ours(a)
    report = ["report", str(tmp_path / "ck"), "--out", str(rep), "--workers", "1", "--control-mdps", "0",
              "--no-progress"]
    assert cli.main(report) == 0
    (rep / "notes.txt").write_text("mine\n")
    assert cli.main(report) == 0
    assert (rep / "notes.txt").read_text() == "mine\n"
    manifest = json.loads((rep / "figures" / "manifest.json").read_text())["files"]
    assert manifest and sorted(p.name for p in (rep / "figures").glob("*.png")) == manifest
    capsys.readouterr()
    (rep / "figures" / "mine.png").write_bytes(b"user")
    assert cli.main(report) == 2
    assert "mine.png is not a figure this report wrote" in capsys.readouterr().err
    assert (rep / "figures" / "mine.png").read_bytes() == b"user"


def test_demo_regenerates_only_its_own_inputs(tmp_path, monkeypatch):
    """A new --out works; a re-run replaces the demo's own inputs and keeps the user's files beside them;
    a foreign file at one of the demo's names is refused. (Torch, recording and analysis are stubbed.)"""
    from icrl_interp.models import checkpoint, construct
    from icrl_interp.report import demo
    from icrl_interp.recording import probe_spec
    from icrl_interp import report
    from icrl_interp.core.errors import UserError
    from icrl_interp.report import ReportOutcome, batch

    def fake_report(inputs, out, config):
        batch.write_summaries([], out)
        return ReportOutcome([], [], Path(out))

    def no_spec(family):
        raise UserError("no probe spec in this test")

    monkeypatch.setattr(report, "build_report", fake_report)
    monkeypatch.setattr(construct, "construct", lambda family, values, target, overwrite=False: shutil.copytree(CK, target))
    monkeypatch.setattr(checkpoint, "load", lambda path: None)
    monkeypatch.setattr(probe_spec, "shipped_spec", no_spec)
    monkeypatch.setattr(demo, "shipped_checkpoints", lambda root=None: [])
    monkeypatch.setattr(demo.ad_demo, "closed_loop_verdict",  # the AD model acting: tests/report/test_ad_demo.py
                        lambda out, seed: {"verdict": {"text": "none fits", "best": None}, "candidates": {}})
    config = demo.DemoConfig(out=tmp_path / "demo", families=("sarsa",))
    assert demo.run_demo(config) == 0
    inputs = tmp_path / "demo" / "inputs"
    (inputs / "keep.txt").write_text("mine\n")
    (inputs / "theta_star-sarsa" / "model.safetensors").write_bytes(b"stale")
    assert demo.run_demo(config) == 0
    assert (inputs / "keep.txt").read_text() == "mine\n"
    assert (inputs / "theta_star-sarsa" / "model.safetensors").read_bytes() == (CK / "model.safetensors").read_bytes()
    (inputs / "theta_star-sarsa" / "thesis.txt").write_text("mine\n")
    before = snapshot(tmp_path)
    with pytest.raises(UserError, match="is not a file the demo wrote"):
        demo.run_demo(config)
    assert snapshot(tmp_path) == before


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes anywhere")
def test_a_read_only_directory_is_refused_in_one_line(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        assert cli.main(["construct", "linear-td", "--out", str(ro / "ck")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "cannot write in" in err
    finally:
        ro.chmod(0o755)
