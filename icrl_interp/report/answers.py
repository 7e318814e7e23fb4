"""The report's first section: per model, the answer to the question the toolkit exists for.

Which RL algorithm does the model's forward pass run (the verdict: its best candidate or its label, the
fitted parameters with their 95 % intervals, whether it is `clear`), and does erasing that computation
change the output (the causal test's conclusion)? One row per model, before any metric.

A model is named by its JSON files: `NAME_verdict.json` / `NAME-verdict.json` / `NAME.verdict.json` and
`NAME_causal.json` (etc.) are one model, NAME (`model_name`); a file of another name is its own model.

The verdict and causal JSON are read defensively, newest keys first: the verdict's `label` and `params`
({name: {value, ci}}) when present, else `best` / "none fits" and the output's fitted
`hyperparameters` / `step` (with `hyperparameter_ci` / `step_ci` where recorded); the causal section's
`conclusion` ("yes" / "no" / "inconclusive", a string or {answer, reason}) with its reason when present, else
the random-init comparison's `exceeds_random_init` (marked as such: it is not the conclusion).
"""
from __future__ import annotations

import re
import textwrap
from html import escape

from ..analyzers.inputs import EPISODE_VERDICT_SCHEMAS as EPISODE_SCHEMAS
from .batch import Result
from .fields import get, num

SUFFIX = re.compile(r"[._-](verdict|causal)$")
"""What `model_name` strips from a JSON file's stem."""
COLUMNS = [("model", "model"), ("task", "task"), ("verdict", "verdict"),
           ("params", "fitted parameters [95% CI]"), ("margin", "margin over runner-up [95% CI; adjusted: "
                                                                 "for the comparisons made]"),
           ("clear", "clear"), ("causal", "causal conclusion")]
"""(key, header) of the answers table; `reason` and `verdict_text` go below each row."""
HOWTO = ("no verdict or causal JSON among the inputs: add `icrl-interp verdict SOURCE --json NAME_verdict.json` "
         "and `icrl-interp causal ... --json NAME_causal.json` to say which algorithm each model runs "
         "(docs/verdict.md, docs/causal.md)")


def model_name(r: Result) -> str:
    """The model a verdict or causal input is about: its file's stem without a `_verdict` / `_causal` suffix."""
    return SUFFIX.sub("", r.input.path.stem) or r.input.path.stem


def _interval(value, ci) -> str:
    v = num(value)
    if v is None:
        return "—"
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and num(ci[0]) is not None and num(ci[1]) is not None:
        return f"{v:.3g} [{num(ci[0]):.3g}, {num(ci[1]):.3g}]"
    return f"{v:.3g} (no interval)"


def verdict_params(doc: dict) -> dict[str, tuple]:
    """{name: (value, ci or None)} of the verdict's fitted parameters: `verdict.params` when present, else the
    output's fit of the best candidate (`hyperparameters` + `step`, their `*_ci` where recorded)."""
    v = doc.get("verdict") if isinstance(doc.get("verdict"), dict) else {}
    params = v.get("params")
    best = v.get("best")
    if not params and isinstance(best, str) and doc.get("schema") in EPISODE_SCHEMAS:  # fitted per rule, not in `verdict`
        params = get(doc, "candidates", best, "params")
    if isinstance(params, dict) and params:
        out = {}
        for name, p in params.items():
            out[str(name)] = (p.get("value"), p.get("ci")) if isinstance(p, dict) else (p, None)
        return out
    fit = get(doc, "output", "behaviour", best) if isinstance(best, str) else None
    if not isinstance(fit, dict):
        return {}
    hyper = fit.get("hyperparameters") if isinstance(fit.get("hyperparameters"), dict) else {}
    cis = fit.get("hyperparameter_ci") if isinstance(fit.get("hyperparameter_ci"), dict) else {}
    out = {str(k): (x, cis.get(k)) for k, x in hyper.items()}
    if fit.get("step") is not None:
        out["step"] = (fit["step"], fit.get("step_ci"))
    return out


def verdict_label(doc: dict) -> str:
    """The verdict's label ('reward regression (no bootstrapping)', ...) when given, else its best candidate, or
    'none fits'."""
    v = doc.get("verdict") if isinstance(doc.get("verdict"), dict) else {}
    if isinstance(v.get("label"), str) and v["label"]:
        return v["label"]
    if v.get("fits") and isinstance(v.get("best"), str):
        return v["best"]
    return "none fits"


def causal_conclusion(doc: dict) -> tuple[str, str]:
    """(answer, reason) of a causal document: `causal.conclusion` when present, else the random-init
    comparison, marked as that; ('—', why) when there is neither."""
    s = doc.get("causal") if isinstance(doc.get("causal"), dict) else {}
    layer = s.get("layer")
    at = f" (layer {layer})" if isinstance(layer, int) and not isinstance(layer, bool) else ""
    c = s.get("conclusion")
    if isinstance(c, dict):
        answer, reason = c.get("answer") or c.get("conclusion"), c.get("reason")
    else:
        answer, reason = c, s.get("conclusion_reason") or s.get("reason") or get(s, "conclusion_detail", "reason")
    if isinstance(answer, str) and answer:
        return answer + at, str(reason or "")
    exceeds = get(s, "baseline", "comparison", "exceeds_random_init")
    if isinstance(exceeds, str) and exceeds:
        head, _, rest = exceeds.partition(" (")
        return f"exceeds random init: {head}{at}", ("(" + rest if rest else "") + \
            " — no `conclusion` in this causal JSON (an older one): this is only the random-init comparison"
    return "—", "the causal JSON holds no conclusion and no random-init comparison"


