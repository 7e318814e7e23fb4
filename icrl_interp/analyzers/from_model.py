"""Live analysis: a model's analysis JSON straight from its forward pass, no activation on disk.

`analyze_model(model, task)` runs the model over the task's prompts exactly as `icrl_interp.record`
would record them and feeds the same analyzers from the stream of batches (`icrl_interp.live`). The
result is the analysis of that recording (docs/analyzers.md, "Live analysis"): every field equal,
except `source` (the model's name) and `kind` ('live'), plus `live`: what the stream cost.
"""
from __future__ import annotations

from pathlib import Path

from .analyze import AnalyzeOptions, analyze_open


def analyze_model(model, task, *, task_options: dict | None = None, probe=None, tasks: int = 512,
                  batch_size: int = 128, seed: int = 0, baseline: str = "random-init", prompts=None,
                  out=None, options: AnalyzeOptions | None = None, name: str | None = None,
                  checkpoint_sha256: str = "", progress: bool = False, device=None) -> dict:
    """The analysis of `model` on `task` (a family name with `task_options`, a checkpoint directory or a
    CheckpointConfig; see `recorder.spec_and_source` for `probe`, `tasks`, `seed`, `prompts`).

    `baseline`: 'random-init' also runs the same architecture at random initialization (the probes'
    and readouts' baseline), 'none' does not. `out`: also write the recording there, in the same pass
    (`record --also-analyze`). `options`: the analysis knobs (`AnalyzeOptions`). `device`: where the
    model runs ('cpu', 'cuda', 'auto'; None: where it is); the analyzers run on the CPU."""
    from ..live import open_live
    from ..recorder import spec_and_source

    opts = options or AnalyzeOptions()
    spec, source = spec_and_source(model, task, task_options=task_options, probe=probe, tasks=tasks, seed=seed,
                                   prompts=prompts)
    name = name or type(model).__name__
    with open_live(model, spec, source, name=name, out=out, batch_size=batch_size, baseline=baseline,
                   checkpoint_sha256=checkpoint_sha256, outputs="require", progress=progress, device=device) as rec:
        result = analyze_open(rec, opts, source=name, kind="live")
        n_batches = rec.f.run.n_batches
        result["live"] = {
            "prompts": int(source.n_total), "batch_size": int(rec.f.run.batch_size), "batches": int(n_batches),
            "forward_batches": int(rec.forward_batches) + 1,  # + batch 0, run by prepare()
            "recording": None if out is None else str(Path(out)),
        }
    return result
