"""Fan-out on dask.distributed (icrl_interp/core/cluster.py, `icrl-interp sweep`, reports on a cluster).

One real LocalCluster of 2 worker processes is shared by the module. The sweep and report tests
reach it as an existing cluster (`--scheduler tcp://...`), so the test can kill its workers while
a sweep runs: the lost task runs again on a live worker, the trainer resumes the killed runs
from their last checkpoint, and the report's summary.json equals the serial path's byte for byte.
"""
from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from icrl_interp import cli
from icrl_interp.core.cluster import (
    Engine,
    Scheduler,
    TaskLost,
    choose_scheduler,
    engine_for,
    open_engine,
    parse_scheduler,
)
from icrl_interp.core.errors import UserError

GRID = """
family = "linear-td"
seeds = [0, 1]

[base]
d = 2
n_states = 4
n = 6
n_layers = 2
windows = 4
trajectories_per_task = 1
tasks_per_step = 2
eval_tasks = 4
steps = 12
checkpoint_every = 6
log_every = 6

[grid]
lr = [0.01, 0.003]

[report]
max_recordings = 0
live_tasks = 16
"""
"""4 tiny linear-td runs (2 learning rates x 2 seeds) of 12 steps, a checkpoint every 6: 8 report inputs, each
also analyzed live on 16 prompts (the default 256 adds time, not code)."""


# ------------------------------------------------------------------ parsing (no cluster)
@pytest.mark.parametrize("text, want", [
    ("serial", Scheduler("serial")),
    ("local:3", Scheduler("local", 3)),
    (" local:1 ", Scheduler("local", 1)),
    ("tcp://10.0.0.5:8786", Scheduler("address", 0, "tcp://10.0.0.5:8786")),
    ("tcp://[::1]:8786", Scheduler("address", 0, "tcp://[::1]:8786")),
])
def test_scheduler_strings_parse(text, want):
    assert parse_scheduler(text) == want


def test_bare_local_uses_the_cpus_up_to_four():
    assert parse_scheduler("local") == Scheduler("local", max(1, min(4, os.cpu_count() or 1)))


@pytest.mark.parametrize("text, fragment", [
    ("local:0", "positive integer"), ("local:two", "positive integer"), ("local:-1", "positive integer"),
    ("dask", "is not a scheduler"), ("", "is not a scheduler"), ("tcp://host", "tcp://HOST:PORT"),
    ("tcp://host:0", "port in 1..65535"), ("tcp://host:70000", "port in 1..65535"), ("local4", "is not a scheduler"),
])
def test_bad_scheduler_strings_are_one_line_errors(text, fragment):
    with pytest.raises(UserError, match=fragment.replace(".", r"\.").replace("(", r"\(")) as e:
        parse_scheduler(text)
    assert "\n" not in str(e.value)


def test_default_is_serial_for_one_task_or_one_worker_else_a_local_cluster():
    assert choose_scheduler(None, 1, 4) == Scheduler("serial")
    assert choose_scheduler(None, 5, 1) == Scheduler("serial")
    assert choose_scheduler(None, 5, 3) == Scheduler("local", 3)
    assert choose_scheduler(None, 2, 8) == Scheduler("local", 2)  # never more workers than tasks
    assert choose_scheduler("serial", 50, 8) == Scheduler("serial")  # what the user says wins
    with pytest.raises(UserError, match="--workers must be at least 1"):
        choose_scheduler(None, 5, 0)


def test_an_address_nobody_listens_on_is_a_one_line_error():
    import socket

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(UserError, match=f"tcp://127.0.0.1:{port}: cannot reach a Dask scheduler"):
        with open_engine(f"tcp://127.0.0.1:{port}"):
            pass


def test_serial_engine_runs_in_order_in_this_process():
    seen = []
    out = Engine().map(divmod, [(7, 2), (9, 4), (1, 5)], progress=False, on_result=lambda i, v: seen.append((i, v)))
    assert out == [(3, 1), (2, 1), (0, 1)] and seen == list(enumerate(out))


