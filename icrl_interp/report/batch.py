"""Collect report inputs, analyze them on a scheduler (`cluster`: serial, a local Dask cluster or a
running one) with a content-hash cache, and write `summary.json` / `summary.csv` (one flat row per input).

Inputs are checkpoints (a directory with `config.json` + `model.safetensors`), recordings (an
HDF5 file), causal JSON files (`icrl-interp causal --json`, schema `icrl_interp.causal/2`) or any
directory holding them (training run directories: `checkpoints/step_*/`).
Each input is hashed by its bytes (a checkpoint: the names and bytes of its files); an analysis
is cached as `<out>/cache/<sha256>.json` and reused while the hash, the analyzer and the package
version are unchanged. A causal JSON is not analyzed: it is read and checked (`read_causal`), and
cached the same way under the reader's name (`CAUSAL_READER`). `summary.json` holds nothing that varies between runs on the same inputs
(no times, no cache hits), so a re-run reproduces it byte for byte.
Sarsa / actor-critic checkpoints also get a closed-loop control evaluation in their analysis job
(`control_eval`, seeded); its settings are part of their cache entry.
"""
from __future__ import annotations

import csv
import hashlib
import importlib
import io
import json
import math
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Iterator

from .._version import __version__
from ..analyzers import inputs
from ..analyzers.keys import CONTROL
from ..core import outputs
from ..core.cluster import Engine, engine_for
from ..core.errors import UserError, one_line
from ..core.faults import kill_point
from ..core.files import is_lock_file, locked, temporaries, write_atomic
from .control_eval import CURVE_KEY, ControlSettings, wants_control

ANALYSIS_SCHEMA = "icrl_interp.analysis/1"
SUMMARY_SCHEMA = "icrl_interp.report/1"
CACHE_SCHEMA = "icrl_interp.report-cache/1"
FIGURES_SCHEMA = "icrl_interp.report-figures/1"
FIGURES_MANIFEST = "figures/manifest.json"
"""The figures a report wrote (`write_figure_manifest`): with the figures marked as the package's
(`outputs.is_ours`), the only ones a later report may delete."""
REPORT_LOCK = ".icrl_interp-report.lock"
"""The file a report creates first in its directory and holds locked while it writes there
(`writing_report`): it marks the directory as a report's even when the report was killed before
its summary.json, and keeps two reports from writing one directory at once. It stays."""
DEFAULT_ANALYZER = "icrl_interp.analyzers.analyze:analyze"
META_COLUMNS = ("input", "kind", "status", "error", "reasons", "sha256", "family", "source", "run_id", "step", "seed",
                "gamma", "context_length")
CAUSAL_READER = "icrl_interp.report.batch:read_causal"
"""What a causal JSON's cache entry records as its analyzer."""
PROBE_DETAIL = re.compile(r"\.td_probe\..+\.(targets|per_task)(\.|$)")
"""Flattened keys of the TD probes' per-target and per-task tables: written to td_probes.csv and
td_probe_tasks.csv (report/td_probes.py), not to the summary rows."""
CAUSAL_DETAIL = re.compile(r"\.draws$")
"""Flattened keys of a causal section's per-draw lists (`….random.draws`): in the causal JSON, the cache
and the figure, not in the summary rows."""
ANALYZED = ("ok", "partial")
"""Statuses of inputs that have results (figures, tables); 'nothing analyzed' and 'failed' have none."""


# ------------------------------------------------------------------ inputs
@dataclass
class ReportInput:
    """One thing to analyze, with what can be learned about it without analyzing it."""

    path: Path
    """Absolute path of the checkpoint directory, recording or causal JSON file."""
    kind: str
    """'checkpoint', 'recording', 'causal' (a causal JSON file, or a `.json` file given on the command line)
    or 'missing' (a path that does not exist / holds nothing analyzable)."""
    meta: dict = field(default_factory=dict)
    """family, run_id, step, seed, gamma, context_length when known (else absent)."""
    problem: str = ""
    """Why this input cannot be analyzed at all (set for kind 'missing')."""


