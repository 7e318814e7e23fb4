"""Where fan-out work runs: in this process, on a local Dask cluster, or on an existing one.

A `--scheduler` value (docs/cluster.md) is one of

    serial            every task in this process, one after the other
    local             a dask.distributed LocalCluster with one worker process per CPU (at most 4)
    local:N           a LocalCluster with N worker processes (one thread each)
    tcp://HOST:PORT   the scheduler of a running cluster (e.g. dask-jobqueue's SLURMCluster)

`open_engine(spec)` turns it into an `Engine`, whose `map(fn, args)` runs `fn(*a)` for every `a`,
shows one progress bar over all tasks as they finish, and returns the results in input order.
`on_result(i, value)` runs in *this* process as each result arrives: the owner of the outputs
writes them there (atomically), workers only compute and return plain data.

On connecting, every worker must import this version of icrl_interp (`check_workers`): a worker that
cannot would never run a task, and the client would wait forever.

Faults are Dask's business, not ours: a worker process that dies (killed, out of memory) takes its
tasks with it, its nanny starts a fresh worker and the scheduler runs the lost tasks again on a
live worker; a task lost `ALLOWED_FAILURES` + 1 times counts as failed (`TaskLost`). An exception
raised *inside* a task is not retried (it would fail the same way again): it reaches the caller.

dask is imported only when a cluster is used: `serial` never loads it.
"""
from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from .errors import UserError, one_line

ALLOWED_FAILURES = 3
"""How many times the scheduler of a LocalCluster re-runs a task whose worker died
(`distributed.scheduler.allowed-failures`; a remote cluster keeps its own setting)."""
DEFAULT_LOCAL_WORKERS = 4
"""Worker processes of a bare `local` (fewer on a machine with fewer CPUs)."""
CONNECT_TIMEOUT_S = 10
"""How long `tcp://...` waits for the scheduler before giving up."""
WORKER_WAIT_S = 20
"""How long a command waits for a cluster's first worker (a scheduler without workers runs nothing)."""
CHECK_TIMEOUT_S = 10
"""How long the workers get to answer the environment check (`check_workers`)."""
WORKER_PYTHON = "__import__('sys').executable"
WORKER_PACKAGE = "__import__('icrl_interp').__version__"
"""Expressions `check_workers` evaluates on every worker (with the builtin `eval`, which every worker
can unpickle: a function of this package could not be unpickled where the package is missing)."""
_LOCAL = re.compile(r"local(?::(\S*))?")
_ADDRESS = re.compile(r"(tcp|tls|ucx|inproc)://\S+")
_TCP = re.compile(r"tcp://(\[[^\]]+\]|[^:/\s]+):(\d{1,5})")


class TaskLost(RuntimeError):
    """A task whose workers kept dying (more than the scheduler's allowed failures)."""


@dataclass(frozen=True)
class Scheduler:
    """A parsed `--scheduler` value."""

    kind: str
    """'serial', 'local' or 'address'."""
    workers: int = 1
    """Worker processes of a local cluster (1 for serial; unknown, 0, for an address)."""
    address: str = ""
    """The scheduler address of kind 'address'."""

    def __str__(self) -> str:
        return {"serial": "serial", "local": f"local:{self.workers}"}.get(self.kind, self.address)


def parse_scheduler(text: str, flag: str = "--scheduler") -> Scheduler:
    """'serial' | 'local' | 'local:N' | 'tcp://HOST:PORT' -> Scheduler; anything else a one-line UserError."""
    value = str(text).strip()
    if value == "serial":
        return Scheduler("serial")
    m = _LOCAL.fullmatch(value)
    if m:
        if m.group(1) is None:
            return Scheduler("local", max(1, min(DEFAULT_LOCAL_WORKERS, os.cpu_count() or 1)))
        if not m.group(1).isdigit() or int(m.group(1)) < 1:
            raise UserError(f"{flag} {text}: the number of local workers must be a positive integer (e.g. local:4)")
        return Scheduler("local", int(m.group(1)))
    if _ADDRESS.fullmatch(value):
        tcp = _TCP.fullmatch(value)
        if value.startswith("tcp://") and not (tcp and 0 < int(tcp.group(2)) < 65536):
            raise UserError(f"{flag} {text}: a TCP scheduler address is tcp://HOST:PORT with a port in 1..65535")
        return Scheduler("address", 0, value)
    raise UserError(f"{flag} {text!r} is not a scheduler; use serial, local, local:N (N worker processes) "
                    "or the address of a running Dask scheduler, tcp://HOST:PORT")