def test_serial_scheduler_does_not_import_dask():
    import subprocess
    import sys

    code = ("import sys; from icrl_interp.core.cluster import open_engine\n"
            "with open_engine('serial') as e: assert e.map(abs, [(-1,)], progress=False) == [1]\n"
            "from icrl_interp import cli; cli.build_parser()\n"
            "import icrl_interp.analyzers, icrl_interp.report\n"
            "assert 'distributed' not in sys.modules and 'dask' not in sys.modules, 'dask imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ------------------------------------------------------------------ a real LocalCluster
@pytest.fixture(scope="module")
def cluster():
    """A LocalCluster of 2 worker processes (open_engine's own setup) and its engine."""
    with open_engine("local:2", announce=None) as engine:
        yield engine


def _pid_and_square(x: int) -> tuple[int, int]:
    return os.getpid(), x * x


def _sleep_then(x: float) -> float:
    time.sleep(x)
    return x


def _die(_x) -> None:
    os._exit(1)  # the worker process dies with this task, every time


def test_cluster_map_keeps_input_order_and_the_owner_sees_each_result(cluster):
    owner, seen = os.getpid(), []
    out = cluster.map(_pid_and_square, [(i,) for i in range(6)], progress=False,
                      on_result=lambda i, v: seen.append((i, os.getpid())))
    assert [sq for _, sq in out] == [i * i for i in range(6)]
    assert {pid for pid, _ in out} <= set(cluster.worker_pids().values()) and owner not in {pid for pid, _ in out}
    assert sorted(seen) == [(i, owner) for i in range(6)]  # on_result runs here, in the owner
    assert "127.0.0.1" in cluster.dashboard or cluster.dashboard == ""


def test_a_killed_worker_loses_nothing(cluster):
    pids = cluster.worker_pids()
    threading.Timer(0.5, os.kill, (next(iter(pids.values())), signal.SIGKILL)).start()
    assert cluster.map(_sleep_then, [(1.0,)] * 4, progress=False) == [1.0] * 4
    _wait_for_workers(cluster, 2)
    assert set(cluster.worker_pids().values()) != set(pids.values())  # one was replaced


def test_a_task_whose_worker_always_dies_is_lost_not_hung(cluster):
    scheduler = cluster.client.cluster.scheduler
    allowed, scheduler.allowed_failures = scheduler.allowed_failures, 0  # one death is enough
    try:
        assert cluster.map(_die, [(0,)], progress=False, lost=lambda why: f"lost: {why}")[0].startswith("lost: ")
        _wait_for_workers(cluster, 2)
        with pytest.raises(TaskLost, match="worker died more often than the scheduler allows"):
            cluster.map(_die, [(0,)], progress=False)
    finally:
        scheduler.allowed_failures = allowed
        _wait_for_workers(cluster, 2)


def _wait_for_workers(engine, n: int, timeout: float = 240) -> None:
    """Until `n` workers are up: a worker restarted by its nanny after a kill imports torch and the package again,
    which took over 60 s on a slow shared machine with one BLAS thread (waiting longer passes nothing that fails)."""
    engine.client.wait_for_workers(n, timeout=timeout)


def test_engine_for_reuses_an_open_engine_and_skips_the_cluster_without_tasks(cluster):
    with engine_for(cluster, "local:9", 5) as e:
        assert e is cluster
    with engine_for(None, "local:9", 0) as e:
        assert not e.parallel


# ------------------------------------------------------------------ sweep + report on the cluster
def _sweep(tmp: Path, out: str, *extra: str) -> tuple[int, str]:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = cli.main(["sweep", str(tmp / "grid.toml"), "--out", str(tmp / out), "--no-progress", *extra])
    return code, buf.getvalue()


def _summary(tmp: Path, out: str) -> str:
    return (tmp / out / "report" / "summary.json").read_text().replace(str((tmp / out).resolve()), "OUT")


def _executing(dask_worker) -> list[str]:
    """The arguments of the tasks a worker is running (run on the worker by `client.run`)."""
    return [str(getattr(ts.run_spec, "args", "")) for ts in dask_worker.state.executing]


def _kill_worker_mid_run(engine, runs: Path, killed: list, done: threading.Event) -> None:
    """As soon as a run has its first checkpoint and no final metrics, SIGKILL the worker training it."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not done.is_set():
        for ck in runs.glob("*/checkpoints/step_000006/trainer_state.json"):
            run = ck.parents[2]
            if (run / "final_metrics.json").exists():
                continue
            busy = engine.client.run(_executing)
            pids = engine.worker_pids()
            victims = [pids[w] for w, args in busy.items() if any(run.name in a for a in args) and w in pids]
            if victims and not (run / "final_metrics.json").exists():
                os.kill(victims[0], signal.SIGKILL)
                killed.append(run.name)
                return
        time.sleep(0.005)


def test_sweep_on_a_cluster_survives_killed_workers_and_matches_serial(cluster, tmp_path, no_figures):
    """The three reports are compared by their summary.json, so their figures are not drawn (`no_figures`)."""
    (tmp_path / "grid.toml").write_text(GRID)
    code, serial_out = _sweep(tmp_path, "serial", "--scheduler", "serial")
    assert code == 0, serial_out
    assert serial_out.count(": trained") == 4

    killed, done = [], threading.Event()
    killer = threading.Thread(target=_kill_worker_mid_run, args=(cluster, tmp_path / "dask" / "runs", killed, done))
    killer.start()
    code, dask_out = _sweep(tmp_path, "dask", "--scheduler", cluster.client.scheduler_info()["address"])
    done.set()
    killer.join()
    assert code == 0, dask_out
    assert len(killed) == 1, "the worker was not killed mid-run"
    # the killed run went on from its last checkpoint on a live worker (6, or 12 when the kill landed in its
    # final evaluation); an uninterrupted run would say "trained"
    assert re.search(rf"^{re.escape(killed[0])}: resumed from step (6|12)$", dask_out, re.M), dask_out
    # byte for byte, paths aside: each run and analysis is the same computation, on a worker or here
    assert _summary(tmp_path, "dask") == _summary(tmp_path, "serial")
    assert json.loads((tmp_path / "dask" / "report" / "summary.json").read_text())["n_inputs"] == 8

    # nothing half-written at a final path: every step directory complete, every JSON whole
    for run in (tmp_path / "dask" / "runs").iterdir():
        steps = sorted(p.name for p in (run / "checkpoints").iterdir() if not p.name.startswith("."))
        assert steps == ["step_000006", "step_000012"]
        for step in steps:
            assert {p.name for p in (run / "checkpoints" / step).iterdir()} >= {"model.safetensors", "config.json",
                                                                                "trainer_state.json"}
        for f in [run / "config.json", run / "final_metrics.json"]:
            json.loads(f.read_text())
        lines = (run / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(x)["step"] for x in lines] == [6, 12]  # a resumed run's log has no repeated step

    # a re-run trains nothing and analyzes nothing; one live worker is enough for it (a nanny's restart of the
    # killed worker once hung past 240 s on a loaded machine, and the answer does not depend on the worker count)
    _wait_for_workers(cluster, 1)
    code, again = _sweep(tmp_path, "dask", "--scheduler", cluster.client.scheduler_info()["address"])
    assert code == 0
    assert again.count("finished before (reused)") == 4 and "(8 analyses from cache)" in again
    assert _summary(tmp_path, "dask") == _summary(tmp_path, "serial")


def test_report_analyses_on_the_cluster_match_serial_and_are_cached_by_the_owner(cluster, tmp_path):
    """The real analyzer on the shipped checkpoints (a control family included: its control run too)."""
    from icrl_interp.report.batch import collect_inputs, run_batch, write_summaries

    shipped = Path(__file__).resolve().parents[2] / "data" / "checkpoints"
    inputs = sorted(str(p) for p in shipped.iterdir() if (p / "config.json").is_file())
    assert len(inputs) >= 3
    from icrl_interp.report.control_eval import ControlSettings

    control = ControlSettings(mdps=2, iterations=5)
    serial = run_batch(collect_inputs(inputs), tmp_path / "a", scheduler="serial", progress=False, control=control)
    on_cluster = run_batch(collect_inputs(inputs), tmp_path / "b", engine=cluster, progress=False, control=control)
    write_summaries(serial, tmp_path / "a")
    write_summaries(on_cluster, tmp_path / "b")
    # exact: each analysis is the same computation, on a worker or here
    assert (tmp_path / "a" / "summary.json").read_bytes() == (tmp_path / "b" / "summary.json").read_bytes()
    assert all(r.status in ("ok", "partial") and not r.cached for r in on_cluster)
    assert any("control" in (r.analysis or {}) for r in on_cluster)
    # the owner cached every analysis as it arrived: a second batch analyzes nothing
    again = run_batch(collect_inputs(inputs), tmp_path / "b", engine=cluster, progress=False, control=control)
    assert all(r.cached for r in again)


# ------------------------------------------------------------------ workers that cannot run the tasks
def _side_cluster(n_workers: int, preload: list[str]):
    """A LocalCluster of its own (open_engine's settings), for a test that breaks its workers."""
    import logging

    from distributed import LocalCluster

    return LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                        scheduler_port=0, dashboard_address="127.0.0.1:0", silence_logs=logging.CRITICAL,
                        preload=preload)


def test_a_worker_whose_python_lacks_the_package_fails_the_command_at_once(tmp_path, capsys):
    """Such a worker cannot unpickle a task of the package: Dask would wait for it forever (distributed
    2026.8.0). The preload hides icrl_interp from the worker's Python, as a missing install does."""
    hide = tmp_path / "hide.py"
    hide.write_text("import sys\nsys.modules['icrl_interp'] = None  # this Python has no icrl_interp\n")
    (tmp_path / "grid.toml").write_text(GRID)
    with _side_cluster(1, [str(hide)]) as side:
        address = side.scheduler_address
        worker = next(iter(side.scheduler.workers))
        t0 = time.monotonic()
        with pytest.raises(UserError, match=rf"^--scheduler {address}: worker {worker} cannot import icrl_interp "):
            with open_engine(address, announce=None):
                pass
        assert time.monotonic() - t0 < 10
        code = cli.main(["sweep", str(tmp_path / "grid.toml"), "--out", str(tmp_path / "sw"), "--scheduler", address])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1 and f"worker {worker} cannot import icrl_interp" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.toml", "hide.py"]  # nothing written


def test_a_cluster_without_workers_fails_after_the_wait(monkeypatch):
    from icrl_interp.core import cluster as cluster_module

    monkeypatch.setattr(cluster_module, "WORKER_WAIT_S", 0.5)
    with _side_cluster(0, []) as side:
        t0 = time.monotonic()
        with pytest.raises(UserError, match="no Dask worker joined the cluster within 0.5 s"):
            with open_engine(side.scheduler_address, announce=None):
                pass
        assert time.monotonic() - t0 < 10


def test_a_worker_of_another_version_is_refused(cluster, monkeypatch):
    from icrl_interp import _version

    monkeypatch.setattr(_version, "__version__", "0.0.0-other")  # this process's version, as the check reads it
    with pytest.raises(UserError, match=r"worker tcp://\S+ runs icrl_interp \S+, this command 0.0.0-other; install"):
        with open_engine(cluster.client.scheduler_info()["address"], announce=None):
            pass
