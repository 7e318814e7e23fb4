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
"""
from __future__ import annotations

import datetime as _dt
import hashlib
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
from ..tasks.episodes import Episodes, read_episodes
from .capture import capture, role_points
from .format import RecordingWriter

EPISODE_ARRAYS = ("observations", "actions", "rewards", "next_observations", "terminations", "truncations", "valid")
"""The histories stored beside the activations: all of `Episodes`' arrays, so the analyzers replay the candidates' targets
(which bootstrap from s' at a time limit) from the recording alone (`analyzers.episode_recording`)."""
DEFAULT_ROLES = {"resid_post": "blocks.{layer}.hook_resid_post"}


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

    def table(self) -> str:
        lines = [f"recording {self.path}", f"  histories: {self.n_histories} x {self.n_steps} steps"]
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
                    progress: bool = True, model_spec: str = "", user: bool | None = None) -> EpisodeRecordSummary:
    """Record `model` over `episodes` (an `Episodes`, or the path of an episodes file) into the HDF5 file `out`
    (module docstring). `roles`: {role: template or list of paths} as a probe spec's roles
    (`capture.ROLES`; default: `resid_post` at `blocks.{layer}.hook_resid_post`); `patterns`: also the
    attention rows at the read positions (role `pattern`, default `blocks.{layer}.attn.hook_pattern`).
    `batch_size`: histories per batch. `user`: the model's errors are one-line errors (default: a model
    that is not the package's `ADTransformer`)."""
    from ..core.files import locked
    from ..core.heap import release_free_memory
    from ..models.ad_transformer import ADTransformer
    from .recorder import _check_finite, _stochastic_note, _versions, model_info
    from .shards import leftovers, lock_path

    source_sha = ""
    if not isinstance(episodes, Episodes):
        path = Path(episodes)
        episodes = read_episodes(path)
        source_sha = _sha256(path)
    if not isinstance(model, nn.Module):
        raise UserError(f"record needs a torch.nn.Module, got {type(model).__name__}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise UserError(f"--batch-size must be a positive integer, got {batch_size!r}")
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
            "episodes_meta": episodes.meta, "token_format": fmt.to_dict(), "roles": points, "n_total": int(H),
            "n_steps": int(T), "batch_size": batch_size, "seed": int(baseline_seed), "rows": "histories",
            "versions": _versions(), "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    if base is not None:
        meta["baseline"] = base[1]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    from tqdm.auto import tqdm

    t0, forward_s, shapes = time.perf_counter(), 0.0, {}
    with locked(lock_path(out), f"the recording {out}"), eval_mode(*[r.model for _, r in runs]):
        for stale in leftovers(out):
            stale.unlink()
        writer = None
        try:
            bar = tqdm(total=H, unit="history", desc="record episodes", disable=not progress)
            for lo in range(0, H, batch_size):
                part = episodes.select(np.arange(lo, min(lo + batch_size, H)))
                tokens, pmap = et.encode(part, fmt)
                x = torch.from_numpy(tokens).to(devices.of(model))
                data = {}
                for prefix, run in runs:
                    got, s = run(x, pmap)
                    forward_s += s
                    data.update({prefix + k: v for k, v in got.items()})
                # NaN marks the padding steps: only the valid ones are checked
                _check_finite({k: v[part.valid] for k, v in data.items()}, f"histories {lo}..{lo + part.n_histories - 1}")
                if pattern_points:
                    data["maps/key_step"] = _key_steps(pmap)
                for name in EPISODE_ARRAYS:
                    data[f"episodes/{name}"] = getattr(part, name)
                data["episodes/episode_index"], data["episodes/episode_step"] = part.episode_index, part.episode_step
                if writer is None:  # the first batch passed every check: now the file may exist
                    writer = RecordingWriter(out, meta)
                writer.write_batch(data)
                shapes = {k: v.shape[1:] for k, v in data.items() if k.startswith(("acts/", "outputs/"))}
                del data, tokens, x
                release_free_memory()  # the batch's arrays are freed: keep peak memory flat in the histories
                bar.update(part.n_histories)
            bar.close()
            path = writer.finish()
        except BaseException:
            if writer is not None:
                writer.discard()  # no resume for episode recordings: nothing half-written stays
            raise
    return EpisodeRecordSummary(path, H, T, shapes, time.perf_counter() - t0, forward_s, notes)


def _key_steps(pmap: et.PositionMap) -> np.ndarray:
    """[H, T, P]: the history step of each key position of the sequence each step is read from."""
    out = np.full((pmap.n_histories, pmap.n_steps, pmap.step.shape[1]), -1, dtype=np.int64)
    out[pmap.read_history, pmap.read_step] = pmap.step[pmap.read_seq]
    return out
