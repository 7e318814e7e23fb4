"""`icrl-interp zoo run --out DIR`: the models with known answers, judged by the verdict and the causal test.

Writes DIR/zoo.json (`icrl_interp.zoo/1`: one row per model, the summary, the confusion matrix) and
DIR/confusion.png; each model's row lands in DIR/rows/ as soon as it is judged, so a run stopped midway
continues where it stopped when started again with the same options (docs/zoo.md). The full set also checks the
intervals' calibration by simulation (zoo.json's `calibration`, DIR/calibration.json and DIR/calibration.png).

`icrl-interp zoo calibrate --out DIR`: the verdict's parameter intervals checked by simulation on noisy teachers
(zoo/calibration.py); writes DIR/calibration.json and DIR/calibration.png (docs/zoo.md, "Calibration").
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from ..core.cli_fields import add_fields, parsed


@dataclass
class ZooOptions:
    """Which zoo, and where its results go."""

    out: str = field(metadata={"metavar": "DIR"})
    """Directory of the results: zoo.json, confusion.png and rows/ (the full set: calibration.json and .png too; a new,
    empty or earlier zoo directory)."""
    set: str = field(default="default", metadata={"choices": ("default", "full", "episodes")})
    """Which entries: a few that run in about a minute (default), every one (full), or the episode zoo: teachers
    and decoys acting on the Ledge, judged by the behavioural fit (episodes; writes DIR/episode_zoo.json)."""
    zoo_seed: int = 0
    """Seed of the zoo: 0 is the zoo the thresholds were read against; any other draws a fresh zoo (step sizes
    jittered, other prompts, splits and random directions)."""
    progress: bool = True
    """Show a progress bar over the models on stderr."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    add_fields(sub.add_parser("run", help="judge every model of the zoo; write DIR/zoo.json and the confusion matrix",
                              description="judge every model of the zoo; write DIR/zoo.json and the confusion matrix"),
               ZooOptions)
    add_fields(sub.add_parser("calibrate", help="check by simulation that the verdict's 95%% parameter intervals cover "
                              "the truth; write DIR/calibration.json and calibration.png",
                              description="check by simulation that the verdict's 95 percent parameter intervals cover the "
                              "truth: noisy exact teachers, fresh tasks and noise per replicate; write "
                              "DIR/calibration.json and DIR/calibration.png (docs/zoo.md, Calibration)"),
               CalibrateOptions)


@dataclass
class CalibrateOptions:
    """How many simulated replicates, and where the result goes."""

    out: str = field(metadata={"metavar": "DIR"})
    """Directory of the results: calibration.json and calibration.png (a new, empty or earlier calibration directory)."""
    replicates: int = 100
    """Replicates per teacher and noise level (fresh tasks and noise each); about 0.5 CPU s each."""
    tasks: int = 160
    """Tasks per replicate, one prompt each (70 % train the fit, as in the verdict)."""
    zoo_seed: int = 0
    """Seed of the simulation: its tasks, noise, splits and resamples."""
    progress: bool = True
    """Show a progress bar over the replicates on stderr."""


def _calibrate(args) -> int:
    """`zoo calibrate`: zoo/calibration.py's simulation, its JSON written atomically, the figure beside it."""
    from pathlib import Path

    from ..core.errors import UserError
    from ..core.files import write_json
    from ..core.outputs import output_dir
    from ..report.calibration import coverage_text, write_figure
    from ..zoo.calibration import calibrate

    o = parsed(args, CalibrateOptions)
    if o.replicates < 1 or o.tasks < 10 or o.zoo_seed < 0:
        raise UserError(f"--replicates must be >= 1, --tasks >= 10 and --zoo-seed >= 0, got {o.replicates}, "
                        f"{o.tasks} and {o.zoo_seed}")
    out = Path(output_dir(o.out, "--out", owned=lambda p: (p / "calibration.json").is_file(),
                          what="calibration directory"))
    result = calibrate(o.replicates, seed=o.zoo_seed, tasks=o.tasks, progress=o.progress)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "calibration.json", result)
    write_figure(result, out / "calibration.png")
    print(f"calibration: {coverage_text(result['summary']['overall'])} in {result['seconds']:.0f} s; wrote "
          f"{out / 'calibration.json'} and {out / 'calibration.png'}")
    return 0


def _owned(path) -> bool:
    return (path / "zoo.json").is_file() or (path / "rows").is_dir()


def run(args) -> int:
    from pathlib import Path

    from ..core.errors import UserError
    from ..core.outputs import output_dir

    if args.action == "calibrate":
        return _calibrate(args)
    o = parsed(args, ZooOptions)
    if o.zoo_seed < 0:
        raise UserError(f"--zoo-seed must be a non-negative integer, got {o.zoo_seed}")
    if o.set == "episodes":
        return _episodes(o)
    from ..report.calibration import write_figure as calibration_figure
    from ..report.known_answers import calibration_text
    from ..report.zoo import write_figure  # matplotlib and the families' zoo: not needed by the episode zoo
    from ..zoo import registry
    from ..zoo import run as zoo_run

    registry.entries(o.set, o.zoo_seed)  # a broken table is refused before the directory is touched
    out = Path(output_dir(o.out, "--out", owned=_owned, what="zoo directory"))
    result = zoo_run.run(out, o.set, o.zoo_seed, progress=o.progress)
    write_figure(result, out / "confusion.png")
    wrote, cal = [out / "zoo.json", out / "confusion.png"], result.get("calibration")
    if cal:  # the full set: the intervals' coverage by simulation, its figure beside the confusion matrix
        wrote.append(calibration_figure(cal, out / "calibration.png"))
    s = result["summary"]
    print(f"zoo {o.set} (seed {o.zoo_seed}): {s['models']} models ({s['decoys']} decoys) in {result['seconds']:.0f} s; "
          f"non-decoys right {s['non_decoys_right']}/{s['non_decoys']}, decoys refused {s['decoys_refused']}/"
          f"{s['decoys']}, clear wrong {s['clear_wrong']}{calibration_text(result)}; wrote "
          f"{', '.join(map(str, wrote))}")
    return 0


def _episodes(o) -> int:
    """`zoo run --set episodes`: the episode zoo (zoo/episode_zoo.py) with --zoo-seed as the histories' seed."""
    from pathlib import Path

    from ..core.outputs import output_dir
    from ..zoo.episode_zoo import run_episode_zoo

    out = Path(output_dir(o.out, "--out", owned=_owned, what="zoo directory"))
    result = run_episode_zoo(out, seed=o.zoo_seed, progress=o.progress)
    s = result["summary"]
    print(f"episode zoo (seed {o.zoo_seed}): {s['entries']} agents ({s['decoys']} decoys) in "
          f"{result['seconds']:.0f} s; teachers named {s['teachers_named_right']}/{s['teachers']}, alpha within "
          f"20 % {s['alpha_within_20pct']}/{s['alpha_checked']}, decoys 'none fits' {s['decoys_none_fits']}/"
          f"{s['decoys']}, clear wrong {s['clear_wrong']}; wrote {out / 'episode_zoo.json'}")
    return 0
