"""The end-to-end demo: theta* and shipped trained checkpoints -> recordings -> analyses -> report.

Runs on embedded defaults only (no flags, no network): builds the theta* of each
registered family with demo options (`registry.Family.demo`), takes the small trained checkpoints shipped in `data/checkpoints/`,
records a few hundred prompts through each, analyzes everything (with the shipped runs' training
snapshots, for metrics against training step) and writes a report directory with a one-screen summary.
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ..core import outputs
from ..core import resources
from ..core.errors import UserError, one_line
from ..families import registry
from . import ad_demo

DATA_DIR = resources.checkpoints_dir()
"""Shipped trained checkpoints (one directory per family, or per run; see `resources` for wheel vs checkout)."""
LIVE_TASKS = 64
"""Prompts each checkpoint (theta*, shipped, snapshot) is also analyzed live on in the report, so the
snapshots' activation metrics (e.g. Wang's VD / SS) appear over training without recording them."""


@dataclass
class DemoConfig:
    """Embedded defaults of `icrl-interp demo`."""

    out: Path = Path("icrl-report")
    """Report directory (inputs and recordings go in its `inputs/` subfolder)."""
    tasks: int = 256
    """Tasks sampled per model, one prompt each (recorded)."""
    quick: bool = False
    """Fewer tasks (64) and no algorithm verdicts, for a fast look."""
    prompt_seed: int = 0
    """Seed of the task sampler: which tasks are drawn and the trajectories of their prompts."""
    workers: int = 2
    """Parallel analysis processes."""
    families: tuple[str, ...] | None = None
    """Families whose theta* the demo builds (None: every registered family with `demo` options)."""


def _checkpoint_dirs(root: Path) -> list[Path]:
    if not root.exists():
        return []
    return sorted(p.parent for p in root.rglob("config.json") if (p.parent / "model.safetensors").exists())


def shipped_checkpoints(root: Path = DATA_DIR) -> list[Path]:
    """Every checkpoint directory under data/checkpoints/ (a folder holding config.json), training
    snapshots (`shipped_snapshots`) apart."""
    return [p for p in _checkpoint_dirs(root) if resources.SNAPSHOTS not in p.relative_to(root).parts]


def shipped_snapshots(checkpoints: list[Path]) -> list[Path]:
    """The earlier checkpoints of these shipped runs (`<checkpoint>/snapshots/step_*/`): with the final
    checkpoints they give the report's metrics-over-training view."""
    return [p for c in checkpoints for p in _checkpoint_dirs(c / resources.SNAPSHOTS)]


def reproduction_lines(paths: list[Path]) -> list[str]:
    """One line per shipped trained checkpoint: the held-out numbers its training run measured
    (its final_metrics.json, read through the family's trend series: e.g. SS / IWS / VD, or the relative
    errors and lazy blocks). Checkpoints without final metrics or a training recipe are left out."""
    from ..models import checkpoint
    from ..train import recipe

    lines = []
    for path in paths:
        try:
            metrics = json.loads((path / "final_metrics.json").read_text())
            family = checkpoint.read(path)[0].family
            series = recipe(family).trends.series([metrics])
        except (OSError, ValueError, KeyError, TypeError, IndexError, UserError):
            continue
        nums = ", ".join(f"{k} {v[0]:.3g}" for k, v in series.items() if isinstance(v[0], (int, float)))
        lines.append(f"  {path.name} ({family}, step {metrics.get('step')}): {nums}")
    return lines


def _validate(config: DemoConfig) -> None:
    for name in ("tasks", "workers"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"--{name} must be a positive integer, got {value!r}")
    if isinstance(config.prompt_seed, bool) or not isinstance(config.prompt_seed, int) or config.prompt_seed < 0:
        raise UserError(f"--prompt-seed must be a non-negative integer, got {config.prompt_seed!r}")


def _clear_own(inputs_dir: Path, names: list[str]) -> None:
    """Remove the demo's own earlier outputs of these names from inputs/ (refused, before anything is
    removed, if one of them is not the package's); other files there are left alone."""
    if inputs_dir.exists() and not inputs_dir.is_dir():
        raise UserError(f"{inputs_dir} is a file where the demo puts its inputs; move it away or choose another --out")
    paths = [inputs_dir / n for n in names if (inputs_dir / n).exists() or (inputs_dir / n).is_symlink()]
    for path in paths:
        if not outputs.is_ours(path):
            raise UserError(f"{path} is not a file the demo wrote, and the demo would replace it; "
                            "move it away or choose another --out")
    for path in paths:
        shutil.rmtree(path) if path.is_dir() else path.unlink()


VERDICT_SUFFIX = ".verdict.json"
"""The demo's verdict JSON of recording NAME.h5 is NAME.verdict.json beside it (`report.answers.model_name`
pairs it with NAME)."""


def write_verdicts(recordings: list[Path]) -> list[Path]:
    """The algorithm verdict of each recording (behaviour and probes; no causal evidence, which would need the
    model edited per candidate), as `<name>.verdict.json` beside it. A verdict that cannot be reached is one
    printed line, and the demo goes on without it."""
    from ..core.files import write_json
    from ..verdicts.causal_evidence import verdict

    print(f"algorithm verdict of each of {len(recordings)} recordings (docs/verdict.md)")
    out = []
    for rec in recordings:
        target = rec.with_name(rec.stem + VERDICT_SUFFIX)
        try:
            write_json(target, verdict(rec, progress=False))
        except Exception as e:  # noqa: BLE001 - one model's verdict failing leaves the rest of the demo standing
            print(f"verdict: {rec.stem}: not reached: {one_line(e)}")
            continue
        out.append(target)
    return out


