"""A sweep: a TOML grid of training configs x seeds -> one resumable run directory per point.

The grid file (docs/cluster.md, "Sweeps"):

    family = "<FAMILY>"           # a family with a training recipe, e.g. linear-td
    seeds = [0, 1, 2]             # every point is trained once per seed (default [0])

    [base]                        # fields of the family's TrainConfig, the same for every run
    steps = 200

    [grid]                        # fields swept: lists of values; the runs are their Cartesian product
    lr = [1e-3, 3e-3]
    n_layers = [2, 4]

    [report]                      # optional: fields of report.ReportConfig for the batch report
    control_mdps = 0

Values must have the field's TOML type (an integer field takes integers; a float field integers or
floats; a string field strings; a boolean field true / false); a field of no table, a repeated
field, an empty list or an empty grid is refused in one line naming the field, and so is a number
that is not finite (`inf`, `nan`) or a seed outside 0..2**63-1 (what the random generators take). A grid
of more than `MAX_RUNS` runs is refused with its size before anything else is done (before torch is
imported). Every point is then checked as a config (`TrainConfig.validate`) before anything is trained.

Run directory names (`SweepPoint.name`) are the swept values, the seed and a short hash of the whole
config except `steps`: a changed base field makes new directories (the trainer refuses to continue a
run under another config), while more `steps` continues the same runs. A point is finished when its
last checkpoint (step `steps`) is complete, and with evaluation also its final_metrics.json: a
re-run skips finished points, and the trainer resumes unfinished ones from their last checkpoint.

`train_point` is the task a worker runs: it writes only its own run directory (atomically, through
the trainer) and returns plain data, or an error line instead of raising (a run that diverges fails
the same way wherever it runs, so it is not retried).
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import re
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import UserError, check, one_line
from ..core.files import is_lock_file, locked, temporaries
from ..families import registry
from .config import MAX_SEED, TrainConfig, config_for, renamed_fields
from .recipe import recipe, training_families

SWEEP_SCHEMA = "icrl_interp.sweep/1"
"""`schema` of OUT/sweep.json (the plan of a sweep, written before any training)."""
SWEEP_LOCK = ".icrl_interp-sweep.lock"
"""The file a sweep creates first in its directory and holds locked while it runs (`writing_sweep`):
it marks the directory as a sweep's even before sweep.json exists, and keeps two sweeps from writing
one directory at once. It stays."""
TABLES = ("base", "grid", "report")
KEYS = ("family", "seeds", *TABLES)
"""Top-level keys of a grid file."""
NOT_SWEPT = ("family", "seed", "run_id")
"""Config fields set elsewhere: the family and seeds at the top level, the run id by the trainer."""
REPORT_FIELDS = ("title", "max_recordings", "svg", "embed", "control_mdps", "control_iterations", "use_cache",
                 "live_tasks")
"""ReportConfig fields a grid file's [report] table may set (not where the analyses run: the sweep's
scheduler decides that)."""
REPORT_TYPES = {"title": "str", "max_recordings": "int", "svg": "bool", "embed": "bool", "control_mdps": "int",
                "control_iterations": "int", "use_cache": "bool", "live_tasks": "int"}
MAX_RUNS = 10_000
"""The most runs one sweep plans: checking and naming a point takes ~0.5 ms, its entry in sweep.json
~0.5 KiB and its report rows as many as its checkpoints; a larger study is several sweeps."""


@dataclass
class SweepPoint:
    """One run of the sweep."""

    name: str
    """Its run directory's name under OUT/runs/."""
    swept: dict
    """The swept fields' values of this point and its seed."""
    config: TrainConfig
    """The full, validated training config."""


@dataclass
class Sweep:
    """A parsed, validated grid file."""

    family: str
    """The family trained."""
    seeds: list[int]
    """Seeds of every point."""
    base: dict
    """Fixed config fields."""
    grid: dict[str, list]
    """Swept fields and their values, in file order."""
    report: dict = field(default_factory=dict)
    """ReportConfig fields for the batch report."""
    points: list[SweepPoint] = field(default_factory=list)
    """One per (grid point, seed), seeds innermost."""

    def to_dict(self) -> dict:
        return {"family": self.family, "seeds": self.seeds, "base": self.base, "grid": self.grid, "report": self.report}


# ------------------------------------------------------------------ reading and checking the grid
def _type_name(value) -> str:
    return {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "a list",
            dict: "a table"}.get(type(value), type(value).__name__)


