"""The family registry: the one place where a family name is turned into behaviour.

A *family* is one RL algorithm that a transformer's forward pass can run in context
(docs/concepts.md). Its home module owns everything about it and registers one
`Family` here:

* the **task**: the prompt layout, how tasks are drawn and prompts built, the float64
  reference algorithm run on a prompt, and the family's constants (step sizes, scales);
* the **construction**: which model `architecture` runs it, and theta* for that architecture;
* **hints** for the generic stages: how to read the algorithm's output off the residual
  stream, where the TD error should live, which weight blocks theta* fits, the probe spec,
  the in-context control rule, the `construct` defaults.

Generic stages (recorder, analyzers, trainer, report, control, CLI) look a family up here and
never compare family names. The numpy half of a family is imported on first lookup; its
torch half (model config for training, batches, objectives, held-out evaluation) is named
by a dotted module path and imported only by the trainer (`Family.training()`).

A family from outside the package is one `register(Family(...))` call
(docs/adding-a-family.md).
"""
from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import UserError
from ..core.plugins import load_registry

BUILTIN = ("icrl_interp.families.linear_td", "icrl_interp.families.softmax_td", "icrl_interp.families.sarsa",
           "icrl_interp.families.actor_critic")
"""Homes of the built-in families, imported on the first lookup (each registers itself)."""
ENTRY_POINTS = "icrl_interp.families"
"""Entry-point group of installed packages' family homes (each entry names a module that registers)."""
ENV_VAR = "ICRL_INTERP_FAMILIES"
"""Comma-separated module names of further family homes, imported after the built-in ones. Worker
processes (analysis, reports) inherit it, so a family of your own is known there too."""


# ------------------------------------------------------------ architectures
@dataclass(frozen=True)
class Architecture:
    """A model architecture: which D x D matrices a layer holds and what they do."""

    name: str
    """Registry key (also the `model.architecture` field of checkpoints)."""
    parameters: tuple[str, ...]
    """Per-layer parameter names (blocks.{l}.attn.<name>)."""
    score: str
    """The parameter that scores a source against a target: score(i, j) = z_i^T S z_j."""
    value: str
    """The parameter that maps a source column to what it writes (value map on column vectors)."""
    forms: tuple[str, ...] = ()
    """Variants of the layer (first = default); a form may add parameters (`form_parameters`)."""
    form_parameters: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Extra per-layer parameters of a form."""
    activations: tuple[str, ...] = ()
    """Elementwise kernel activations the architecture supports (empty: none)."""
    softmax: bool = False
    """Whether attention patterns are softmax rows (each sums to 1): a kernel to analyze."""

    def parameter_names(self, form: str | None = None) -> tuple[str, ...]:
        return self.parameters + self.form_parameters.get(form or "", ())


ARCHITECTURES: dict[str, Architecture] = {}


def register_architecture(arch: Architecture) -> Architecture:
    """Add an architecture (the model class is registered separately, in `icrl_interp.models`)."""
    ARCHITECTURES[arch.name] = arch
    return arch


def architecture(name: str) -> Architecture:
    _load_builtins()
    if name not in ARCHITECTURES:
        raise UserError(f"unknown model architecture {name!r} (known: {', '.join(sorted(ARCHITECTURES))})")
    return ARCHITECTURES[name]


# Wang et al.'s masked linear attention, Z + (1/n) P Z M act(Z^T Q Z): value P, kernel Q.
register_architecture(Architecture("linear-attention", ("P", "Q"), score="Q", value="P",
                                   activations=("relu", "tanh", "leaky_relu", "elu", "selu")))
# Liang & Lai's unmasked linear self-attention, H + (1/n) (V H)(H^T P H): value V, kernel P.
register_architecture(Architecture("lsa", ("P", "V"), score="P", value="V"))
# Xie et al.'s softmax attention with a temporal shift ('tsm') or a second, shifted head ('dual').
register_architecture(Architecture("softmax-ictd", ("A", "V"), score="A", value="V", forms=("tsm", "dual"),
                                   form_parameters={"dual": ("V_target",)}, softmax=True))


# --------------------------------------------------------------------- hints
@dataclass(frozen=True)
class BlockFit:
    """Fit learned (X, Y) to theta*'s (c X*, Y*/c) over the best c (the scaling manifold)."""

    x: tuple[str, str, str]
    """(parameter, row range, column range) of X; a range is ':' (all), ':block' (rows before the
    block) or 'block:' (from the block on)."""
    y: tuple[str, str, str]
    """(parameter, row range, column range) of Y."""
    names: tuple[str, str]
    """Names of X and Y in the output (e.g. 'P12', 'V21')."""
    y_unread: tuple[str, ...] = ()
    """Blocks among Y's rows that write a part of the output no readout and no later layer reads (e.g.
    the constant entry of SARSA's w~ = [1; w]): no loss sees those rows, so they are not identifiable.
    They are left out of the headline fit and reported apart (`unidentifiable` in the weights section)."""


