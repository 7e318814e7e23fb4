"""The recorder's writer thread (`recording.background`): errors reach the caller, the queue is bounded,
jobs run in order and none runs after a failed one; the recorder on top of it writes every batch's own
rows (three buffer sets under a slow disk), starts the disk's writeback as it goes, and the linear-attention families'
shipped specs record O(n) per prompt (`--full-patterns`: the [pos, pos] patterns)."""
import os
import threading
import time

import numpy as np
import pytest
import torch

from icrl_interp.models import checkpoint, theta_star_model
from icrl_interp.recording import background, format as fmt, probe_spec, recorder
from icrl_interp.recording.background import BackgroundWriter
from icrl_interp.recording.capture import hook_names, parameters
from icrl_interp.recording.format import Recording, partial_path


class Boom(RuntimeError):
    pass


def _fail():
    raise Boom("disk full")


def test_a_jobs_error_reaches_the_next_put_and_later_jobs_never_run():
    ran = []
    w = BackgroundWriter(depth=2)
    w.put(lambda: ran.append(0))
    w.put(_fail)
    w.stop()  # let the thread run everything queued, then look
    with pytest.raises(Boom, match="disk full"):
        w.put(lambda: ran.append(2))
    assert ran == [0]  # the job put after the failure never runs: /progress would vouch for a gap
    refused = []  # a refused put gives its slot back: the next put raises too, it does not wait forever

    def again():
        for _ in range(3):  # more puts than the depth
            try:
                w.put(lambda: ran.append(3))
            except Boom:
                refused.append(1)

    t = threading.Thread(target=again, daemon=True)
    t.start()
    t.join(5)
    assert refused == [1, 1, 1] and ran == [0]


def test_a_jobs_error_reaches_close_and_later_jobs_are_dropped():
    ran, gate = [], threading.Event()
    w = BackgroundWriter(depth=3)
    w.put(lambda: (gate.wait(), _fail()))
    w.put(lambda: ran.append(1))  # queued behind the failing job (depth 3: no wait)
    gate.set()
    with pytest.raises(Boom):
        w.close()
    assert ran == []


def test_the_context_manager_raises_the_writers_error_and_keeps_the_callers():
    with pytest.raises(Boom):
        with BackgroundWriter() as w:
            w.put(_fail)
    with pytest.raises(KeyError):  # the caller's own error wins over the writer's
        with BackgroundWriter() as w:
            w.put(_fail)
            time.sleep(0.05)
            raise KeyError("interrupted")


def test_jobs_run_in_order_in_one_other_thread():
    seen, threads = [], set()

    def job(i):
        def run():
            time.sleep(0.001 * (i % 3))  # uneven job times do not reorder them
            seen.append(i)
            threads.add(threading.get_ident())
        return run

    with BackgroundWriter(depth=3) as w:
        for i in range(30):
            w.put(job(i))
    assert seen == list(range(30))
    assert threads and threading.get_ident() not in threads


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_at_most_depth_jobs_are_pending(depth):
    """put blocks while `depth` jobs are queued or running: memory is bounded by the depth."""
    gate, put = threading.Event(), []
    w = BackgroundWriter(depth=depth)

    def producer():
        for i in range(depth + 3):
            w.put(gate.wait)
            put.append(i)

    t = threading.Thread(target=producer, daemon=True)
    t.start()
    time.sleep(0.2)  # ample time for an unbounded queue to take every job
    assert len(put) == depth  # exact count: the depth-th put returned, the next one waits for a slot
    gate.set()
    t.join(10)
    w.close()
    assert len(put) == depth + 3


def test_the_callers_exception_still_lets_the_queued_jobs_run():
    """Leaving the block by an exception of the caller (an interrupt while the next batch runs) writes the
    batches already handed over, in order, before the file is closed (a --resume keeps them)."""
    release, ran = threading.Event(), []

    def slow():
        release.wait()
        ran.append("slow")

    with pytest.raises(KeyboardInterrupt):
        with BackgroundWriter(depth=3) as w:
            w.put(slow)
            w.put(lambda: ran.append("queued"))
            threading.Timer(0.1, release.set).start()
            raise KeyboardInterrupt
    assert ran == ["slow", "queued"]


