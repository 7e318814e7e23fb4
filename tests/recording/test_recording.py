import h5py
import numpy as np
import pytest

from pathlib import Path

from icrl_interp.families import registry
from icrl_interp.core.errors import UserError
from icrl_interp.recording.format import (
    CHUNK_MAX,
    CHUNK_MIN,
    SCHEMA,
    SCHEMA_V1,
    Recording,
    RecordingWriter,
    bf16_to_float32,
    chunk_shape,
)

FORMAT_V1 = Path(__file__).resolve().parent.parent / "fixtures" / "format_v1"


@pytest.mark.parametrize("row, itemsize, batch", [((3,), 8, 4), ((65, 65), 4, 512), ((1, 65, 65), 4, 7),
                                                   ((2000, 2000), 4, 16), ((9,), 8, None), ((700, 200), 8, 3)])
def test_chunks_stay_between_10kib_and_1mib(row, itemsize, batch):
    chunk = chunk_shape(row, itemsize, batch)
    nbytes = int(np.prod(chunk)) * itemsize
    assert nbytes <= CHUNK_MAX
    assert nbytes >= min(CHUNK_MIN, int(np.prod(row)) * itemsize)
    if batch and chunk[1:] == row and CHUNK_MIN <= batch * int(np.prod(row)) * itemsize:
        assert batch % chunk[0] == 0 or chunk[0] * int(np.prod(row)) * itemsize >= CHUNK_MIN


def test_batch_aligned_chunks_are_written_whole(tmp_path):
    w = RecordingWriter(tmp_path / "a.h5", {"task_family": "", "batch_size": 64})
    data = np.arange(64 * 3 * 100, dtype=np.float64).reshape(3, 64, 100)
    for i in range(3):
        w.write_batch({"acts/x": data[i]})
    w.write_batch({"acts/x": data[0][:10]})  # a last, partial batch
    w.finish()
    with Recording(tmp_path / "a.h5") as r:
        np.testing.assert_array_equal(r.read("x"), np.concatenate([data[0], data[1], data[2], data[0][:10]]))  # copies
        assert r.n_prompts == 202
        assert [b["x"].shape[0] for b in r.iter_batches(batch_size=100)] == [100, 100, 2]


def test_bf16_decoding_is_exact():
    values = np.array([1.0, -2.5, 3.140625, 0.0], dtype=np.float32)
    raw = (values.view(np.uint32) >> 16).astype(np.uint16)
    np.testing.assert_array_equal(bf16_to_float32(raw), values)  # exact: bfloat16 is float32's upper half


def test_reader_refuses_foreign_incomplete_and_corrupt_files(tmp_path):
    (tmp_path / "text.h5").write_text("not hdf5")
    with pytest.raises(UserError, match="not an HDF5 file"):
        Recording(tmp_path / "text.h5")
    with h5py.File(tmp_path / "foreign.h5", "w") as f:
        f["x"] = np.zeros(3)
    with pytest.raises(UserError, match="not an icrl_interp recording"):
        Recording(tmp_path / "foreign.h5")
    w = RecordingWriter(tmp_path / "b.h5", {"task_family": "", "batch_size": 4})
    w.write_batch({"acts/x": np.zeros((4, 2))})
    w.close()
    with pytest.raises(UserError, match="incomplete"):
        Recording(tmp_path / "b.h5.partial")
    with Recording(tmp_path / "b.h5.partial", allow_incomplete=True) as r:
        assert r.n_prompts == 4
        with pytest.raises(UserError, match="no recorded hook 'y'"):
            r.read("y")
    with pytest.raises(UserError, match="no such recording"):
        Recording(tmp_path / "missing.h5")


def _tiny(path, meta):
    w = RecordingWriter(path, meta)
    w.write_batch({"acts/x": np.zeros((2, 3))})
    return w.finish()


def test_schema_2_keeps_task_and_model_apart(tmp_path):
    model = {"family": None, "architecture": None, "class": "HookedTransformer"}
    with Recording(_tiny(tmp_path / "a.h5", {"task_family": "softmax-td", "model": model})) as r:
        assert r.schema == SCHEMA and r.schema_version == 2
        assert r.task_family == "softmax-td" and r.family is None and r.model_info == model
        assert r.checkpoint_config is None
    with Recording(_tiny(tmp_path / "b.h5", {"task_family": ""})) as r:  # no task, no model attribute
        assert r.task_family is None and r.model_info == {"family": None, "architecture": None, "class": None}
    with Recording(_tiny(tmp_path / "c.h5", {"checkpoint_config": {"format_version": 2, "model": {}}})) as r:
        with pytest.raises(UserError, match="unreadable checkpoint_config"):
            r.checkpoint_config


