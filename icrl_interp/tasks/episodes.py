"""Learning histories of an agent in an environment: the `Episodes` grid, its HDF5 file, Minari import.

H histories (one task each) of T steps on an [H, T] grid; a history is a sequence of episodes of one
learning agent (Algorithm Distillation's "learning history"), episodes ending where
`terminations | truncations`; rows shorter than T are padded at their end (`valid` False).
Layout and file: docs/episodes.md.

The file (schema `icrl_interp.episodes/1`) is written atomically (`core.files.atomic_path`) with
`libver="latest"`, so HDF5 checksums its superblock and every object header and refuses a truncated file
on open; strings are fixed-length attributes (no global heap, whose corruption HDF5 cannot detect: see
recording/integrity.py); the raw data of each dataset, which HDF5 does not checksum, has its SHA-256 in
the `sha256` attribute, compared on every read. Needs neither torch nor gymnasium (Minari import:
`minari`, imported lazily).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from .._version import __version__
from ..core.errors import UserError
from ..core.files import atomic_path, json_clean
from ..core.validate import count

SCHEMA = "icrl_interp.episodes/1"
ARRAYS = ("observations", "actions", "rewards", "next_observations", "terminations", "truncations", "valid")
"""The [H, T, ...] arrays of `Episodes`, in the order of its fields (also the datasets of the file)."""
HDF5_ERRORS = (OSError, KeyError, RuntimeError, ValueError, TypeError)
"""What h5py and json raise on a damaged file (a corrupt object header, an unreadable attribute)."""


@dataclass(frozen=True)
class Episodes:
    """Learning histories on an [H, T] grid (docs/episodes.md). Validated on construction (one-line UserError);
    integer arrays become int64, `rewards` float64, Box observations float32, `meta` its JSON form."""

    observations: np.ndarray
    """int64 [H, T] (Discrete observations) or float32 [H, T, obs_dim] (Box observations): s_t."""
    actions: np.ndarray
    """int64 [H, T] in [0, n_actions): a_t."""
    rewards: np.ndarray
    """float64 [H, T]: the reward received for actions[h, t]."""
    next_observations: np.ndarray
    """Like observations: s' after step t (after an episode's end the next row holds the reset observation)."""
    terminations: np.ndarray
    """bool [H, T]: step t ended its episode in a terminal state (no bootstrap from s')."""
    truncations: np.ndarray
    """bool [H, T]: step t ended its episode by a time limit (bootstrap from s')."""
    valid: np.ndarray
    """bool [H, T]: False on the padding after a shorter history's end (a prefix mask per row)."""
    n_actions: int
    n_observations: int | None
    """Number of discrete observations; None for Box observations."""
    meta: dict = field(default_factory=dict)
    """JSON: env id and kwargs, agent and its parameters, seed, versions, per-history `tasks` (a list of H dicts)."""

    def __post_init__(self):
        discrete = self.n_observations is not None
        object.__setattr__(self, "n_actions", count("episodes: n_actions", self.n_actions))
        if discrete:
            object.__setattr__(self, "n_observations", count("episodes: n_observations", self.n_observations))
        kinds = {"actions": "i", "rewards": "f", "terminations": "b", "truncations": "b", "valid": "b",
                 "observations": "i" if discrete else "f", "next_observations": "i" if discrete else "f"}
        dtypes = {"i": np.int64, "f": np.float64, "b": np.bool_}
        for name in ARRAYS:
            arr = np.asarray(getattr(self, name))
            want = kinds[name]
            ok = arr.dtype.kind in ("iu" if want == "i" else "fiu" if want == "f" else "b")
            if not ok:
                what = {"i": "integers", "f": "numbers", "b": "booleans"}[want]
                raise UserError(f"episodes: {name} must hold {what}, got dtype {arr.dtype}")
            dtype = np.float32 if want == "f" and name.endswith("observations") else dtypes[want]
            object.__setattr__(self, name, np.ascontiguousarray(arr, dtype=dtype))
        grid = self.actions.shape
        if self.actions.ndim != 2 or 0 in grid:
            raise UserError(f"episodes: actions must be [histories, steps] with both >= 1, got shape {grid}")
        for name in ARRAYS:
            shape = getattr(self, name).shape
            want = "[H, T, obs_dim]" if name.endswith("observations") and not discrete else "[H, T]"
            if shape[:2] != grid or len(shape) != (3 if want != "[H, T]" else 2):
                raise UserError(f"episodes: {name} has shape {shape}; expected {want} with [H, T] = {list(grid)}")
        v = self.valid
        resumed = v[:, 1:] & ~v[:, :-1]  # a valid step after padding
        if resumed.any():
            h = int(np.flatnonzero(resumed.any(1))[0])
            raise UserError(f"episodes: valid of history {h} is not a prefix (True steps after a False one)")
        _in_range("actions", self.actions[v], self.n_actions)
        if discrete:
            _in_range("observations", self.observations[v], self.n_observations)
            _in_range("next_observations", self.next_observations[v], self.n_observations)
        for name in ("rewards", "observations", "next_observations"):
            if not np.all(np.isfinite(getattr(self, name)[v])):
                raise UserError(f"episodes: {name} holds NaN or infinite values")
        try:
            meta = json.loads(json.dumps(json_clean(self.meta), allow_nan=False))
        except (TypeError, ValueError) as e:
            raise UserError(f"episodes: meta is not JSON ({e})") from None
        if not isinstance(meta, dict):
            raise UserError(f"episodes: meta must be a dict, got {type(self.meta).__name__}")
        object.__setattr__(self, "meta", meta)

    # ------------------------------------------------------------------ derived
    @property
    def n_histories(self) -> int:
        return self.actions.shape[0]

    @property
    def n_steps(self) -> int:
        return self.actions.shape[1]

    @property
    def discrete(self) -> bool:
        return self.n_observations is not None

    @property
    def dones(self) -> np.ndarray:
        """bool [H, T]: step t ended its episode (terminal or time limit)."""
        return self.terminations | self.truncations

    @property
    def episode_index(self) -> np.ndarray:
        """int64 [H, T]: which episode of its history step t belongs to (0, 0, ..., 1, 1, ...)."""
        d = self.dones.astype(np.int64)
        return np.cumsum(d, axis=1) - d

    @property
    def episode_step(self) -> np.ndarray:
        """int64 [H, T]: the step's position within its episode (0 at each episode's first step)."""
        t = np.arange(self.n_steps)
        starts = np.ones_like(self.dones)
        starts[:, 1:] = self.dones[:, :-1]
        return t - np.maximum.accumulate(np.where(starts, t, 0), axis=1)

    def select(self, histories) -> "Episodes":
        """The histories `histories` (indices, or a bool mask over H), in that order; `meta["tasks"]` follows
        and `meta["histories"]` records their indices in the original file."""
        idx = np.asarray(histories)
        idx = np.flatnonzero(idx) if idx.dtype == bool and idx.shape == (self.n_histories,) else idx
        if idx.ndim != 1 or idx.size == 0 or idx.dtype.kind not in "iu" or idx.min() < -self.n_histories \
                or idx.max() >= self.n_histories:
            raise UserError(f"episodes: select needs a non-empty list of history indices in [0, {self.n_histories})")
        idx = idx % self.n_histories
        meta = dict(self.meta)
        meta["histories"] = [meta["histories"][i] for i in idx] if "histories" in meta else idx.tolist()
        if isinstance(meta.get("tasks"), list) and len(meta["tasks"]) == self.n_histories:
            meta["tasks"] = [meta["tasks"][i] for i in idx]
        return Episodes(**{name: getattr(self, name)[idx] for name in ARRAYS}, n_actions=self.n_actions,
                        n_observations=self.n_observations, meta=meta)


def _in_range(name: str, values: np.ndarray, n: int) -> None:
    if values.size and (values.min() < 0 or values.max() >= n):
        bad = values[(values < 0) | (values >= n)][0]
        raise UserError(f"episodes: {name} holds {bad}, outside [0, {n})")


# ------------------------------------------------------------------ the file
def _digest(arr: np.ndarray) -> str:
    """SHA-256 of an array's dtype, shape and bytes (a reshaped or retyped array has another digest)."""
    h = hashlib.sha256(f"{arr.dtype.str}{arr.shape}".encode())
    h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def _text_attr(value: str) -> np.bytes_:
    """A fixed-length string attribute: it lives in HDF5's checksummed attribute storage, not a global heap."""
    return np.bytes_(value.encode())


def write_episodes(path, episodes: Episodes) -> Path:
    """Write `episodes` to `path` atomically (temporary sibling, fsync, rename): the file or nothing."""
    if not isinstance(episodes, Episodes):
        raise UserError(f"write_episodes needs an Episodes, got {type(episodes).__name__}")
    with atomic_path(path) as tmp:
        with h5py.File(tmp, "w", libver="latest") as f:
            for name in ARRAYS:
                f.create_dataset(name, data=getattr(episodes, name))
            f.attrs["schema"] = _text_attr(SCHEMA)
            f.attrs["package_version"] = _text_attr(__version__)
            f.attrs["n_actions"] = np.int64(episodes.n_actions)
            f.attrs["n_observations"] = np.int64(episodes.n_observations or 0)  # 0: Box observations
            f.attrs["meta"] = _text_attr(json.dumps(episodes.meta, sort_keys=True))
            f.attrs["sha256"] = _text_attr(json.dumps({n: _digest(getattr(episodes, n)) for n in ARRAYS}))
    return Path(path)


def _text(attrs, key: str) -> str:
    raw = attrs[key]
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def read_episodes(path) -> Episodes:
    """The `Episodes` of a file `write_episodes` wrote; a truncated, corrupt or foreign file is refused with
    one line naming it."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such episodes file")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise UserError(f"{path}: not an episodes file (not a readable HDF5 file: {_reason(e)})") from None
    try:
        with f:
            schema = _text(f.attrs, "schema") if "schema" in f.attrs else None
            if schema != SCHEMA:
                raise UserError(f"{path}: not an episodes file (schema {schema!r}; expected {SCHEMA!r})")
            digests = json.loads(_text(f.attrs, "sha256"))
            arrays = {}
            for name in ARRAYS:
                arrays[name] = f[name][()]
                if _digest(arrays[name]) != digests.get(name):
                    raise UserError(f"{path}: corrupt episodes file ({name} does not match its SHA-256)")
            n_obs = int(f.attrs["n_observations"])
            kw = dict(n_actions=int(f.attrs["n_actions"]), n_observations=n_obs or None,
                      meta=json.loads(_text(f.attrs, "meta")))
    except HDF5_ERRORS as e:
        raise UserError(f"{path}: corrupt episodes file ({_reason(e)})") from None
    try:
        return Episodes(**arrays, **kw)
    except UserError as e:
        raise UserError(f"{path}: {e}") from None


def _reason(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


# ------------------------------------------------------------------ Minari
def from_minari(dataset, episodes_per_history: int = 1) -> Episodes:
    """A local Minari dataset (its id in the local Minari store, or its directory) as `Episodes`: each run
    of `episodes_per_history` consecutive episodes is one history (a remainder is dropped; `meta` says how
    many). Nothing is downloaded. Discrete actions; Discrete or Box observations."""
    try:
        import gymnasium.spaces as spaces
        import minari
        from minari.dataset.minari_dataset import MinariDataset
    except ImportError:
        raise UserError("reading a Minari dataset needs minari: pip install 'icrl_interp[episodes]'") from None
    episodes_per_history = count("episodes_per_history", episodes_per_history)
    where = Path(str(dataset))
    try:
        if where.is_dir():
            data = MinariDataset(where / "data" if (where / "data").is_dir() else where)
        else:
            data = minari.load_dataset(str(dataset), download=False)
    except (FileNotFoundError, ValueError, OSError, KeyError) as e:
        raise UserError(f"Minari dataset {dataset}: not found locally or unreadable ({_reason(e)})") from None
    obs_space, act_space = data.observation_space, data.action_space
    if not isinstance(act_space, spaces.Discrete):
        raise UserError(f"Minari dataset {dataset}: actions must be Discrete, got {act_space}")
    if not isinstance(obs_space, (spaces.Discrete, spaces.Box)):
        raise UserError(f"Minari dataset {dataset}: observations must be Discrete or Box, got {obs_space}")
    episodes = list(data.iterate_episodes())
    H = len(episodes) // episodes_per_history
    if H == 0:
        raise UserError(f"Minari dataset {dataset}: {len(episodes)} episodes, fewer than "
                        f"episodes_per_history={episodes_per_history}")
    histories = []
    for h in range(H):
        group = episodes[h * episodes_per_history:(h + 1) * episodes_per_history]
        # each episode: T_e + 1 observations; Discrete spaces may start at a value other than 0
        obs = [np.asarray(e.observations) - getattr(obs_space, "start", 0) for e in group]
        histories.append({
            "observations": np.concatenate([o[:-1] for o in obs]),
            "next_observations": np.concatenate([o[1:] for o in obs]),
            "actions": np.concatenate([np.asarray(e.actions) - act_space.start for e in group]),
            "rewards": np.concatenate([np.asarray(e.rewards, dtype=np.float64) for e in group]),
            "terminations": np.concatenate([np.asarray(e.terminations, dtype=bool) for e in group]),
            "truncations": np.concatenate([np.asarray(e.truncations, dtype=bool) for e in group]),
        })
    T = max(len(x["actions"]) for x in histories)
    discrete = isinstance(obs_space, spaces.Discrete)
    grid = {}
    for name in ("observations", "next_observations", "actions", "rewards", "terminations", "truncations"):
        rows = [x[name].reshape(len(x["actions"]), -1) if name.endswith("observations") and not discrete
                else x[name] for x in histories]
        out = np.zeros((H, T, *rows[0].shape[1:]), dtype=rows[0].dtype)
        for h, row in enumerate(rows):
            out[h, :len(row)] = row
        grid[name] = out
    lengths = np.array([len(x["actions"]) for x in histories])
    meta = {"source": "minari", "dataset_id": data.spec.dataset_id, "minari_version": minari.__version__,
            "episodes_per_history": episodes_per_history, "episodes_dropped": len(episodes) - H * episodes_per_history,
            "env_spec": json.loads(data.spec.env_spec.to_json()) if data.spec.env_spec is not None else None}
    return Episodes(**grid, valid=np.arange(T) < lengths[:, None], n_actions=int(act_space.n),
                    n_observations=int(obs_space.n) if discrete else None, meta=meta)