def test_depth_below_one_is_refused():
    with pytest.raises(ValueError):
        BackgroundWriter(depth=0)


# ------------------------------------------------------------------ the recorder on the writer thread
def _config(model, n=8):
    return checkpoint.make_config(model.config, {"task": {"kind": "boyan", "n": n, "n_states": 5},
                                                 "origin": model.origin})


def test_every_batch_is_written_from_its_own_buffers_under_a_slow_disk(tmp_path, monkeypatch):
    """The forward passes run ahead of a slow writer until the queue is full: each batch must still be
    written from its own buffer set, in order. Every row is compared with a forward pass of its own prompt
    (the same float32 kernels on the same inputs; rows of a swapped or overwritten batch differ by O(1))."""
    real = fmt.RecordingWriter.write_batch

    def slow(self, *a, **kw):
        time.sleep(0.02)
        return real(self, *a, **kw)

    monkeypatch.setattr(fmt.RecordingWriter, "write_batch", slow)
    model = theta_star_model("linear-td", d=3, n_layers=2, dtype="float32")
    spec = probe_spec.shipped_spec("linear-td")
    out = tmp_path / "r.h5"
    source = recorder.PromptSource(config=_config(model), n_total=36, seed=3)
    recorder.record(model, out, spec, source, batch_size=4, progress=False)
    with Recording(out) as rec:
        z = rec.array("/prompts/z")
        got = {h: rec.read(h) for h in rec.hooks()}
    _, cache = model.run_with_cache(torch.from_numpy(z).float(), names_filter=list(got))
    for h, rows in got.items():
        want = cache[h].numpy()
        scale = float(np.abs(want).max())
        np.testing.assert_allclose(rows, want, rtol=0, atol=64 * np.finfo(np.float32).eps * scale)


def test_the_recorder_keeps_depth_plus_one_buffer_sets(tmp_path):
    # the memory bound docs/formats.md ("Writing at disk speed") and budget.batch_bytes state: 2 queued + 1
    assert background.DEPTH == 2 and background.BUFFER_SETS == 3
    model = theta_star_model("linear-td", d=3, n_layers=1, dtype="float32")
    source = recorder.PromptSource(config=_config(model), n_total=12, seed=0)
    with recorder.prepare(model, probe_spec.shipped_spec("linear-td"), source, batch_size=4) as run:
        assert len(run.probe_sets) == background.BUFFER_SETS


def test_the_writer_sends_batches_to_the_disk_as_it_goes(tmp_path, monkeypatch):
    """Every SYNC_BYTES of batches the writer thread starts the file's writeback (`writeback.WriteBehind`), so
    the final fsync does not write the whole recording while nothing else runs."""
    synced, sizes = [], []
    real_sync, real_write = fmt.WriteBehind.__call__, fmt.RecordingWriter.write_batch

    def write(self, batches, *a, **kw):
        sizes.append(sum(v.nbytes for v in batches.values()))
        return real_write(self, batches, *a, **kw)

    def sync(self):
        synced.append(threading.get_ident())
        # the recording's own file: its partial file, or the scratch name it has until its first batch is written
        names = [p for p in (partial_path(out), *fmt.scratch_paths(out)) if p.exists()]
        assert os.fstat(self.fd).st_ino in {os.stat(p).st_ino for p in names}
        return real_sync(self)

    monkeypatch.setattr(fmt.WriteBehind, "__call__", sync)
    monkeypatch.setattr(fmt.RecordingWriter, "write_batch", write)
    model = theta_star_model("linear-td", d=3, n_layers=1, dtype="float32")
    for i, sync_bytes in enumerate((None, 1, 2)):  # measure a batch; then sync after every batch; every two
        if sync_bytes is not None:
            monkeypatch.setattr(fmt, "SYNC_BYTES", sync_bytes * sizes[0])
        synced.clear()
        source = recorder.PromptSource(config=_config(model), n_total=20, seed=0)
        out = tmp_path / f"r{i}.h5"
        recorder.record(model, out, probe_spec.shipped_spec("linear-td"), source, batch_size=4, progress=False)
        assert len(set(sizes)) == 1  # five equal batches (exact: byte counts)
        assert len(synced) == {None: 0, 1: 5, 2: 2}[sync_bytes]  # exact counts of calls
    assert threading.get_ident() not in synced  # from the writer thread, overlapping the forward passes