def _check_value(where: str, value, kind: str):
    """`value` if it has the TOML type of a field of type `kind` ('int', 'float | None', ...); else UserError."""
    base = kind.removesuffix(" | None")
    ok = {"int": isinstance(value, int) and not isinstance(value, bool),
          "float": isinstance(value, (int, float)) and not isinstance(value, bool),
          "bool": isinstance(value, bool),
          "str": isinstance(value, str)}.get(base, isinstance(value, (int, float, str, bool)))
    want = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}.get(base, "a value")
    check(ok, f"{where}: expected {want}, got {_type_name(value)} {value!r}")
    if base == "float":
        try:
            number = float(value)
        except OverflowError:  # an integer beyond the floats
            number = math.inf
        check(math.isfinite(number), f"{where}: expected a finite number, got {value!r}")
        return number
    return value


def _check_count(seeds: list, grid, base) -> None:
    """Refuse a grid of more than MAX_RUNS runs with its size and training steps (where the file sets
    them), counted from the lengths of its lists alone: nothing is expanded, no family is imported."""
    grid, base = (t if isinstance(t, dict) else {} for t in (grid, base))
    sizes = [len(v) if isinstance(v, list) else 1 for v in grid.values()]
    runs = math.prod(sizes) * len(seeds)
    if runs <= MAX_RUNS:
        return
    steps = grid.get("steps", [base.get("steps")])
    per_run = [v for v in steps if isinstance(v, int) and not isinstance(v, bool)] if isinstance(steps, list) else []
    steps_note = f", ~{runs * sum(per_run) / len(per_run):.3g} training steps" if per_run else ""
    shown = " x ".join(str(n) for n in sizes)
    raise UserError(f"grid: {shown} values x {len(seeds)} seed{'s' * (len(seeds) != 1)} = {runs:,} runs"
                    f"{steps_note}; a sweep runs at most {MAX_RUNS}: split it into smaller sweeps")


def _fields(family: str) -> dict[str, str]:
    """{field name: declared type} of the family's TrainConfig."""
    return {f.name: str(f.type) for f in dataclasses.fields(recipe(family).config_class)}


def _table(data: dict, key: str) -> dict:
    value = data.get(key, {})
    check(isinstance(value, dict), f"{key}: expected a table [{key}], got {_type_name(value)}")
    return value


def _known(where: str, name: str, types: dict[str, str], family: str) -> str:
    check(name not in NOT_SWEPT, f"{where}: {name} is not a field of [base] or [grid]"
                                 + ("; list the seeds in `seeds`" if name == "seed" else
                                    "; the family is the top-level `family`" if name == "family" else ""))
    check(name in types, f"{where}: unknown {family} training field (known: {', '.join(n for n in types if n not in NOT_SWEPT)})")
    return types[name]


def parse_sweep(data: dict) -> Sweep:
    """A grid file's TOML data -> a validated Sweep with its points (one-line UserError naming the field)."""
    unknown = [k for k in data if k not in KEYS]
    check(not unknown, f"{unknown[0] if unknown else ''}: unknown top-level key (known: {', '.join(KEYS)})")
    family = data.get("family")
    check(isinstance(family, str), f"family: expected a string naming a family ({', '.join(training_families())}), "
                                   f"got {_type_name(family) if family is not None else 'nothing'}")
    check(family in training_families(), f"family: {family!r} has no training recipe (known: {', '.join(training_families())})")
    seeds = data.get("seeds", [0])
    check(isinstance(seeds, list) and bool(seeds), f"seeds: expected a non-empty list of integers, got {seeds!r}")
    for i, s in enumerate(seeds):
        check(isinstance(s, int) and not isinstance(s, bool) and s >= 0,
              f"seeds[{i}]: expected a non-negative integer, got {_type_name(s)} {s!r}")
        check(s <= MAX_SEED, f"seeds[{i}]: {s} is larger than the largest seed, {MAX_SEED} (2**63 - 1)")
    check(len(set(seeds)) == len(seeds), f"seeds: {seeds} repeats a seed")
    _check_count(seeds, data.get("grid"), data.get("base"))
    types = _fields(family)  # imports the family's torch half
    base = {k: _check_value(f"base.{k}", v, _known(f"base.{k}", k, types, family)) for k, v in _table(data, "base").items()}
    grid: dict[str, list] = {}
    for k, values in _table(data, "grid").items():
        kind = _known(f"grid.{k}", k, types, family)
        check(k not in base, f"grid.{k}: also set in [base]; a field is either fixed or swept")
        check(isinstance(values, list), f"grid.{k}: expected a list of values, got {_type_name(values)} {values!r}")
        check(bool(values), f"grid.{k}: the list of values is empty")
        grid[k] = [_check_value(f"grid.{k}[{i}]", v, kind) for i, v in enumerate(values)]
        check(len({json.dumps(v) for v in grid[k]}) == len(grid[k]), f"grid.{k}: {values} repeats a value")
    check(bool(grid), "grid: the grid is empty; give [grid] at least one field with a list of values")
    report = {}
    for k, v in _table(data, "report").items():
        check(k in REPORT_TYPES, f"report.{k}: unknown report field (known: {', '.join(REPORT_FIELDS)})")
        report[k] = _check_value(f"report.{k}", v, REPORT_TYPES[k])
    sweep = Sweep(family, list(seeds), base, grid, report)
    sweep.points = _points(sweep)
    return sweep