def answers(results: list[Result]) -> list[dict]:
    """One row per model (in input order) with a verdict or causal input: display strings for `COLUMNS`,
    plus `reason` (the causal reason) and `verdict_text`."""
    rows: dict[str, dict] = {}
    for r in results:
        if r.input.kind not in ("verdict", "causal"):
            continue
        name = model_name(r)
        row = rows.setdefault(name, {"model": name, "task": "—", "verdict": "not run", "params": "—", "margin": "—",
                                     "clear": "—", "causal": "not run", "reason": "", "verdict_text": ""})
        if r.input.kind == "verdict":
            doc = r.verdict if isinstance(r.verdict, dict) else None
            if doc is None or not r.analyzed:
                row["verdict"] = f"{r.status}: {r.error or r.reasons}"
                continue
            v = doc["verdict"] if isinstance(doc.get("verdict"), dict) else {}
            row["task"] = str(get(doc, "task", "family") or ("episodes" if doc.get("schema") in EPISODE_SCHEMAS else "—"))
            row["verdict"] = verdict_label(doc)
            params = verdict_params(doc)
            row["params"] = ", ".join(f"{k} {_interval(*p)}" for k, p in params.items()) or "—"
            # the interval `clear` is decided on (corrected for the comparisons made); no margin when none fits
            if v.get("runner_up") and v.get("fits") is not False:
                adjusted = v.get("margin_ci_adjusted")
                ci = adjusted if isinstance(adjusted, list) else v.get("margin_ci")
                row["margin"] = (f"{_interval(v.get('margin'), ci)}{' adjusted' if ci is adjusted else ''} "
                                 f"over {v['runner_up']}")
            row["clear"] = "yes" if v.get("clear") is True else "no"
            row["verdict_text"] = str(v.get("text") or "")
        else:
            doc = r.causal if isinstance(r.causal, dict) else None
            if doc is None or not r.analyzed:
                row["causal"], row["reason"] = r.status, r.error or r.reasons
                continue
            if row["task"] == "—":
                row["task"] = str(get(doc, "causal", "task", "family") or "—")
            row["causal"], row["reason"] = causal_conclusion(doc)
    return list(rows.values())


def text(results: list[Result], width: int = 110) -> str:
    """The answers as plain text for the terminal ('' when the batch holds no verdict or causal input)."""
    rows = answers(results)
    if not rows:
        return ""
    lines = ["which algorithm each model runs (verdict: held-out behaviour R², docs/verdict.md; causal: docs/causal.md):"]
    for row in rows:
        lines.append(f"  {row['model']} ({row['task']}): {row['verdict']}"
                     + (" — clear" if row["clear"] == "yes" else "") + f"; causal: {row['causal']}")
        details = [f"fitted {row['params']}" if row["params"] != "—" else "",
                   f"margin {row['margin']}" if row["margin"] != "—" else "",
                   row["verdict_text"] if row["verdict"] == "none fits" else "", row["reason"]]
        for d in filter(None, details):
            lines += textwrap.wrap(d, width, initial_indent="      ", subsequent_indent="        ")
    return "\n".join(lines)


ANCHOR = "answers"


def html_section(results: list[Result]) -> str:
    """The page's first section: the answers table, or how to get one."""
    rows = answers(results)
    out = [f'<h2 id="{ANCHOR}">Which algorithm does each model run?</h2>']
    if not rows:
        return out[0] + f'<p class="muted">{escape(HOWTO)}.</p>'
    head = "".join(f'<th class="l">{escape(h)}</th>' for _, h in COLUMNS)
    body = []
    for row in rows:
        body.append("<tr>" + "".join(f'<td class="l">{escape(row[k])}</td>' for k, _ in COLUMNS) + "</tr>")
        notes = "; ".join(x for x in (row["verdict_text"], row["reason"] and f"causal: {row['reason']}") if x)
        if notes:
            body.append(f'<tr><td class="l muted" colspan="{len(COLUMNS)}">{escape(notes)}</td></tr>')
    out.append(f'<table class="answers"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>')
    out.append('<p class="caption">Per model (its verdict and causal JSON inputs, paired by file name: '
               "<code>NAME_verdict.json</code>, <code>NAME_causal.json</code>): the candidate algorithm whose output best "
               "explains the model's on held-out tasks, or \"none fits\" when none beats the input baseline; its fitted "
               "parameters with 95% intervals; the paired margin over the runner-up; <code>clear</code> only when that "
               "margin's interval lies above 0; and the causal test's conclusion at its layer with the reason. Details: "
               "the Algorithm verdicts and Causal tests sections below.</p>")
    return "\n".join(out)