def choose_scheduler(text: str | None, n_tasks: int, workers: int | None = None, flag: str = "--scheduler") -> Scheduler:
    """The scheduler given, else the default: serial for at most one task or one worker, otherwise a
    LocalCluster of `workers` processes (None: as many as `local` gives), never more than the tasks."""
    if text is not None:
        return parse_scheduler(text, flag)
    if workers is not None and workers < 1:
        raise UserError(f"--workers must be at least 1, got {workers}")
    local = parse_scheduler("local")
    n = min(workers or local.workers, n_tasks)
    return Scheduler("serial") if n <= 1 else Scheduler("local", n)


def _bar(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="task", disable=not enabled or total == 0, leave=False)


class Engine:
    """Runs tasks in this process (the serial engine); `DaskEngine` runs them on a cluster."""

    scheduler: Scheduler = Scheduler("serial")
    dashboard: str = ""
    """The Dask dashboard's address ('' without a cluster, or when the cluster serves none)."""

    @property
    def parallel(self) -> bool:
        return False

    def map(self, fn: Callable, args: Sequence[tuple], *, desc: str = "tasks", progress: bool = True,
            on_result: Callable[[int, object], None] | None = None,
            lost: Callable[[str], object] | None = None) -> list:
        """[fn(*a) for a in args], in input order; `on_result(i, value)` as each one finishes.

        A task lost with its workers more often than the scheduler allows becomes `lost(reason)`,
        or raises `TaskLost` when `lost` is None (only a cluster loses tasks)."""
        out = []
        with _bar(len(args), desc, progress) as bar:
            for i, a in enumerate(args):
                out.append(fn(*a))
                if on_result is not None:
                    on_result(i, out[-1])
                bar.update()
        return out


class DaskEngine(Engine):
    """Tasks on a dask.distributed cluster through `client`."""

    def __init__(self, client, scheduler: Scheduler):
        self.client = client
        self.scheduler = scheduler
        link = ""
        try:
            if "dashboard" in (client.scheduler_info().get("services") or {}):
                link = client.dashboard_link
        except Exception:  # noqa: BLE001 - no dashboard is no reason to fail the work
            link = ""
        self.dashboard = link

    @property
    def parallel(self) -> bool:
        return True

    def worker_pids(self) -> dict[str, int]:
        """{worker address: process id} of the live workers (what a fault test kills)."""
        return self.client.run(os.getpid)

    def map(self, fn, args, *, desc="tasks", progress=True, on_result=None, lost=None) -> list:
        from distributed import as_completed
        from distributed.scheduler import KilledWorker

        # pure=False: two equal argument lists are still two tasks (their results are not shared)
        futures = [self.client.submit(fn, *a, pure=False) for a in args]
        index = {f.key: i for i, f in enumerate(futures)}
        out: list = [None] * len(futures)
        try:
            with _bar(len(futures), desc, progress) as bar:
                for fut in as_completed(futures):
                    i = index[fut.key]
                    try:
                        out[i] = fut.result()
                    except KilledWorker as e:
                        why = f"its worker died more often than the scheduler allows ({one_line(e)})"
                        if lost is None:
                            raise TaskLost(f"task {i} ({desc}): {why}") from None
                        out[i] = lost(why)
                    if on_result is not None:
                        on_result(i, out[i])
                    bar.update()
        finally:
            for f in futures:  # on an error: do not leave the rest running for nobody
                f.cancel()
        return out


def _reachable(scheduler: Scheduler, flag: str) -> None:
    """Fail at once on a TCP address nothing listens on (Dask itself would retry for its whole timeout)."""
    import socket

    tcp = _TCP.fullmatch(scheduler.address)
    if tcp is None:
        return
    host, port = tcp.group(1).strip("[]"), int(tcp.group(2))
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise UserError(f"{flag} {scheduler.address}: cannot reach a Dask scheduler there "
                        f"({e.strerror or one_line(e)}); start one or check the address") from None