def shipped_ad_verdict(target: Path, config: DemoConfig) -> list[Path]:
    """The shipped AD model (`data/ad/`, `report.ad_demo`): its return curve on held-out goals beside the source's
    printed, and (not with --quick) its behavioural verdict on its own closed-loop episodes written to `target`.
    Without the model or gymnasium, one line and nothing else."""
    from ..models.ad_transformer import read_config

    try:
        print("\n".join(ad_demo.curve_lines(read_config(resources.ad_dir()))))
        if config.quick:
            print("  its behavioural verdict: skipped with --quick (`icrl-interp collect --model data/ad ...`, then "
                  "`verdict --episodes`)")
            return []
        doc = ad_demo.closed_loop_verdict(target, seed=config.prompt_seed)
    except Exception as e:  # noqa: BLE001 - the AD model's part failing leaves the rest of the demo standing
        print(f"shipped AD model: not reached: {one_line(e)}")
        return []
    v = doc["verdict"]
    params = (doc["candidates"].get(v.get("closest") or v.get("best")) or {}).get("params", {})
    print(f"  its behavioural verdict on its own closed-loop episodes: {v['text']}")
    if params:
        print(f"  {v.get('closest') or v.get('best')} fitted: "
              + ", ".join(f"{k} {p['value']:.3g} [{p['ci'][0]:.3g}, {p['ci'][1]:.3g}]" for k, p in params.items()))
    return [target]


def run_demo(config: DemoConfig) -> int:
    """Build, record, analyze, report. Returns the number of failed inputs."""
    from ..models import checkpoint
    from ..models.construct import construct
    from ..recording import probe_spec, prompts, recorder
    from . import ReportConfig, build_report
    from .batch import claim_out_dir, write_figure_manifest
    from .headline import text_table

    t0 = time.perf_counter()
    _validate(config)
    shipped = shipped_checkpoints()
    out = claim_out_dir(config.out, inputs=shipped)
    inputs_dir = out / "inputs"
    n_prompts = 64 if config.quick else config.tasks

    families = config.families or registry.where(lambda f: f.demo is not None and f.construct is not None)
    names = [f"theta_star-{family}" for family in families]
    names += [f"trained-{checkpoint.read(path)[0].family}-{path.name}" for path in shipped]
    ad_verdict = inputs_dir / f"{ad_demo.NAME}{VERDICT_SUFFIX}"  # the shipped AD model's verdict (episodes)
    _clear_own(inputs_dir, names + [f"{n}{x}" for n in names for x in (".h5", ".h5.partial", VERDICT_SUFFIX)]
               + [ad_verdict.name])
    inputs_dir.mkdir(parents=True, exist_ok=True)  # `out` itself may be new (its parent exists)

    models: list[tuple[str, Path]] = []
    for family in families:
        target = inputs_dir / f"theta_star-{family}"
        models.append((target.name, construct(family, registry.get(family).demo, target, overwrite=True)))
    if not shipped:
        print(f"note: no trained checkpoints found under {DATA_DIR}; the demo shows theta* only")
    for path, name in zip(shipped, names[len(families):]):
        models.append((name, path))

    recordings: list[Path] = []
    print(f"recording {n_prompts} prompts through each of {len(models)} models")
    for name, path in models:
        cfg, _ = checkpoint.read(path)
        model = checkpoint.load(path)
        try:
            spec = probe_spec.shipped_spec(cfg.family)
        except UserError:
            continue
        target = inputs_dir / f"{name}.h5"
        source = prompts.PromptSource(config=cfg, n_total=n_prompts, seed=config.prompt_seed)
        summary = recorder.record(model, target, spec, source, batch_size=min(128, n_prompts),
                                  checkpoint_sha256=checkpoint.sha256(path), progress=True)
        recordings.append(summary.path)

    # the shipped runs' earlier checkpoints: with the final ones they draw each metric against training step
    snapshots = shipped_snapshots(shipped)
    # the answer the report leads with; --quick (a smoke run, the packaging test's) skips it: a verdict fits every
    # candidate's step size and step on each layer, seconds to minutes of CPU per model
    # θ* runs its family's reference algorithm by construction: the trained checkpoints are the question
    verdicts = write_verdicts([p for p in recordings if p.name.startswith("trained-")]) if not config.quick else []
    if config.quick:
        print("algorithm verdicts: skipped with --quick (`icrl-interp verdict INPUTS/NAME.h5` gives one)")
    verdicts += shipped_ad_verdict(ad_verdict, config)
    inputs = [p for _, p in models] + snapshots + recordings + verdicts
    outcome = build_report(inputs, out, ReportConfig(workers=config.workers, title="icrl-interp demo report",
                                                        live_tasks=min(LIVE_TASKS, n_prompts)))
    write_figure_manifest(out, outcome.figures)
    print()
    print(text_table(outcome.results))
    shipped_lines = reproduction_lines(shipped)
    if shipped_lines:
        print("\nshipped reproductions (held-out numbers of their training runs; docs/reproductions.md):")
        print("\n".join(shipped_lines))
    print(f"\nreport: {out / 'index.html'}  ({len(inputs)} inputs, {outcome.n_failed} failed, "
          f"{time.perf_counter() - t0:.0f} s)")
    for r in outcome.results:
        if r.status != "ok":
            print(f"failed: {r.input}: {r.error}")
    return outcome.n_failed
