"""Every integrity check of a sharded recording, given the bad input it exists for (docs/integrity.md,
docs/formats.md "Sharded recordings"): a master is never joined from a gap, a prefix, shards out of
order or shards of another run, and a reader refuses a master whose virtual datasets read a file it
does not list, or that lists no shards, or lists a path instead of a file name beside it. Each refusal
is one line, and a refused join leaves nothing behind.

Mutants caught (tests/mutation.py): the gap / prefix / agreement checks of `write_master` removed or
relaxed (`!=` -> `==`, `at += n` -> `at -= n`, the `shard` attribute left out of the agreement), the
stray-source and no-shards checks of `Recording._check_shards` removed.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import pytest

from icrl_interp.recording import shards
from icrl_interp.core.errors import UserError
from icrl_interp.recording.format import SHARDS, Recording
from icrl_interp.recording.integrity import seal

from .test_shards import _copy, _record, pair, setup  # noqa: F401 - the fixtures: a run of 5 batches in 3 shards


def _refused(match: str, fn, *args) -> str:
    with pytest.raises(UserError, match=match) as info:
        fn(*args)
    assert "\n" not in str(info.value)
    return str(info.value)


@pytest.fixture(scope="module")
def other_runs(setup, tmp_path_factory):  # noqa: F811 - the imported fixture
    """Shards of two other runs: the same split with another seed, and the same seed split in two."""
    d = tmp_path_factory.mktemp("others")
    _record(setup, d / "seed4.h5", seed=4, shards=3, workers=0)
    _record(setup, d / "two.h5", shards=2, workers=0)
    return shards.shard_paths(d / "seed4.h5", 3), shards.shard_paths(d / "two.h5", 2)


@pytest.mark.parametrize("case", ["gap", "prefix", "suffix", "repeat", "another-seed", "another-split"])
def test_a_master_is_never_joined_from_a_gap_a_prefix_or_another_run(pair, other_runs, tmp_path, case):  # noqa: F811
    _, parts = _copy(pair, tmp_path)  # shards of 8, 16 and 16 prompts (first prompts 0, 8, 24)
    seed4, two = other_runs
    shutil.copy2(seed4[1], tmp_path / "seed4-1.h5")
    shutil.copy2(two[1], tmp_path / "two-1.h5")
    chosen, words = {
        "gap": ([parts[0], parts[2]], "shard-2-of-3.h5 starts at prompt 24, expected 8"),
        "prefix": ([parts[0], parts[1]], "hold 24 prompts, the run has 40"),
        "suffix": ([parts[1], parts[2]], "shard-1-of-3.h5 starts at prompt 8, expected 0"),
        "repeat": ([parts[0], parts[1], parts[1], parts[2]], "shard-1-of-3.h5 starts at prompt 8, expected 24"),
        "another-seed": ([parts[0], tmp_path / "seed4-1.h5", parts[2]], "seed4-1.h5 was recorded with a different seed"),
        "another-split": ([parts[0], tmp_path / "two-1.h5"], "two-1.h5 was recorded with a different shard"),
    }[case]
    before = sorted(p.name for p in tmp_path.iterdir())
    out = tmp_path / "joined.h5"
    _refused(words, shards.write_master, out, chosen)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no master, no temporary


def test_the_whole_run_in_order_joins(pair, tmp_path):  # noqa: F811
    """The counterpart of the refusals above: the very same call on the right shards succeeds."""
    _, parts = _copy(pair, tmp_path)
    out = shards.write_master(tmp_path / "joined.h5", parts)
    with Recording(out) as rec:
        assert rec.n_prompts == 40 and [e["first_prompt"] for e in rec.attr(SHARDS)] == [0, 8, 24]


def _rewire(master: Path, source_of=lambda i, name: name, shards_attr=...) -> None:
    """Rebuild the master's per-prompt virtual dataset /prompts/z with shard i's rows read from
    `source_of(i, file)`, and/or replace its `shards` attribute; then seal it again (so only the check
    under test can object)."""
    with h5py.File(master, "r+") as f:
        ds = f["prompts/z"]
        sources = ds.virtual_sources()
        layout = h5py.VirtualLayout(shape=ds.shape, dtype=ds.dtype)
        attrs = dict(ds.attrs)
        for i, vs in enumerate(sources):
            with h5py.File(master.parent / vs.file_name, "r") as g:
                shape = g[vs.dset_name].shape
            start = vs.vspace.get_select_bounds()[0][0]
            layout[start : start + shape[0]] = h5py.VirtualSource(source_of(i, vs.file_name), vs.dset_name, shape=shape)
        del f["prompts/z"]
        f.create_virtual_dataset("prompts/z", layout)
        for k, v in attrs.items():
            f["prompts/z"].attrs[k] = v
        if shards_attr is None:
            del f.attrs[SHARDS]
        elif shards_attr is not ...:
            f.attrs[SHARDS] = shards_attr
    with h5py.File(master, "r+") as f:  # once HDF5 has written everything (closing writes the new heaps)
        seal(f)


def test_a_virtual_dataset_reading_a_file_the_master_does_not_list_is_refused(pair, tmp_path):  # noqa: F811
    master, parts = _copy(pair, tmp_path)
    _rewire(master)  # the same mapping rebuilt: still a good master (the helper itself changes nothing)
    Recording(master).close()
    shutil.copy2(parts[1], tmp_path / "stray.h5")  # the very same rows, in a file the master does not list
    _rewire(master, lambda i, name: "stray.h5" if i == 1 else name)
    _refused(r"virtual datasets read files that are not its shards: stray\.h5$", Recording, master)


def test_virtual_datasets_without_a_shards_list_are_refused(pair, tmp_path):  # noqa: F811
    master, parts = _copy(pair, tmp_path)
    _rewire(master, shards_attr=None)
    message = _refused("virtual datasets read other files .* but it lists no shards", Recording, master)
    assert all(p.name in message for p in parts)


@pytest.mark.parametrize("entry, words", [
    ({"file": "../x.h5"}, "a shard is not a file name beside it"),
    ({"file": ""}, "a shard is not a file name beside it"),
    ({"file": 7}, "a shard is not a file name beside it"),
    ({"bytes": ...}, "unreadable shards attribute"),
])
def test_a_shards_list_naming_something_other_than_a_file_beside_it_is_refused(pair, tmp_path, entry, words):  # noqa: F811
    import json

    master, _ = _copy(pair, tmp_path)
    with Recording(master) as rec:
        listed = rec.attr(SHARDS)
    first = {**listed[0], **entry}
    if entry.get("bytes") is ...:
        del first["bytes"]
    _rewire(master, shards_attr=json.dumps([first, *listed[1:]]))
    _refused(words, Recording, master)


def test_a_shards_attribute_that_is_not_a_list_is_refused(pair, tmp_path):  # noqa: F811
    master, _ = _copy(pair, tmp_path)
    _rewire(master, shards_attr='{"file": "x.h5"}')
    _refused("unreadable shards attribute", Recording, master)


def test_a_sharded_run_refuses_what_it_must_not_touch_naming_it(tmp_path):
    """Before any work (`shards.check_outputs`): an existing master, a shard or a .partial left by an
    earlier run without --resume (the message names the very file found), and a --resume with nothing
    to resume."""
    from icrl_interp.recording.format import partial_path

    out = tmp_path / "sh.h5"
    paths = shards.shard_paths(out, 3)
    assert shards.check_outputs(out, paths, resume=False) == ["new"] * 3
    _refused(r"nothing to resume: no shard of .*sh\.h5 \(sh\.shard-0-of-3\.h5, \.\.\.\) nor its \.partial exists",
             shards.check_outputs, out, paths, True)
    partial_path(paths[1]).write_bytes(b"")
    message = _refused("exists from an earlier run; pass --resume", shards.check_outputs, out, paths, False)
    assert message.startswith(f"{partial_path(paths[1])} exists")
    paths[2].write_bytes(b"")
    partial_path(paths[2]).write_bytes(b"")  # a finished shard beside a stale .partial: the shard is named
    partial_path(paths[1]).unlink()
    message = _refused("exists from an earlier run", shards.check_outputs, out, paths, False)
    assert message.startswith(f"{paths[2]} exists")
    assert shards.check_outputs(out, paths, resume=True) == ["new", "new", "done"]
    partial_path(paths[0]).write_bytes(b"")
    assert shards.check_outputs(out, paths, resume=True) == ["resume", "new", "done"]
    out.write_bytes(b"")
    _refused(r"sh\.h5 exists; remove it or choose another --out", shards.check_outputs, out, paths, True)