@dataclass
class Result:
    """The outcome for one input."""

    input: ReportInput
    """What was analyzed."""
    status: str
    """'ok' (every analysis that applies was computed), 'partial' (some were: `reasons` names the others),
    'nothing analyzed' (the analyzer ran but computed nothing: `reasons` says why) or 'failed' (`error`)."""
    error: str = ""
    """One-line reason when failed."""
    sha256: str = ""
    """Content hash of the input ('' when it could not be read)."""
    analysis: dict | None = None
    """The analysis dict (contract icrl_interp.analysis/1), JSON-normalised; None when failed."""
    cached: bool = False
    """Whether the analysis came from the cache (kept out of summary.json on purpose)."""
    reasons: str = ""
    """One line: what a 'partial' analysis lacks, or why 'nothing analyzed' ('' otherwise)."""
    causal: dict | None = None
    """A causal input's document {"schema", "source", "causal": section} (`read_causal`); None otherwise
    (a causal input has no `analysis`)."""
    verdict: dict | None = None
    """A verdict input's document (`icrl_interp.verdict/2` or /1, `read_verdict`); None otherwise."""

    @property
    def analyzed(self) -> bool:
        """Whether there are results to show (status 'ok' or 'partial')."""
        return self.status in ANALYZED

    @property
    def failed(self) -> bool:
        """Whether the input counts as failed (status 'failed' or 'nothing analyzed')."""
        return not self.analyzed

    def set_analysis(self, analysis: dict) -> None:
        """Take an analysis and its status (`analyzers.analyze.status_of`)."""
        from ..analyzers.analyze import status_of

        self.analysis = analysis
        self.status, self.reasons = status_of(analysis)

    def set_causal(self, doc: dict) -> None:
        """Take a causal JSON document (`read_causal`) and its status (`causal_status`)."""
        self.causal = doc
        self.status, self.reasons = causal_status(doc)

    def set_verdict(self, doc: dict) -> None:
        """Take a verdict JSON document (`read_verdict`) and its status (`verdict_status`)."""
        self.verdict = doc
        self.status, self.reasons = verdict_status(doc)

    @property
    def causal_section(self) -> dict:
        """The `causal` section of a causal input ({} for other inputs)."""
        section = (self.causal or {}).get("causal")
        return section if isinstance(section, dict) else {}

    @property
    def family(self) -> str:
        if self.verdict is not None:  # the task's family; prompts of no known task are 'generic'
            task = self.verdict.get("task")
            fam = task.get("family") if isinstance(task, dict) else None
            return str(fam) if fam else "generic"
        if self.causal is not None:  # the tested model's family; a model of your own is 'generic'
            model = self.causal_section.get("model")
            fam = model.get("family") if isinstance(model, dict) else None
            return str(fam) if fam else "generic"
        fam = (self.analysis or {}).get("family") or self.input.meta.get("family")
        return str(fam) if fam else "unknown"

    @property
    def source(self) -> str:
        """Where the weights came from: the checkpoint's origin kind ('theta_star', 'trained', ...).

        The analyzer's own `source` field names the input path, which the `input` column holds."""
        origin = (self.analysis or {}).get("origin")
        src = self.input.meta.get("source") or (origin.get("kind") if isinstance(origin, dict) else None)
        return str(src) if src else ""


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _origin_meta(config: dict) -> dict:
    """family / run_id / step / seed / source from a checkpoint's config.json, format 1 (flat) or 2
    (model / task / origin), read leniently: missing or odd keys are skipped (the analysis of the
    input reports what is wrong with it)."""
    model = config.get("model") if isinstance(config.get("model"), dict) else config
    meta = {}
    if isinstance(model.get("family"), str):
        meta["family"] = model["family"]
    if isinstance(config.get("seed"), int):
        meta["seed"] = config["seed"]
    origin = config.get("origin")
    if isinstance(origin, dict):
        if isinstance(origin.get("kind"), str):
            meta["source"] = origin["kind"]
        if origin.get("run_id") is not None:
            meta["run_id"] = str(origin["run_id"])
        if isinstance(origin.get("step"), int):
            meta["step"] = origin["step"]
        if isinstance(origin.get("seed"), int) and "seed" not in meta:
            meta["seed"] = origin["seed"]
    task = config.get("task")
    n = task.get("n") if isinstance(task, dict) and "n" in task else config.get("n")
    if isinstance(n, int) and not isinstance(n, bool):
        meta["context_length"] = n
    gamma = model.get("gamma")
    if isinstance(gamma, (int, float)) and not isinstance(gamma, bool):
        meta["gamma"] = float(gamma)
    meta["series"] = series_key(config)
    return meta


