"""May a command write here (`icrl_interp.core.outputs`, docs/integrity.md "What commands will and will not
overwrite"): each rule given the input it exists to refuse, beside the input it lets through. What is
the package's own (a JSON of its schema, not of another; a marked PNG / SVG; an HDF5 file of its
schema; a checkpoint directory of checkpoint files only, no links), where an output may not go (onto
or into an input, a missing parent, a link), and the size checks' arithmetic (`check_fits`' largest
value that fits, `human`).

Mutants caught (tests/mutation.py): the schema prefix test relaxed or an empty list accepted, a PNG mark
found after the image data, the link checks of `is_checkpoint_dir` removed, `_inside` comparing the
wrong way, the input checks of `_claim` removed, the culprit or the bisection of `check_fits` off by
one, the unit steps of `human`.
"""
from __future__ import annotations

import json
import math
import pickle
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import pytest

from icrl_interp.core import outputs
from icrl_interp.core.errors import UserError


def _refused(fn, *args, match: str, **kw) -> str:
    with pytest.raises(UserError, match=match) as info:
        fn(*args, **kw)
    assert "\n" not in str(info.value)
    return str(info.value)


# ------------------------------------------------------------------ what is ours
@pytest.mark.parametrize("payload, ours", [
    ({"schema": "icrl_interp.analysis/3"}, True),
    ([{"schema": "icrl_interp.analysis/3"}, {"schema": "icrl_interp.verdict/1"}], True),
    ({"schema": "other.analysis/1"}, False),                       # a JSON of another schema
    ({"schema": "icrl_interp_analysis/1"}, False),                 # the prefix includes the dot
    ({"schema": "xicrl_interp.analysis/1"}, False),                # a prefix, not a substring
    ({"kind": "analysis"}, False),                                 # no schema
    ({"schema": None}, False),
    ([{"schema": "icrl_interp.analysis/3"}, {"schema": "other/1"}], False),  # one foreign item
    ([], False),                                                   # an empty list names no schema
    ("icrl_interp.analysis/3", False),
])
def test_a_json_file_is_ours_only_with_the_package_schema(tmp_path, payload, ours):
    path = tmp_path / "a.json"
    path.write_text(json.dumps(payload))
    assert outputs.is_ours(path) is ours


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_a_pickle_is_never_ours(tmp_path, protocol):
    path = tmp_path / "a.json"
    path.write_bytes(pickle.dumps({"schema": "icrl_interp.analysis/3"}, protocol=protocol))
    assert not outputs.is_ours(path)


def _png(chunks: list[tuple[bytes, bytes]]) -> bytes:
    out = outputs.PNG_MAGIC
    for kind, data in chunks:
        out += struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return out


