"""The Episodes grid (icrl_interp.tasks.episodes): validation, derived columns, selection, the HDF5 file (round
trip, refusal of truncated / corrupt / foreign files, atomic writes) and the import of a local Minari dataset."""
from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from icrl_interp.core.errors import UserError
from icrl_interp.tasks.episodes import ARRAYS, SCHEMA, Episodes, from_minari, read_episodes, write_episodes

from helpers import raises_user


def grid(box: bool = False, seed: int = 0, H: int = 3, T: int = 7, **override) -> dict:
    """The constructor arguments of a small Episodes: the last history padded after 4 steps; Box observations if `box`."""
    rng = np.random.default_rng(seed)
    obs_shape = (H, T, 2) if box else (H, T)
    obs = rng.standard_normal(obs_shape).astype(np.float32) if box else rng.integers(0, 5, obs_shape)
    nxt = rng.standard_normal(obs_shape).astype(np.float32) if box else rng.integers(0, 5, obs_shape)
    valid = np.ones((H, T), bool)
    valid[-1, 4:] = False
    actions = rng.integers(0, 3, (H, T))
    actions[-1, 5] = -1  # padding may hold anything: only valid steps are checked
    u = rng.random((H, T))
    kw = dict(observations=obs, actions=actions, rewards=rng.standard_normal((H, T)), next_observations=nxt,
              terminations=u < 0.2, truncations=(u >= 0.2) & (u < 0.3), valid=valid, n_actions=3,
              n_observations=None if box else 5,
              meta={"env": "test", "tasks": [{"goal": [h, 0]} for h in range(H)], "nested": {"x": (1, 2)}})
    kw.update(override)
    return kw


def assert_same(a: Episodes, b: Episodes) -> None:
    for name in ARRAYS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        np.testing.assert_array_equal(x, y)  # exact: the file stores the bytes
    assert (a.n_actions, a.n_observations, a.meta) == (b.n_actions, b.n_observations, b.meta)


# ------------------------------------------------------------------ the grid
def test_arrays_get_the_documented_dtypes_and_meta_its_json_form():
    e = Episodes(**grid(actions=grid()["actions"].astype(np.int32)))
    assert e.actions.dtype == np.int64 and e.observations.dtype == np.int64 and e.rewards.dtype == np.float64
    assert e.valid.dtype == bool and e.meta["nested"] == {"x": [1, 2]}  # a tuple is a JSON list
    b = Episodes(**grid(box=True, observations=grid(box=True)["observations"].astype(np.float64)))
    assert b.observations.dtype == np.float32 and not b.discrete and (b.n_histories, b.n_steps) == (3, 7)


@pytest.mark.parametrize("change, words", [
    (dict(actions=np.full((3, 7), 3)), ("actions holds 3", "[0, 3)")),
    (dict(observations=np.full((3, 7), 5)), ("observations holds 5",)),
    (dict(next_observations=np.full((3, 7), -1)), ("next_observations holds -1",)),
    (dict(actions=np.zeros((3, 7)) + 0.5), ("actions must hold integers", "float64")),
    (dict(terminations=np.zeros((3, 7), np.int64)), ("terminations must hold booleans",)),
    (dict(rewards=np.zeros((3, 6))), ("rewards has shape (3, 6)", "[3, 7]")),
    (dict(observations=np.zeros((3, 7, 2), np.int64)), ("observations has shape",)),
    (dict(actions=np.zeros(7, np.int64)), ("actions must be [histories, steps]",)),
    (dict(valid=np.array([[True] * 7, [True, False, True, True, True, True, True], [True] * 7])),
     ("valid of history 1 is not a prefix",)),
    (dict(rewards=np.where(np.eye(3, 7, dtype=bool), np.nan, 0.0)), ("rewards holds NaN",)),
    (dict(n_actions=0), ("n_actions must be an integer >= 1",)),
    (dict(n_observations=0), ("n_observations must be an integer >= 1",)),
    (dict(meta={"bad": object()}), ("meta is not JSON",)),
])
def test_invalid_grids_are_refused_in_one_line_naming_the_problem(change, words):
    with raises_user(*words) as info:
        Episodes(**grid(**change))
    assert "\n" not in str(info.value)


