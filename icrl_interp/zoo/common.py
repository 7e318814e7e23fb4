"""What the zoo's runners share (`run`, `calibration`, `episode_calibration`): reading the verdict's reported
parameters against the truth, and the one-thread block they judge and fit in. Kept below them, so that `run` can
run the calibration, which reads intervals with the same code, without an import circle."""
from __future__ import annotations

from contextlib import contextmanager

PARAM_NAMES = {"alpha": ("alpha",), "gamma": ("gamma", "gamma_prime", "discount"), "lambda": ("lambda", "lam"),
               "beta": ("beta",), "steps_per_layer": ("steps_per_layer",)}
"""A true parameter -> the names the verdict's `params` may report it under."""


def params_inside(truth: dict, reported) -> dict:
    """Per true parameter that the verdict reports with an interval: {value, ci, inside}."""
    out = {}
    if not isinstance(reported, dict):
        return out
    for key, value in truth.items():
        for name in PARAM_NAMES.get(key, (key,)):
            r = reported.get(name)
            ci = r.get("ci") if isinstance(r, dict) else None
            if isinstance(ci, (list, tuple)) and len(ci) == 2 and None not in ci:
                tol = 1e-9 * max(1.0, abs(value))  # a grid value printed and parsed back
                inside = bool(ci[0] - tol <= value <= ci[1] + tol)
                out[key] = {"value": r.get("value"), "ci": list(ci), "inside": inside}
                break
    return out


@contextmanager
def one_thread():
    """torch's intra-op pool and every BLAS / OpenMP pool at one thread (`ICRL_INTERP_THREADS` where set) inside the
    block, restored after. The zoo's models and candidate fits are many small operations: on the shared 2-core
    machine a teacher's forward pass of 128 prompts took 0.33 s of CPU with two torch threads, 0.013 s with one."""
    import torch
    from threadpoolctl import threadpool_limits

    from ..core import threads

    n = threads.override() or 1
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        with threadpool_limits(n):
            yield
    finally:
        torch.set_num_threads(before)