IHDR = (b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
MARK = (b"tEXt", outputs.PNG_MARK)


@pytest.mark.parametrize("chunks, ours", [
    ([IHDR, MARK, (b"IDAT", b"x"), (b"IEND", b"")], True),
    ([IHDR, (b"tEXt", b"Software\0matplotlib"), MARK, (b"IDAT", b"x")], True),   # not the first text chunk
    ([IHDR, (b"IDAT", b"x"), MARK, (b"IEND", b"")], False),                     # after the image data
    ([IHDR, (b"tEXt", b"icrl_interp\0other"), (b"IDAT", b"x")], False),          # the keyword, another value
    ([IHDR, (b"IDAT", b"x"), (b"IEND", b"")], False),
])
def test_a_png_is_ours_only_with_the_mark_before_its_image_data(tmp_path, chunks, ours):
    path = tmp_path / "f.png"
    path.write_bytes(_png(chunks))
    assert outputs.is_ours(path) is ours


def test_mark_png_adds_the_mark_right_after_the_header(tmp_path):
    path = tmp_path / "f.png"
    plain = _png([IHDR, (b"IDAT", b"x"), (b"IEND", b"")])
    path.write_bytes(plain)
    assert not outputs.is_ours(path)
    outputs.mark_png(path)
    assert path.read_bytes() == _png([IHDR, MARK, (b"IDAT", b"x"), (b"IEND", b"")])  # exact: bytes
    assert outputs.is_ours(path)
    path.write_bytes(b"GIF89a")
    _refused(outputs.mark_png, path, match="is not a PNG file")


@pytest.mark.parametrize("text, ours", [
    (f'<?xml version="1.0"?><svg>{outputs.SVG_MARK.decode()}</svg>', True),
    ('<?xml version="1.0"?><svg><dc:description>a drawing</dc:description></svg>', False),
])
def test_an_svg_is_ours_only_with_the_mark(tmp_path, text, ours):
    path = tmp_path / "f.svg"
    path.write_text(text)
    assert outputs.is_ours(path) is ours


@pytest.mark.parametrize("schema, ours", [("icrl_interp.recording/2", True), (b"icrl_interp.recording/2", True),
                                          ("other.recording/1", False), (None, False)])
def test_an_hdf5_file_is_ours_only_with_the_package_schema(tmp_path, schema, ours):
    path = tmp_path / "r.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.zeros(3)
        if schema is not None:
            f.attrs["schema"] = schema
    assert outputs.is_ours(path) is ours


def test_a_json_file_over_256_mib_is_not_read_so_not_ours(tmp_path):
    """Recognising a file must not read a huge one into memory: a JSON of our schema padded with
    whitespace (still valid JSON) to one byte past 256 MiB is not ours; at exactly 256 MiB it is."""
    head = json.dumps({"schema": "icrl_interp.analysis/3"}).encode()
    path = tmp_path / "big.json"
    with open(path, "wb") as f:
        f.write(head + b" " * (2**20 - len(head)))
        for _ in range(255):
            f.write(b" " * 2**20)
    assert outputs.is_ours(path)
    with open(path, "ab") as f:
        f.write(b" ")
    assert not outputs.is_ours(path)
    path.unlink()


def test_a_link_to_our_own_file_is_not_ours(tmp_path):
    real = tmp_path / "a.json"
    real.write_text(json.dumps({"schema": "icrl_interp.analysis/3"}))
    (tmp_path / "link.json").symlink_to(real)
    assert outputs.is_ours(real) and not outputs.is_ours(tmp_path / "link.json")


# ------------------------------------------------------------------ checkpoint directories and links
def _checkpoint(d: Path) -> Path:
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"format_version": 2}))
    (d / "model.safetensors").write_bytes(b"weights")
    return d


def test_a_checkpoint_directory_holds_checkpoint_files_only(tmp_path):
    ck = _checkpoint(tmp_path / "ck")
    assert outputs.is_checkpoint_dir(ck)
    (ck / "thesis.txt").write_text("mine")
    assert not outputs.is_checkpoint_dir(ck)
    (ck / "thesis.txt").unlink()
    (ck / "config.json").write_text(json.dumps({"format_version": "2"}))
    assert not outputs.is_checkpoint_dir(ck)  # a format_version that is not an integer
    (ck / "config.json").write_text(json.dumps([{"format_version": 2}]))
    assert not outputs.is_checkpoint_dir(ck)
    assert not outputs.is_checkpoint_dir(tmp_path / "missing") and not outputs.is_checkpoint_dir(ck / "config.json")
    (tmp_path / "empty").mkdir()
    assert not outputs.is_checkpoint_dir(tmp_path / "empty")


def test_exported_snapshots_are_part_of_a_checkpoint_but_only_of_checkpoints(tmp_path):
    ck = _checkpoint(tmp_path / "ck")
    snaps = ck / outputs.SNAPSHOTS
    _checkpoint(snaps / "step_10")
    assert outputs.is_checkpoint_dir(ck)
    assert not outputs.is_checkpoint_dir(ck, snapshots=False)  # a snapshot itself holds no snapshots
    (snaps / "notes.txt").write_text("mine")
    assert not outputs.is_checkpoint_dir(ck)
    (snaps / "notes.txt").unlink()
    (snaps / "step_10" / "notes.txt").write_text("mine")
    assert not outputs.is_checkpoint_dir(ck)
    (snaps / "step_10" / "notes.txt").unlink()
    _checkpoint(snaps / "step_20" / outputs.SNAPSHOTS / "step_1")  # snapshots of a snapshot: not an export
    (snaps / "step_20" / "config.json").write_text(json.dumps({"format_version": 2}))
    (snaps / "step_20" / "model.safetensors").write_bytes(b"w")
    assert not outputs.is_checkpoint_dir(ck)