def read_sweep(path) -> Sweep:
    """Read and validate a grid file (one-line UserError naming the file and the field)."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise UserError(f"cannot read the grid file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path} is not a TOML grid file (not UTF-8 text)") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path} is not valid TOML: {one_line(e)}") from None
    try:
        return parse_sweep(data)
    except UserError as e:
        raise UserError(f"{path}: {e}") from None


def _slug(value) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]", "_", str(value))[:24]


def config_hash(cfg: TrainConfig) -> str:
    """Short hash of the config without `steps` (more steps continue a run; anything else is another run)."""
    blob = json.dumps({k: v for k, v in cfg.hashed_dict().items() if k != "steps"}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:8]


def _points(sweep: Sweep) -> list[SweepPoint]:
    points = []
    keys = list(sweep.grid)
    for values in itertools.product(*(sweep.grid[k] for k in keys)):
        for seed in sweep.seeds:
            swept = {**dict(zip(keys, values)), "seed": seed}
            try:
                cfg = config_for(sweep.family, **sweep.base, **swept)
            except UserError as e:
                shown = ", ".join(f"{k}={v}" for k, v in swept.items())
                raise UserError(f"the point {shown} is not a valid config: {e}") from None
            name = "_".join(f"{k}-{_slug(v)}" for k, v in swept.items()) + f"_{config_hash(cfg)}"
            points.append(SweepPoint(name, swept, cfg))
    return points


# ------------------------------------------------------------------ runs
def is_finished(run_dir, cfg: TrainConfig, evaluate: bool = True) -> bool:
    """Whether `run_dir` holds this config's run trained to its last step (and evaluated, with `evaluate`)."""
    run_dir = Path(run_dir)
    try:
        stored = json.loads((run_dir / "config.json").read_text())
        final = json.loads((run_dir / "final_metrics.json").read_text()) if evaluate else {"step": cfg.steps}
    except (OSError, ValueError, RecursionError):
        return False
    stored = {k: v for k, v in stored.items() if k != "run_id"} if isinstance(stored, dict) else {}
    stored = registry.current_keys(stored, renamed_fields(cfg.family))  # a run made before a field was renamed
    last = run_dir / "checkpoints" / f"step_{cfg.steps:06d}" / "trainer_state.json"
    return stored == cfg.to_dict() and isinstance(final, dict) and final.get("step") == cfg.steps and last.is_file()


def train_point(config: dict, run_dir: str, evaluate: bool = True) -> dict:
    """The task of one point (runs on a worker): train (or resume) `config` into `run_dir`.

    Returns {"run_dir", "resumed_from", "final_metrics"} or {"run_dir", "error": one line}."""
    from ..core.files import json_clean
    from .config import config_from_dict
    from .trainer import train

    try:
        result = train(config_from_dict(config), run_dir, progress=False, evaluate=evaluate, threads=1)
    except Exception as e:  # noqa: BLE001 - a failed run is a row of the sweep; the others go on
        return {"run_dir": str(run_dir), "error": one_line(e)}
    return {"run_dir": str(run_dir), "resumed_from": result.resumed_from, "final_metrics": json_clean(result.final_metrics)}


def plan(sweep: Sweep, runs_dir: Path) -> dict:
    """The content of OUT/sweep.json: the grid as read and every point's run directory and config."""
    from .._version import __version__

    return {"schema": SWEEP_SCHEMA, "icrl_interp": __version__, "grid": sweep.to_dict(),
            "points": [{"name": p.name, "run_dir": str(runs_dir / p.name), "swept": p.swept, "config": p.config.to_dict()}
                       for p in sweep.points]}


def is_sweep_dir(path) -> bool:
    """A directory holding a sweep's own sweep.json, or the lock file a sweep creates first
    (`SWEEP_LOCK`: a sweep killed before its sweep.json was written)."""
    if is_lock_file(Path(path) / SWEEP_LOCK):
        return True
    try:
        return json.loads((Path(path) / "sweep.json").read_text()).get("schema") == SWEEP_SCHEMA
    except (OSError, ValueError, AttributeError, RecursionError):
        return False


@contextmanager
def writing_sweep(out) -> Iterator[Path]:
    """Hold the sweep directory `out` (made if missing) while a sweep writes there: its lock file first,
    then the temporary sweep.json a killed sweep left removed. Another sweep writing there is a
    one-line UserError."""
    out = Path(out)
    out.mkdir(exist_ok=True)
    with locked(out / SWEEP_LOCK, f"the sweep directory {out}", keep=True):
        for tmp in temporaries(out, "sweep.json"):  # locked: no live sweep is writing it
            tmp.unlink(missing_ok=True)
        yield out