@dataclass(frozen=True)
class ValueRowFit:
    """Fit a score matrix by one scale and read one row of a value map (Xie et al.'s form)."""

    score: str
    """Score parameter, compared with theta* normalised to max |entry| = 1."""
    value: str
    """Value parameter whose row is read."""
    row: str
    """Block whose (first) row holds the update."""
    columns: tuple[str, ...]
    """Blocks whose first columns the row is read over."""
    extra: tuple[str, ...] = ()
    """Further value parameters compared with theta* up to one scale each."""


@dataclass(frozen=True)
class Hints:
    """What the generic analyzers need to know about a family (data, no code paths per name)."""

    output: str
    """How the algorithm's output sits in hook_resid_post: 'query' (a scalar value at the last
    position), 'positions' (a value at every position, block `value_block`) or 'parameters' (the
    updated parameter vector in the last position, blocks `output_blocks`)."""
    value_block: str | None = None
    """'positions' output: the block holding the value of each position's state."""
    output_blocks: tuple[str, ...] = ()
    """'parameters' output: the blocks of the last position holding the updated parameters."""
    td_direction: dict[str, float] = field(default_factory=dict)
    """Where theta* writes the TD error in the residual stream: block -> coefficient (empty: nowhere)."""
    primary_probe: tuple[str, ...] = ("hook_resid_post",)
    """Hooks (relative to blocks.{l}) whose TD probe is the headline td_probe_r2, first present wins."""
    weight_fit: BlockFit | ValueRowFit | None = None
    """How learned weights are compared with theta*."""
    lazy_from: str | None = None
    """Block where the lazy parameter block starts (its rows x columns stay 0 under theta*), or None."""
    query_linear: bool = False
    """The output is linear in the query features (Wang's VD/SS/IWS apply)."""
    wang_summary: bool = False
    """Report Wang et al.'s P/Q summaries (needs blocks phi and gamma_phi_next)."""
    population_kernel: str | None = None
    """Feature block of a softmax score: the population kernel M_pi is computed from A[block, block]."""
    value_error_label: str = "value error ‖v_l − v_π‖_∞ (reward units)"
    """What `value_error` measures for this family (figure axis label)."""
    algorithm: str | None = None
    """The candidate algorithm (`icrl_interp.verdicts.candidates`) theta* runs: the verdict's known answer on theta*
    (docs/verdict.md); None: not one of the candidates."""


@dataclass
class ConstructPlan:
    """What `icrl-interp construct` builds: theta* model arguments, theta* constants and the task."""

    model: dict
    """Keyword arguments of `models.theta_star_model` (d, n_layers, gamma, alpha, tied, form, m, dtype)."""
    constants: dict
    """theta* constants of the family (keys of `Family.constants`)."""
    task: dict
    """The checkpoint's task (keys of `sampling.TaskSpec`)."""