# config keys that differ between seeds of one experiment (or name the run), not its setting
_VOLATILE = ("seed", "origin", "run_id", "name", "created", "out", "resume", "versions")


def series_key(config: dict) -> str:
    """Short hash of a config without its seed and bookkeeping: runs sharing it are seeds of one series."""
    core = {k: v for k, v in config.items() if k not in _VOLATILE}
    return hashlib.sha256(json.dumps(core, sort_keys=True, default=str).encode()).hexdigest()[:8]


def _checkpoint_input(path: Path) -> ReportInput:
    meta = _origin_meta(_read_json(path / "config.json"))
    m = inputs.STEP_DIR.match(path.name)
    if m and "step" not in meta:
        meta["step"] = int(m.group(1))
    if m and "run_id" not in meta and path.parent.name == "checkpoints":
        meta["run_id"] = path.parent.parent.name
    if "seed" not in meta and m and path.parent.name == "checkpoints":
        seed = _read_json(path.parent.parent / "config.json").get("seed")
        if isinstance(seed, int):
            meta["seed"] = seed
    return ReportInput(path, "checkpoint", meta)


def _recording_input(path: Path) -> ReportInput:
    """Metadata from the root attributes (cheap: no dataset is read)."""
    meta: dict = {}
    try:
        import h5py

        with h5py.File(path, "r") as f:
            def attr(key):
                v = f.attrs.get(key)
                v = v.decode() if isinstance(v, bytes) else v
                if isinstance(v, str) and v[:1] in "{[":
                    try:
                        return json.loads(v)
                    except ValueError:
                        return None
                return v.item() if hasattr(v, "item") else v

            config = attr("checkpoint_config")
            if isinstance(config, dict):
                meta.update(_origin_meta(config))
            model = attr("model")  # schema 2: the model that produced the recording; schema 1: "family"
            family = model.get("family") if isinstance(model, dict) else attr("family")
            if isinstance(family, str):
                meta["family"] = family
            gamma = attr("gamma")
            if isinstance(gamma, (int, float)) and not isinstance(gamma, bool):
                meta["gamma"] = float(gamma)
            if "prompts/z" in f and f["prompts/z"].ndim == 3:
                meta["context_length"] = int(f["prompts/z"].shape[1]) - 1
    except (OSError, ValueError, KeyError):
        pass  # unreadable: the analyzer says why
    return ReportInput(path, "recording", meta)


def collect_inputs(paths: list[str | os.PathLike]) -> list[ReportInput]:
    """Expand the command-line paths into inputs, in order, without duplicates (`analyzers.inputs.discover`,
    with causal JSON files)."""
    out: list[ReportInput] = []
    for f in inputs.discover([os.path.abspath(p) for p in paths], causal=True):
        if f.kind == "missing":
            out.append(ReportInput(f.path, "missing", problem=f.problem))
        elif f.kind in ("causal", "verdict"):  # a .json named on the command line: routed by its schema
            out.append(ReportInput(f.path, "verdict" if inputs.is_verdict_json(f.path) else f.kind))
        elif f.kind == "checkpoint":
            out.append(_checkpoint_input(f.path))
        else:  # a recording, or a file the analyzer will name the problem of
            out.append(_recording_input(f.path))
    return out


