"""The report shows the TD probe as its selectivity with an interval (never raw R² as 'good'), keeps
the per-target and per-task tables out of summary.csv, and writes them to their own CSVs."""
from __future__ import annotations

import csv
import io
import json
import re

from analyzers.test_td_probe_honest import random_map, record, with_delta

from icrl_interp.report import ReportConfig, build_report, headline


def test_report_headline_is_the_selectivity_and_the_tables_go_per_target_and_task(tmp_path):
    root = tmp_path / "in"
    root.mkdir()
    record(root / "untrained.h5", random_map(1), baseline=random_map(2))
    record(root / "trained.h5", with_delta(1), baseline=random_map(2))
    out = build_report([root], tmp_path / "out", ReportConfig(workers=1, progress=False))
    by = {r.input.path.stem: r for r in out.results}
    cell = {k: headline.formatted(r)["td_probe_selectivity"] for k, r in by.items()}
    assert all(re.fullmatch(r"[+-]\d\.\d{3} \[[+-]\d\.\d{3}, [+-]\d\.\d{3}\]", c) for c in cell.values()), cell
    last = {k: r.analysis["activations"]["layers"][-1] for k, r in by.items()}
    assert abs(last["untrained"]["td_probe_selectivity"]) < 0.01 and last["untrained"]["td_probe_r2"] > 0.3
    assert last["trained"]["td_probe_selectivity_ci"][0] > 0.3
    assert "TD-probe R²" not in [h for _, h, _ in headline.columns()]
    assert "TD-probe R² near 1" not in (out.out_dir / "index.html").read_text()
    assert "probe sel." in headline.text_table(out.results)

    summary = json.loads((out.out_dir / "summary.json").read_text())
    keys = set().union(*(row.keys() for row in summary["rows"]))
    assert "activations.layers.3.td_probe_selectivity" in keys
    assert not any(".per_task" in k and ".td_probe." in k or ".targets." in k for k in keys)

    targets = list(csv.DictReader(io.StringIO((out.out_dir / "td_probes.csv").read_text())))
    assert len(targets) == 2 * 4 * 5  # inputs x layers x targets (delta_0 .. delta_4), one hook each
    primary = [t for t in targets if t["primary"] == "True"]
    assert len(primary) == 8 and {t["target"] for t in primary} == {f"td_error_{k}" for k in range(1, 5)}
    for t in primary:
        layer = by[t["input"].rsplit("/", 1)[1][:-3]].analysis["activations"]["layers"][int(t["layer"])]
        assert float(t["selectivity"]) == layer["td_probe_selectivity"]  # exact: copies (repr reads back exactly)
        assert [float(t["selectivity_lo"]), float(t["selectivity_hi"])] == layer["td_probe_selectivity_ci"]
    tasks = list(csv.DictReader(io.StringIO((out.out_dir / "td_probe_tasks.csv").read_text())))
    held = sum(layer["td_probe"][layer["td_probe_hook"]]["n_test_tasks"]
               for r in out.results for layer in r.analysis["activations"]["layers"])
    assert len(tasks) == held and all(t["sse"] and t["sst"] and t["sse_input"] for t in tasks)