@dataclass(frozen=True)
class Family:
    """Everything the generic stages need about one family. See docs/adding-a-family.md."""

    name: str
    """Registry key; checkpoints store it as model.family and task.family."""
    summary: str
    """One line for `--help` and reports."""
    architecture: str
    """The model architecture that runs it (a key of ARCHITECTURES)."""
    layout: Callable[..., Any]
    """layout(d, m=None) -> PromptLayout."""
    task_kind: str
    """Default task distribution: 'boyan' (Boyan chain MRPs) or 'mdp' (tabular MDPs)."""
    sample: Callable[..., Any]
    """sample(config, task, batch, rng) -> sampling.PromptBatch: prompts, task data and the reference
    algorithm's run. `config` is a checkpoint config (`.model`, `.constants`), `task` a TaskSpec."""
    reference: Callable[..., dict]
    """reference(z, model_config, constants) -> {td_errors, output, ...}: the float64 reference on prompts."""
    theta_star: Callable[..., dict] | None
    """theta_star(model_config, alpha, constants) -> {parameter: D x D matrix} of one layer (None: no construction)."""
    constants: dict[str, Any] = field(default_factory=dict)
    """Constants of theta* and the reference beyond gamma and alpha, with their defaults."""
    gauge: tuple[str, ...] = ()
    """Constants that move theta* along a symmetry without changing the map (e.g. the scale c);
    analyzers compare learned weights with theta* at their defaults and fit the gauge."""
    read_constants: Callable[[Any], dict] | None = None
    """read_constants(config) -> constants of a checkpoint (default: from config.origin, else the defaults)."""
    needs_m: bool = False
    """The layout takes a policy dimension m."""
    hints: Hints = field(default_factory=lambda: Hints(output="query"))
    """Analysis hints."""
    probe_spec: str | None = None
    """Probe spec: a file name in the shipped probes/ directory, or a path."""
    construct: type | None = None
    """Dataclass of `icrl-interp construct` options (fields and docstrings are the CLI)."""
    demo: dict | None = field(default_factory=dict)
    """Construct options of the theta* the demo builds ({} = the construct defaults; None = not in the demo)."""
    control: Callable[..., Any] | None = None
    """control(config, epsilon) -> a control rule for in-context control (None: not a control family)."""
    training: str | None = None
    """Dotted path of the torch half (a module with a `TRAINING` object), imported by the trainer only."""
    init_gain_per_layer: bool = False
    """Untied layers start with gain / n_layers (Wang et al.'s init)."""
    renamed: dict[str, dict[str, str]] = field(default_factory=dict)
    """Keys of a checkpoint's config this family renamed: {section ('origin', 'training'): {old key: new key}}.
    Older checkpoints and run configs are read with the new keys (`current_config`); new ones are written so."""

    def training_half(self):
        """The family's torch half (`TRAINING` of the module named by `training`)."""
        if self.training is None:
            raise UserError(f"family {self.name!r} has no training recipe")
        return importlib.import_module(self.training).TRAINING

    def current_config(self, data: dict) -> dict:
        """A checkpoint's config.json object with the keys of `renamed` under their new names (a copy; a key
        written under both names keeps the new one's value)."""
        data = dict(data)
        for section, names in self.renamed.items():
            part = data.get(section)
            if isinstance(part, dict) and any(old in part for old in names):
                data[section] = current_keys(part, names)
        return data

    def constants_of(self, config) -> dict:
        """The family's constants for a checkpoint config (origin values over defaults)."""
        if self.read_constants is not None:
            return self.read_constants(config)
        origin = getattr(config, "origin", None) or {}
        return {k: origin.get(k, default) for k, default in self.constants.items()}


def current_keys(values: dict, names: dict[str, str]) -> dict:
    """`values` with its keys renamed by `names` ({old: new}), in place of the old ones; a key given under
    both names keeps the new one's value."""
    out = {}
    for key, value in values.items():
        new = names.get(key)
        if new is None:
            out[key] = value
        elif new not in values:
            out[new] = value
    return out


FAMILIES: dict[str, Family] = {}
_loaded = False


def _range_blocks(spec: str) -> list[str]:
    """Blocks named by a BlockFit range (':', ':block', 'block:')."""
    if spec.count(":") != 1:
        raise UserError(f"a block range is ':', ':block' or 'block:', got {spec!r}")
    return [b for b in spec.split(":") if b]