# ------------------------------------------------------------------ hashing and cache
def content_hash(item: ReportInput, chunk: int = 1 << 22) -> str:
    """SHA-256 of a recording's bytes, or of a checkpoint directory's (relative name, bytes) pairs."""
    h = hashlib.sha256()
    if item.path.is_file():
        files = [(item.path.name, item.path)]
        single = True
    else:
        files = sorted((p.relative_to(item.path).as_posix(), p) for p in item.path.rglob("*") if p.is_file())
        single = False
    for name, path in files:
        if not single:
            h.update(f"{name}\0{path.stat().st_size}\0".encode())
        with open(path, "rb") as f:
            while block := f.read(chunk):
                h.update(block)
    return h.hexdigest()


def _cache_path(cache_dir: Path, sha: str) -> Path:
    return cache_dir / f"{sha}.json"


def load_cached(cache_dir: Path, sha: str, analyzer: str, control: dict | None = None) -> dict | None:
    """The cached analysis for this hash, or None (absent, unreadable, other analyzer, version or
    control settings; `control` is ControlSettings.key() for inputs that get a control run, else None)."""
    data = _read_json(_cache_path(cache_dir, sha))
    if (data.get("schema") != CACHE_SCHEMA or data.get("analyzer") != analyzer or data.get("icrl_interp") != __version__
            or data.get("control") != control):
        return None
    analysis = data.get("analysis")
    return analysis if isinstance(analysis, dict) else None


def store_cached(cache_dir: Path, sha: str, analyzer: str, analysis: dict, control: dict | None = None) -> None:
    payload = {"schema": CACHE_SCHEMA, "sha256": sha, "analyzer": analyzer, "icrl_interp": __version__,
               "control": control, "analysis": analysis}
    write_atomic(_cache_path(cache_dir, sha), dumps(payload))