def test_box_observations_must_be_three_dimensional_and_finite():
    with raises_user("observations has shape", "[H, T, obs_dim]"):
        Episodes(**grid(box=True, observations=np.zeros((3, 7), np.float32)))
    obs = grid(box=True)["observations"]
    obs[0, 0, 1] = np.inf
    with raises_user("observations holds NaN or infinite"):
        Episodes(**grid(box=True, observations=obs))


def test_episode_index_and_step_restart_after_every_end():
    kw = grid(H=2, T=6)
    term = np.zeros((2, 6), bool)
    trunc = np.zeros((2, 6), bool)
    term[0, 1], trunc[0, 4] = True, True  # ends at steps 1 (terminal) and 4 (time limit)
    trunc[1, 0], term[1, 2], trunc[1, 2] = True, True, True  # both flags on one step is one end
    e = Episodes(**{**kw, "terminations": term, "truncations": trunc, "valid": np.ones((2, 6), bool),
                    "actions": np.zeros((2, 6), np.int64)})
    np.testing.assert_array_equal(e.episode_index, [[0, 0, 1, 1, 1, 2], [0, 1, 1, 2, 2, 2]])
    np.testing.assert_array_equal(e.episode_step, [[0, 1, 0, 1, 2, 0], [0, 0, 1, 0, 1, 2]])
    np.testing.assert_array_equal(e.dones, term | trunc)


def test_select_keeps_rows_tasks_and_the_original_indices():
    e = Episodes(**grid())
    s = e.select([2, 0])
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(s, name), getattr(e, name)[[2, 0]])
    assert s.meta["tasks"] == [{"goal": [2, 0]}, {"goal": [0, 0]}] and s.meta["histories"] == [2, 0]
    assert s.select([1]).meta["histories"] == [0]  # indices into the first file, through two selections
    assert e.select(np.array([False, True, False])).meta["histories"] == [1]
    for bad in ([], [3], [[0]], [0.5]):
        with raises_user("select needs"):
            e.select(bad)


# ------------------------------------------------------------------ the file
@pytest.mark.parametrize("box", [False, True])
def test_the_file_round_trips_bit_exactly(tmp_path, box):
    e = Episodes(**grid(box=box))
    path = write_episodes(tmp_path / "e.h5", e)
    assert_same(read_episodes(path), e)
    with h5py.File(path) as f:
        assert f.attrs["schema"].decode() == SCHEMA and json.loads(f.attrs["meta"])["env"] == "test"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    from icrl_interp.tasks import episodes as module

    path = tmp_path / "e.h5"
    write_episodes(path, Episodes(**grid()))
    before = path.read_bytes()

    def boom(arr):
        raise RuntimeError("disk gone")

    monkeypatch.setattr(module, "_digest", boom)
    with pytest.raises(RuntimeError):
        write_episodes(path, Episodes(**grid(seed=1)))
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["e.h5"]


@pytest.fixture(scope="module")
def good_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("eps") / "good.h5"
    write_episodes(path, Episodes(**grid()))
    return path


@pytest.mark.parametrize("keep", [0.999, 0.5, 0.05])
def test_a_truncated_file_is_refused(good_file, tmp_path, keep):
    raw = good_file.read_bytes()
    bad = tmp_path / "cut.h5"
    bad.write_bytes(raw[:int(len(raw) * keep)])
    with raises_user(str(bad), "episodes file") as info:
        read_episodes(bad)
    assert "\n" not in str(info.value)


def test_a_flipped_byte_in_the_data_is_caught_by_its_digest(good_file, tmp_path):
    raw = bytearray(good_file.read_bytes())
    at = raw.find(Episodes(**grid()).rewards.tobytes())  # the rewards' bytes, stored contiguously
    assert at > 0
    raw[at + 3] ^= 0x10
    bad = tmp_path / "flip.h5"
    bad.write_bytes(bytes(raw))
    with raises_user(str(bad), "corrupt episodes file", "rewards does not match its SHA-256"):
        read_episodes(bad)