def test_a_symlinked_config_is_read_but_its_directory_is_never_ours(tmp_path):
    """Decided: inputs are read through links (a checkpoint whose config.json links to a file elsewhere
    loads like any other), and a directory holding a link is not the package's, so `construct --force`
    never replaces it (nor, so, what the link points to)."""
    from icrl_interp.models import checkpoint
    from icrl_interp import cli

    assert cli.main(["construct", "linear-td", "--out", str(tmp_path / "ck")]) == 0
    ck = tmp_path / "ck"
    shared = tmp_path / "shared-config.json"
    (ck / "config.json").rename(shared)
    (ck / "config.json").symlink_to(shared)
    config, tensors = checkpoint.read(ck)  # resolved: read through the link
    assert config.family == "linear-td" and tensors
    assert not outputs.is_checkpoint_dir(ck)
    kept = shared.read_bytes()
    _refused(outputs.output_dir, ck, "--out", replaces=True, force=True,
             match="holds files that are not a checkpoint directory icrl-interp wrote")
    assert cli.main(["construct", "linear-td", "--out", str(ck), "--force"]) == 2
    assert (ck / "config.json").is_symlink() and shared.read_bytes() == kept


def test_a_snapshots_link_is_never_ours(tmp_path):
    ck = _checkpoint(tmp_path / "ck")
    elsewhere = tmp_path / "elsewhere"
    _checkpoint(elsewhere / "step_10")
    (ck / outputs.SNAPSHOTS).symlink_to(elsewhere)
    assert not outputs.is_checkpoint_dir(ck)
    (ck / outputs.SNAPSHOTS).unlink()
    (ck / outputs.SNAPSHOTS).mkdir()
    (ck / outputs.SNAPSHOTS / "step_10").symlink_to(elsewhere / "step_10")
    assert not outputs.is_checkpoint_dir(ck)


# ------------------------------------------------------------------ where an output may go
def test_an_output_that_is_a_link_is_refused_even_to_our_own_file(tmp_path):
    real = tmp_path / "a.json"
    real.write_text(json.dumps({"schema": "icrl_interp.analysis/3"}))
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert outputs.output_file(real, "--json") == real  # our own file: replaced
    _refused(outputs.output_file, link, "--json", match="--json .*link.json is a symbolic link")
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "nowhere.json")
    _refused(outputs.output_file, dangling, "--json", match="is a symbolic link")
    (tmp_path / "dirlink").symlink_to(_checkpoint(tmp_path / "ck"))
    _refused(outputs.output_dir, tmp_path / "dirlink", "--out", replaces=True, force=True, match="is a symbolic link")
    assert link.is_symlink() and real.exists() and dangling.is_symlink()


def test_output_file_replaces_only_our_own_files(tmp_path):
    ours, theirs = tmp_path / "ours.json", tmp_path / "theirs.json"
    ours.write_text(json.dumps({"schema": "icrl_interp.analysis/3"}))
    theirs.write_text(json.dumps({"schema": "other.analysis/1"}))
    assert outputs.output_file(ours, "--json") == ours
    assert outputs.output_file(tmp_path / "new.json", "--json") == tmp_path / "new.json"
    _refused(outputs.output_file, theirs, "--json", match="exists and was not written by icrl-interp")
    _refused(outputs.output_file, tmp_path, "--json", match="is a directory; give a file name")
    _refused(outputs.output_file, tmp_path / "x.txt", "--figure", suffixes=(".png",), match="unknown file suffix '.txt'")
    _refused(outputs.output_file, tmp_path / "x", "--figure", suffixes=(".png",), match=r"unknown file suffix '\(none\)'")
    assert outputs.output_file(tmp_path / "x.PNG", "--figure", suffixes=(".png",)) == tmp_path / "x.PNG"
    for empty in ("", "  ", None):
        _refused(outputs.output_file, empty, "--json", match="--json is empty; give a path")


