"""The report's "Known answers" section: a zoo's confusion matrix (true algorithm x verdict).

A zoo (`icrl-interp zoo run --out DIR`) writes `DIR/zoo.json`, one row per model whose algorithm is known: its
true algorithm and the verdict (and causal conclusion) the toolkit gave it. A report whose inputs name such a
directory or file shows how often the verdict named the true algorithm, and how many wrong verdicts were
`clear`, before trusting its verdicts on models whose algorithm is not known. The rows are read defensively
(`row_of`): a field that is absent reads as '—'.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from html import escape
from pathlib import Path

ZOO_FILE = "zoo.json"
MAX_BYTES = 64 << 20
"""A zoo.json larger than this is not read."""


def _load(path: Path) -> dict | None:
    """A zoo document (a JSON object with a `rows` list), or None."""
    try:
        if path.stat().st_size > MAX_BYTES:
            return None
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("rows"), list) else None


def _zoo_file(raw) -> Path | None:
    p = Path(raw)
    path = p if p.name == ZOO_FILE else p / ZOO_FILE
    return path if path.is_file() and _load(path) is not None else None


def find(paths) -> list[tuple[Path, dict]]:
    """(path, document) of every zoo named by the inputs: a `zoo.json` file, or a directory holding one."""
    out = []
    for raw in paths:
        path = _zoo_file(raw)
        if path is not None and all(path != p for p, _ in out):
            out.append((path, _load(path)))
    return out


def without_zoos(paths) -> list:
    """The inputs other than zoos: a named zoo.json, or a directory whose only input is its zoo.json, is left
    out (the report's analysis would call it a broken causal JSON, or a folder holding nothing)."""
    from ..analyzers import inputs

    out = []
    for raw in paths:
        if _zoo_file(raw) is not None and (Path(raw).is_file() or all(
                f.kind == "missing" for f in inputs.discover([os.path.abspath(raw)], causal=True))):
            continue
        out.append(raw)
    return out


def _text(x) -> str:
    return str(x) if isinstance(x, (str, int, float)) and not isinstance(x, bool) and str(x) else "—"


def row_of(row: dict) -> dict:
    """{'truth', 'decoy', 'verdict', 'clear', 'right', 'causal'} of one zoo row: display strings, and whether it
    is a decoy, its verdict `clear`, and right: the row's own `score.right` when it has one (the zoo's count:
    named, with its parameters inside their intervals; `score.named_right` where a row has only that), else the
    label equals the true algorithm, or for a decoy is "none fits" or "reward regression ...")."""
    truth = row.get("truth")
    t = truth.get("algorithm") if isinstance(truth, dict) else truth if truth is not None else row.get("true_algorithm")
    decoy = (isinstance(truth, dict) and truth.get("decoy") is True) or row.get("kind") == "decoy" or \
        (isinstance(truth, dict) and truth.get("kind") == "decoy")
    v = row.get("verdict")
    if isinstance(v, dict):
        label = v.get("label") or (v.get("best") if v.get("fits") or "fits" not in v else None) or "none fits"
        clear = v.get("clear") is True
    else:
        label, clear = v, False
    c = row.get("causal")
    c = c.get("conclusion") if isinstance(c, dict) else c
    c = c.get("answer") if isinstance(c, dict) else c
    score = row.get("score") if isinstance(row.get("score"), dict) else {}
    right = next((score[k] for k in ("right", "named_right") if isinstance(score.get(k), bool)), None)
    out = {"truth": ("decoy: " if decoy else "") + _text(t), "decoy": decoy, "verdict": _text(label),
           "clear": clear, "causal": _text(c)}
    refused = out["verdict"] == "none fits" or out["verdict"].startswith("reward regression")
    out["right"] = right if right is not None else refused if decoy else _text(t) == out["verdict"]
    return out


def confusion(doc: dict) -> tuple[list[str], list[str], Counter, dict]:
    """(true algorithms, verdicts, counts {(truth, verdict): n}, totals) of a zoo document. Totals: models, right
    answers (`row_of`), clear wrong verdicts, decoys with a causal "yes"."""
    rows = [row_of(r) for r in doc["rows"] if isinstance(r, dict)]
    counts = Counter((r["truth"], r["verdict"]) for r in rows)
    truths = sorted({r["truth"] for r in rows})
    verdicts = sorted({r["verdict"] for r in rows})
    totals = {"models": len(rows), "right": sum(r["right"] for r in rows),
              "clear and wrong": sum(r["clear"] and not r["right"] for r in rows),
              "decoys with causal yes": sum(r["decoy"] and r["causal"] == "yes" for r in rows)}
    return truths, verdicts, counts, totals


def html_section(zoos: list[tuple[Path, dict]]) -> str:
    """One confusion matrix per zoo ('' without zoos)."""
    if not zoos:
        return ""
    out = ['<h2 id="known-answers">Known answers</h2>']
    for path, doc in zoos:
        truths, verdicts, counts, totals = confusion(doc)
        head = '<th class="l">true algorithm ↓ / verdict →</th>' + "".join(f"<th>{escape(v)}</th>" for v in verdicts)
        body = "".join(f'<tr><td class="l">{escape(t)}</td>' + "".join(
            f"<td>{counts[(t, v)] or ''}</td>" for v in verdicts) + "</tr>" for t in truths)
        out.append(f"<h3>{escape(str(path))}</h3>")
        out.append(f"<table class='confusion'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        out.append('<p class="caption">' + escape(", ".join(f"{k}: {v}" for k, v in totals.items()) +
                                                   calibration_text(doc)) +
                   ". Each cell counts the zoo's models of that true algorithm given that verdict; a good verdict puts "
                   "every model on the diagonal, every decoy under \"none fits\" or \"reward regression\", and makes no "
                   "clear wrong verdict.</p>")
    return "\n".join(out)


def text(zoos: list[tuple[Path, dict]]) -> str:
    """The zoos' totals for the terminal ('' without zoos)."""
    return "\n".join(f"known answers ({path}): " + ", ".join(f"{k} {v}" for k, v in confusion(doc)[3].items())
                     + calibration_text(doc) for path, doc in zoos)


def calibration_text(doc: dict) -> str:
    """'; interval coverage by simulation (...): C/N intervals cover the truth (x%, Wilson 95% [lo%, hi%])' of a
    zoo whose run checked its intervals' calibration (the full set's `calibration` block), else ''."""
    from .calibration import coverage_text

    cal = doc.get("calibration")
    try:
        return (f"; interval coverage by simulation ({int(cal['settings']['replicates'])} replicates per cell): "
                + coverage_text(cal["summary"]["overall"]))
    except (KeyError, TypeError, ValueError):  # no block (the default set, an older zoo), or a malformed one
        return ""
