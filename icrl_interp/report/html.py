"""`index.html`: one self-contained page, no JavaScript, no network.

Figures are referenced relatively (`figures/<name>.png`, beside the page) or, with `embed=True`,
inlined as base64 data URIs so the page is a single file.
"""
from __future__ import annotations

import base64
from collections import Counter, defaultdict
from html import escape
from pathlib import Path

from .._version import __version__
from . import answers, known_answers
from .batch import Result
from .fields import control_of, get, label_of, num
from .figures import FigureInfo
from .headline import CAUSAL_COLUMNS, causal_headline, columns, formatted

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2em auto;max-width:1400px;
     padding:0 1em;color:#222;background:#fff}
h1{margin-bottom:.2em} h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;font-size:13px;margin:1em 0}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right;vertical-align:top}
th{background:#f3f3f3;position:sticky;top:0}
td.l,th.l{text-align:left} tr.failed td,tr.nothing-analyzed td{background:#fde8e8} tr.partial td{background:#fdf6e0}
.fig{margin:1.5em 0} .fig img{max-width:100%;height:auto;border:1px solid #eee}
.caption{color:#555;font-size:13px;max-width:60em} .err{color:#b00}
.muted{color:#777;font-size:13px} code{background:#f6f6f6;padding:0 3px}
nav a{margin-right:1em}
"""


def _img_src(report_dir: Path, rel: str, embed: bool) -> str:
    if not embed:
        return escape(rel, quote=True)
    data = (report_dir / rel).read_bytes()
    return "data:image/png;base64," + base64.b64encode(data).decode()


def _table(results: list[Result]) -> str:
    cols = columns()
    head = "".join(f'<th class="{"l" if i < 4 else ""}">{escape(h)}</th>' for i, (_, h, _) in enumerate(cols))
    body = []
    for r in results:
        cells = formatted(r)
        tds = "".join(f'<td class="{"l" if i < 4 else ""}">{escape(cells[k])}</td>' for i, (k, _, _) in enumerate(cols))
        title = escape(str(r.input.path), quote=True)
        status = r.status.replace(" ", "-")
        row = f'<tr class="{status}" title="{title}">{tds}</tr>'
        if r.status != "ok":  # failed, nothing analyzed: why; partial: what is missing
            why = r.error or r.reasons
            row += (f'<tr class="{"partial" if r.status == "partial" else "failed"}"><td class="l err" '
                    f'colspan="{len(cols)}">{escape(str(r.input.path))}: {escape(r.status)}: {escape(why)}</td></tr>')
        body.append(row)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _figure(info: FigureInfo, report_dir: Path, embed: bool) -> str:
    parts = [f'<div class="fig" id="{escape(info.key, quote=True)}"><h3>{escape(info.title)}</h3>']
    if info.error:
        parts.append(f'<p class="err">This figure could not be drawn: {escape(info.error)}</p>')
    pngs = [f for f in info.files if f.endswith(".png")]
    for rel in pngs:
        parts.append(f'<img src="{_img_src(report_dir, rel, embed)}" alt="{escape(info.title, quote=True)}">')
    svgs = [f for f in info.files if f.endswith(".svg")]
    if svgs and not embed:
        parts.append(" ".join(f'<a href="{escape(s, quote=True)}">SVG</a>' for s in svgs))
    parts.append(f'<p class="caption">{escape(info.caption)}</p></div>')
    return "".join(parts)


def _pm(stats) -> str:
    mean, std = num(get(stats, "mean")), num(get(stats, "std"))
    return "—" if mean is None else f"{mean:.3f} ± {std:.3f}" if std is not None else f"{mean:.3f}"


def _fmt(value, spec: str) -> str:
    return "—" if num(value) is None else format(num(value), spec)


CONTROL_HEADERS = ("input", "random", "teacher", "transformer", "oracle", "transformer − teacher",
                   "greedy agreement", "rel. param. distance (mean / max)", "note")


def _control_table(members: list[Result]) -> str:
    """Final-update returns (mean ± std over MDPs) and teacher tracking of every input with a control run."""
    rows = []
    for r in members:
        c = control_of(r)
        if c is None:
            continue
        ret, tr = c.get("returns"), c.get("tracking")
        agree, agree_min = num(get(tr, "greedy_agreement")), num(get(tr, "greedy_agreement_min"))
        cells = [label_of(r), _pm(get(ret, "random")), _pm(get(ret, "teacher")), _pm(get(ret, "transformer")),
                 _pm(get(ret, "oracle")), _pm(c.get("transformer_minus_teacher")),
                 "—" if agree is None else f"{100 * agree:.2f}% (min {_fmt(100 * agree_min if agree_min is not None else None, '.1f')}%)",
                 f"{_fmt(get(tr, 'rel_param_distance'), '.2e')} / {_fmt(get(tr, 'rel_param_distance_max'), '.2e')}",
                 str(c.get("error") or "")]
        tds = "".join(f'<td class="{"l" if i in (0, len(cells) - 1) else ""}{" err" if i == len(cells) - 1 else ""}">'
                      f"{escape(x)}</td>" for i, x in enumerate(cells))
        rows.append(f"<tr>{tds}</tr>")
    if not rows:
        return ""
    s = next((get(control_of(r), "settings") for r in members if get(control_of(r), "settings")), {}) or {}
    head = "".join(f'<th class="{"l" if i in (0, len(CONTROL_HEADERS) - 1) else ""}">{escape(h)}</th>'
                   for i, h in enumerate(CONTROL_HEADERS))
    return ('<div class="control"><h3>In-context control: numbers</h3>'
            f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
            f'<p class="caption">Exact discounted return at the final closed-loop update, mean ± std over '
            f"{escape(str(s.get('mdps', '?')))} held-out MDPs ({escape(str(s.get('iterations', '?')))} updates, seed "
            f"{escape(str(s.get('seed', '?')))}); greedy agreement: share of (state, update) pairs where the "
            "transformer's greedy action is a greedy action of the teacher's step on the same prompt; relative "
            "parameter distance ‖θ_tf − θ_teacher‖ / ‖θ_teacher‖ per update. Good: transformer ≈ teacher (θ*: "
            "equal, agreement 100 %, distance ~1e-16), both well above random and below the oracle.</p></div>")


def _not_computed(members: list[Result]) -> str:
    """What the analyses of these inputs did not compute, with why (their `sections` other than 'ok'), so
    that every '—' of the table and every missing figure is explained."""
    items = []
    for r in members:
        sections = get(r.analysis, "sections")
        missing = [(k, str(v)) for k, v in sections.items() if v != "ok"] if isinstance(sections, dict) else []
        if missing:
            why = "; ".join(f"<b>{escape(str(k))}</b>: {escape(v)}" for k, v in missing)
            items.append(f"<li>{escape(label_of(r))}: {why}</li>")
    if not items:
        return ""
    return ('<div class="sections"><h3>Not computed</h3><p class="caption">Analyses that do not apply to an input '
            "or lack what they need, and why (the analysis' <code>sections</code>; summary.csv columns "
            f"<code>sections.*</code>).</p><ul class=\"muted\">{''.join(items)}</ul></div>")


CAUSAL_ANCHOR = "causal-tests"


def _causal_section(rows: list[Result], figures: list[FigureInfo], report_dir: Path, embed: bool) -> str:
    """The causal JSON inputs: a table of their headline numbers, then their figures."""
    head = "".join(f'<th class="{"l" if i < 3 or k in ("exceeds", "notes") else ""}">{escape(h)}</th>'
                   for i, (k, h, _) in enumerate(CAUSAL_COLUMNS))
    body = []
    for r in rows:
        cells = causal_headline(r)
        tds = "".join(f'<td class="{"l" if i < 3 or k in ("exceeds", "notes") else ""}">{escape(cells[k])}</td>'
                      for i, (k, _, _) in enumerate(CAUSAL_COLUMNS))
        body.append(f'<tr class="{r.status.replace(" ", "-")}" title="{escape(str(r.input.path), quote=True)}">{tds}</tr>')
        if r.status != "ok":
            body.append(f'<tr class="{"partial" if r.status == "partial" else "failed"}"><td class="l err" '
                        f'colspan="{len(CAUSAL_COLUMNS)}">{escape(str(r.input.path))}: {escape(r.status)}: '
                        f"{escape(r.error or r.reasons)}</td></tr>")
    out = [f'<h2 id="{CAUSAL_ANCHOR}">Causal tests</h2>',
           f'<p class="muted">{len(rows)} causal JSON inputs (<code>icrl-interp causal --json</code>).</p>',
           f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>",
           '<p class="caption">Erasing the TD-error direction at one layer: mean ‖Δ output‖ over held-out tasks of the '
           "TD direction and of random directions (the control), their ratio and the paired Cohen d, each with its "
           "95% bootstrap interval over held-out tasks. With a random-init baseline: the excess (TD − random) of the "
           "trained model and of the same architecture at random initialization, and whether the trained model's "
           "interval lies above. Good: ratio above 1 with its interval, d above 0, and the excess above the random-init "
           "copy's. Every number: summary.csv columns <code>causal.*</code>.</p>"]
    drawn = [f for f in figures if f.section == "causal"]
    out += [_figure(info, report_dir, embed) for info in drawn]
    return "\n".join(out)


VERDICT_ANCHOR = "algorithm-verdicts"


def _verdict_section(rows: list[Result], figures: list[FigureInfo], report_dir: Path, embed: bool) -> str:
    """The verdict JSON inputs: per input its verdict table (`report.verdict.html_table`), then the figures."""
    from .verdict import html_table

    out = [f'<h2 id="{VERDICT_ANCHOR}">Algorithm verdicts</h2>',
           f'<p class="muted">{len(rows)} verdict JSON inputs (<code>icrl-interp verdict --json</code>).</p>']
    for r in rows:
        out.append(f"<h3>{escape(r.input.path.stem)} ({escape(r.family)})</h3>")
        if r.verdict is None or r.status != "ok":
            out.append(f'<p class="err">{escape(str(r.input.path))}: {escape(r.status)}: '
                       f"{escape(r.error or r.reasons)}</p>")
            continue
        out.append(html_table(r.verdict))
    out.append('<p class="caption">Per layer and for the model\'s output: the candidate algorithm with the largest held-out '
               "R² of the model's update (its step size and step fitted on training tasks), the runner-up and the "
               "paired margin with its 95% bootstrap interval over held-out tasks; \"none fits\" when no candidate "
               "beats the input baseline and R² 0.5. Probes' top: the candidate whose internal quantity the residual "
               "stream holds most selectively; causal top: the one whose erasure moves the output most above random "
               "directions (needs the model). Every number: summary.csv columns <code>verdict.*</code>.</p>")
    out += [_figure(info, report_dir, embed) for info in figures if info.section == "verdict"]
    return "\n".join(out)


def _anchor(family: str) -> str:
    return "family-" + "".join(c if c.isalnum() else "-" for c in family)


def render(results: list[Result], figures: list[FigureInfo], report_dir: Path, title: str = "icrl-interp report",
           embed: bool = False, zoos: list | None = None) -> str:
    """The page as a string (images must already be written when `embed` is true); `zoos`: the batch's
    known-answer zoos (`known_answers.find`), shown as confusion matrices."""
    report_dir = Path(report_dir)
    causal = [r for r in results if r.input.kind == "causal"]
    verdicts = [r for r in results if r.input.kind == "verdict"]
    analyses = [r for r in results if r.input.kind not in ("causal", "verdict")]
    families = sorted({r.family for r in analyses})
    counts = Counter((r.family, r.analyzed) for r in analyses)
    n_failed = sum(r.failed for r in results)
    n_partial = sum(r.status == "partial" for r in results)
    figs_by_family: dict[str, list[FigureInfo]] = defaultdict(list)
    for f in figures:
        if f.section == "family":
            figs_by_family[f.family].append(f)

    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(title)}</title>",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<style>{CSS}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        f'<p class="muted">{len(results)} inputs, {len(results) - n_failed} analyzed, {n_failed} failed'
        f'{f" ({n_partial} analyzed partially)" if n_partial else ""}. '
        f"icrl_interp {escape(__version__)}. Machine-readable: "
        '<a href="summary.json">summary.json</a>, <a href="summary.csv">summary.csv</a>.</p>',
        "<nav>" + "".join(f'<a href="#{_anchor(f)}">{escape(f)}</a>' for f in families)
        + (f'<a href="#{CAUSAL_ANCHOR}">causal tests</a>' if causal else "")
        + (f'<a href="#{VERDICT_ANCHOR}">algorithm verdicts</a>' if verdicts else "") + "</nav>",
        answers.html_section(results),  # the question the toolkit answers comes before any metric
        known_answers.html_section(zoos or []),
        "<h2>Overview</h2><table><thead><tr><th class=\"l\">family</th><th>inputs</th><th>analyzed</th><th>failed</th>"
        "</tr></thead><tbody>",
    ]
    for fam in families:
        ok, total = counts[(fam, True)], sum(v for (f, _), v in counts.items() if f == fam)
        out.append(f'<tr><td class="l"><a href="#{_anchor(fam)}">{escape(fam)}</a></td><td>{total}</td>'
                   f"<td>{ok}</td><td>{total - ok}</td></tr>")
    if causal:
        ok = sum(r.analyzed for r in causal)
        out.append(f'<tr><td class="l"><a href="#{CAUSAL_ANCHOR}">causal tests</a></td><td>{len(causal)}</td>'
                   f"<td>{ok}</td><td>{len(causal) - ok}</td></tr>")
    out.append("</tbody></table>")
    out.append(
        '<p class="caption">What good looks like: in-support energy 1, manifold relative error 0 and gauge '
        "cosine 1 (θ* up to the scale gauge), sign pattern <code>+,+,-</code> (R + γv′ − v), lazy drift 0, "
        "kernel-diagonality margin above 0 (every min_s M̂(s,s) above (1+γ)/2), a TD-probe selectivity whose "
        "95% interval lies above 0 (the probe's R² beats the prompt column alone, the random-init model and "
        "shuffled labels; a raw R² near 1 is not evidence: δ is mostly the reward, which is in the input), and "
        "small value error. Worst layer for the kernel; last layer for the probe and the value error. "
        "In-context control (sarsa / actor-critic checkpoints): the transformer's return equal to the teacher's.</p>"
    )
    out.append("<h2>All inputs</h2>")
    out.append(_table(results))
    for fam in families:
        members = [r for r in analyses if r.family == fam]
        out.append(f'<h2 id="{_anchor(fam)}">Family: {escape(fam)}</h2>')
        out.append(f'<p class="muted">{len(members)} inputs.</p>')
        drawn = figs_by_family.get(fam, [])
        if not drawn:
            out.append('<p class="muted">No figure: these inputs hold none of the fields the figures need.</p>')
        for info in drawn:
            out.append(_figure(info, report_dir, embed))
        out.append(_control_table(members))
        out.append(_not_computed(members))
    if causal:
        out.append(_causal_section(causal, figures, report_dir, embed))
    if verdicts:
        out.append(_verdict_section(verdicts, figures, report_dir, embed))
    out.append("</body></html>\n")
    return "\n".join(out)
