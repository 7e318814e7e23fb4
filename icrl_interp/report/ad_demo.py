"""The shipped AD model in the demo (`data/ad/`, docs/episodes.md "The shipped model"): its closed-loop return
curve on held-out goals beside the Q-learning source's (the numbers its training run measured, from its
config.json), and its behavioural verdict on episodes of its own acting (`train.ad.rollout` on the held-out
goals, `verdicts.behaviour_fit.fit_behaviour`), written as an episode verdict JSON the report reads.
"""
from __future__ import annotations

from pathlib import Path

NAME = "ad-dark-room"
"""The demo's name of the shipped AD model (its verdict is `inputs/ad-dark-room.verdict.json`)."""
HISTORIES_PER_GOAL = 3
"""Closed-loop histories per held-out goal the demo's verdict is fitted on (8 goals: 24 histories of 120 steps)."""


def curve_lines(config: dict) -> list[str]:
    """The return curves of the shipped model and its source on the held-out goals, and the improvement within
    the context with its 95 % interval over goals, from the model's config.json (`evaluation`)."""
    e = config["evaluation"]
    lines = [f"shipped AD model (data/ad/): closed-loop return per episode on {len(e['goals'])} held-out Dark Room goals"]
    for who in ("model", "source"):
        m = e[who]
        lines.append(f"  {'AD model' if who == 'model' else 'Q-learning source':<17} "
                     + " ".join(f"{x:.2f}" for x in m["curve"])
                     + f"  (last quarter - first episode: {m['difference']:+.2f} [{m['ci95'][0]:.2f}, {m['ci95'][1]:.2f}])")
    return lines


def closed_loop_verdict(out: Path, *, histories_per_goal: int = HISTORIES_PER_GOAL, seed: int = 0) -> dict:
    """The shipped model acting on its held-out goals (`histories_per_goal` histories each, sampled from its softmax,
    seeded by `seed`), judged by the behavioural fit; the verdict JSON written to `out` and returned."""
    import torch

    from ..core import threads
    from ..core.files import write_json
    from ..models.ad_transformer import shipped
    from ..train import ad
    from ..verdicts.behaviour_fit import fit_behaviour

    model = shipped()
    cfg = ad.ADTrainConfig(**model.saved_config["training"]["config"])
    goals = model.saved_config["evaluation"]["goals"]
    R = histories_per_goal
    before = torch.get_num_threads()
    torch.set_num_threads(threads.override() or 1)  # a model this small gains nothing from intra-op threads (train.ad)
    try:
        runs = ad.concatenate([ad.rollout(model, {"size": cfg.size, "horizon": cfg.horizon, "goal": list(g)},
                                          range(i * R, (i + 1) * R), cfg.context, seed) for i, g in enumerate(goals)])
    finally:
        torch.set_num_threads(before)
    doc = fit_behaviour(runs, split_seed=seed, source=f"{NAME}: data/ad acting in closed loop, {R} histories on each "
                                                      f"of {len(goals)} held-out goals")
    write_json(out, doc)
    return doc
