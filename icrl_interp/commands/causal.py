"""`icrl-interp causal`: erase / steer the TD-error direction at one layer, against random directions.

Either a checkpoint of the package (`causal CKPT --layer L`), or your own model on a family's task
(`causal --model FILE.py:FUNC [--weights W.safetensors] --task FAMILY [task options] [--probe SPEC.toml]
--layer L`). docs/causal.md says what is measured and what theta* must give.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from ..core import devices
from ..core.cli_fields import add_fields, parsed
from ..interventions.causal import DEFAULT_METHOD, DEFAULT_REFITS, DEFAULT_STEER, DIRECTIONS, METHODS, SITES
from ..interventions.interchange import CHANGES
from . import task_options


@dataclass
class CausalOptions:
    """The edit, its controls and what is written."""

    layer: int
    """Layer whose activation is edited (0-based)."""
    hook: str | None = field(default=None, metadata={"choices": tuple(SITES)})
    """Where in the layer: the residual stream after it (resid_post), before it (resid_pre), the attention
    output, or the last query row of the attention scores (None: the family's primary TD probe hook;
    resid_post for your own model)."""
    method: str = field(default=DEFAULT_METHOD, metadata={"choices": METHODS})
    """Erasure: LEACE linear erasure of delta (leace, the default: no linear readout of it is left at the site),
    mean-ablation of the projection on the direction (mean) or zero-ablation of the projection (zero); the
    result's r2_after says how much of delta each edit left decodable."""
    direction: str = field(default="probe", metadata={"choices": DIRECTIONS})
    """The TD direction: a ridge probe fitted on training tasks (probe), or the construction's
    (construction; the package's models only)."""
    test_fraction: float = 0.5
    """Share of the tasks held out for the interventions; the rest fit the direction."""
    split_seed: int = 0
    """Seed of the held-out split of the tasks and of its bootstrap resamples."""
    random_draws: int = 32
    """Random directions of the control."""
    direction_seed: int = 0
    """Seed of the random directions of the control."""
    steer: tuple[float, ...] = field(default=DEFAULT_STEER, metadata={"metavar": "S"})
    """Steering scales s: add s * std * direction (none given: no steering; with --episodes at one step of a
    history at a time, std the selective projection's)."""
    bootstrap: int = 1000
    """Bootstrap resamples of the held-out tasks."""
    refits: int = DEFAULT_REFITS
    """Refits of the selective and input-explained directions on resampled training tasks, which the bootstrap
    resamples with the held-out tasks, so the conclusion's intervals hold how the fitted directions vary (0: fitted
    once; docs/causal.md, "Refitting")."""
    baseline_seed: int = 0
    """Seed of the random-init copy's parameters (with --baseline random-init)."""
    interchange: str = field(default="none", metadata={"choices": ("none", *CHANGES)})
    """Also run interchange interventions at the layer: counterfactual prompts with one reward (reward) or one
    transition's successor (transition) changed, their activation patched into the base run at the context
    columns, the output change compared with the task's reference algorithm's (the JSON's `interchange`)."""
    json: str | None = field(default=None, metadata={"metavar": "OUT.json"})
    """Write the result here (icrl_interp.causal/2)."""
    figure: str | None = field(default=None, metadata={"metavar": "OUT.png"})
    """Draw the output change against the random directions, the steering curve and (with the baseline) the
    trained model against its random-init copy."""


@dataclass
class CausalPrompts(task_options.Prompts):
    """The prompts of a causal test: every one is held at once (one batch of data)."""

    tasks: int = 256
    """Number of tasks sampled, one prompt each."""
    batch_size: int = 256
    """Prompts per forward pass."""