# ------------------------------------------------------------------ JSON normalisation
def _plain(obj):
    """numpy scalars/arrays, tuples and non-finite floats -> plain JSON values (NaN/Inf -> None)."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):
        return _plain(obj.tolist())
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, bytes):
        return obj.decode(errors="replace")
    return str(obj)


def dumps(obj) -> str:
    """Canonical JSON text (stable key order within each dict as built, no NaN)."""
    return json.dumps(_plain(obj), indent=1, allow_nan=False) + "\n"


def normalise_analysis(analysis) -> dict:
    """Round-trip through JSON so a fresh analysis and a cached one are the same object."""
    if not isinstance(analysis, dict):
        raise UserError(f"the analyzer returned {type(analysis).__name__}, expected a dict")
    plain = json.loads(dumps(analysis))
    if plain.get("schema") != ANALYSIS_SCHEMA:
        raise UserError(f"analysis has schema {plain.get('schema')!r}, expected {ANALYSIS_SCHEMA!r}")
    return plain


# ------------------------------------------------------------------ causal JSON
def read_causal(path) -> dict:
    """A causal JSON file (`icrl-interp causal --json`) as {"schema", "source", "causal": section},
    JSON-normalised (NaN / Inf -> null); a one-line UserError when it is not one (the message does not
    repeat the path: the row names it)."""
    try:
        data = json.loads(Path(path).read_bytes())
    except OSError as e:
        raise UserError(f"cannot read: {e.strerror or e}") from None
    except ValueError as e:  # not UTF-8, not JSON
        raise UserError(f"not a causal JSON file: not valid JSON ({one_line(e)})") from None
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema != inputs.CAUSAL_SCHEMA:
        what = f"its schema is {schema!r}" if isinstance(data, dict) else f"it holds a JSON {type(data).__name__}"
        raise UserError(f"not a causal JSON file: {what}, expected an object with schema {inputs.CAUSAL_SCHEMA!r} "
                        "(written by `icrl-interp causal --json`)")
    if not isinstance(data.get("causal"), dict):
        raise UserError("a causal JSON file without its `causal` section")
    return json.loads(dumps({"schema": schema, "source": data.get("source"), "causal": data["causal"]}))


def causal_status(doc: dict) -> tuple[str, str]:
    """('ok' | 'partial' | 'nothing analyzed', one-line reasons) of a causal document: 'ok' when the section
    holds a result (the TD direction's erasure effect), 'partial' when its random-init baseline could not
    run (the reason), 'nothing analyzed' when there is no result."""
    section = doc.get("causal") if isinstance(doc, dict) else None
    td = section
    for key in ("erasure", "output_change", "td", "mean"):
        td = td.get(key) if isinstance(td, dict) else None
    if not isinstance(td, (int, float)) or isinstance(td, bool):
        return "nothing analyzed", "the causal section holds no result (erasure.output_change.td.mean is missing or not finite)"
    base = section.get("baseline")
    if isinstance(base, dict) and base.get("error"):
        why = (str(base["error"]).strip().splitlines() or [""])[0]
        return "partial", f"random-init baseline: not run: {why}"
    return "ok", ""


def _causal_job(item: ReportInput, r: Result, cache_dir: Path, use_cache: bool) -> None:
    """Read a causal (or verdict) input into `r` (from the cache when its hash is there); a bad file fails the row."""
    reader, read, take = ((VERDICT_READER, read_verdict, r.set_verdict) if item.kind == "verdict" else
                          (CAUSAL_READER, read_causal, r.set_causal))
    cached = load_cached(cache_dir, r.sha256, reader) if use_cache else None
    if cached is not None:
        r.cached = True
        take(cached)
        return
    try:
        doc = read(item.path)
    except Exception as e:  # noqa: BLE001 - a bad file is a failed row, the batch goes on
        r.status, r.error = "failed", one_line(e)
        return
    take(doc)
    store_cached(cache_dir, r.sha256, reader, doc)


# ------------------------------------------------------------------ verdict JSON
VERDICT_READER = "icrl_interp.report.batch:read_verdict"
"""What a verdict JSON's cache entry records as its analyzer."""


def read_verdict(path) -> dict:
    """A verdict JSON file (`icrl-interp verdict --json`), JSON-normalised; a one-line UserError when it is not one."""
    try:
        data = json.loads(Path(path).read_bytes())
    except OSError as e:
        raise UserError(f"cannot read: {e.strerror or e}") from None
    except ValueError as e:
        raise UserError(f"not a verdict JSON file: not valid JSON ({one_line(e)})") from None
    if not isinstance(data, dict) or data.get("schema") not in inputs.VERDICT_SCHEMAS:
        raise UserError(f"not a verdict JSON file: expected an object with schema {inputs.VERDICT_SCHEMA!r}")
    episode = data["schema"] in inputs.EPISODE_VERDICT_SCHEMAS  # behaviour on episodes: no layers, no output
    for key in ("verdict", "candidates") if episode else ("layers", "output", "verdict", "candidates"):
        if key not in data:
            raise UserError(f"a verdict JSON file without its {key!r} field")
    return json.loads(dumps(data))


def verdict_status(doc: dict) -> tuple[str, str]:
    """('ok' | 'nothing analyzed', reason) of a verdict document: ok when it holds a verdict text."""
    v = doc.get("verdict") if isinstance(doc, dict) else None
    if not isinstance(v, dict) or not isinstance(v.get("text"), str):
        return "nothing analyzed", "the verdict JSON holds no verdict"
    return "ok", ""


# ------------------------------------------------------------------ analysis
def resolve_analyzer(ref: str) -> Callable[[str], dict]:
    """'package.module:function' -> the function."""
    module, _, name = ref.partition(":")
    if not module or not name:
        raise UserError(f"analyzer must look like 'package.module:function', got {ref!r}")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise UserError(f"cannot load analyzer {ref!r}: {e}") from None


def analyze_job(analyzer: str, path: str, control: ControlSettings | None = None,
                options: dict | None = None) -> tuple[str, object]:
    """Worker entry point: ('ok', analysis) or ('failed', one-line reason); never raises. `options`:
    keyword arguments of the analyzer (the default analyzer's `live_tasks` for checkpoints).

    With `control`, a successful analysis also gets the closed-loop control evaluation under its
    `control` key (whose own failure is recorded there, not raised)."""
    try:
        analysis = normalise_analysis(resolve_analyzer(analyzer)(path, **(options or {})))
    except Exception as e:  # noqa: BLE001 - every failure becomes a failed row, the batch goes on
        return "failed", one_line(e)
    if control is not None:
        from .control_eval import evaluate

        analysis[CONTROL] = json.loads(dumps(evaluate(path, control)))
    return "ok", analysis


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="input", disable=not enabled or total == 0, leave=False)