def test_a_nan_found_by_the_writer_thread_discards_the_new_file(tmp_path):
    """The finite check runs in the writer thread now: a NaN in the last batch (seen only when the writer
    closes) still reaches the caller as the one-line error and leaves neither the file nor a .partial."""
    from icrl_interp.core.errors import ModelFault

    model = theta_star_model("linear-td", d=3, n_layers=1, dtype="float32")
    source = recorder.PromptSource(config=_config(model), n_total=12, seed=0)
    calls = []

    def nan_in_batch_3(module, inputs, output):
        calls.append(1)
        return output * float("nan") if len(calls) == 3 else output

    handle = model.blocks[0].hook_resid_post.register_forward_hook(nan_in_batch_3)
    out = tmp_path / "r.h5"
    try:
        with pytest.raises(ModelFault, match="batch 3 of 3"):
            recorder.record(model, out, probe_spec.shipped_spec("linear-td"), source, batch_size=4, progress=False)
    finally:
        handle.remove()
    assert not out.exists() and not partial_path(out).exists()


# ------------------------------------------------------------------ O(n) per prompt by default
LINEAR = ["linear-td", "sarsa", "actor-critic"]


@pytest.mark.parametrize("family", LINEAR)
def test_linear_attention_specs_record_o_n_per_prompt(family):
    """No hook of a shipped linear-attention spec is [pos, pos]: a hook's per-prompt size is O(n) when
    every rule of a pattern or score hook keeps one query row, and linear-td hooks no pattern at all
    (hooking it makes the model materialise [pos, pos], the quadratic order)."""
    model = theta_star_model(family, d=6, n_layers=1, **({"m": 6} if family == "actor-critic" else {}))
    rules, _ = probe_spec.shipped_spec(family).resolve(hook_names(model), parameters(model))
    attention = [n for n in rules if n.endswith(probe_spec.PATTERN_HOOKS)]
    if family == "linear-td":
        assert attention == []
    for n in attention:
        sl = rules[n].position_slice()
        assert sl is not None and len(range(100)[sl]) == 1, n


def test_full_patterns_opt_in_records_pos_by_pos(tmp_path):
    """`record --full-patterns` (ProbeSpec.full_patterns) brings back the [pos, pos] pattern of every layer."""
    from icrl_interp.cli import main

    model = theta_star_model("linear-td", d=3, n_layers=2, dtype="float32")
    full = probe_spec.spec_for(model, full_patterns=True)
    rules, _ = full.resolve(hook_names(model), parameters(model))
    assert [n for n in rules if n.endswith(probe_spec.PATTERN_HOOKS)] == ["blocks.0.attn.hook_pattern",
                                                                           "blocks.1.attn.hook_pattern"]
    assert all(r.positions is None for r in probe_spec.shipped_spec("sarsa").full_patterns().hooks)
    ck = checkpoint.save(model, {"task": {"kind": "boyan", "n": 6, "n_states": 5}, "origin": model.origin},
                         tmp_path / "ck")
    out = tmp_path / "r.h5"
    assert main(["record", str(ck), "--out", str(out), "--tasks", "4", "--baseline", "none", "--no-progress",
                 "--full-patterns"]) == 0
    with Recording(out) as rec:
        assert rec.shape("blocks.1.attn.hook_pattern") == (4, 1, 7, 7)
