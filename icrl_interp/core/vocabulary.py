"""The one flag vocabulary of the command line: every flag, what it means, where it is used, and the old
spellings that are now refused.

Rules (tests/commands/test_vocabulary.py walks every parser of every command and checks them):

- one meaning, one spelling: the same quantity has the same flag in every command (`--prompt-seed` is the
  task sampler's seed wherever tasks are sampled), and no flag has a second spelling (no aliases; a
  boolean is `--x / --no-x`);
- one spelling, one meaning: a flag means what `FLAGS` says in every command it is listed for; a command
  that uses it elsewhere fails the test until its entry lists that command (say so only if it means the
  same there);
- every flag of every command is in `FLAGS`; a flag is added here before it is added to a command.

Flags come from the fields of option dataclasses (`core.cli_fields.add_fields`): a field's flag is its
name with dashes, unless the field's name is kept in a file format (a JSON key, a run's config) and its
metadata names the flag (`field(metadata={"flag": "--split-seed"})`). An old spelling of `RENAMED` is
refused by the command it was renamed in, with one line naming the new one
(`icrl-interp record: error: --seed is now --prompt-seed`), exit status 2.
"""
from __future__ import annotations

import argparse
import warnings
from dataclasses import dataclass


@dataclass(frozen=True)
class Flag:
    """What a flag means and the commands that have it."""

    meaning: str
    """What it sets, in the words its help text may elaborate."""
    commands: tuple[str, ...]
    """Commands that have it: 'record', or 'train sarsa' for one family's sub-command ('train' is all of them)."""


TASK = ("construct", "record", "analyze", "causal", "verdict")
"""Commands that take a family's task options (`construct FAMILY`'s fields; `--task FAMILY` with a model)."""
RUN = ("record", "analyze", "causal", "verdict")
"""Commands that run a model on sampled prompts."""
FAMILY_TRAIN = ("train",)
"""Every family's `train FAMILY` (its TrainConfig fields)."""

