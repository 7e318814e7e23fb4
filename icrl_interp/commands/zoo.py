"""`icrl-interp zoo run --out DIR`: the models with known answers, judged by the verdict and the causal test.

Writes DIR/zoo.json (`icrl_interp.zoo/1`: one row per model, the summary, the confusion matrix) and
DIR/confusion.png; each model's row lands in DIR/rows/ as soon as it is judged, so a run stopped midway
continues where it stopped when started again with the same options (docs/zoo.md).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from ..core.cli_fields import add_fields, parsed


@dataclass
class ZooOptions:
    """Which zoo, and where its results go."""

    out: str = field(metadata={"metavar": "DIR"})
    """Directory of the results: zoo.json, confusion.png and rows/ (a new, empty or earlier zoo directory)."""
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


def _owned(path) -> bool:
    return (path / "zoo.json").is_file() or (path / "rows").is_dir()


def run(args) -> int:
    from pathlib import Path

    from ..core.errors import UserError
    from ..core.outputs import output_dir

    o = parsed(args, ZooOptions)
    if o.zoo_seed < 0:
        raise UserError(f"--zoo-seed must be a non-negative integer, got {o.zoo_seed}")
    if o.set == "episodes":
        return _episodes(o)
    from ..report.zoo import write_figure  # matplotlib and the families' zoo: not needed by the episode zoo
    from ..zoo import registry
    from ..zoo import run as zoo_run

    registry.entries(o.set, o.zoo_seed)  # a broken table is refused before the directory is touched
    out = Path(output_dir(o.out, "--out", owned=_owned, what="zoo directory"))
    result = zoo_run.run(out, o.set, o.zoo_seed, progress=o.progress)
    write_figure(result, out / "confusion.png")
    s = result["summary"]
    print(f"zoo {o.set} (seed {o.zoo_seed}): {s['models']} models ({s['decoys']} decoys) in {result['seconds']:.0f} s; "
          f"non-decoys right {s['non_decoys_right']}/{s['non_decoys']}, decoys refused {s['decoys_refused']}/"
          f"{s['decoys']}, clear wrong {s['clear_wrong']}; wrote {out / 'zoo.json'} and {out / 'confusion.png'}")
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