def _connect(scheduler: Scheduler, flag: str):
    """(client, cluster or None) for a parsed scheduler of kind 'local' or 'address'."""
    import logging

    import dask
    from distributed import Client, LocalCluster

    if scheduler.kind == "address":
        _reachable(scheduler, flag)
        try:
            return Client(scheduler.address, timeout=CONNECT_TIMEOUT_S), None
        except (OSError, TimeoutError) as e:
            raise UserError(f"{flag} {scheduler.address}: cannot reach a Dask scheduler there "
                            f"({one_line(e)}); start one or check the address") from None
        except ValueError as e:  # a malformed host:port
            raise UserError(f"{flag} {scheduler.address}: not a usable scheduler address ({one_line(e)})") from None
    # one thread per worker: the work is many small numpy / torch calls that do not share a GIL well;
    # the nanny already starts the workers with OMP_NUM_THREADS=1. Ports 0: any free ones (several
    # clusters may run on one machine).
    with dask.config.set({"distributed.scheduler.allowed-failures": ALLOWED_FAILURES}):
        cluster = LocalCluster(n_workers=scheduler.workers, threads_per_worker=1, processes=True,
                               host="127.0.0.1", scheduler_port=0, dashboard_address="127.0.0.1:0",
                               silence_logs=logging.ERROR)
    try:
        return Client(cluster), cluster
    except BaseException:
        cluster.close()
        raise


def check_workers(client, where: str) -> None:
    """Fail in one line unless the cluster has a worker within WORKER_WAIT_S and every worker imports
    this version of icrl_interp. A worker that cannot import a task's function cannot even unpickle
    the task, and the client then waits forever (distributed 2026.8.0); a cluster without workers
    waits forever too. Workers that join later are not checked."""
    from .._version import __version__

    try:
        client.wait_for_workers(1, timeout=WORKER_WAIT_S)
    except TimeoutError:
        raise UserError(f"{where}: no Dask worker joined the cluster within {WORKER_WAIT_S} s; start workers "
                        "(dask worker ADDRESS) or wait until they run, then try again") from None
    try:
        pythons = client.run(eval, WORKER_PYTHON, on_error="return", callback_timeout=CHECK_TIMEOUT_S)
        versions = client.run(eval, WORKER_PACKAGE, on_error="return", callback_timeout=CHECK_TIMEOUT_S)
    except TimeoutError:
        raise UserError(f"{where}: the Dask workers did not answer within {CHECK_TIMEOUT_S} s; "
                        "check that they are running") from None
    for worker, version in sorted(versions.items()):
        python = pythons.get(worker)
        python = f"Python {python}" if isinstance(python, str) else "its Python"
        if isinstance(version, BaseException):
            raise UserError(f"{where}: worker {worker} cannot import icrl_interp ({one_line(version)}); install "
                            f"icrl_interp {__version__} for {python}, as in this environment")
        if version != __version__:
            raise UserError(f"{where}: worker {worker} runs icrl_interp {version}, this command {__version__}; "
                            f"install the same version for {python}")


@contextmanager
def open_engine(spec: Scheduler | str | None = None, flag: str = "--scheduler",
                announce: Callable[[str], None] | None = lambda line: print(line, file=sys.stderr)) -> Iterator[Engine]:
    """The engine of a scheduler (None: serial), closed (and a local cluster shut down) on exit.

    `announce` gets one line naming the cluster and its dashboard address (None: silent)."""
    scheduler = spec if isinstance(spec, Scheduler) else parse_scheduler(spec or "serial", flag)
    if scheduler.kind == "serial":
        yield Engine()
        return
    client, cluster = _connect(scheduler, flag)
    try:
        check_workers(client, f"{flag} {scheduler}")
        engine = DaskEngine(client, scheduler)
        if announce is not None:
            n = len(client.scheduler_info().get("workers") or {})
            where = f"dashboard {engine.dashboard}" if engine.dashboard else "no dashboard (install bokeh for one)"
            announce(f"dask: {scheduler} with {n} worker{'s' * (n != 1)}; {where}")
        yield engine
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


@contextmanager
def engine_for(engine: Engine | None, scheduler: str | Scheduler | None, n_tasks: int, workers: int | None = None,
               flag: str = "--scheduler") -> Iterator[Engine]:
    """`engine` when the caller holds one open (e.g. a sweep's, shared by its training and its report),
    else a fresh one for `scheduler` (`choose_scheduler`'s default when None); serial without tasks."""
    if engine is not None:
        yield engine
        return
    if n_tasks == 0:
        yield Engine()
        return
    chosen = scheduler if isinstance(scheduler, Scheduler) else choose_scheduler(scheduler, n_tasks, workers, flag)
    with open_engine(chosen, flag) as opened:
        yield opened