def test_an_output_is_never_an_input_nor_inside_one(tmp_path):
    ck = _checkpoint(tmp_path / "ck")
    rec = tmp_path / "r.h5"
    rec.write_bytes(b"x")
    _refused(outputs.output_file, rec, "--json", inputs=[rec], match="is an input of this command")
    _refused(outputs.output_file, tmp_path / "." / "r.h5", "--json", inputs=[rec], match="is an input")  # resolved
    _refused(outputs.output_file, ck / "a.json", "--json", inputs=[ck], match="lies inside the input")
    run = tmp_path / "run"  # a run directory still to be made is an input too
    _refused(outputs.output_dir, run / "export", "--export", inputs=[run], match="lies inside the input")
    # a plain directory given as an input (a report's search root) may hold the output
    (tmp_path / "inputs").mkdir()
    assert outputs.output_file(tmp_path / "inputs" / "a.json", "--json", inputs=[tmp_path / "inputs"])
    # beside an input file is fine; inside a sibling with a common prefix is not "inside"
    assert outputs.output_file(tmp_path / "r.h5.json", "--json", inputs=[rec])
    (tmp_path / "ck2").mkdir()
    assert outputs.output_file(tmp_path / "ck2" / "a.json", "--json", inputs=[ck])
    # a directory replaced as a whole may not hold an input
    _refused(outputs.output_dir, tmp_path, "--out", inputs=[rec], replaces=True,
             match="would replace the directory holding the input")
    assert outputs.output_dir(tmp_path / "fresh", "--out", inputs=[rec]) == tmp_path / "fresh"
    # a directory written into (a report's, by default) may hold an input: nothing of it is replaced
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "r.h5").write_bytes(b"x")
    mine = lambda p: True  # noqa: E731 - the caller recognises the directory as its own
    assert outputs.output_dir(tmp_path / "d", "--out", inputs=[tmp_path / "d" / "r.h5"], owned=mine) == tmp_path / "d"
    _refused(outputs.output_dir, tmp_path / "d", "--out", inputs=[tmp_path / "d" / "r.h5"], owned=mine, replaces=True,
             match="would replace the directory holding the input")


def test_the_parent_must_exist_and_be_a_directory(tmp_path):
    _refused(outputs.output_file, tmp_path / "no" / "a.json", "--json", match="does not exist; create it first")
    (tmp_path / "f").write_text("x")
    _refused(outputs.output_file, tmp_path / "f" / "a.json", "--json", match="is not a directory")
    assert not (tmp_path / "no").exists()


def test_output_dir_rules(tmp_path):
    ck = _checkpoint(tmp_path / "ck")
    _refused(outputs.output_dir, ck, "--out", force=False, match="already exists; pass --force")
    assert outputs.output_dir(ck, "--out", force=True) == ck
    assert outputs.output_dir(ck, "--out") == ck  # force None: an owned directory is replaced freely
    (tmp_path / "empty").mkdir()
    assert outputs.output_dir(tmp_path / "empty", "--out", force=False) == tmp_path / "empty"
    (ck / "thesis.txt").write_text("mine")
    message = _refused(outputs.output_dir, ck, "--out", force=True, match="holds files that are not a checkpoint")
    assert "--force replaces only" in message
    assert "--force" not in _refused(outputs.output_dir, ck, "--out", match="holds files")
    _refused(outputs.output_dir, ck / "thesis.txt", "--out", match="is a file, not a directory")
    assert (ck / "thesis.txt").read_text() == "mine"


# ------------------------------------------------------------------ numbers
@dataclass
class _Options:
    steps: int = 3
    lr: float = 0.1
    scale: float = 1.0


@pytest.mark.parametrize("field, value", [("lr", math.nan), ("scale", math.inf), ("lr", -math.inf)])
def test_check_finite_names_the_flag(field, value):
    _refused(outputs.check_finite, _Options(**{field: value}), match=f"--{field} {value} must be a finite number")


