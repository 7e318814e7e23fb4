"""The TD probes in a report: the headline selectivity per layer, and the two tables the summary
leaves out (they would add thousands of columns to summary.csv):

* `td_probes.csv`: one row per (input, layer, hook, target): R^2, the three baselines, the
  selectivity and its interval, for every target the analyzer probed (delta_k at every reference
  step, values where recorded);
* `td_probe_tasks.csv`: one row per (input, layer, hook, held-out task id) of a probe's matching
  target: samples, sse, sst and R^2 within the task, and the baselines' sse (analyses include
  these only up to `--per-task-max` held-out tasks).

Missing or malformed fields read as absent (older analyses have no selectivity)."""
from __future__ import annotations

import csv
import io
from pathlib import Path

from ..analyzers.keys import LAYER, TD_PROBE, TD_PROBE_HOOK, TD_PROBE_SELECTIVITY, TD_PROBE_SELECTIVITY_CI
from ..core.files import write_atomic
from .batch import Result
from .fields import get, layers_of, num

TARGET_COLUMNS = ("input", "layer", "hook", "primary", "target", "r2", "r2_input", "r2_random_init", "r2_shuffled",
                  "selectivity", "selectivity_lo", "selectivity_hi", "max_baseline")
TASK_COLUMNS = ("input", "layer", "hook", "target", "task_id", "n_prompts", "n_samples", "sse", "sst", "r2",
                "sse_input", "sse_random_init")


def selectivity_values(r: Result) -> tuple[list[int], list[float], list[float | None], list[float | None]]:
    """(layers, selectivity, CI low, CI high) of each layer's primary probe (`td_probe_selectivity`)."""
    xs, ys, lo, hi = [], [], [], []
    for layer in layers_of(r):
        v = num(layer.get(TD_PROBE_SELECTIVITY))
        if v is None:
            continue
        ci = layer.get(TD_PROBE_SELECTIVITY_CI)
        ci = ci if isinstance(ci, list) and len(ci) == 2 else [None, None]
        xs.append(layer[LAYER])
        ys.append(v)
        lo.append(num(ci[0]))
        hi.append(num(ci[1]))
    return xs, ys, lo, hi


def _probes(r: Result):
    for layer in layers_of(r):
        probes = layer.get(TD_PROBE)
        for hook, p in (probes.items() if isinstance(probes, dict) else []):
            if isinstance(p, dict):
                yield layer, hook, p


def target_rows(results: list[Result]) -> list[dict]:
    rows = []
    for r in results:
        for layer, hook, p in _probes(r):
            targets = p.get("targets")
            for name, t in (targets.items() if isinstance(targets, dict) else []):
                if not isinstance(t, dict):
                    continue
                ci = t.get("selectivity_ci") if isinstance(t.get("selectivity_ci"), list) else [None, None]
                rows.append({"input": str(r.input.path), "layer": layer[LAYER], "hook": hook,
                             "primary": hook == layer.get(TD_PROBE_HOOK) and name == p.get("target"), "target": name,
                             **{k: num(t.get(k)) for k in ("r2", "r2_input", "r2_random_init", "r2_shuffled", "selectivity")},
                             "selectivity_lo": num(ci[0]) if len(ci) == 2 else None,
                             "selectivity_hi": num(ci[1]) if len(ci) == 2 else None,
                             "max_baseline": t.get("max_baseline") if isinstance(t.get("max_baseline"), str) else None})
    return rows


def task_rows(results: list[Result]) -> list[dict]:
    rows = []
    for r in results:
        for layer, hook, p in _probes(r):
            table = p.get("per_task")
            ids = get(table, "task_id")
            if not isinstance(ids, list):
                continue
            cols = {k: table.get(k) if isinstance(table.get(k), list) and len(table.get(k)) == len(ids) else None
                    for k in TASK_COLUMNS[5:]}
            for i, task in enumerate(ids):
                rows.append({"input": str(r.input.path), "layer": layer[LAYER], "hook": hook, "target": p.get("target"),
                             "task_id": task, **{k: (None if v is None else v[i]) for k, v in cols.items()}})
    return rows


def _csv(columns, rows) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row.get(k) is None else row[k] for k in columns})
    return buf.getvalue()


def write_tables(results: list[Result], out_dir) -> None:
    """`td_probes.csv` and `td_probe_tasks.csv` (header only when no input has probes)."""
    out_dir = Path(out_dir)
    write_atomic(out_dir / "td_probes.csv", _csv(TARGET_COLUMNS, target_rows(results)))
    write_atomic(out_dir / "td_probe_tasks.csv", _csv(TASK_COLUMNS, task_rows(results)))