@dataclass
class EpisodeCausal:
    """The causal test on a model's actions over learning histories (docs/episodes.md)."""

    episodes: str | None = field(default=None, metadata={"metavar": "EPS.h5"})
    """An episodes file: erase and steer the target's selective direction at --layer of the model (an AD model
    directory, or --model FILE.py:FUNC with a token_format attribute or --token-format) reading these histories,
    and measure its actions."""
    target: str | None = field(default=None, metadata={"choices": ("delta", "q", "v")})
    """With --episodes: the candidate's quantity whose direction is erased: its TD error (delta), Q(s_t, a_t) (q)
    or V(s_t) (v) (None: delta)."""
    closed_loop_histories: int = field(default=0, metadata={"metavar": "N"})
    """With --episodes of a file `collect` wrote: let the model act on N fresh histories of
    the file's environment, unedited, with the selective erasure and with each random one, paired by seed, and
    report the change of its return (0: not run)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .episode_options import EpisodeTargets
    from .record import EpisodeOptions

    p.add_argument("checkpoint", nargs="?", help="checkpoint directory (model.safetensors + config.json); "
                   "or use --model with --task; with --episodes, an AD model directory")
    add_fields(p, CausalOptions)
    add_fields(p, devices.Device)
    add_fields(p.add_argument_group("prompts"), CausalPrompts, skip=("prompts",))
    task_options.add(p)
    episodes = p.add_argument_group("learning histories (--episodes; docs/episodes.md)")
    add_fields(episodes, EpisodeCausal)
    add_fields(episodes, EpisodeOptions, skip=("episodes",))
    add_fields(episodes, EpisodeTargets)


def _fmt(stat: dict | None, key: str = "mean") -> str:
    if not stat or stat.get(key) is None:
        return "—"
    ci = stat.get("ci")
    return f"{stat[key]:.4g}" + (f" [{ci[0]:.3g}, {ci[1]:.3g}]" if ci else "")


def table(section: dict) -> str:
    """A short terminal summary of a causal section."""
    d = section["direction"]
    r2 = lambda v: "—" if v is None else f"{v:.3f}"  # noqa: E731
    lines = [f"causal test at {section['hook']} ({section['module']}), method {section['method']}, "
             f"direction {d['source']} (probe R² train {r2(d.get('r2_train'))}, test {r2(d.get('r2_test'))}, "
             f"shuffled {r2(d.get('r2_shuffled'))})",
             f"held-out tasks {section['tasks']['test']} (train {section['tasks']['train']}), "
             f"{section['random_draws']} random directions, value error vs the {section['value_error']['target']}",
             f"{'':24}{'TD direction':32}{'random directions':32}{'ratio':22}Cohen d"]
    for label, key in (("erase: |Δ output|", "output_change"), ("erase: Δ value error", "value_error_change")):
        e = section["erasure"][key]
        lines.append(f"{label:24}{_fmt(e['td']):32}{_fmt(e['random']):32}"
                     f"{_fmt(e.get('ratio'), 'value') if 'ratio' in e else '—':22}{_fmt(e['cohen_d'], 'value')}")
    after = section["erasure"].get("r2_after")
    if after:
        lines.append(f"{'erase: probe R² after':24}{r2(after.get('td')):32}{r2(after.get('random')):32}"
                     f"(unedited {r2(after.get('before'))}; ≈ 0: the edit left no δ to read linearly)")
    for point in section["steering"]:
        lines.append(f"{'steer s=' + format(point['scale'], 'g') + ': |Δ output|':24}"
                     f"{_fmt({'mean': point['td']['change'], 'ci': point['td']['ci']}):32}"
                     f"{point['random']['change']:<32.4g}"
                     f"{'—' if point['ratio'] is None else format(point['ratio'], '.3g'):22}"
                     f"{'—' if point['cohen_d'] is None else format(point['cohen_d'], '.3g')}")
    sel = section.get("selective")
    if sel:
        e = sel["erasure"]
        lines.append(f"{'selective probe':24}R² held out {r2(sel.get('r2_test'))} "
                     f"(input's {r2(sel.get('input_r2_test'))}), selectivity {_fmt(sel['selectivity'])}")
        lines.append(f"{'erase: selective':24}{_fmt(e['selective']):32}{_fmt(e['random']):32}"
                     f"input-explained (same size) {_fmt(e['input_explained'])}")
    if section.get("conclusion"):
        lines.append(f"conclusion: {section['conclusion_reason']}")
    ic = section.get("interchange")
    if ic:
        for name, c in ic["candidates"].items():
            lines.append(f"interchange ({ic['change']}, {ic['positions']} patched): {name}: R² {_fmt(c['r2'])}, "
                         f"correlation {_fmt(c['correlation'])}, relative error {_fmt(c['relative_error'])}")
    lines += [f"note: {n}" for n in section.get("notes", [])]
    base = section.get("baseline")
    if base is not None:
        lines.append(_baseline_table(base))
    return "\n".join(lines)


def _baseline_table(base: dict) -> str:
    head = f"random-init copy (seed {base['seed']})"
    if "error" in base:
        return f"{head}: not run: {base['error']}"
    d, e = base["direction"], base["erasure"]["output_change"]
    r2 = lambda v: "—" if v is None else f"{v:.3f}"  # noqa: E731
    c = base["comparison"]
    lines = [f"{head}: probe R² test {r2(d.get('r2_test'))}, value error {base['value_error']['base']:.4g}; "
             f"erase |Δ output|: TD {_fmt(e['td'])}, random {_fmt(e['random'])}, "
             f"ratio {_fmt(e.get('ratio'), 'value')}",
             f"{'trained vs random init':24}{'trained':32}{'random init':32}trained − random init"]
    rows = [("erase: TD − random", c["erasure"]["output_change"]),
            ("erase: TD |Δ output|", c["erasure"]["td_output_change"]),
            ("erase: TD − random Δve", c["erasure"]["value_error_change"])]
    rows += [(f"steer s={p['scale']:g}: TD − random", p) for p in c["steering"]]
    rows.append(("probe R² (held out)", c["probe_r2_test"]))
    for label, v in rows:
        lines.append(f"{label:24}{_fmt(v['trained']):32}{_fmt(v['random_init']):32}{_fmt(v['difference'])}")
    lines.append(f"exceeds random init (erasure): {c['exceeds_random_init']}")
    lines.append(f"probe exceeds random init: {c['probe_exceeds_random_init']}")
    lines += [f"note (random init): {n}" for n in base.get("notes", [])]
    return "\n".join(lines)


def run(args) -> int:
    from ..core.files import write_json
    from ..core.outputs import output_file
    from ..interventions.causal import SCHEMA, causal_test

    from ..core.cli_fields import given_flags
    from ..core.errors import UserError
    from .episode_options import target_flags

    o, prompts = parsed(args, CausalOptions), parsed(args, CausalPrompts)
    device = parsed(args, devices.Device).device
    ep = parsed(args, EpisodeCausal)
    if ep.episodes is not None:
        return _episode_run(args, o, prompts, ep, device)
    from .record import EpisodeOptions

    if flags := (given_flags(args, EpisodeCausal) + given_flags(args, EpisodeOptions, ["token_format", "context"])
                 + target_flags(args)):
        raise UserError(f"{flags[0]} goes with --episodes (the causal test on a model's actions over learning histories)")
    inputs = task_options.input_files(args)
    if o.json:
        output_file(o.json, "--json", inputs=inputs, suffixes=(".json",))
    if o.figure:
        output_file(o.figure, "--figure", inputs=inputs, suffixes=(".png", ".svg"))
    task_options.check_sizes(args, prompts, args.checkpoint, held=True)  # before torch: a refusal is instant
    device = devices.resolve(device)  # refused before the model is loaded
    model, config, source = task_options.model_and_task(args, args.checkpoint)
    model.to(device)
    section = causal_test(model, config, o.layer, method=o.method, hook=o.hook, probe=prompts.probe,
                          direction=o.direction, tasks=prompts.tasks, test_fraction=o.test_fraction,
                          prompt_seed=prompts.prompt_seed, split_seed=o.split_seed, direction_seed=o.direction_seed,
                          random_draws=o.random_draws, steer=o.steer, bootstrap=o.bootstrap,
                          batch_size=prompts.batch_size, baseline=prompts.baseline, baseline_seed=o.baseline_seed,
                          refits=o.refits)
    if o.interchange != "none":
        from ..interventions.interchange import interchange

        section["interchange"] = interchange(model, config, o.layer, change=o.interchange, hook=o.hook,
                                             probe=prompts.probe, tasks=prompts.tasks, seed=prompts.prompt_seed,
                                             bootstrap=o.bootstrap, batch_size=prompts.batch_size)
    print(table(section))
    if o.json:
        write_json(o.json, {"schema": SCHEMA, "source": source, "causal": section})
        print(f"wrote {o.json}")
    if o.figure:
        from ..report.causal import write_figure

        write_figure(section, o.figure, title=source)
        print(f"wrote {o.figure}")
    return 0


def episode_table(result: dict) -> str:
    """The steering and closed-loop lines of an episode causal result (`episode_causal.causal_episodes`)."""
    lines = []
    st = result.get("steering")
    if st and st["points"]:
        lines.append(f"steering (one step of each of {st['histories']} histories at a time, norm |s| x "
                     f"{st['sigma']:.3g}): sign {st['sign']}")
        lines.append(f"{'':8}{'Δp(previous action) selective':36}{'random (|Δp|)':32}{'input-explained':36}"
                     "KL selective − random")
        for point in st["points"]:
            d = point["dp_previous"]
            lines.append(f"{'s=' + format(point['scale'], 'g'):8}{_fmt(d['selective']):36}{_fmt(d['random_abs']):32}"
                         f"{_fmt(d['input_explained']):36}{_fmt(point['kl']['excess_over_random'])}")
    elif st:
        lines.append(f"steering: {st['note']}")
    loop = result.get("closed_loop")
    if loop:
        lines.append(f"closed loop on {loop['histories'][1] - loop['histories'][0]} fresh histories of {loop['env']} "
                     f"({loop['steps']} steps): return, unedited / erased selective / erased random")
        for k, label in (("last_quarter", "last quarter"), ("improvement", "last quarter − first episode")):
            arms = " / ".join(_fmt(loop["arms"][a][k]) for a in ("unedited", "selective", "random"))
            lines.append(f"  {label}: {arms}; selective − random {_fmt(loop['selective_minus_random'][k])}")
    return "\n".join(lines)


FAMILY_ONLY = ("hook", "method", "direction", "interchange", "figure", "tasks", "prompt_seed", "probe", "refits")
"""Options of the families' causal test that the test over learning histories does not have."""


