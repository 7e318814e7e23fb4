"""The analyzer protocol: one interface for every analysis of a checkpoint, a recording or a live run.

An *analyzer* is one analysis (the weights against θ*, the value error by layer, the TD probes, ...).
It registers one `Analyzer` with `icrl_interp.analyzers.registry` (docs/adding-an-analyzer.md):

* what it reads: hook `roles` (the probe spec's role names, `ROLES`) and `arrays` (datasets of
  prompts/, tasks/, reference/ and the recorded parameters);
* `open(ctx)`: given the input resolved once (`Context`), a `Stream` for it, or None where the
  analysis does not apply (saying why in `ctx.reasons[analyzer.key]`);
* the stream: `paths` (the datasets it reads from every chunk of prompts), `update(chunk)` per
  `Chunk` and `finalize()`, which returns its part of the analysis JSON: the keys it adds to the
  dict named by `place` ('activations' by default: `{"layers": {layer: {key: value}}}` adds
  per-layer values). A stream with no paths (the weights) is finalized as soon as it is opened; an
  optional `finish(rec, rows)` runs after the chunks (a second pass over held-out prompts);
* how `sections` reports it: `computed(analysis)` (its part is there), else the reasons recorded
  under `key` in `skipped`, else `missing`;
* `columns`: its summary fields, the columns of the report's table; `summary`: a line of
  `icrl-interp analyze`'s table.

The driver (`analyze.py`) resolves the input into a `Context`, opens every registered analyzer in
order, reads a recording once in chunks that feed every stream, and places each result. An analyzer
that raises never drops the others: its section says 'failed: ...'. Nothing here imports torch.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..core.errors import ModelFault, UserError
from ..families import registry as families
from .keys import ACTIVATIONS, LAYERS, WEIGHTS, get
from .streams import TASK_KEY

ANALYSIS = "analysis"
"""`Analyzer.place` of a section at the top of the analysis (the weights)."""
PLACES = (ANALYSIS, WEIGHTS, ACTIVATIONS)
"""Where an analyzer's `finalize` puts its keys: the analysis itself, its `weights` (when the weights
were analyzed) or its `activations` (when there are activations)."""
ROLES = ("resid_pre", "resid_post", "pattern", "attn_out", "readout", "parameters")
"""What an analyzer may read from the model: the probe spec's roles (`recording.probe_spec.ROLE_KEYS`:
blocks.{l}.hook_resid_pre, .hook_resid_post, .attn.hook_pattern, .hook_attn_out, the readout lens) and
the recorded parameters."""
NOT_APPLICABLE = "not applicable"


# ------------------------------------------------------------------ what an analyzer is given
@dataclass
class Subject:
    """The families and architecture an analysis is about, each looked up in the family registry once
    (`resolve`): the model's (its construction, architecture and weights) and the task's (whose prompts,
    task data and reference were recorded). For this package's checkpoints the two are one family; a
    foreign model recorded on a family's prompts has a task family and no model family."""

    family: str | None
    """The model's family name (None: a model of no family)."""
    architecture: str | None
    """The model's architecture name (None: unknown)."""
    task_family: str | None
    """The family whose prompts were recorded (None: none / unknown)."""
    model: families.Family | None = None
    """The registered entry of `family` (None: not registered)."""
    arch: families.Architecture | None = None
    """The registered entry of `architecture` (None: not registered)."""
    task: families.Family | None = None
    """The registered entry of `task_family` (None: not registered)."""

    @property
    def task_hints(self) -> families.Hints | None:
        return None if self.task is None else self.task.hints


def resolve(family: str | None, architecture: str | None, task_family: str | None, config=None) -> Subject:
    """The Subject of these names, each looked up at most once; the entries a parsed checkpoint config
    (`models.config.CheckpointConfig`) resolved already are reused, not looked up again."""
    known: dict[str, families.Family | None] = {}
    arch = None
    if config is not None:
        known[config.model.family] = config.model.family_entry
        known[config.task.family] = config.task_family_entry
        if config.model.architecture_entry.name == architecture:
            arch = config.model.architecture_entry

    def entry(name):
        if not isinstance(name, str):
            return None
        if name not in known:
            known[name] = families.find(name)
        return known[name]

    if arch is None and architecture is not None:
        try:
            arch = families.architecture(architecture)
        except UserError:
            arch = None
    return Subject(family, architecture, task_family, entry(family), arch, entry(task_family))