FLAGS: dict[str, Flag] = {
    # ---- what a command writes
    "--out": Flag("the file or directory the command makes (recording, checkpoint, run, report, sweep, episodes)",
                  ("record", "construct", "train", "report", "sweep", "demo", "zoo", "collect")),
    "--json": Flag("also write the command's result as JSON to this file", ("inspect", *RUN, "control")),
    "--figure": Flag("also draw the result into this image file", ("control", "causal", "verdict")),
    "--force": Flag("replace an existing output of the command (construct: a checkpoint directory; collect: an "
                    "episodes file)", ("construct", "collect")),
    "--resume": Flag("continue a partial output from where it stopped", ("record",)),
    "--progress": Flag("show progress bars on stderr (--no-progress: none)",
                       ("record", "analyze", "report", "train", "sweep", "control", "zoo", "collect")),
    # ---- where the work runs
    "--device": Flag("where the torch work runs: cpu, cuda or auto", ("record", "analyze", "causal", "control", "train")),
    "--workers": Flag("worker processes that run the inputs in parallel", ("analyze", "report", "sweep", "demo")),
    "--scheduler": Flag("where the work runs: serial, local, local:N or a Dask scheduler's address",
                        ("analyze", "report", "sweep")),
    "--threads": Flag("torch threads of one process", ("train",)),
    # ---- the model and the prompts it runs on
    "--model": Flag("your own model: FILE.py:FUNC or package.module:FUNC returning a torch module (collect: also "
                    "an AD model directory)", (*RUN, "collect")),
    "--weights": Flag("a state dict loaded into --model", RUN),
    "--task": Flag("the family whose task --model runs on", RUN),
    "--probe": Flag("the probe spec TOML: which hooks are recorded and what roles they play", RUN),
    "--prompts": Flag("a file of prompts to run on instead of sampling", ("record", "analyze", "verdict")),
    "--tasks": Flag("number of tasks sampled, one prompt each", ("envs", *RUN, "demo", "zoo calibrate")),
    "--batch-size": Flag("prompts per forward pass", RUN),
    "--prompt-seed": Flag("seed of the task sampler: which tasks are drawn and the trajectories of their prompts",
                          ("envs", "construct", "demo", *RUN, "control", "collect")),
    "--baseline": Flag("also run the same architecture at random initialization (random-init) or not (none)", RUN),
    "--baseline-seed": Flag("seed of the random-init copy's parameters", ("causal",)),
    "--interchange": Flag("also run interchange interventions with counterfactual prompts changing one reward or "
                          "one transition (none: not)", ("causal",)),
    # ---- a family's task and theta* (construct FAMILY; --task FAMILY), and training's model fields
    "--d": Flag("feature dimension d", (*TASK, *FAMILY_TRAIN)),
    "--n": Flag("context length n (transitions per prompt)", (*TASK, *FAMILY_TRAIN, "control")),
    "--n-layers": Flag("number of layers L", (*TASK, *FAMILY_TRAIN)),
    "--n-states": Flag("states of each task (Boyan chain or MDP)", ("envs", *TASK, *FAMILY_TRAIN)),
    "--n-actions": Flag("actions of each MDP", ("envs", *TASK, *FAMILY_TRAIN)),
    "--gamma": Flag("discount factor gamma", ("envs", *TASK, *FAMILY_TRAIN, "collect")),
    "--alpha": Flag("the step size alpha of the algorithm (the actor's, for actor-critic)",
                    (*TASK, *FAMILY_TRAIN, "collect")),
    "--critic-step": Flag("actor-critic's critic step (beta in the papers)", (*TASK, "train actor-critic")),
    "--scale": Flag("gauge constant c of theta*: the layer holds (c X*, Y*/c)", TASK),
    "--score-scale": Flag("softmax-td: the factor on theta*'s score matrix A*", TASK),
    "--features": Flag("Boyan features: random or onehot", TASK),
    "--beta": Flag("scale of one-hot state features", (*TASK, "train softmax-td")),
    "--tied": Flag("one set of weights shared by all layers (--no-tied: one per layer)", (*TASK, *FAMILY_TRAIN)),
    "--form": Flag("softmax-td's architecture: tsm (one head + temporal shift) or dual (two heads)",
                   (*TASK, *FAMILY_TRAIN)),
    "--dtype": Flag("parameter dtype: float32 or float64", (*TASK, *FAMILY_TRAIN)),
    "--sa-features": Flag("state-action features of an MDP task: onehot, gaussian or uniform", (*TASK, *FAMILY_TRAIN)),
    "--sa-randomness": Flag("how random a random state-action feature map is, rho in [0, 1]", (*TASK, *FAMILY_TRAIN)),
    "--epsilon": Flag("epsilon of the epsilon-greedy behaviour policy", (*FAMILY_TRAIN, "control", "collect")),
    "--concentration": Flag("Dirichlet concentration of the MDPs' transition rows", (*FAMILY_TRAIN, "control")),
    # ---- learning histories in environments (collect)
    "--env": Flag("the environment: a Gymnasium id or module:Class", ("collect",)),
    "--env-kwargs": Flag("keyword arguments of the environment, a JSON object", ("collect",)),
    "--agent": Flag("the source agent that acts and learns in the environment", ("collect",)),
    "--greedy": Flag("a model acting in closed loop takes the argmax of its logits instead of sampling them",
                     ("collect",)),
    "--episodes": Flag("an episodes file (learning histories) to judge, or to record a model over",
                       ("verdict", "record", "causal")),
    "--token-format": Flag("the token format a model reads episodes in: ad-step, ad-element or dpt",
                           ("record", "collect", "causal")),
    "--context": Flag("steps per window (AD formats) or transitions of context (dpt) of the token format",
                      ("record", "collect", "causal")),
    "--closed-loop-histories": Flag("fresh histories of the episodes' environment on which the model acts in closed "
                                    "loop, unedited and under each erasure (0: none)", ("causal",)),
    "--histories": Flag("learning histories collected, one environment (task) each", ("collect",)),
    "--steps-per-history": Flag("environment steps of each learning history", ("collect",)),
    "--inverse-temperature": Flag("beta of the softmax(beta Q) policy of a learning agent",
                                  ("collect", "analyze", "causal")),
    "--lam": Flag("the trace decay lambda of TD(lambda) control", ("collect", "analyze", "causal")),
    "--candidate": Flag("the learning rule replayed on the histories whose TD error, Q and V are the targets",
                        ("analyze", "causal")),
    "--target": Flag("the candidate's quantity whose direction the causal test erases: delta, q or v", ("causal",)),
    # ---- training (train FAMILY; sweep)
    "--config": Flag("a JSON file of config fields (flags override it)", FAMILY_TRAIN),
    "--export": Flag("after training, copy the final checkpoint (and its snapshots) to this directory", FAMILY_TRAIN),
    "--snapshots": Flag("with --export: also the earlier checkpoints (--no-snapshots: the final one only)",
                        FAMILY_TRAIN),
    "--eval": Flag("the held-out evaluation at the end of training (--no-eval: skip it)", (*FAMILY_TRAIN, "sweep")),
    "--report": Flag("a batch report over the runs after training (--no-report: train only)", ("sweep",)),
    "--seed": Flag("seed of a training run: the model's initialization and its task stream", FAMILY_TRAIN),
    "--steps": Flag("optimizer steps of a training run", FAMILY_TRAIN),
    "--lr": Flag("Adam learning rate at step 0", FAMILY_TRAIN),
    "--lr-decay": Flag("factor on the learning rate every --lr-decay-every steps", FAMILY_TRAIN),
    "--lr-decay-every": Flag("period of the learning-rate decay, in steps", FAMILY_TRAIN),
    "--weight-decay": Flag("Adam's L2 weight decay", FAMILY_TRAIN),
    "--init-gain": Flag("Xavier-normal gain of the initialization", FAMILY_TRAIN),
    "--checkpoint-every": Flag("steps between checkpoints", FAMILY_TRAIN),
    "--log-every": Flag("steps between metrics lines", FAMILY_TRAIN),
    "--eval-tasks": Flag("held-out tasks of the final evaluation", FAMILY_TRAIN),
    "--tasks-per-step": Flag("tasks (prompts) per optimizer step", FAMILY_TRAIN),
    "--objective": Flag("the training loss", FAMILY_TRAIN),
    "--windows": Flag("linear-td: TD errors per trajectory", ("train linear-td",)),
    "--trajectories-per-task": Flag("linear-td: trajectories per task and step", ("train linear-td",)),
    "--masks": Flag("softmax-td: train inside the paper's sparsity masks only", ("train softmax-td",)),
    "--w-std": Flag("std of the parameters w in the prompt", ("train sarsa", "train actor-critic")),
    "--w-std-max": Flag("largest std of w, drawn log-uniformly per prompt", ("train sarsa", "train actor-critic")),
    "--lazy-ablation": Flag("ablation: initialize the lazy blocks too", ("train sarsa", "train actor-critic")),
    "--span-projection": Flag("project updates onto the span the prompts reach", ("train sarsa", "train actor-critic")),
    "--lam-std": Flag("actor-critic: std of the policy parameters lam in the prompt", ("train actor-critic",)),
    "--lam-std-max": Flag("actor-critic: largest std of lam, drawn log-uniformly", ("train actor-critic",)),
    "--critic-weight": Flag("actor-critic: weight of the critic's error in the loss", ("train actor-critic",)),
    "--critic-lr-factor": Flag("actor-critic: factor on the critic rows' Adam steps", ("train actor-critic",)),
    # ---- analysis
    "--layout": Flag("a prompt layout file: where a generic model's values sit", ("analyze",)),
    "--live": Flag("run the model and analyze its batches without writing them", ("analyze",)),
    "--also-analyze": Flag("analyze the batches as they are recorded", ("record",)),
    "--shards": Flag("shard files written in parallel processes", ("record",)),
    "--full-patterns": Flag("record attention patterns and scores at every query position (O(n²) per prompt)",
                            ("record",)),
    "--chunk-mib": Flag("memory budget of one chunk of prompts read, in MiB", ("analyze",)),
    "--test-fraction": Flag("share of the tasks held out for scoring", ("analyze", "causal", "verdict")),
    "--split-seed": Flag("seed of the held-out split of the tasks and of its bootstrap resamples",
                         ("analyze", "causal", "verdict")),
    "--folds": Flag("cross-validation folds of the ridge penalty", ("analyze",)),
    "--probe-max-tasks": Flag("at most about this many tasks feed the TD probes", ("analyze",)),
    "--family": Flag("the family whose construction foreign weights are compared with", ("analyze",)),
    "--head": Flag("attention head of TransformerLens weights", ("analyze",)),
    "--kernel-matrix-max-states": Flag("largest state count whose kernel matrix is written", ("analyze",)),
    "--wang-alpha": Flag("step of the batch TD that VD/SS/IWS compare with", ("analyze",)),
    "--per-task-max": Flag("largest task count whose per-task values are written", ("analyze",)),
    # ---- report
    "--use-cache": Flag("reuse the cached analyses of unchanged inputs", ("report",)),
    "--svg": Flag("also write every figure as SVG", ("report",)),
    "--embed": Flag("inline the figures in index.html", ("report",)),
    "--max-recordings": Flag("recordings per family that get their own figure", ("report",)),
    "--title": Flag("the page title", ("report",)),
    "--control-mdps": Flag("held-out MDPs of the report's control evaluation (control's --mdps)", ("report",)),
    "--control-iterations": Flag("closed-loop updates per MDP of the report's control evaluation "
                                 "(control's --iterations)", ("report",)),
    "--live-tasks": Flag("prompts each checkpoint is also run on and analyzed live", ("report",)),
    "--analyzer": Flag("(hidden, for tests) the analysis function, module:function", ("report",)),
    "--quick": Flag("fewer prompts and no algorithm verdicts, for a fast look", ("demo",)),
    # ---- control
    "--mdps": Flag("held-out random MDPs of the control evaluation", ("control",)),
    "--iterations": Flag("closed-loop updates per MDP", ("control",)),
    "--rewards": Flag("the reward distribution of the MDPs", ("control",)),
    # ---- causal tests and the verdict
    "--layer": Flag("the layer whose activation is edited (0-based)", ("causal",)),
    "--hook": Flag("where in the layer the edit is made", ("causal",)),
    "--method": Flag("how the direction is erased: mean, leace or zero", ("causal",)),
    "--direction": Flag("the TD direction: a probe's or the construction's", ("causal",)),
    "--direction-seed": Flag("seed of the random directions of the control", ("causal", "verdict")),
    "--random-draws": Flag("random directions of the control", ("causal", "verdict")),
    "--steer": Flag("steering scales", ("causal",)),
    "--bootstrap": Flag("bootstrap resamples of the held-out tasks", ("causal", "verdict")),
    "--refits": Flag("refits of the selective test's directions on resampled training tasks", ("causal",)),
    "--candidates": Flag("the candidate algorithms judged", ("verdict",)),
    "--max-step": Flag("largest candidate step k tried per layer", ("verdict",)),
    "--min-r2": Flag("held-out behaviour R^2 a candidate needs to fit", ("verdict",)),
    "--max-prompts": Flag("prompts of the recording read", ("verdict",)),
    "--causal-tasks": Flag("held-out tasks edited for the causal evidence", ("verdict",)),
    "--causal": Flag("the causal evidence with a model (--no-causal: skip it)", ("verdict",)),
    # ---- the zoo of known answers
    "--set": Flag("which zoo entries: default (a few), full (all), or episodes (agents acting in environments)",
                  ("zoo",)),
    "--zoo-seed": Flag("seed of the zoo: 0, or a fresh zoo drawn with other step sizes, prompts and splits", ("zoo",)),
    "--replicates": Flag("simulated replicates per teacher and noise level (fresh tasks and noise each)",
                         ("zoo calibrate",)),
}
"""Every flag: what it means and the commands that have it (`--no-x` is the same flag as `--x`)."""

