"""Named kill points, for the tests that SIGKILL a command in a given phase and resume it.

`kill_point(name)` does nothing unless the environment variable `ICRL_INTERP_KILL_AT` equals
`name`; then it SIGKILLs its own process on the spot, as an out-of-memory killer or `kill -9`
would, with no `finally` block, atexit handler or flush running. The tests set the variable in a
forked child only (tests/train/test_sweep_kills.py, tests/recording/test_shard_kills.py); nobody sets
it in normal use. The points (each placed right after the first durable write of its phase):

    train.checkpoint   the trainer has written a checkpoint of an unfinished run
    report.analysis    a report has cached its first analysis
    report.figure      a report has written its first figure (its summary is written, its page is not)
    shards.publish     the master of a sharded recording is written to its temporary file, not renamed
"""
from __future__ import annotations

import os
import signal

ENV = "ICRL_INTERP_KILL_AT"


def kill_point(name: str) -> None:
    """SIGKILL this process when `ICRL_INTERP_KILL_AT` is `name` (test-only; see the module docstring)."""
    if os.environ.get(ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
