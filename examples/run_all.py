"""The example models end to end from Python: train -> record -> analyze -> causal test -> verdict -> report.

    .venv/bin/python examples/run_all.py --out example-runs        # full size (a few minutes of CPU)
    .venv/bin/python examples/run_all.py --out /tmp/x --quick      # tiny: seconds, numbers meaningless

The same as `examples/run_all.sh` (the command line), through the Python API:

    model = icrl_interp.models.user.load("examples/torch_model.py:make", "torch_model.safetensors")
    icrl_interp.record(model, "linear-td", "torch.h5", task_options={"d": 4, "n": 30, "n_layers": 3},
                       probe="examples/torch_model.toml", tasks=2048)
    icrl_interp.analyze("torch.h5")                                     # the analysis dict
    icrl_interp.interventions.causal.causal_test(model, task, layer=0, probe=...)     # the causal section

Writes into --out, per model X (torch, tl, decoy): X_model.safetensors, X_train.json (value errors before and
after training), X.h5 (recording), X.json (analysis), X_causal.json (+ .png), X_verdict.json; and
report/index.html, which opens with each model's verdict and causal conclusion. `decoy` is torch_model.py
trained on the query state's immediate reward instead of its value: it runs no RL algorithm, and the toolkit
must not call it TD.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = {
    "torch": {"file": HERE / "torch_model.py", "probe": HERE / "torch_model.toml", "target": "value"},
    "tl": {"file": HERE / "tl_model.py", "probe": None, "target": "value"},  # TransformerLens: no probe spec
    # the same architecture as torch, trained on r(s_q): a model of TD with discount 0, no bootstrapping
    "decoy": {"file": HERE / "torch_model.py", "probe": HERE / "torch_model.toml", "target": "reward"},
}
CAUSAL_LAYER = 0
"""The causal test edits the context columns of this layer's residual stream. After the LAST layer no
attention reads the context any more, so an edit there cannot reach the output at the query: the test
is run at layer 0, whose context columns the next block's attention reads."""


def example_module(which: str):
    """The example's module (torch_model / tl_model; the decoy's is torch_model), imported from this folder."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    return importlib.import_module(MODELS[which]["file"].stem)


def run_one(which: str, out: Path, *, steps: int, tasks: int, seed: int = 0, causal_tasks: int = 256,
            random_draws: int = 32, bootstrap: int = 1000, train_options: dict | None = None,
            quiet: bool = False) -> dict:
    """Train, record, analyze and causally test one example model; returns what was written."""
    import icrl_interp
    from icrl_interp.interventions.causal import SCHEMA as CAUSAL_SCHEMA, causal_test
    from icrl_interp.models.construct import task_config
    from icrl_interp.core.files import write_json
    from icrl_interp.models import user

    module = example_module(which)  # puts this folder on sys.path for train_example
    from train_example import TASK, TASK_OPTIONS

    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    spec = MODELS[which]
    probe = None if spec["probe"] is None else str(spec["probe"])
    weights = out / f"{which}_model.safetensors"
    paths = {"weights": weights, "train": out / f"{which}_train.json", "recording": out / f"{which}.h5",
             "analysis": out / f"{which}.json", "causal": out / f"{which}_causal.json",
             "verdict": out / f"{which}_verdict.json"}

    say(f"== {which}: train ({steps} steps, target: {spec['target']} at the query state)")
    trained = module.train(steps, seed, weights, quiet=quiet, target=spec["target"], **(train_options or {}))
    write_json(paths["train"], {k: v for k, v in trained.items() if k != "model"})

    # load it back the way `icrl-interp record --model FILE.py:make --weights W` does (strict)
    model = user.load(f"{spec['file']}:make", weights)

    say(f"== {which}: record {tasks} prompts -> {paths['recording']}")
    summary = icrl_interp.record(model, TASK, paths["recording"], task_options=TASK_OPTIONS, probe=probe,
                                 tasks=tasks, seed=seed, progress=False)
    say(summary.table())

    say(f"== {which}: analyze -> {paths['analysis']}")
    analysis = icrl_interp.analyze(str(paths["recording"]))
    write_json(paths["analysis"], analysis)
    for key, reason in sorted(analysis.get("skipped", {}).items()):
        say(f"   skipped {key}: {reason}")

    say(f"== {which}: causal test at layer {CAUSAL_LAYER} -> {paths['causal']}")
    section = causal_test(model, task_config(TASK, TASK_OPTIONS), CAUSAL_LAYER, probe=probe, tasks=causal_tasks,
                          seed=seed, random_draws=random_draws, bootstrap=bootstrap)
    write_json(paths["causal"], {"schema": CAUSAL_SCHEMA, "source": f"{spec['file']}:make", "causal": section})
    # the reason leads with the answer ("no: ...")
    say(f"   conclusion: {section.get('conclusion_reason') or section.get('conclusion', '—')}")

    say(f"== {which}: verdict -> {paths['verdict']}")
    verdict = icrl_interp.verdict(str(paths["recording"]), bootstrap=bootstrap, progress=False)
    write_json(paths["verdict"], verdict)
    say(f"   {verdict['verdict']['text']}")
    return {"paths": paths, "train": trained, "summary": summary, "analysis": analysis, "causal": section,
            "verdict": verdict}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="example-runs", help="output folder (default: example-runs)")
    p.add_argument("--models", nargs="+", choices=tuple(MODELS), default=list(MODELS))
    p.add_argument("--steps", type=int, default=1200, help="training steps per model (default: 1200)")
    p.add_argument("--tasks", type=int, default=2048, help="prompts recorded per model (default: 2048)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test: seconds, numbers meaningless)")
    p.add_argument("--no-report", action="store_true", help="skip the HTML report")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sizes = dict(steps=args.steps, tasks=args.tasks, causal_tasks=256, random_draws=32, bootstrap=1000)
    train_options = {}
    if args.quick:
        sizes = dict(steps=5, tasks=256, causal_tasks=64, random_draws=4, bootstrap=100)
        train_options = {"batch_size": 32, "held_out_size": 256, "log_every": 0}
    t0 = time.perf_counter()
    results = {w: run_one(w, out, seed=args.seed, train_options=train_options, **sizes) for w in args.models}
    if not args.no_report:
        from icrl_interp.report import ReportConfig, build_report

        from icrl_interp.report.answers import text as answers_text

        inputs = [str(r["paths"][k]) for k in ("recording", "causal", "verdict") for r in results.values()]
        outcome = build_report(inputs, out / "report",
                               ReportConfig(progress=False))
        print(answers_text(outcome.results))
        print(f"report: {Path(outcome.out_dir) / 'index.html'}")
    for which, r in results.items():
        t = r["train"]
        print(f"{which}: held-out RMSE to v_pi(s_q) {t['before']['rmse']:.3f} at init -> {t['after']['rmse']:.3f} "
              f"trained ({t['steps']} steps, {t['wall_s']:.0f} s wall, {t['cpu_s']:.0f} s CPU)")
        comparison = r["causal"].get("baseline", {}).get("comparison")
        if comparison:
            print(f"{which}: causal layer {CAUSAL_LAYER} against the random-init copy: "
                  f"{comparison['exceeds_random_init']}")
        print(f"{which}: verdict: {r['verdict']['verdict']['text']}")
    print(f"done in {time.perf_counter() - t0:.0f} s; outputs in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