RENAMED: dict[str, dict[str, tuple[str, ...]]] = {
    "--seed": {"record": ("--prompt-seed",), "envs": ("--prompt-seed",), "construct": ("--prompt-seed",),
               "demo": ("--prompt-seed",), "control": ("--prompt-seed",), "analyze": ("--split-seed",),
               "verdict": ("--split-seed", "--direction-seed"),
               "causal": ("--prompt-seed", "--split-seed", "--direction-seed"), "collect": ("--prompt-seed",)},
    "--record-seed": {"verdict": ("--prompt-seed",)},
    "--quiet": {"record": ("--no-progress",)},
    "--states": {c: ("--n-states",) for c in ("envs", *TASK, *FAMILY_TRAIN)},
    "--actions": {c: ("--n-actions",) for c in ("envs", *TASK, *FAMILY_TRAIN)},
    "--layers": {c: ("--n-layers",) for c in (*TASK, *FAMILY_TRAIN)},
    "--untied": {c: ("--no-tied",) for c in TASK},
    "--no-untied": {c: ("--tied",) for c in TASK},
    "--batch": {"train": ("--tasks-per-step",)},
    "--beta": {"train actor-critic": ("--critic-step",), "collect": ("--inverse-temperature",)},
    "--probe-tasks": {"analyze": ("--probe-max-tasks",)},
    "--cache": {"report": ("--use-cache",)},
    "--no-cache": {"report": ("--no-use-cache",)},
    "--control-steps": {"report": ("--control-iterations",)},
    "--steps": {"control": ("--iterations",), "verdict": ("--max-step",), "collect": ("--steps-per-history",)},
    "--causal-draws": {"verdict": ("--random-draws",)},
    "--prompts": {"demo": ("--tasks",)},
    # collect counts histories and their steps; --episodes names an episodes file (record, causal, verdict)
    "--episodes": {"collect": ("--histories", "--steps-per-history")},
}
"""Old spelling -> {command: its new spelling(s)}: refused there with one line naming them (spellings of 0.1)."""