def run_batch(
    inputs: list[ReportInput],
    out_dir: Path,
    workers: int = 1,
    analyzer: str = DEFAULT_ANALYZER,
    use_cache: bool = True,
    progress: bool = True,
    control: ControlSettings | None = ControlSettings(),
    scheduler: str | None = None,
    engine: Engine | None = None,
    checkpoint_options: dict | None = None,
) -> list[Result]:
    """Hash every input, reuse cached analyses, analyze the rest on `engine`, else on `scheduler`
    (`cluster.choose_scheduler`: None = a LocalCluster of `workers` processes when > 1 and more than
    one input is left to analyze, else in this process). Each analysis is cached by this process as
    it arrives, so a report stopped half way (or a worker lost) keeps what was done (docs/cluster.md).

    With enabled `control` settings (default: ReportConfig's, 20 MDPs x 200 updates; None or 0 MDPs
    disables), sarsa / actor-critic checkpoints also get a closed-loop control evaluation in the
    same job (see control_eval). `checkpoint_options`: keyword arguments of the analyzer for checkpoint
    inputs (e.g. `{"live_tasks": 256}`: their activations analyzed live); part of their cache key."""
    cache_dir = Path(out_dir) / "cache"

    def key_of(item: ReportInput) -> str:
        """The cache's analyzer entry: the analyzer, and the options it gets for this input."""
        opts = checkpoint_options if item.kind == "checkpoint" else None
        return analyzer + (" " + json.dumps(opts, sort_keys=True) if opts else "")

    results: list[Result] = []
    todo: list[int] = []
    controls: dict[int, ControlSettings] = {}

    def control_for(item: ReportInput) -> ControlSettings | None:
        on = control is not None and control.enabled and wants_control(item.kind, item.meta.get("family"))
        return control if on else None

    with _progress(len(inputs), "hashing", progress) as bar:
        for item in inputs:
            bar.update()
            if item.kind == "missing":
                results.append(Result(item, "failed", error=item.problem))
                continue
            try:
                sha = content_hash(item)
            except OSError as e:
                results.append(Result(item, "failed", error=f"cannot read: {e.strerror or e}"))
                continue
            if item.kind in ("causal", "verdict"):  # read, not analyzed: no worker needed
                results.append(Result(item, "pending", sha256=sha))
                _causal_job(item, results[-1], cache_dir, use_cache)
                continue
            ctl = control_for(item)
            ctl_key = ctl.key() if ctl else None
            cached = load_cached(cache_dir, sha, key_of(item), ctl_key) if use_cache else None
            results.append(Result(item, "pending", sha256=sha, cached=bool(cached)))
            if cached:
                results[-1].set_analysis(cached)
            if ctl:
                controls[len(results) - 1] = ctl
            if not cached:
                todo.append(len(results) - 1)

    def finish(i: int, status: str, value) -> None:
        r = results[i]
        if status == "ok":
            r.set_analysis(value)
            ctl = controls.get(i)
            store_cached(cache_dir, r.sha256, key_of(r.input), value, ctl.key() if ctl else None)
            kill_point("report.analysis")
        else:
            # analyzers name the file in their messages; the row names it already
            prefix = f"{r.input.path}: "
            r.status, r.error = "failed", str(value)[len(prefix):] if str(value).startswith(prefix) else str(value)

    jobs = [(analyzer, str(results[i].input.path), controls.get(i),
             checkpoint_options if results[i].input.kind == "checkpoint" else None) for i in todo]
    with engine_for(engine, scheduler, len(todo), workers) as eng:
        # a task whose workers kept dying (out of memory, killed) fails its row; the batch goes on
        eng.map(analyze_job, jobs, desc="analyzing", progress=progress, on_result=lambda k, v: finish(todo[k], *v),
                lost=lambda why: ("failed", f"analysis process died: {why}"))
    return results