@dataclass
class Facts:
    """What a recording offers the activation analyzers (checked once by the driver)."""

    N: int
    """Prompts."""
    pos: int
    """Positions per prompt (context columns and the query)."""
    n: int
    """Context columns (the reference's TD errors per step)."""
    hooks: set
    """Recorded hooks."""
    has_tasks: bool
    """Task data (tasks/values, tasks/stationary) is recorded."""
    has_ref: bool
    """The reference's TD errors (reference/td_errors) are recorded."""
    labelled: bool
    """Prompts carry state labels (prompts/state >= 0)."""
    n_states: int
    """States of the tasks (0: unknown)."""
    readable: set
    """Layers whose hook_resid_post is recorded at the layout's width (the value error reads them)."""


@dataclass
class Context:
    """One input as every analyzer sees it, resolved once by the driver (`analyze.py`)."""

    kind: str
    """'checkpoint', 'recording', 'live' or 'tl-weights'."""
    subject: Subject
    """The model's and the task's families and the architecture, resolved."""
    layout: Any
    """The prompt layout (`tasks.layouts.PromptLayout`; None: unknown)."""
    config: Any
    """The checkpoint config (`models.config.CheckpointConfig`; None: none)."""
    opts: Any
    """The analysis options (`analyze.AnalyzeOptions`)."""
    reasons: dict
    """{key: why}: what did not run (the analysis' `skipped`); analyzers add their own."""
    analysis: dict
    """The analysis so far: its header, then each section as it is placed."""
    params: dict = field(default_factory=dict)
    """The model's parameters as float64 (learned weights; a foreign model's TL heads converted)."""
    theta: dict = field(default_factory=dict)
    """theta* for the same names (empty: no construction)."""
    weights_family: families.Family | None = None
    """The family whose construction the weights are compared with (None: none)."""
    foreign: bool = False
    """The weights are a foreign model's (read as `weights_family`), not a construction's own."""
    n_layers: int = 0
    """Layers of the model."""
    gamma: float = math.nan
    """The task's discount (NaN: unknown)."""
    rec: Any = None
    """The open recording (`recording.format.Recording` or a live one); None: weights only."""
    check: Callable[[Context], Facts | None] | None = None
    """The driver's check of the recording: run once, on the first read of `facts`."""
    hints: families.Hints | None = None
    """Where the task's output sits in the residual stream (the task family's hints; for prompts of no
    known task, those of the layout's family); None without a layout. Set by `check`."""

    def __post_init__(self):
        self._facts: Facts | None = None
        self._checked = False  # `check` has run

    @property
    def facts(self) -> Facts | None:
        """What the recording offers (None: no recording, or nothing to analyze in it: the reason is in
        `skipped` under 'activations', as is the check's failure)."""
        if not self._checked:
            self._checked = True
            if self.rec is not None and self.check is not None:
                self._facts = guard(self.reasons, ACTIVATIONS, self.check, self)
        return self._facts

    @property
    def f(self):
        """The recording's file (h5py.File, or its live counterpart)."""
        return self.rec.f

    def guard(self, key: str, fn, *args, **kw):
        """fn(*args, **kw), or None with 'failed: why' in reasons[key]: one failure never drops the others."""
        return guard(self.reasons, key, fn, *args, **kw)


@dataclass
class Chunk:
    """Consecutive prompts start..stop-1 of a recording, as every stream is fed them."""

    start: int
    stop: int
    data: dict
    """{dataset path: its rows} (bfloat16 decoded) for the union of the streams' paths, and the task ids."""
    shared: dict = field(default_factory=dict)
    """What several streams compute from this chunk once (e.g. the kernel's source columns)."""

    @property
    def task(self) -> np.ndarray:
        """Task id of each prompt (`prompts/task_id`, else the prompt index)."""
        return self.data[TASK_KEY]