def _episode_run(args, o: CausalOptions, prompts: CausalPrompts, ep: EpisodeCausal, device) -> int:
    """`causal (AD_MODEL_DIR | --model FILE.py:FUNC) --episodes EPS.h5 --layer L`: `episode_causal.causal_episodes`."""
    from ..core.cli_fields import given_flags
    from ..core.errors import UserError
    from ..core.files import write_json
    from ..core.outputs import output_file
    from ..interventions.episode_causal import causal_episodes, environment_of, read_mask, run_model, to_steps
    from ..models import episode_tokens as et
    from ..models.random_init import random_init_copy
    from ..recording.episodes import token_format_of
    from .record import EpisodeOptions
    from ..tasks.episodes import read_episodes
    from ..analyzers.episode_recording import action_probs
    from .episode_options import EpisodeTargets, load_model, other_task_flags, targets

    family = [*given_flags(args, CausalOptions, [n for n in FAMILY_ONLY if n in CausalOptions.__dataclass_fields__]),
              *given_flags(args, CausalPrompts, [n for n in FAMILY_ONLY if n in CausalPrompts.__dataclass_fields__]),
              *other_task_flags(args)]
    if family:
        raise UserError(f"{family[0]} does not go with --episodes (the histories are the prompts; the edits are the "
                        "mean-ablation of the probe's selective direction and steering along it at the residual "
                        "stream after --layer)")
    if o.json:
        output_file(o.json, "--json", inputs=[ep.episodes, *task_options.input_files(args)], suffixes=(".json",))
    episodes = read_episodes(ep.episodes)
    target = devices.resolve(device)
    model, spec = load_model(args, args.checkpoint)
    point = f"blocks.{o.layer}.hook_resid_post"
    have = sorted(n for n, _ in model.named_modules() if n.startswith("blocks.") and n.endswith(".hook_resid_post"))
    if point not in have:
        raise UserError(f"--layer {o.layer}: the model has no {point} (its layers: "
                        f"{', '.join(h.split('.')[1] for h in have) or 'none with that hook'})")
    tf = parsed(args, EpisodeOptions)
    fmt = token_format_of(model, episodes, tf.token_format, tf.context)
    et.check_fits(fmt, episodes)
    if ep.closed_loop_histories:  # refused before the behavioural fit and the test: seconds to minutes
        environment_of(episodes)
    model.to(target)
    probs = None
    if parsed(args, EpisodeTargets).candidate is None:
        tokens, pmap = et.encode(episodes, fmt)  # the model's own action probabilities: what the fit explains
        logits = to_steps(pmap, run_model(model, tokens, point, read_mask(pmap), batch_size=prompts.batch_size)[0])
        probs = action_probs(logits, episodes.valid)
    t, info = targets(args, episodes, action_probs=probs, split_seed=o.split_seed, test_fraction=o.test_fraction)
    base = random_init_copy(model, o.baseline_seed)[0] if prompts.baseline == "random-init" else None
    result = causal_episodes(model, episodes, fmt, t, layer=o.layer, target=ep.target or "delta", draws=o.random_draws,
                             seed=o.direction_seed, split_seed=o.split_seed, test_fraction=o.test_fraction,
                             n_boot=o.bootstrap, batch_size=prompts.batch_size, random_model=base, steer=o.steer,
                             closed_loop_histories=ep.closed_loop_histories)
    result = {**result, "source": spec, "episodes": str(ep.episodes), "candidate": info,
              "random_init": None if base is None else {"seed": o.baseline_seed}}
    params = ", ".join(f"{k} {v:.3g}" for k, v in info["params"].items())
    print(f"causal test at {result['site']} of {spec}: {result['target']} of {info['candidate']} ({params}; "
          f"{info['source']}), held-out histories {result['split']['test_histories']}")
    print(f"conclusion: {result['reason']}")  # the reason starts with the answer: yes, no or inconclusive
    if lines := episode_table(result):
        print(lines)
    if o.json:
        write_json(o.json, result)
        print(f"wrote {o.json}")
    return 0