def test_check_finite_lets_finite_options_through():
    outputs.check_finite(_Options(lr=1e308, scale=-0.0))


@pytest.mark.parametrize("n, text", [(0, "0 B"), (1023, "1.02e+03 B"), (1024, "1 KiB"), (1536, "1.5 KiB"),
                                     (5 * 2**20, "5 MiB"), (3 * 2**30, "3 GiB"), (2**40, "1 TiB"), (2**50, "1 PiB"),
                                     (2**60, "1 EiB"), (math.inf, f"{2.0 ** 840:.3g} EiB")])
def test_human(n, text):
    """Exact strings: the divisions are by powers of two (infinity is capped at 2^900 = 2^840 EiB)."""
    assert outputs.human(n) == text


def test_check_fits_names_the_culprit_and_the_largest_value_that_fits():
    """need = 8 a b bytes, a budget of 1000: --a 100 --b 10 needs 8000. Setting a to 1 leaves 80, b to 1
    leaves 800, so a is the culprit, and the largest a with 80 a <= 1000 is 12 (exact integers)."""
    estimate = lambda s: 8 * s["a"] * s["b"]  # noqa: E731
    message = _refused(outputs.check_fits, estimate, {"a": 100, "b": 10}, {"a": "--a", "b": "--b"}, "the job",
                       budget=1000, match="--a 100 needs ~7.81 KiB of memory for the job")
    assert message.endswith("this machine has 1e+03 B: at most --a 12 fits")
    outputs.check_fits(estimate, {"a": 12, "b": 10}, {"a": "--a", "b": "--b"}, "the job", budget=1000)  # 960 fits
    outputs.check_fits(estimate, {"a": 125, "b": 1}, {"a": "--a", "b": "--b"}, "the job", budget=1000)  # exactly
    # b is the culprit when it matters more; nothing fits when even 1 is too much
    message = _refused(outputs.check_fits, estimate, {"a": 10, "b": 100}, {"a": "--a", "b": "--b"}, "x",
                       budget=1000, match="--b 100")
    assert message.endswith("at most --b 12 fits")
    message = _refused(outputs.check_fits, lambda s: 10_000 * s["a"], {"a": 3}, {"a": "--a"}, "x", budget=1000,
                       match="--a 3")
    assert message.endswith("lower the other sizes too")


def test_check_disk_compares_with_the_free_space(tmp_path, monkeypatch):
    monkeypatch.setattr(outputs, "free_bytes", lambda path: 1000)
    outputs.check_disk(1000, tmp_path, "--tasks 5 would write")  # exactly the free space fits
    message = _refused(outputs.check_disk, 1001, tmp_path / "new" / "r.h5", "--tasks 6 would write",
                       match=r"--tasks 6 would write ~1e\+03 B \(free on /")
    assert message.endswith(": 1e+03 B)")


def test_memory_is_the_physical_memory_or_16_gib_where_the_platform_does_not_say(monkeypatch):
    import os

    assert outputs.memory_bytes() == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def unknown(name):
        raise ValueError(name)

    monkeypatch.setattr(os, "sysconf", unknown)
    assert outputs.memory_bytes() == 16 * 2**30


def test_the_mount_point_of_a_path_on_another_filesystem_is_its_own():
    """/dev/shm is a filesystem of its own (tmpfs) where it exists: a path still to be made there is on
    it, not on the root filesystem (the walk up stops at the first existing folder, then at its mount)."""
    import os

    shm = Path("/dev/shm")
    if not os.path.ismount(shm):
        pytest.skip("no /dev/shm mount here")
    assert outputs._mount(shm / "not" / "yet" / "made.h5") == shm
    assert outputs._mount(Path("/")) == Path("/")


def test_the_disk_checked_is_that_of_the_nearest_existing_folder(tmp_path):
    """A path still to be made is on the filesystem of its nearest existing ancestor (its mount point)."""
    import os

    m = outputs._mount(tmp_path / "not" / "yet" / "made.h5")
    assert os.path.ismount(m) and (m == tmp_path or m in tmp_path.parents)
    assert m.stat().st_dev == tmp_path.stat().st_dev
