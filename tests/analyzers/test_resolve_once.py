"""A checkpoint's analysis resolves its family and its architecture once: every later stage reads the
registry entries the parsed config holds (`ModelConfig.family_entry`, `architecture_entry`,
`CheckpointConfig.task_family_entry`), never the registry again. Counted by wrapping the registry's
lookup functions, over the analysis of the weights and the live analysis (a model run on its own task)."""
from __future__ import annotations

import collections
from pathlib import Path

import pytest

import icrl_interp
from icrl_interp import cli
from icrl_interp.families import registry

SHIPPED = Path(__file__).resolve().parents[2] / "data" / "checkpoints"


@pytest.fixture
def lookups(monkeypatch) -> collections.Counter:
    """(kind, name) -> calls of the family registry's lookups from now on."""
    registry.names()  # the built-in families loaded before counting
    calls: collections.Counter = collections.Counter()
    for fn, kind in (("get", "family"), ("find", "family"), ("architecture", "architecture")):
        def counted(name, *args, _orig=getattr(registry, fn), _kind=kind, **kw):
            calls[(_kind, name)] += 1
            return _orig(name, *args, **kw)

        monkeypatch.setattr(registry, fn, counted)
    return calls


def once(family: str) -> dict:
    """What one resolution of a checkpoint of `family` looks up: its family (the model's and the task's
    are one) and its architecture."""
    return {("family", family): 1, ("architecture", registry.FAMILIES[family].architecture): 1}  # not a lookup


@pytest.mark.parametrize("family", ["linear-td", "softmax-td", "sarsa", "actor-critic"])
def test_the_analysis_of_a_checkpoint_looks_its_family_up_once(family, lookups):
    r = icrl_interp.analyze(SHIPPED / family)
    assert r["sections"]["weights"] == "ok"
    assert dict(lookups) == once(family)


@pytest.mark.parametrize("family", ["linear-td", "softmax-td"])
def test_the_live_analysis_of_a_checkpoint_looks_its_family_up_once(family, lookups):
    r = icrl_interp.analyze(SHIPPED / family, live_tasks=16)  # `analyze --live`'s run, as the report makes it
    assert r["sections"]["value_error"] == "ok" and r["sections"]["probes"] == "ok"
    assert dict(lookups) == once(family)


def test_the_analyze_command_looks_a_checkpoints_family_up_once(lookups, tmp_path, capsys):
    parser = cli.build_parser()  # the parser lists every family's options: not the analysis
    args = parser.parse_args(["analyze", str(SHIPPED / "linear-td"), "--json", str(tmp_path / "a.json")])
    lookups.clear()
    assert args._run(args) == 0
    assert dict(lookups) == once("linear-td")
