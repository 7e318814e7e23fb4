"""The keys of the analysis JSON (`icrl_interp.analysis/1`, docs/formats.md "Analysis JSON"), in one place,
and tolerant reading of them.

The analyzers write these keys and every reader (the report, the `analyze` table, the verdict) reads
them by these names. The readers here never raise on a missing or malformed field: it reads as None
(or empty), so a report draws what an analysis holds and skips the rest. Nothing here imports torch.
"""
from __future__ import annotations

import math

GENERIC = "generic"
"""`family` of the analysis of a model of no registered family."""

# ------------------------------------------------------------------ where the sections sit
WEIGHTS = "weights"
"""The learned weights against θ* (`analysis.weights`)."""
ACTIVATIONS = "activations"
"""What the recorded (or live) activations give (`analysis.activations`; None for weights alone)."""
LAYERS = "layers"
"""`activations.layers`: one entry per layer."""
LAYER = "layer"
"""The layer index of a per-layer entry."""
SKIPPED = "skipped"
"""{key: why}: every analysis (or part of one) that did not run."""
SECTIONS = "sections"
"""{section: 'ok' | why}: the outcome of every registered analyzer."""

# ------------------------------------------------------------------ sections
POPULATION_KERNEL = "population_kernel"
"""`weights.population_kernel`: M_π per layer from a softmax score matrix."""
VALUE_ERROR = "value_error"
"""Per layer: the value read off the residual stream against v_π (also each readout lens's per layer)."""
REFERENCE_VALUE_ERROR = "reference_value_error"
"""Per layer: the reference algorithm's value error at the same depth."""
RANDOM_INIT_VALUE_ERROR = "random_init_value_error"
"""Per readout-lens layer: the same lens on the model at random initialization."""
CONVERGENCE = "convergence"
"""`activations.convergence`: the value error's convergence with depth."""
KERNEL_DIAGONALITY = "kernel_diagonality"
"""Per layer: the state-aggregated attention kernel's diagonal (softmax patterns)."""
LABEL_FREE_DIAGONAL = "label_free_diagonal"
"""Per layer: the kernel's diagonal mass without state labels."""
TD_PROBE = "td_probe"
"""Per layer: {hook: probe} of the TD-error probes."""
TD_PROBE_HOOK = "td_probe_hook"
"""Per layer: the hook of the headline probe."""
TD_PROBE_R2 = "td_probe_r2"
"""Per layer: held-out R² of the headline probe."""
TD_PROBE_SELECTIVITY = "td_probe_selectivity"
"""Per layer: the headline probe's R² minus its largest baseline."""
TD_PROBE_SELECTIVITY_CI = "td_probe_selectivity_ci"
"""Per layer: the selectivity's 95% interval over held-out tasks."""
WANG_METRICS = "wang_metrics"
"""`activations.wang_metrics`: VD, SS and IWS against batch TD."""
READOUTS = "readouts"
"""`activations.readouts`: a foreign model's value error through its lenses."""
CONTROL = "control"
"""`analysis.control`: the in-context control evaluation the report adds to a control family's checkpoint."""


# ------------------------------------------------------------------ tolerant reading
def num(x) -> float | None:
    """x as a finite float, else None (bools are not numbers here)."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def get(d, *keys):
    """d[k0][k1]...; None as soon as a level is missing or not a dict."""
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def layers(analysis) -> list[dict]:
    """The per-layer entries of an analysis, sorted by layer ([] when absent)."""
    rows = get(analysis, ACTIVATIONS, LAYERS)
    if not isinstance(rows, list):
        return []
    rows = [x for x in rows if isinstance(x, dict) and isinstance(x.get(LAYER), int)]
    return sorted(rows, key=lambda x: x[LAYER])


def last_layer(analysis, key: str) -> float | None:
    """The value of a per-layer metric at the last layer that has it (None: no layer has it)."""
    values = [num(x.get(key)) for x in layers(analysis) if num(x.get(key)) is not None]
    return values[-1] if values else None


def any_layer(analysis, *keys: str) -> bool:
    """Whether some layer holds one of `keys` (not None)."""
    return any(x.get(k) is not None for x in layers(analysis) for k in keys)
