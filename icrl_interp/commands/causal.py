"""`icrl-interp causal`: erase / steer the TD-error direction at one layer, against random directions.

Either a checkpoint of the package (`causal CKPT --layer L`), or your own model on a family's task
(`causal --model FILE.py:FUNC [--weights W.safetensors] --task FAMILY [task options] [--probe SPEC.toml]
--layer L`). docs/causal.md says what is measured and what theta* must give.
"""
from __future__ import annotations

import argparse

from ..core import devices
from . import task_options


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..interventions.causal import BASELINES, DEFAULT_STEER, DIRECTIONS, METHODS, SITES

    p.add_argument("checkpoint", nargs="?", help="checkpoint directory (model.safetensors + config.json); "
                   "or use --model with --task")
    p.add_argument("--layer", type=int, required=True, help="layer whose activation is edited (0-based)")
    p.add_argument("--hook", choices=tuple(SITES), help="where in the layer: the residual stream after it "
                   "(resid_post), before it (resid_pre), the attention output, or the last query row of the "
                   "attention scores (default: the family's primary TD probe hook; resid_post for your own model)")
    p.add_argument("--method", choices=METHODS, default="mean", help="erasure: mean-ablation of the projection "
                   "on the direction (mean), LEACE linear erasure of delta (leace) or zero-ablation of the "
                   "projection (zero); the result's r2_after says how much of delta each edit left decodable "
                   "(default: mean)")
    p.add_argument("--direction", choices=DIRECTIONS, default="probe", help="the TD direction: a ridge probe fitted "
                   "on training tasks (probe), or the construction's (construction; the package's models only)")
    p.add_argument("--tasks", type=int, default=256, help="tasks sampled, one prompt each (default: 256)")
    p.add_argument("--test-fraction", type=float, default=0.5, help="share of the tasks held out for the "
                   "interventions; the rest fit the direction (default: 0.5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the tasks, the split, the random directions and "
                   "the bootstrap (default: 0)")
    p.add_argument("--random-draws", type=int, default=32, help="random directions of the control (default: 32)")
    p.add_argument("--steer", type=float, nargs="*", default=list(DEFAULT_STEER), metavar="S",
                   help="steering scales s: add s * std * direction (default: -2 -1 1 2; none: no steering)")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples of the held-out tasks "
                   "(default: 1000)")
    p.add_argument("--batch-size", type=int, default=256, help="prompts per forward pass (default: 256)")
    p.add_argument("--baseline", choices=BASELINES, default="random-init", help="also run the identical test "
                   "(same tasks, split, random directions, its own probe) on the same architecture at random "
                   "initialization and compare (random-init), or not (none) (default: random-init)")
    p.add_argument("--baseline-seed", type=int, help="seed of the random-init copy's parameters (default: --seed)")
    p.add_argument("--probe", help="probe spec TOML whose [roles] map resid_post (resid_pre, attn_out) to your "
                   "model's modules (not needed for TransformerLens models)")
    p.add_argument("--json", metavar="OUT.json", help="write the result here (icrl_interp.causal/1)")
    devices.add_argument(p, "the model (and its random-init copy) run")
    p.add_argument("--figure", metavar="OUT.png", help="draw the output change against the random directions, "
                   "the steering curve and (with the baseline) the trained model against its random-init copy")
    task_options.add(p)


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
    from ..interventions.causal import SCHEMA, causal_test
    from ..core.files import write_json
    from ..core.outputs import output_file

    inputs = task_options.input_files(args)
    if args.json:
        output_file(args.json, "--json", inputs=inputs, suffixes=(".json",))
    if args.figure:
        output_file(args.figure, "--figure", inputs=inputs, suffixes=(".png", ".svg"))
    task_options.check_sizes(args, args.checkpoint, held=True)  # before torch is imported: a refusal is instant
    device = devices.resolve(args.device)  # refused before the model is loaded
    model, config, source = task_options.model_and_task(args, args.checkpoint)
    model.to(device)
    section = causal_test(model, config, args.layer, method=args.method, hook=args.hook, probe=args.probe,
                          direction=args.direction, tasks=args.tasks, test_fraction=args.test_fraction,
                          seed=args.seed, random_draws=args.random_draws, steer=args.steer,
                          bootstrap=args.bootstrap, batch_size=args.batch_size, baseline=args.baseline,
                          baseline_seed=args.baseline_seed)
    print(table(section))
    if args.json:
        write_json(args.json, {"schema": SCHEMA, "source": source, "causal": section})
        print(f"wrote {args.json}")
    if args.figure:
        from ..report.causal import write_figure

        write_figure(section, args.figure, title=source)
        print(f"wrote {args.figure}")
    return 0