# ------------------------------------------------------------------ flat rows
def flatten(obj, prefix: str = "") -> dict:
    """Nested analysis -> {'a.b.c': value}. A list of dicts with a 'layer' key is keyed by layer,
    other lists of dicts by index; a list without dicts (a vector, a matrix) stays one value."""
    out: dict = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, list) and any(isinstance(v, dict) for v in obj):
        by_layer = all(isinstance(v, dict) and isinstance(v.get("layer"), int) for v in obj) and obj
        for i, v in enumerate(obj):
            if by_layer:
                v = {k: x for k, x in v.items() if k != "layer"}
                out.update(flatten(v, f"{prefix}.{obj[i]['layer']}"))
            else:
                out.update(flatten(v, f"{prefix}.{i}"))
    else:
        out[prefix] = obj
    return out


def summary_row(r: Result) -> dict:
    """Metadata columns first, then every metric of the analysis, flattened."""
    meta = r.input.meta
    row = {
        "input": str(r.input.path),
        "kind": r.input.kind,
        "status": r.status,
        "error": r.error,
        "reasons": r.reasons,
        "sha256": r.sha256,
        "family": r.family,
        "source": r.source,
        "run_id": meta.get("run_id"),
        "step": meta.get("step"),
        "seed": meta.get("seed"),
        "gamma": meta.get("gamma"),
        "context_length": meta.get("context_length"),
    }
    if r.verdict is not None:
        v = r.verdict
        row["task_family"] = (v.get("task") or {}).get("family")
        row["context_length"] = (v.get("task") or {}).get("n")
        row["verdict.source"] = v.get("source")
        for key, value in flatten(v["verdict"], "verdict").items():
            row[key] = value
    if r.causal is not None:
        section = r.causal_section
        task = section.get("task") if isinstance(section.get("task"), dict) else {}
        if isinstance(task.get("n"), int) and not isinstance(task.get("n"), bool):
            row["context_length"] = task["n"]
        row["task_family"] = task.get("family")
        row["causal.source"] = r.causal.get("source")
        for key, value in flatten(section, "causal").items():
            if key not in row and not CAUSAL_DETAIL.search(key):  # per-draw lists stay in the JSON
                row[key] = value
    if r.analysis:
        for key in ("gamma", "context_length"):  # the analyzer read them from the data itself
            if r.analysis.get(key) is not None:
                row[key] = r.analysis[key]
        for key, value in flatten(r.analysis).items():
            # schema is fixed; the analyzer's source / kind / family repeat the columns above;
            # the control curves are for the figure (and the cache), not for a table cell
            if key not in row and key != "schema" and not key.startswith(CURVE_KEY + ".") \
                    and not PROBE_DETAIL.search(key):
                row[key] = value
    return _plain(row)


def summary_json(results: list[Result]) -> str:
    rows = [summary_row(r) for r in results]
    failed = sum(r.failed for r in results)
    partial = sum(r.status == "partial" for r in results)
    return dumps({"schema": SUMMARY_SCHEMA, "n_inputs": len(rows), "n_failed": failed, "n_partial": partial,
                  "rows": rows})


def _cell(value) -> str:
    """CSV cell: empty for None, JSON for vectors / matrices, repr-exact for floats."""
    if value is None:
        return ""
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def summary_csv(results: list[Result]) -> str:
    rows = [summary_row(r) for r in results]
    columns = list(META_COLUMNS)
    for row in rows:
        for key in row:
            if key not in columns:
                columns.append(key)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(row.get(k)) for k in columns})
    return buf.getvalue()


