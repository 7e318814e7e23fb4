"""Record a model over learning histories (an `Episodes` file): the residual stream of every layer at the
action-readout positions, aligned to steps, and the model's action logits (docs/episodes.md, "Recording
a model over episodes"; docs/formats.md, "Recordings").

The model reads the documented token tensor of its format (`models.episode_tokens`: the model's own
`token_format`, else the one given) and returns action logits [N, P, A], or (logits, values [N, P]).
Histories go through in batches: each batch is encoded, run with hooks on the roles' points (the
package's own names, or a user model's modules mapped by roles as `record --model` does,
`capture.role_points`), read at the `PositionMap`'s read positions and appended to the recording as rows
[b, T, ...] (one row per history): memory is that of one batch, whatever the number of histories. The
recording is a schema-2 recording (`format.RecordingWriter`: atomic, sealed, `complete` only when whole)
whose rows are histories:

* `acts/blocks.{l}.hook_resid_post` [H, T, d_model] (and the other roles' per-layer points), NaN on
  padding steps;
* `acts/blocks.{l}.attn.hook_pattern` [H, T, heads, P] with `patterns=True`: the attention row of the
  read position over its sequence, and `maps/key_step` [H, T, P], the history step of each key position
  (-1 on padding; for `dpt` the query token's key is its own step);
* `outputs/logits` [H, T, A], `outputs/values` [H, T] (when the model returns values);
* `episodes/{observations, actions, rewards, next_observations, terminations, truncations, valid,
  episode_index, episode_step}` [H, T]: the histories themselves, so the analyzers' targets come from the same file;
* with `baseline="random-init"`, the same under `baseline/` for the model at random initialization
  (`models.random_init`).

The model runs in eval mode, its modes restored afterwards (`models.modes.eval_mode`); a user model's
exceptions and non-finite outputs are one-line errors (`models.user.forward`, `recorder._check_finite`).

A recording is resumable and shardable as a family's (`recorder.record`): an interrupted run leaves
`OUT.partial`, which `resume=True` continues from its last complete batch (the writer cuts every dataset back to
`/progress`); `shards=K` writes the run's whole batches into K shard files (`shards.plan_files`, in forked
workers: `shards.run`) joined by a master of virtual datasets (`shards.write_master`). A batch's rows depend on
its histories and the models only (the random-init copy is drawn once, under `baseline_seed`; torch's generator
is seeded per batch by `baseline_seed` and the batch's first history, for a model that draws random numbers), so
a resumed or sharded recording holds exactly the datasets of an uninterrupted one. A resume is refused unless the
partial file (or a complete shard) was recorded with the same histories, model weights, format, hooks, baseline,
batch size and split (`IDENTITY`).
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..core import devices
from ..core.errors import UserError
from ..models import episode_tokens as et
from ..models.modes import eval_mode
from ..models.random_init import random_init_copy
from ..tasks.episodes import ARRAYS, Episodes, _digest, read_episodes
from . import shards as sharding
from .capture import capture, role_points
from .format import Recording, RecordingWriter

EPISODE_ARRAYS = ("observations", "actions", "rewards", "next_observations", "terminations", "truncations", "valid")
"""The histories stored beside the activations: all of `Episodes`' arrays, so the analyzers replay the candidates' targets
(which bootstrap from s' at a time limit) from the recording alone (`analyzers.episode_recording`)."""
DEFAULT_ROLES = {"resid_post": "blocks.{layer}.hook_resid_post"}
IDENTITY = (*RecordingWriter.IDENTITY, "histories_sha256", "model_sha256", "token_format", "roles", "patterns",
            "baseline", "n_steps")
"""Root attributes a resumed partial file (or a complete shard) must share with the run: what fixes its rows."""


class _Writer(RecordingWriter):
    """The recording writer, resuming only a partial file of the same run (`IDENTITY`)."""

    IDENTITY = IDENTITY


@dataclass
class EpisodeRecordSummary:
    path: Path
    n_histories: int
    n_steps: int
    hooks: dict[str, tuple[int, ...]]
    seconds: float
    forward_seconds: float
    """Time in the model's forward passes (with hooks), of `seconds` in all."""
    notes: list = field(default_factory=list)
    resumed_from: int = 0
    """Histories found recorded by an interrupted run (its partial file, its complete shards)."""

    def table(self) -> str:
        resumed = f" (resumed at {self.resumed_from})" if self.resumed_from else ""
        lines = [f"recording {self.path}", f"  histories: {self.n_histories} x {self.n_steps} steps{resumed}"]
        width = max((len(h) for h in self.hooks), default=10)
        lines += [f"  {h:<{width}}  {tuple(s)}" for h, s in self.hooks.items()]
        lines.append(f"  {self.seconds:.2f} s ({self.forward_seconds:.2f} s in forward passes)")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def token_format_of(model: nn.Module, episodes: Episodes, name: str | None, context: int | None,
                    stride: int | None = None) -> et.TokenFormat:
    """The format the model reads: its own `token_format` (a TokenFormat or its dict), else `name` and
    `context` (both needed then); checked against the episodes' spaces by `encode`."""
    own = getattr(model, "token_format", None)
    if own is not None:
        fmt = own if isinstance(own, et.TokenFormat) else et.TokenFormat.from_dict(own)
        if name is not None and name != fmt.name or context is not None and context != fmt.context:
            raise UserError(f"the model reads {fmt.name} tokens with context {fmt.context}; drop the token format "
                            f"options or make them agree")
        return fmt if stride is None else et.TokenFormat(fmt.name, fmt.obs_width, fmt.n_actions, fmt.context, stride)
    if name is None or context is None:
        raise UserError("the model has no token_format attribute: give the token format and its context "
                        "(--token-format NAME --context K)")
    return et.format_for(episodes, name, context, stride)


def load_episode_model(spec, weights=None) -> nn.Module:
    """The model of `record --episodes` and `collect --model`: an AD model directory (`ad_transformer.load`; a
    spec without a colon is one), or a user's `FILE.py:FUNC` / `package.module:FUNC` (`models.user.load`, with
    optional safetensors weights)."""
    from ..models import ad_transformer, user

    if Path(str(spec)).is_dir() or ":" not in str(spec):  # a user's model is always FILE.py:FUNC or module:FUNC
        if weights is not None:
            raise UserError(f"--weights goes with --model FILE.py:FUNC, not with the AD model directory {spec}")
        return ad_transformer.load(spec)
    return user.load(str(spec), weights)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def histories_digest(episodes: Episodes) -> str:
    """SHA-256 of the histories (every array, the spaces, the meta), from a file or from memory: the histories a
    resumed recording must hold (root attribute `histories_sha256`)."""
    parts = {name: _digest(getattr(episodes, name)) for name in ARRAYS}
    parts.update(n_actions=episodes.n_actions, n_observations=episodes.n_observations, meta=episodes.meta)
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def model_digest(model: nn.Module) -> str:
    """SHA-256 of a model's state (each parameter and buffer: name, dtype, shape, bytes), wherever it came from (an
    AD model directory, a user's FILE.py:FUNC): the weights a resumed recording must have (`model_sha256`)."""
    h = hashlib.sha256()
    for name, value in model.state_dict().items():
        if not isinstance(value, torch.Tensor):  # a module's extra state
            h.update(f"{name} {value!r}\n".encode())
            continue
        t = value.detach().cpu().contiguous()
        h.update(f"{name} {t.dtype} {tuple(t.shape)}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


class _Run:
    """One model's pass over a batch: its hooks' activations read at the read positions, aligned to steps."""

    def __init__(self, model: nn.Module, points: dict[str, str], patterns: list[str], user: bool):
        self.model, self.points, self.patterns, self.user = model, points, patterns, user

    def __call__(self, tokens: torch.Tensor, pmap: et.PositionMap) -> tuple[dict[str, np.ndarray], float]:
        from ..models import user as user_model

        acts: dict[str, torch.Tensor] = {}

        def keep(name: str, t: torch.Tensor) -> None:
            acts[name] = t.detach()

        t0 = time.perf_counter()
        with torch.no_grad(), capture(self.model, {**self.points, **{p: p for p in self.patterns}}, keep):
            y = user_model.forward(self.model, tokens) if self.user else self.model(tokens)
        seconds = time.perf_counter() - t0
        logits, values = (y if isinstance(y, (tuple, list)) and len(y) == 2 else (y, None))
        N, P = tokens.shape[:2]
        for what, v, ndim in (("logits", logits, 3), ("values", values, 2)):
            if v is not None and (not isinstance(v, torch.Tensor) or v.ndim != ndim or tuple(v.shape[:2]) != (N, P)):
                shape = tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
                raise UserError(f"the model's {what} have shape {shape}; expected [{N}, {P}{', A' if ndim == 3 else ''}] "
                                "(one per token position)")
        out = {"outputs/logits": pmap.to_steps(logits.float().cpu().numpy())}
        if values is not None:
            out["outputs/values"] = pmap.to_steps(values.float().cpu().numpy())
        for name in self.points:
            a = acts.get(name)
            if a is None or a.ndim != 3 or tuple(a.shape[:2]) != (N, P):
                raise UserError(f"hook {name} gave {None if a is None else tuple(a.shape)}; expected [{N}, {P}, d] "
                                "(it did not fire, or is not per position)")
            out[f"acts/{name}"] = pmap.to_steps(a.float().cpu().numpy())
        for name in self.patterns:
            a = acts[name]
            if a.ndim == 3:
                a = a[:, None]
            rows = a.float().cpu().numpy()[pmap.read_seq, :, pmap.read_pos]  # [M, heads, P]
            full = np.full((pmap.n_histories, pmap.n_steps, *rows.shape[1:]), np.nan, dtype=np.float32)
            full[pmap.read_history, pmap.read_step] = rows
            out[f"acts/{name}"] = full
        return out, seconds


def record_episodes(model: nn.Module, episodes, out, *, token_format: str | None = None, context: int | None = None,
                    stride: int | None = None, roles: dict | None = None, patterns: bool = False,
                    baseline: str = "random-init", baseline_seed: int = 0, batch_size: int = 32,
                    progress: bool = True, model_spec: str = "", user: bool | None = None, resume: bool = False,
                    shards: int = 1, workers: int | None = None) -> EpisodeRecordSummary:
    """Record `model` over `episodes` (an `Episodes`, or the path of an episodes file) into the HDF5 file `out`
    (module docstring). `roles`: {role: template or list of paths} as a probe spec's roles
    (`capture.ROLES`; default: `resid_post` at `blocks.{layer}.hook_resid_post`); `patterns`: also the
    attention rows at the read positions (role `pattern`, default `blocks.{layer}.attn.hook_pattern`).
    `batch_size`: histories per batch. `user`: the model's errors are one-line errors (default: a model
    that is not the package's `ADTransformer`). `resume`: continue the partial file(s) of an interrupted run of
    the same arguments. `shards` > 1: that many shard files and a master at `out`, written by `workers` forked
    processes at a time (None: one per shard up to the CPU count; 0 or 1: one after another in this process, as
    for a model on a GPU)."""
    from ..core.files import locked
    from ..models.ad_transformer import ADTransformer
    from .recorder import _stochastic_note, _versions, model_info

    source_sha = ""
    if not isinstance(episodes, Episodes):
        path = Path(episodes)
        episodes = read_episodes(path)
        source_sha = _sha256(path)
    if not isinstance(model, nn.Module):
        raise UserError(f"record needs a torch.nn.Module, got {type(model).__name__}")
    for flag, value in (("--batch-size", batch_size), ("--shards", shards)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise UserError(f"{flag} must be a positive integer, got {value!r}")
    if baseline not in ("random-init", "none"):
        raise UserError(f"baseline must be random-init or none, got {baseline!r}")
    fmt = token_format_of(model, episodes, token_format, context, stride)
    et.check_fits(fmt, episodes)
    user = not isinstance(model, ADTransformer) if user is None else user
    points = role_points(model, roles or DEFAULT_ROLES)
    pattern_points = []
    if patterns:
        pattern_points = list(role_points(model, {"pattern": (roles or {}).get("pattern", "blocks.{layer}.attn.hook_pattern")}))
    H, T = episodes.n_histories, episodes.n_steps
    batch_size = int(min(batch_size, H))
    base = random_init_copy(model, baseline_seed) if baseline == "random-init" else None
    runs = [("", _Run(model, points, pattern_points, user))]
    if base is not None:
        runs.append(("baseline/", _Run(base[0], points, pattern_points, user)))
    notes = [n for n in (_stochastic_note(model),) if n]
    meta = {"task_family": "", "model": model_info(model), "model_spec": model_spec, "episodes_sha256": source_sha,
            "histories_sha256": histories_digest(episodes), "model_sha256": model_digest(model),
            "episodes_meta": episodes.meta, "token_format": fmt.to_dict(), "roles": points, "patterns": pattern_points,
            "n_total": int(H), "n_steps": int(T), "batch_size": batch_size, "seed": int(baseline_seed),
            "baseline": base[1] if base is not None else None, "rows": "histories", "versions": _versions(),
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    job = _Job(episodes, fmt, runs, bool(pattern_points), batch_size, int(baseline_seed))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with locked(sharding.lock_path(out), f"the recording {out}"), eval_mode(*[r.model for _, r in runs]):
        for stale in sharding.leftovers(out):  # of killed runs; no other run of `out` is alive now
            stale.unlink()
        if shards == 1:
            done = [_record_file(job, out, meta, 0, H, resume, progress)]
        else:
            done = _record_sharded(job, out, meta, int(shards), resume, workers, progress)
            notes.append(f"{shards} shards ({sharding.shard_paths(out, shards)[0].name} ...), joined by virtual "
                         f"datasets in {out.name}")
    return EpisodeRecordSummary(out, H, T, _shapes(out), time.perf_counter() - t0,
                                sum(d["forward_seconds"] for d in done), notes, sum(d["resumed_from"] for d in done))


@dataclass
class _Job:
    """What every file of a run records from: the histories, their format, the model's runs (and the random-init
    copy's, drawn once), in batches of `batch_size` histories."""

    episodes: Episodes
    fmt: et.TokenFormat
    runs: list
    patterns: bool
    batch_size: int
    seed: int
    """The baseline seed: with the batch's first history, it seeds torch's generator for the batch (`batch`)."""

    def batch(self, lo: int, hi: int) -> tuple[dict[str, np.ndarray], float]:
        """The rows of histories [lo, hi) ({dataset path: [b, T, ...]}, checked finite) and the seconds spent in
        forward passes. They depend on these histories and the models only: any file may hold any batch."""
        from .recorder import _check_finite

        part = self.episodes.select(np.arange(lo, hi))
        tokens, pmap = et.encode(part, self.fmt)
        x = torch.from_numpy(tokens).to(devices.of(self.runs[0][1].model))
        data, seconds = {}, 0.0
        # a model that draws random numbers draws the same for these histories in whichever run or shard records
        # them: torch's generator is seeded by (seed, first history) for the batch, and restored after it
        with torch.random.fork_rng(devices=[x.device.index or 0] if x.is_cuda else []):
            torch.manual_seed(int(np.random.SeedSequence([self.seed, lo]).generate_state(1)[0]))
            for prefix, run in self.runs:
                got, s = run(x, pmap)
                seconds += s
                data.update({prefix + k: v for k, v in got.items()})
        # NaN marks the padding steps: only the valid ones are checked
        _check_finite({k: v[part.valid] for k, v in data.items()}, f"histories {lo}..{hi - 1}")
        if self.patterns:
            data["maps/key_step"] = _key_steps(pmap)
        for name in EPISODE_ARRAYS:
            data[f"episodes/{name}"] = getattr(part, name)
        data["episodes/episode_index"], data["episodes/episode_step"] = part.episode_index, part.episode_step
        return data, seconds


def _record_file(job: _Job, path: Path, meta: dict, lo: int, hi: int, resume: bool, progress: bool) -> dict:
    """Histories [lo, hi) of the run into the recording `path` (the run's file, or a shard: then `meta` holds its
    `shard` attribute and its own `n_total`), from the last complete batch of its partial file when `resume`.
    Returns what it did as JSON (a shard's worker process sends it back)."""
    from tqdm.auto import tqdm

    from ..core.heap import release_free_memory

    writer = _Writer(path, meta, resume=True) if resume else None
    start = lo + (writer.n_done if writer is not None else 0)
    forward_s = 0.0
    bar = tqdm(total=hi - lo, initial=start - lo, unit="history", desc="record episodes", disable=not progress)
    try:
        if (start - lo) % job.batch_size and start != hi:
            raise UserError(f"cannot resume: {start - lo} histories done is not a whole number of batches of "
                            f"{job.batch_size}")
        for b0 in range(start, hi, job.batch_size):
            data, seconds = job.batch(b0, min(b0 + job.batch_size, hi))
            forward_s += seconds
            if writer is None:  # the first batch passed every check: now the file may exist
                writer = _Writer(path, meta)
            writer.write_batch(data)
            del data
            release_free_memory()  # the batch's arrays are freed: keep peak memory flat in the histories
            bar.update(min(job.batch_size, hi - b0))
        writer.finish()
    except UserError:
        # a refused batch (a NaN, the model raised): resuming would refuse it again, so a new file goes; a resumed
        # one keeps the batches it had, all checked
        if writer is not None and resume:
            writer.close()
        elif writer is not None:
            writer.discard()
        raise
    except BaseException:
        if writer is not None:
            writer.close()  # interrupted: the .partial stays for --resume; the final path is never touched
        raise
    finally:
        bar.close()
    return {"histories": hi - lo, "resumed_from": start - lo, "forward_seconds": forward_s}


def _record_sharded(job: _Job, out: Path, meta: dict, count: int, resume: bool, workers: int | None,
                    progress: bool) -> list[dict]:
    """`shards=count`: the run's whole batches in `count` shard files (`shards.plan_files`), each recorded by
    `_record_file` in a forked worker (`shards.run`; a complete one kept on --resume once it proves to be this
    run's), then joined by the master `out` (`shards.write_master`)."""
    from tqdm.auto import tqdm

    H, B = job.episodes.n_histories, job.batch_size
    files = sharding.plan_files(out, H, B, count, resume)

    def one(i: int) -> dict:
        path, shard, (b0, b1), state = files[i]
        lo, hi = b0 * B, min(b1 * B, H)
        own = {**meta, "n_total": hi - lo, "shard": shard}
        if state == "done":
            sharding.check_done(path, shard, own, IDENTITY)
            return {"histories": hi - lo, "resumed_from": hi - lo, "forward_seconds": 0.0}
        return _record_file(job, path, own, lo, hi, state == "resume", False)

    if devices.of(job.runs[0][1].model).type != "cpu":
        workers = 0  # CUDA cannot be used in a forked child: a GPU records the shards one after another
    paths = [f[0] for f in files]
    bar = tqdm(total=H, unit="history", desc=f"record episodes ({count} shards)", disable=not progress)
    try:
        done = sharding.run(one, count, workers, [f"shard {i} ({p})" for i, p in enumerate(paths)],
                            progress=lambda r: bar.update(r["histories"]))
    finally:
        bar.close()
    sharding.write_master(out, paths)
    return done


def _shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """{dataset: per-history shape} of the recorded activations and outputs (of the file, or the master)."""
    with Recording(path) as rec:
        return {f"{group}/{name}": tuple(ds.shape[1:]) for group in ("outputs", "acts") if group in rec.f
                for name, ds in rec.f[group].items()}


def _key_steps(pmap: et.PositionMap) -> np.ndarray:
    """[H, T, P]: the history step of each key position of the sequence each step is read from."""
    out = np.full((pmap.n_histories, pmap.n_steps, pmap.step.shape[1]), -1, dtype=np.int64)
    out[pmap.read_history, pmap.read_step] = pmap.step[pmap.read_seq]
    return out