@pytest.mark.parametrize("family", ["linear-td", "softmax-td", "sarsa", "actor-critic"])
def test_schema_1_recordings_still_read(family):
    """Files of icrl_interp 0.1: one `family` attribute for the task and the model, a format-1 config."""
    with Recording(FORMAT_V1 / f"rec-{family}.h5") as r:
        assert r.schema == SCHEMA_V1 and r.schema_version == 1 and r.n_prompts == 8
        assert r.task_family == family and r.family == family
        assert r.model_info == {"family": family, "architecture": registry.get(family).architecture, "class": None}
        config = r.checkpoint_config
        assert config.family == config.task.family == family and config.task.n == r.array("/prompts/z").shape[1] - 1
        assert r.layout.d_model == config.model.D
        assert set(r.group("theta_star")) == set(r.group("params"))


def test_schema_1_generic_means_no_family(tmp_path):
    w = RecordingWriter(tmp_path / "g.h5", {"schema": SCHEMA_V1, "family": "generic"})
    w.write_batch({"acts/x": np.zeros((2, 3))})
    with Recording(w.finish()) as r:
        assert r.schema_version == 1 and r.task_family is None
        assert r.model_info == {"family": None, "architecture": None, "class": None}


@pytest.mark.parametrize("row, itemsize, batch, chunk", [
    ((100,), 8, 64, (64, 100)),    # 800-byte rows: the largest divisor of the batch in [13, 1310] rows
    ((100,), 8, 12, (81, 100)),    # no divisor of 12 reaches 13 rows (10 KiB): 64 KiB of rows, unaligned
    ((10,), 8, None, (819, 10)),   # no batch size: 64 KiB of rows
    ((5,), 8, 4096, (4096, 5)),    # 40-byte rows: the whole batch fits the 1 MiB bound
    ((5,), 8, 2**17, (2**14, 5)),  # 2^17 rows would be 5 MiB: its largest divisor under 26214 rows is 2^14
    ((1000, 200), 8, 64, (1, 500, 200)),  # one 1.6 MB row: halved along its largest axis, one row a chunk
])
def test_chunk_shape_known_answers(row, itemsize, batch, chunk):
    """Exact integers: lo = ceil(10 KiB / row bytes), hi = floor(1 MiB / row bytes) rows per chunk."""
    assert chunk_shape(row, itemsize, batch) == chunk


def test_iter_batches_brings_the_extra_paths_row_for_row(tmp_path):
    w = RecordingWriter(tmp_path / "a.h5", {"task_family": "", "batch_size": 4})
    for i in range(3):
        w.write_batch({"acts/x": np.full((4, 2), float(i)), "prompts/z": np.arange(4.0) + 4 * i})
    w.finish()
    with Recording(tmp_path / "a.h5") as r:
        got = list(r.iter_batches(hooks=["x"], batch_size=5, extra=["/prompts/z"]))
    assert [sorted(b) for b in got] == [["/prompts/z", "x"]] * 3
    np.testing.assert_array_equal(np.concatenate([b["/prompts/z"] for b in got]), np.arange(12.0))  # copies
    assert [b["x"].shape[0] for b in got] == [5, 5, 2]


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_a_recording_is_read_without_hdf5s_chunk_cache_unless_compressed(tmp_path, compression):
    """Reading a selection through HDF5's chunk cache copies every chunk that fits through a buffer of its own: a
    recording with no compressed dataset is opened without it (rdcc_nbytes 0), one with a compressed dataset keeps
    it (a compressed chunk two reads share is decompressed once). The data read are the same either way."""
    w = RecordingWriter(tmp_path / "c.h5", {"task_family": "", "batch_size": 64})
    data = np.random.default_rng(0).standard_normal((2, 64, 50))
    for i in range(2):
        w.write_batch({"acts/x": data[i], "acts/y": data[i][:, :3]},
                      {"acts/x": {"compression": compression}} if i == 0 and compression else None)
    w.finish()
    with Recording(tmp_path / "c.h5") as r:
        assert (r.f["acts/x"].compression is not None) == (compression is not None)
        nbytes = r.f.id.get_access_plist().get_cache()[2]  # (metadata elements, slots, bytes, w0)
        assert (nbytes > 0) == (compression is not None)
        np.testing.assert_array_equal(r.f["acts/x"][10:100], np.concatenate(list(data))[10:100])
        np.testing.assert_array_equal(r.f["acts/y"][60:70], np.concatenate(list(data))[60:70, :3])