OLD_KEYS: dict[str, tuple[str, bool]] = {"states": ("n_states", False), "actions": ("n_actions", False),
                                         "layers": ("n_layers", False), "untied": ("tied", True)}
"""Old field names of the families' construct options (Python `task_options` keys) -> (new name, whether the
value is negated); read for one release with a DeprecationWarning."""


def applies(commands: tuple[str, ...], command: str) -> bool:
    """Whether `command` ('train sarsa') is one of `commands` ('train' covers every family's)."""
    return any(command == c or command.startswith(c + " ") for c in commands)


def renamed_in(command: str) -> dict[str, tuple[str, ...]]:
    """{old spelling: new spellings} refused by `command`."""
    out = {}
    for old, where in RENAMED.items():
        hits = [new for scope, new in where.items() if applies((scope,), command)]
        if hits:
            out[old] = hits[-1]  # the most specific scope is listed last
    return out


def message(old: str, new: tuple[str, ...]) -> str:
    """'--seed is now --prompt-seed' (', ... and ...' for a flag split into several)."""
    names = new[0] if len(new) == 1 else f"{', '.join(new[:-1])} and {new[-1]}"
    return f"{old} is now {names}"


class Refused(argparse.Action):
    """An old spelling: parsing stops with one line naming the new one, exit status 2."""

    def __init__(self, option_strings, dest, new: tuple[str, ...] = (), **kwargs):
        super().__init__(option_strings, dest, nargs="?", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        parser.exit(2, f"{parser.prog}: error: {message(option_string, self.new)}\n")


def refuse_renamed(parser: argparse.ArgumentParser, command: str) -> None:
    """Make `parser` (the parser of `command`) refuse the old spellings renamed in it: those whose new
    spellings it has (a family's sub-command refuses `--actions` only when the family has `--n-actions`)."""
    have = parser._option_string_actions
    for old, new in renamed_in(command).items():
        if old not in have and all(n in have for n in new):
            parser.add_argument(old, action=Refused, dest="_refused", new=new)


def current_options(values: dict, names) -> dict:
    """`values` (construct options given in Python) with the old keys of `OLD_KEYS` renamed to those among
    `names`, with a DeprecationWarning; a new key given too wins."""
    out = dict(values)
    for old, (new, negate) in OLD_KEYS.items():
        if old in out and old not in names and new in names:
            value = out.pop(old)
            warnings.warn(f"option {old!r} is now {new!r}" + (" (negated)" if negate else "")
                          + "; the old name works for one release (see the changelog)", DeprecationWarning, stacklevel=3)
            out.setdefault(new, (not value) if negate else value)
    return out