class Stream(Protocol):
    """What `Analyzer.open` returns for one input."""

    paths: Collection[str]
    """Datasets read from every chunk (those the recording lacks are left out of the chunk)."""

    def update(self, chunk: Chunk) -> None:
        """Accumulate one chunk (fixed-size statistics: a recording of any length is one pass)."""

    # optional: prepare(data, shared, hurry) -> None. Work on one chunk that needs nothing but the chunk's `data` and
    # the stream's settings (no state that `update` changes): the driver runs it where the chunk is read, in the reader
    # thread ahead of the analysis when there is one, and `update` finds what it put in `chunk.shared`; what it did
    # not put there, `update` computes (`prepared`). `hurry()` turns True once the analysis waits for the chunk: a
    # prepare in parts (`Layers`) stops there and leaves the rest to `update`. It must not raise: an error is put in
    # `shared` for `update` to raise.

    def finalize(self) -> dict | None:
        """Its keys of the analysis JSON (`Analyzer.place`); None: nothing to add."""


# ------------------------------------------------------------------ what an analyzer is
@dataclass(frozen=True)
class Column:
    """One summary field: a column of the report's table."""

    key: str
    """Column key (unique over the registry)."""
    header: str
    """Header of the report's HTML table."""
    value: Callable[[dict], Any]
    """value(analysis) -> the raw value (None where the analysis lacks it); must not raise on odd input."""
    fmt: str = "{}"
    """How a value is shown (str.format)."""
    short: str | None = None
    """Header of the terminal table (default: `header`)."""
    legend: str | None = None
    """What the terminal legend says about it (None: nothing)."""


@dataclass(frozen=True)
class Analyzer:
    """One analysis, registered with `registry.register` (see the module docstring)."""

    name: str
    """Its section in `sections` (unique over the registry)."""
    summary: str
    """One line: what it measures."""
    open: Callable[[Context], Any]
    """open(ctx) -> a `Stream` for this input, or None (the reason in ctx.reasons[key])."""
    place: str = ACTIVATIONS
    """Where its `finalize` keys go (`PLACES`)."""
    roles: tuple[str, ...] = ()
    """Model roles it reads (`ROLES`)."""
    arrays: tuple[str, ...] = ()
    """Datasets of the recording it reads (prompts/..., tasks/..., reference/..., params)."""
    columns: tuple[Column, ...] = ()
    """Its summary fields: the report's columns."""
    computed: Callable[[dict], bool] | None = None
    """computed(analysis): whether its part is there (default: the key `name` in `place` is set, not empty)."""
    missing: str = f"{NOT_APPLICABLE}: nothing to analyze"
    """What `sections` says when it computed nothing and recorded no reason."""
    reason_key: str | None = None
    """Its key (and key prefix) in `skipped` (default: `name`)."""
    layer_keys: tuple[str, ...] = ()
    """Per-layer keys every layer entry holds (None until it sets them)."""
    line: Callable[[dict], str | None] | None = None
    """line(analysis) -> its line in `icrl-interp analyze`'s table (None: none)."""

    @property
    def key(self) -> str:
        return self.reason_key or self.name

    def is_computed(self, analysis: dict) -> bool:
        if self.computed is not None:
            return bool(self.computed(analysis))
        where = analysis if self.place == ANALYSIS else get(analysis, self.place)
        return bool(get(where, self.name))


