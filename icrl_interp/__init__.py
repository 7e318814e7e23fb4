"""icrl_interp: which RL algorithm does a transformer's forward pass run?

Importing this package stays light: it never imports torch or transformer_lens (the
model modules do, on first use). Families are looked up in `icrl_interp.families.registry`.
"""
from . import _compat
from ._version import __version__
from .core.errors import UserError
from .families import registry
from .tasks import envs, layouts, reference
from .tasks.layouts import Prompt, PromptLayout


def layout_for(family: str, d: int, m: int | None = None) -> PromptLayout:
    """The prompt layout of a registered family for feature dimension d (and policy dimension m)."""
    return registry.get(family).layout(d, m)


def record(model, task, out, **options):
    """Record `model` (any torch module taking the task's prompts, or one of the package's models) on
    `task` (a family name plus `task_options`, or a checkpoint) into the HDF5 file `out`; see
    `icrl_interp.recording.recorder.record_model` and docs/byom.md. Returns a RecordSummary."""
    from .recording.recorder import record_model

    return record_model(model, task, out, **options)


def analyze(path_or_model, task=None, **options) -> dict:
    """Analyze a checkpoint, recording or TransformerLens weights file into the analysis JSON dict
    (`icrl_interp.analyzers.analyze.analyze`); or a model (a torch module) live on `task`, from its
    forward pass without writing a recording (`icrl_interp.analyzers.analyze.analyze_model`). An episode
    recording (`record --episodes`) gets its probes' JSON (`verdicts.episode_targets.probe_recording`, whose
    options it takes: candidate, params, split_seed, test_fraction, folds)."""
    if hasattr(path_or_model, "named_modules"):  # a torch module (checked without importing torch)
        from .analyzers.analyze import analyze_model

        if task is None:
            raise UserError("analyze(model, task=...): a model is analyzed on a task (a family name, a checkpoint "
                            "directory or a config)")
        return analyze_model(path_or_model, task, **options)
    if task is not None:
        raise UserError("task= goes with a model; a checkpoint or recording brings its own task")
    from .analyzers.episode_recording import is_episode_recording

    if is_episode_recording(path_or_model):  # `record --episodes`: the probes' JSON, as `analyze REC.h5` writes it
        from .verdicts.episode_targets import probe_recording

        return probe_recording(path_or_model, **options)
    from .analyzers.analyze import analyze as _analyze

    return _analyze(path_or_model, **options)


def verdict(source=None, **options) -> dict:
    """Which candidate RL algorithm a model runs: the verdict JSON (`icrl_interp.verdict/2`) of a recording, or
    of a model (`model=`, with `task=` when there is no recording; then with causal evidence); see
    `icrl_interp.verdicts.causal_evidence.verdict` and docs/verdict.md. An episode recording (`record --episodes`)
    gets the episode verdict (`icrl_interp.episode_verdict/2`: `verdicts.episode_evidence.verdict_on_recording`,
    whose options it takes)."""
    from .analyzers.episode_recording import is_episode_recording

    if source is not None and is_episode_recording(source):
        from .analyzers.episode_recording import open_episode_recording
        from .verdicts.episode_evidence import verdict_on_recording

        with open_episode_recording(source) as rec:
            return verdict_on_recording(rec, source=str(source), **options)
    from .verdicts.causal_evidence import verdict as _verdict

    return _verdict(source, **options)


__all__ = ["__version__", "UserError", "PromptLayout", "Prompt", "layout_for", "envs", "layouts", "reference",
           "registry", "record", "analyze", "verdict"]


_compat.install()


def __getattr__(name: str):
    """Old flat names (`icrl_interp.recorder`, ...) for one release: see icrl_interp._compat."""
    return _compat.old_attribute(__name__, name)
