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

from icrl_interp import cli, outputs

SHIPPED = Path(__file__).resolve().parents[2] / "data" / "checkpoints"
CK = SHIPPED / "sarsa"  # a checkpoint of a control family, a few KiB
TINY = ["--n-states", "2", "--n-actions", "2", "--n", "8", "--batch", "4", "--eval-tasks", "4"]
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
    ("demo-prompts-zero", ["demo", "--out", "{t}/demo", "--prompts", "0"], None, "--prompts must be a positive integer"),
    ("analyze-head-out-of-range", ["analyze", "{t}/ck", "--head", "99"], ck, "1 attention head"),
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
    ("construct-layers-absurd", ["construct", "linear-td", "--out", "{t}/ck", "--layers", str(10**6)], None,
     f"--layers {10**6} needs ~"),
    ("construct-states-absurd", ["construct", "sarsa", "--out", "{t}/ck", "--states", str(10**6)], None,
     f"--states {10**6} needs ~"),
    ("train-d-absurd", ["train", "linear-td", "--out", "{t}/run", "--d", "100000"], None, "--d 100000 needs ~"),
    ("train-layers-absurd", ["train", "linear-td", "--out", "{t}/run", "--n-layers", str(10**6)], None,
     f"--n-layers {10**6} needs ~"),
    ("train-batch-absurd", ["train", "sarsa", "--out", "{t}/run", "--batch", BIG], None, f"--batch {BIG} needs ~"),
    ("train-n-absurd", ["train", "sarsa", "--out", "{t}/run", "--n", str(10**9)], None, f"--n {10**9} needs ~"),
    ("train-eval-tasks-absurd", ["train", "sarsa", "--out", "{t}/run", "--eval-tasks", BIG], None,
     f"--eval-tasks {BIG} needs ~"),
    ("train-steps-absurd", ["train", "sarsa", "--out", "{t}/run", *TINY, "--steps", str(10**18)], None,
     "of checkpoints and metrics"),
    ("control-steps-absurd", ["control", "{t}/ck", "--steps", BIG], ck, f"--steps {BIG} needs ~"),
    ("control-mdps-absurd", ["control", "{t}/ck", "--mdps", BIG], ck, f"--mdps {BIG} needs ~"),
    ("control-n-absurd", ["control", "{t}/ck", "--n", BIG], ck, f"--n {BIG} needs ~"),
    ("envs-tasks-absurd", ["envs", "boyan", "--tasks", BIG], None, f"--tasks {BIG} needs ~"),
    ("envs-states-absurd", ["envs", "mdp", "--states", "100000"], None, "--states 100000 needs ~"),
    ("construct-negative-seed", ["construct", "linear-td", "--out", "{t}/ck", "--seed", "-1"], None,
     "--seed must be a non-negative integer"),
    ("control-negative-seed", ["control", "{t}/ck", "--seed", "-1"], ck, "--seed must be a non-negative integer"),
    ("train-negative-seed", ["train", "sarsa", "--out", "{t}/run", *TINY, "--seed", "-1"], None,
     "--seed must be a non-negative integer"),
    ("envs-negative-seed", ["envs", "boyan", "--seed", "-1"], None, "--seed must be a non-negative integer"),
    ("demo-negative-seed", ["demo", "--out", "{t}/demo", "--seed", "-1"], None, "--seed must be a non-negative integer"),
    ("analyze-negative-seed", ["analyze", "{t}/ck", "--seed", "-1"], ck, "--seed must be a non-negative integer"),
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
    ("record-shards-zero", ["record", "{t}/ck", "--out", "{t}/r.h5", "--tasks", "8", "--shards", "0", "--quiet"], ck,
     "--shards must be a positive integer, got 0"),
    ("record-shards-more-than-batches", ["record", "{t}/ck", "--out", "{t}/r.h5", "--tasks", "8", "--batch-size", "4",
                                         "--shards", "3", "--quiet"], ck, "splits into 1 to 2 shards"),
    ("record-shards-resume-nothing", ["record", "{t}/ck", "--out", "{t}/r.h5", "--tasks", "8", "--batch-size", "4",
                                      "--shards", "2", "--resume", "--quiet"], ck, "nothing to resume"),
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
]
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


@pytest.mark.parametrize("name, argv, setup, fragment", ROWS, ids=[r[0] for r in ROWS])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(name, argv, setup, fragment, tmp_path, monkeypatch,
                                                          capfd, tiny_run):
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


# ------------------------------------------------------------------ what the rule still allows
def test_own_outputs_are_replaced_and_user_files_beside_them_survive(tmp_path, capsys):
    """Re-running a command over its own JSON, PNG and report works; files the user keeps beside them stay."""
    ck(tmp_path)
    a, png, rep = tmp_path / "a.json", tmp_path / "c.png", tmp_path / "rep"
    control = ["control", str(tmp_path / "ck"), "--mdps", "2", "--steps", "2", "--no-progress", "--json", str(a),
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
    from icrl_interp import checkpoint, construct, demo, probe_spec, report
    from icrl_interp.errors import UserError
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