def check_analyzer(a: Analyzer) -> None:
    """Refuse an analyzer whose fields cannot work (one line naming the field)."""
    if not isinstance(a.name, str) or not a.name or "." in a.name:
        raise UserError(f"an analyzer needs a non-empty name without dots, got {a.name!r}")
    if not callable(a.open):
        raise UserError(f"analyzer {a.name!r}: open must be callable, got {a.open!r}")
    if a.place not in PLACES:
        raise UserError(f"analyzer {a.name!r}: place must be one of {', '.join(PLACES)}, got {a.place!r}")
    unknown = [r for r in a.roles if r not in ROLES]
    if unknown:
        raise UserError(f"analyzer {a.name!r}: unknown roles {', '.join(map(repr, unknown))} (known: {', '.join(ROLES)})")
    for c in a.columns:
        if not isinstance(c, Column) or not callable(c.value):
            raise UserError(f"analyzer {a.name!r}: columns must be Column(key, header, value) with a callable value")


# ------------------------------------------------------------------ failures
def failure(e: BaseException) -> str:
    """The `skipped` reason of an analyzer that raised; a failure of the model a live analysis runs is
    raised on: it fails every analyzer, and the run."""
    if isinstance(e, ModelFault):
        raise e
    if isinstance(e, UserError):
        return f"failed: {e}"
    return f"failed (internal error, {type(e).__name__}): {e}"


def prepare_into(shared: dict, key, fn, *args) -> None:
    """shared[key] = fn(*args), or the error it raised: a `prepare` never raises; `prepared` raises it in `update`,
    where the stream's failures are handled."""
    try:
        shared[key] = fn(*args)
    except Exception as e:  # noqa: BLE001
        shared[key] = e


def prepared(shared: dict, key, fn, *args):
    """What a `prepare` put in `shared[key]` (fn(*args) where it put nothing: no reader thread ran it), raising
    the error it put there instead."""
    res = shared[key] if key in shared else fn(*args)
    if isinstance(res, Exception):
        raise res
    return res


def guard(reasons: dict, key: str, fn, *args, **kw):
    """fn(*args, **kw), or None with 'failed: why' in reasons[key]: one analyzer's failure never drops
    the others."""
    try:
        return fn(*args, **kw)
    except Exception as e:  # noqa: BLE001
        reasons[key] = failure(e)
    return None


class Once:
    """A stream that reads no chunk: `finalize` returns fn(*args), computed from what the context holds
    (the weights; a checkpoint's sampled tasks). The driver finalizes it as soon as it is opened."""

    paths = ()

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def update(self, chunk: Chunk) -> None:
        """Nothing to read."""

    def finalize(self):
        return self.fn(*self.args)


class Layers:
    """An analyzer's independent streams, one per layer (each with `paths`, `update(chunk)` and
    `result()`), each under its own `skipped` key `{key}.layer{l}`: one that raises is dropped with its
    reason, the others go on. `finalize` puts `fields(layer, result)` into each layer's entry."""

    def __init__(self, streams: dict[int, Any], reasons: dict, key: str, fields: Callable[[int, Any], dict]):
        self.streams, self.reasons, self.key, self.fields = streams, reasons, key, fields

    def key_of(self, layer: int) -> str:
        return f"{self.key}.layer{layer}"

    @property
    def paths(self) -> set[str]:
        return {p for s in self.streams.values() for p in s.paths}

    def prepare(self, data: dict, shared: dict, hurry=lambda: False) -> None:
        """Each layer's `prepare` (`Stream`), where it has one, until `hurry()`: the layers left are computed by
        their `update`."""
        for s in list(self.streams.values()):
            if hurry():
                return
            if hasattr(s, "prepare"):
                s.prepare(data, shared, hurry)

    def update(self, chunk: Chunk) -> None:
        for layer, s in list(self.streams.items()):
            try:
                s.update(chunk)
            except Exception as e:  # noqa: BLE001 - a bug in one layer's stream must not lose the others
                self.reasons[self.key_of(layer)] = failure(e)
                del self.streams[layer]

    def results(self) -> dict[int, Any]:
        """{layer: result()} of the streams whose result did not raise."""
        out = {}
        for layer, s in self.streams.items():
            res = guard(self.reasons, self.key_of(layer), s.result)
            if res is not None:
                out[layer] = res
        return out

    def finalize(self) -> dict:
        return {LAYERS: {layer: self.fields(layer, res) for layer, res in self.results().items()}}