def flips_are_refused_or_harmless(good_file, tmp_path, stride: int) -> None:
    """A flip anywhere (metadata, attributes, data, free space) gives a UserError or the very same episodes."""
    raw = good_file.read_bytes()
    good = read_episodes(good_file)
    bad = tmp_path / "flip.h5"
    refused = 0
    for at in range(0, len(raw), stride):
        flipped = bytearray(raw)
        flipped[at] ^= 0x01
        bad.write_bytes(bytes(flipped))
        try:
            got = read_episodes(bad)
        except UserError as e:
            assert "\n" not in str(e) and str(bad) in str(e), (at, str(e))
            refused += 1
            continue
        assert_same(got, good)
    assert refused > 0.3 * len(range(0, len(raw), stride))  # most bytes matter


def test_flipped_bytes_are_refused_or_harmless(good_file, tmp_path):
    flips_are_refused_or_harmless(good_file, tmp_path, stride=97)  # a prime: lands on every kind of region


@pytest.mark.slow
def test_every_flipped_byte_is_refused_or_harmless(good_file, tmp_path):
    flips_are_refused_or_harmless(good_file, tmp_path, stride=1)


def test_foreign_files_are_refused(tmp_path):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f.attrs["schema"] = "icrl_interp.recording/2"
    with raises_user("not an episodes file", "icrl_interp.recording/2", SCHEMA):
        read_episodes(other)
    text = tmp_path / "text.h5"
    text.write_text("hello")
    with raises_user("not an episodes file", "not a readable HDF5 file"):
        read_episodes(text)
    with raises_user("no such episodes file"):
        read_episodes(tmp_path / "missing.h5")


# ------------------------------------------------------------------ Minari
def test_a_local_minari_dataset_becomes_histories_of_its_episodes(tmp_path, monkeypatch):
    minari = pytest.importorskip("minari")
    from minari.data_collector.episode_buffer import EpisodeBuffer

    import icrl_interp.tasks.environments  # noqa: F401  registers the env id the dataset names

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    lengths = [3, 2, 4, 1, 2]
    rng = np.random.default_rng(0)
    eps = [dict(obs=rng.integers(0, 9, n + 1), act=rng.integers(0, 5, n), rew=rng.random(n),
                term=np.arange(n) == n - 1, trunc=np.zeros(n, bool)) for n in lengths]
    eps[1]["term"], eps[1]["trunc"] = np.zeros(2, bool), np.array([False, True])  # one ends by its time limit
    buffers = [EpisodeBuffer(id=i, observations=list(e["obs"]), actions=list(e["act"]), rewards=list(e["rew"]),
                             terminations=list(e["term"]), truncations=list(e["trunc"]), infos={})
               for i, e in enumerate(eps)]
    with pytest.warns(UserWarning):  # minari asks for an author, a description, ...
        minari.create_dataset_from_buffers("test/dark-v0", buffers, env="icrl_interp/DarkRoom-v0",
                                           algorithm_name="random")
    got = from_minari("test/dark-v0", episodes_per_history=2)
    assert (got.n_histories, got.n_steps, got.n_actions, got.n_observations) == (2, 5, 5, 81)
    assert got.meta["episodes_dropped"] == 1 and got.meta["dataset_id"] == "test/dark-v0"
    for h in range(2):
        pair = eps[2 * h:2 * h + 2]
        n = sum(len(e["act"]) for e in pair)
        np.testing.assert_array_equal(got.observations[h, :n], np.concatenate([e["obs"][:-1] for e in pair]))
        np.testing.assert_array_equal(got.next_observations[h, :n], np.concatenate([e["obs"][1:] for e in pair]))
        np.testing.assert_array_equal(got.actions[h, :n], np.concatenate([e["act"] for e in pair]))
        np.testing.assert_array_equal(got.rewards[h, :n], np.concatenate([e["rew"] for e in pair]))  # exact: copied
        np.testing.assert_array_equal(got.terminations[h, :n], np.concatenate([e["term"] for e in pair]))
        np.testing.assert_array_equal(got.truncations[h, :n], np.concatenate([e["trunc"] for e in pair]))
        np.testing.assert_array_equal(got.valid[h], np.arange(5) < n)
    whole = from_minari(tmp_path / "test" / "dark-v0", episodes_per_history=5)  # by its directory
    assert whole.n_histories == 1 and whole.n_steps == sum(lengths) and whole.meta["episodes_dropped"] == 0
    with raises_user("test/none-v0", "not found locally"):
        from_minari("test/none-v0")
    with raises_user("fewer than episodes_per_history=6"):
        from_minari("test/dark-v0", episodes_per_history=6)
