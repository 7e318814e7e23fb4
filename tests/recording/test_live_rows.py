"""A live recording's datasets index like the recorded file's (icrl_interp/recording/live.py `LiveDataset` against
h5py under `recording.Recording`): negative rows count from the end, in a single index, a slice and a
list of rows; rows past either end are an IndexError, never another row; a second index picks within
the row. Exact comparisons: the live rows are the same forward passes on the same batches.

Mutants caught (tests/mutation.py): the negative-index shift removed or flipped (`first < 0` ->
`first <= 0`, `+ n` -> `- n`), the range checks relaxed (`<` -> `<=`), the squeeze of a single row.
"""
from __future__ import annotations

import numpy as np
import pytest

from helpers import theta_star_setup

from icrl_interp.recording import recorder
from icrl_interp.recording.live import open_live
from icrl_interp.recording.format import Recording

N, BATCH = 20, 8  # three batches, the last one short


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(model, spec, a fresh prompt source of the run, its recorded file)."""
    model, cfg, spec = theta_star_setup(6)
    source = lambda: recorder.PromptSource(config=cfg, n_total=N, seed=2)  # noqa: E731
    out = tmp_path_factory.mktemp("live") / "r.h5"
    recorder.record(model, out, spec, source(), batch_size=BATCH, progress=False)
    return model, spec, source, out


@pytest.fixture(scope="module")
def both(run):
    """(recorded file, live recording) of the same prompts; the live one is open for the module."""
    model, spec, source, out = run
    with Recording(out) as rec, open_live(model, spec, source(), batch_size=BATCH) as live:
        yield rec, live


def test_the_first_batch_read_after_a_later_one_is_still_the_first(run):
    """Batch 0 comes from the run's check of its first batch, whose activations sit in buffers that
    batch 2 reuses: read after batch 2 it must still be batch 0 (it used to be batch 2's numbers)."""
    model, spec, source, out = run
    path = PATHS[0]
    with Recording(out) as rec, open_live(model, spec, source(), batch_size=BATCH) as live:
        np.testing.assert_array_equal(live.f[path][-1], rec.f[path][-1])  # batch 2 runs first
        np.testing.assert_array_equal(live.f[path][:BATCH], rec.f[path][:BATCH])  # exact: the same forward pass


PATHS = ("acts/blocks.1.hook_resid_post", "prompts/z")
KEYS = {"last": -1, "first-from-the-end": -N, "second-last": -2, "zero": 0, "last-by-count": N - 1,
        "tail": slice(-3, None), "all-but-two": slice(None, -2), "middle": slice(5, -5), "wide": slice(-100, 3),
        "empty": slice(-2, -5), "list-negative": [-1], "list-both": [0, -1], "list-two-from-end": [-9, -2],
        "row-and-position": (-1, 0), "rows-and-position": (slice(-4, None), 1)}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("key", KEYS)
def test_live_rows_index_like_the_recorded_file(both, path, key):
    rec, live = both
    want = np.asarray(rec.f[path][KEYS[key]])
    got = np.asarray(live.f[path][KEYS[key]])
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)  # exact: the same forward passes


@pytest.mark.parametrize("key", [N, -N - 1, [N], [-N - 1], [0, N]])
def test_rows_past_either_end_are_an_index_error(both, key):
    _, live = both
    with pytest.raises(IndexError, match="out of range for 20 prompts"):
        live.f["prompts/z"][key]


def test_the_readers_methods_agree_from_the_end(both):
    rec, live = both
    for r in (rec, live):
        assert r.n_prompts == N
    hook = PATHS[0].split("/", 1)[1]
    np.testing.assert_array_equal(live.read(hook, -3), rec.read(hook, -3))
    np.testing.assert_array_equal(live.array("/prompts/z", 2, -2), rec.array("/prompts/z", 2, -2))


def test_a_chunk_of_a_longer_run_is_held_once(run):
    """A read of activations of consecutive prompts over several batches (an analyzer's chunk) of a
    longer run copies them out, and the cached batches give that path up: the chunk is held once, not also in the cache
    (docs/analyzers.md, "Live analysis"). A later read computes them again, equal; a read of the whole
    run keeps them (its second pass finds them cached)."""
    model, spec, source, out = run
    path = PATHS[0]
    with Recording(out) as rec, open_live(model, spec, source(), batch_size=BATCH) as live:
        f = live.f
        np.testing.assert_array_equal(f[path][: 2 * BATCH], rec.f[path][: 2 * BATCH])  # exact: the same forward pass
        assert all(path not in f._full[b] for b in (0, 1)) and "prompts/z" in f._full[0]  # activations only
        before = f.forward_batches
        np.testing.assert_array_equal(f[path][: 2 * BATCH], rec.f[path][: 2 * BATCH])
        assert f.forward_batches == before + 2  # both batches ran again (counts: integers)
        np.testing.assert_array_equal(f[path][:N], rec.f[path][:N])
        assert all(path in data for data in f._full.values())
