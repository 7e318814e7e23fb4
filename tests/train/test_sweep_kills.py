"""A sweep SIGKILLed in each of its phases (training, analysis, report) resumes to the uninterrupted result.

The killed sweep is the real command (`cli.main`) in a forked child of the test process (torch and the
models are imported already, so a child costs no start-up), which SIGKILLs itself at a named point of
the phase (`icrl_interp.core.faults`: no `finally`, no flush runs). The re-run, in this process, must take
the directory over, finish it, and leave the summary and the plan byte for byte the uninterrupted
sweep's (paths aside), with no temporary file anywhere. The report's figures are two blank plots
(drawing the real ones would take most of the test's time; what is tested is how they are written).
"""
from __future__ import annotations

import contextlib
import io
import json
import multiprocessing as mp
import os
import re
import signal
from pathlib import Path

import pytest

from matplotlib.figure import Figure

from icrl_interp import cli
from icrl_interp.core import faults
from icrl_interp.report import figures
from icrl_interp.report.batch import REPORT_LOCK, is_report_dir
from icrl_interp.train.sweep import SWEEP_LOCK

GRID = """
family = "linear-td"
seeds = [0]

[base]
d = 2
n_states = 4
n = 6
n_layers = 1
windows = 2
trajectories_per_task = 1
tasks_per_step = 2
eval_tasks = 4
steps = 4
checkpoint_every = 2
log_every = 2

[grid]
lr = [0.01, 0.003]

[report]
max_recordings = 0
control_mdps = 0
live_tasks = 0
"""
"""2 tiny runs of 4 steps, a checkpoint every 2: 4 report inputs, weights-only analyses."""
LEFTOVER = re.compile(r"\..+\.([a-z0-9_]{8}\.(tmp|png|svg)|old-[0-9a-f]{8})$|\.partial$")
"""Names a killed writer leaves: atomic_path's and atomic_dir's temporaries, .partial files."""


def _argv(grid: Path, out: Path) -> list[str]:
    return ["sweep", str(grid), "--out", str(out), "--scheduler", "serial", "--no-progress"]


def _sweep(grid: Path, out: Path) -> tuple[int, str]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = cli.main(_argv(grid, out))
    return code, buf.getvalue()


def _child(argv: list[str], point: str) -> None:
    os.environ[faults.ENV] = point
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
        cli.main(argv)  # returning (exit status 0) means the kill point was never reached


def _killed_at(point: str, grid: Path, out: Path) -> None:
    proc = mp.get_context("fork").Process(target=_child, args=(_argv(grid, out), point))
    proc.start()
    proc.join(300)
    assert proc.exitcode == -signal.SIGKILL, f"the sweep was not killed at {point} (exit {proc.exitcode})"


def _normalised(path: Path, out: Path) -> str:
    return path.read_text().replace(str(out.resolve()), "OUT")


def _blank(family, results) -> Figure:
    fig = Figure(figsize=(1, 1))
    fig.add_subplot().axis("off")
    return fig


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, Path]:
    """(grid file, directory of the uninterrupted sweep)."""
    d = tmp_path_factory.mktemp("sweep-ref")
    (d / "grid.toml").write_text(GRID)
    with pytest.MonkeyPatch.context() as mp_:
        mp_.setattr(figures, "FAMILY_FIGURES", [("a", "A", _blank, ""), ("b", "B", _blank, "")])
        code, text = _sweep(d / "grid.toml", d / "ref")
        assert code == 0, text
        assert sorted(p.name for p in (d / "ref" / "report" / "figures").glob("*.png")) == ["linear-td-a.png",
                                                                                           "linear-td-b.png"]
        yield d / "grid.toml", d / "ref"


def _phase_left(point: str, out: Path) -> None:
    """What the kill left shows that it came in the middle of its phase."""
    runs = sorted((out / "runs").iterdir())
    report = out / "report"
    if point == "train.checkpoint":  # the first run has its step-2 checkpoint, nothing more
        assert [p.name for p in (runs[0] / "checkpoints").iterdir()] == ["step_000002"]
        assert not (runs[0] / "final_metrics.json").exists() and not report.exists()
    elif point == "report.analysis":  # one analysis cached, no summary: recognised by its lock file alone
        assert all((r / "final_metrics.json").is_file() for r in runs)
        assert len(list((report / "cache").iterdir())) == 1 and not (report / "summary.json").exists()
        assert (report / REPORT_LOCK).is_file() and is_report_dir(report)
    else:  # the summary and one figure are written, the page and the figure manifest are not
        assert (report / "summary.json").is_file() and not (report / "index.html").exists()
        assert len(list((report / "figures").glob("*.png"))) == 1
        assert not (report / "figures" / "manifest.json").exists()


@pytest.mark.parametrize("point, resumed", [
    ("train.checkpoint", r"^lr-0\.01_seed-0_\w+: resumed from step 2$"),
    ("report.analysis", r"\(1 analyses from cache\)"),
    ("report.figure", r"\(4 analyses from cache\)"),
])
def test_a_sweep_killed_in_each_phase_resumes_to_the_uninterrupted_result(reference, tmp_path, point, resumed):
    grid, ref = reference
    out = tmp_path / "sweep"
    _killed_at(point, grid, out)
    assert (out / SWEEP_LOCK).is_file()
    _phase_left(point, out)

    code, text = _sweep(grid, out)
    assert code == 0, text
    assert re.search(resumed, text, re.M), text
    for name in ("sweep.json", "report/summary.json", "report/summary.csv", "report/figures/manifest.json"):
        assert _normalised(out / name, out) == _normalised(ref / name, ref), name
    assert sorted(p.name for p in (out / "report" / "figures").iterdir()) == \
        sorted(p.name for p in (ref / "report" / "figures").iterdir())
    assert (out / "report" / "index.html").is_file()
    left = [p for p in out.rglob("*") if LEFTOVER.search(p.name)]
    assert left == [], left
    assert json.loads((out / "sweep.json").read_text())["schema"] == "icrl_interp.sweep/1"