def write_summaries(results: list[Result], out_dir: Path) -> tuple[Path, Path]:
    out_dir = Path(out_dir)
    write_atomic(out_dir / "summary.json", summary_json(results))
    write_atomic(out_dir / "summary.csv", summary_csv(results))
    return out_dir / "summary.json", out_dir / "summary.csv"


# ------------------------------------------------------------------ the report directory
def is_report_dir(path) -> bool:
    """A directory holding a report's own summary.json (schema icrl_interp.report/1), or the lock file
    a report creates first (`REPORT_LOCK`: a report killed before its summary was written)."""
    path = Path(path)
    return _read_json(path / "summary.json").get("schema") == SUMMARY_SCHEMA or is_lock_file(path / REPORT_LOCK)


def _leftovers(out_dir: Path) -> list[Path]:
    """The temporary files a killed report left in `out_dir` (`files.temporaries`)."""
    fig_dir = out_dir / "figures"
    return (temporaries(out_dir) + temporaries(out_dir / "cache") + temporaries(fig_dir, suffix=".png")
            + temporaries(fig_dir, suffix=".svg"))


@contextmanager
def writing_report(out_dir) -> Iterator[Path]:
    """Hold the report directory `out_dir` (made if missing) while a report writes there: its lock
    file first, then, in a directory that was empty or a report's, the temporary files of a killed
    report removed (elsewhere, e.g. a folder of the user's given to `build_report`, nothing is removed
    and the lock file goes at the end). Another report writing there is a one-line UserError."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ours = is_report_dir(out_dir) or not any(out_dir.iterdir())
    with locked(out_dir / REPORT_LOCK, f"the report directory {out_dir}", keep=ours):
        for tmp in _leftovers(out_dir) if ours else []:  # locked: no live report is writing them
            tmp.unlink(missing_ok=True)
        yield out_dir


def _own_figures(out_dir: Path) -> set[str]:
    """Names of the figures the report in `out_dir` wrote: its manifest, else those its index.html shows."""
    manifest = _read_json(out_dir / FIGURES_MANIFEST)
    if manifest.get("schema") == FIGURES_SCHEMA and isinstance(manifest.get("files"), list):
        return {str(f) for f in manifest["files"]}
    try:
        page = (out_dir / "index.html").read_text(errors="replace")
    except OSError:
        return set()
    return set(re.findall(r"figures/([^\"'<>/]+\.(?:png|svg))", page))


def claim_out_dir(out, inputs=(), flag: str = "--out") -> Path:
    """`out` if a report may be written there (`outputs.output_dir`: new, empty or an earlier report,
    never an input), and every PNG / SVG in its figures/ is one the package wrote (listed in the
    manifest or marked as ours: the report deletes those as stale); otherwise a one-line UserError."""
    out = outputs.output_dir(out, flag, inputs=inputs, owned=is_report_dir, what="report")
    fig_dir = out / "figures"
    if fig_dir.exists() and not fig_dir.is_dir():
        raise UserError(f"{fig_dir} is a file where the report puts its figures; move it away or choose another {flag}")
    if fig_dir.is_dir():
        ours = _own_figures(out)
        leftovers = set(_leftovers(out))  # a killed report's temporary files: removed when it is written again
        for f in sorted(fig_dir.iterdir()):
            if (f.suffix in (".png", ".svg") and f.is_file() and f.name not in ours and f not in leftovers
                    and not outputs.is_ours(f)):
                raise UserError(f"{f} is not a figure this report wrote, and a report replaces the figures in "
                                f"{fig_dir}; move it away or choose another {flag}")
    return out


def write_figure_manifest(out_dir, figures) -> None:
    """Record the figure files of this report (FigureInfo.files), so the next one deletes only those."""
    fig_dir = Path(out_dir) / "figures"
    if fig_dir.is_dir():
        names = sorted({Path(f).name for info in figures for f in info.files})
        write_atomic(Path(out_dir) / FIGURES_MANIFEST, dumps({"schema": FIGURES_SCHEMA, "files": names}))
