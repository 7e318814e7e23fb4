"""The end-to-end demo: theta* and shipped trained checkpoints -> recordings -> analyses -> report.

Runs on embedded defaults only (no flags, no network): builds the theta* of each
family, takes the small trained checkpoints shipped in `data/checkpoints/`,
records a few hundred prompts through each, analyzes everything and writes a
report directory with a one-screen summary.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import UserError

DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "checkpoints"
"""Shipped trained checkpoints (one directory per family, or per run)."""


@dataclass
class DemoConfig:
    """Embedded defaults of `icrl-interp demo`."""

    out: Path = Path("icrl-report")
    """Report directory (inputs and recordings go in its `inputs/` subfolder)."""
    prompts: int = 256
    """Prompts recorded per model."""
    quick: bool = False
    """Fewer prompts (64) for a fast look."""
    seed: int = 0
    """Seed of the task samplers."""
    workers: int = 2
    """Parallel analysis processes."""
    theta_star: dict = field(default_factory=lambda: {
        "linear-td": dict(d=4, n_layers=3, gamma=0.9, alpha=1.0,
                          task={"kind": "boyan", "n": 30, "n_states": 10, "features": "random"}),
        "softmax-td": dict(d=5, n_layers=20, gamma=0.9, alpha=1.0, score_scale=8.0,
                           task={"kind": "boyan", "n": 40, "n_states": 5, "features": "onehot"}),
        "sarsa": dict(d=36, n_layers=1, gamma=0.5, alpha=1.0,
                      task={"kind": "mdp", "n": 64, "n_states": 9, "n_actions": 4}),
    })
    """theta* models built for the demo: constructor arguments and the task distribution recorded on.
    The softmax score is scaled (beta^2 = 8 on one-hot features of 5-state chains) so that
    Assumption 5.1 holds: min_s M_pi(s, s) is about 0.99 > (1 + gamma) / 2 = 0.95."""


def shipped_checkpoints(root: Path = DATA_DIR) -> list[Path]:
    """Every checkpoint directory under data/checkpoints/ (a folder holding config.json)."""
    if not root.exists():
        return []
    return sorted(p.parent for p in root.rglob("config.json") if (p.parent / "model.safetensors").exists())


def _construct(family: str, spec: dict, out_dir: Path) -> Path:
    from . import checkpoint
    from .models import theta_star_model

    spec = dict(spec)
    task = spec.pop("task")
    model = theta_star_model(family, **spec)
    checkpoint.save(model, {"task": task, "n": task["n"], "origin": model.origin, "seed": 0}, out_dir, overwrite=True)
    return out_dir


def run_demo(config: DemoConfig) -> int:
    """Build, record, analyze, report. Returns the number of failed inputs."""
    from . import checkpoint, probe_spec, recorder
    from .report import ReportConfig, build_report
    from .report.headline import text_table

    t0 = time.perf_counter()
    out = Path(config.out)
    inputs_dir = out / "inputs"
    if inputs_dir.exists():
        shutil.rmtree(inputs_dir)  # regenerated from the embedded defaults each time
    inputs_dir.mkdir(parents=True)
    n_prompts = 64 if config.quick else config.prompts

    models: list[tuple[str, Path]] = []
    for family, spec in config.theta_star.items():
        models.append((f"theta_star-{family}", _construct(family, spec, inputs_dir / f"theta_star-{family}")))
    shipped = shipped_checkpoints()
    if not shipped:
        print(f"note: no trained checkpoints found under {DATA_DIR}; the demo shows theta* only")
    for path in shipped:
        cfg, _ = checkpoint.read(path)
        models.append((f"trained-{cfg['family']}-{path.name}", path))

    recordings: list[Path] = []
    print(f"recording {n_prompts} prompts through each of {len(models)} models")
    for name, path in models:
        cfg, _ = checkpoint.read(path)
        model = checkpoint.load(path)
        try:
            spec = probe_spec.shipped_spec(cfg["family"])
        except UserError:
            continue
        target = inputs_dir / f"{name}.h5"
        source = recorder.PromptSource(config=cfg, n_total=n_prompts, seed=config.seed)
        summary = recorder.record(model, target, spec, source, batch_size=min(128, n_prompts),
                                  checkpoint_sha256=checkpoint.sha256(path), progress=True)
        recordings.append(summary.path)

    inputs = [p for _, p in models] + recordings
    outcome = build_report(inputs, out, ReportConfig(workers=config.workers, title="icrl-interp demo report"))
    print()
    print(text_table(outcome.results))
    print(f"\nreport: {out / 'index.html'}  ({len(inputs)} inputs, {outcome.n_failed} failed, "
          f"{time.perf_counter() - t0:.0f} s)")
    for r in outcome.results:
        if r.status != "ok":
            print(f"failed: {r.input}: {r.error}")
    return outcome.n_failed