def check_family(family: Family) -> None:
    """Refuse a family whose hints name blocks its layout lacks or parameters its architecture lacks."""
    if not isinstance(family.name, str) or not family.name:
        raise UserError(f"a family needs a non-empty name, got {family.name!r}")
    if family.architecture not in ARCHITECTURES:
        raise UserError(f"family {family.name!r} names unknown architecture {family.architecture!r} "
                        f"(known: {', '.join(sorted(ARCHITECTURES))})")
    arch = ARCHITECTURES[family.architecture]
    params = set(arch.parameters).union(*arch.form_parameters.values()) if arch.form_parameters else set(arch.parameters)
    lay = family.layout(2, 2 if family.needs_m else None)
    h = family.hints
    blocks = list(h.td_direction) + list(h.output_blocks)
    blocks += [b for b in (h.value_block, h.lazy_from, h.population_kernel) if b is not None]
    if h.output not in ("query", "positions", "parameters"):
        raise UserError(f"family {family.name!r}: hints.output must be 'query', 'positions' or 'parameters', "
                        f"got {h.output!r}")
    if h.output == "positions" and h.value_block is None:
        raise UserError(f"family {family.name!r}: hints.output 'positions' needs hints.value_block")
    if h.output == "parameters" and not h.output_blocks:
        raise UserError(f"family {family.name!r}: hints.output 'parameters' needs hints.output_blocks")
    names: list[str] = []
    if isinstance(h.weight_fit, BlockFit):
        for name, rows, cols in (h.weight_fit.x, h.weight_fit.y):
            names.append(name)
            blocks += _range_blocks(rows) + _range_blocks(cols)
        blocks += list(h.weight_fit.y_unread)
    elif isinstance(h.weight_fit, ValueRowFit):
        names += [h.weight_fit.score, h.weight_fit.value, *h.weight_fit.extra]
        blocks += [h.weight_fit.row, *h.weight_fit.columns]
    missing = sorted(set(blocks) - set(lay.names))
    if missing:
        raise UserError(f"family {family.name!r}: hints name blocks {', '.join(missing)} that its layout lacks "
                        f"(blocks: {', '.join(lay.names)})")
    unknown = sorted(set(names) - params)
    if unknown:
        raise UserError(f"family {family.name!r}: hints name parameters {', '.join(unknown)} that the "
                        f"{arch.name} architecture lacks (parameters: {', '.join(sorted(params))})")


def register(family: Family, *, replace: bool = False) -> Family:
    """Add a family after checking its hints against its layout and architecture (`check_family`);
    a second family of the same name is an error unless `replace`."""
    if family.name in FAMILIES and not replace and FAMILIES[family.name] is not family:
        raise UserError(f"a family named {family.name!r} is already registered")
    check_family(family)
    FAMILIES[family.name] = family
    return family


def unregister(name: str) -> None:
    """Remove a family (tests register temporary ones)."""
    FAMILIES.pop(name, None)


def _load_builtins() -> None:
    """Import the built-in homes, installed plugins (entry points) and $ICRL_INTERP_FAMILIES, once."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    rank = {m: i for i, m in enumerate(BUILTIN)}  # built-in families first, in BUILTIN order
    load_registry(FAMILIES, BUILTIN, lambda f: rank.get(f.sample.__module__, len(rank)), ENTRY_POINTS, ENV_VAR,
                  "family")


def get(name) -> Family:
    """The family registered under `name`; a one-line UserError naming the known ones otherwise."""
    _load_builtins()
    if not isinstance(name, str) or name not in FAMILIES:
        raise UserError(f"unknown family {name!r} (known: {', '.join(names())})")
    return FAMILIES[name]


def find(name) -> Family | None:
    """The family registered under `name`, or None."""
    _load_builtins()
    return FAMILIES.get(name) if isinstance(name, str) else None


def names() -> list[str]:
    """Registered family names, in registration order."""
    _load_builtins()
    return list(FAMILIES)


def where(predicate: Callable[[Family], bool]) -> list[str]:
    """Names of the families for which `predicate(family)` holds (e.g. those with a control rule)."""
    return [n for n in names() if predicate(FAMILIES[n])]
