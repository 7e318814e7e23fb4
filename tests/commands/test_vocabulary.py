"""One flag vocabulary (`icrl_interp.core.vocabulary`): every flag of every command, walked from the real
parsers (sub-commands of `construct` and `train` included), is in the table, for that command, with one
spelling and one kind of value; every old spelling is refused with one line naming the new one."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io

import pytest

from icrl_interp import cli
from icrl_interp.core import cli_fields, vocabulary
from icrl_interp.families import registry

PACKAGE_FAMILIES = ("linear-td", "softmax-td", "sarsa", "actor-critic")


def parsers(parser: argparse.ArgumentParser, command: str = "") -> list[tuple[str, argparse.ArgumentParser]]:
    """(command path, parser) of `parser` and every sub-command under it, a family's flags filled in."""
    if hasattr(parser, "fill"):
        parser.fill()  # `train FAMILY` adds its config's flags on first use
    out = [(command, parser)] if command else []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                if command.split(" ")[0] in ("construct", "train") and name not in PACKAGE_FAMILIES:
                    continue  # a family another test registered: its own fields are not the package's vocabulary
                out += parsers(child, f"{command} {name}".strip())
    return out


def flags(walked) -> list[tuple[str, argparse.Action]]:
    """(command, action) of every flag a user can give (help and refused old spellings aside)."""
    return [(command, a) for command, p in walked for a in p._actions
            if a.option_strings and not isinstance(a, (argparse._HelpAction, vocabulary.Refused))]


def kind(action: argparse.Action) -> str:
    """What a flag takes: 'switch', or the type of its value(s)."""
    if action.nargs == 0:
        return "switch"
    name = getattr(action.type, "__name__", "str") if action.type is not None else "str"
    return f"{name}{'...' if action.nargs in ('*', '+') else ''}"


def problems(pairs, table=vocabulary.FLAGS) -> list[str]:
    """What breaks the vocabulary's rules among `pairs` of (command, flag action)."""
    out, kinds = [], {}
    for command, action in pairs:
        name = action.option_strings[0]
        if action.option_strings not in ([name], [name, "--no-" + name[2:]]):
            out.append(f"{command}: {' / '.join(action.option_strings)}: one meaning, several spellings")
        entry = table.get(name)
        if entry is None:
            out.append(f"{command}: {name} is not in core.vocabulary.FLAGS")
        elif not vocabulary.applies(entry.commands, command):
            out.append(f"{command}: {name} means '{entry.meaning}' in {', '.join(entry.commands)}; "
                       "list this command only if it means the same here")
        kinds.setdefault(name, {}).setdefault(kind(action), command)
    out += [f"{name} takes {' and '.join(f'{k} ({c})' for k, c in ks.items())}: one spelling, two meanings"
            for name, ks in kinds.items() if len(ks) > 1]
    return out


@pytest.fixture(scope="module")
def walked():
    return parsers(cli.build_parser())


def test_the_walk_reaches_every_command_and_family(walked):
    commands = {c for c, _ in walked}
    assert set(cli.COMMANDS) <= commands
    assert {f"{c} {f}" for c in ("construct", "train") for f in PACKAGE_FAMILIES} <= commands
    names = {a.option_strings[0] for _, a in flags(walked)}
    assert {"--prompt-seed", "--split-seed", "--direction-seed", "--n-states", "--critic-step"} <= names
    assert len(flags(walked)) > 300


def test_every_flag_is_the_vocabularys_with_one_spelling_and_one_meaning(walked):
    found = problems(flags(walked))
    assert not found, "\n".join(found)


def test_the_checks_catch_an_alias_an_unknown_flag_a_second_meaning_and_a_wrong_command():
    p = argparse.ArgumentParser()
    p.add_argument("--states", "--n-states", type=int)  # two spellings of one meaning
    p.add_argument("--bogus")  # not in the table
    p.add_argument("--prompts", type=int)  # a count where the vocabulary's --prompts is a file
    p.add_argument("--layer", type=int)  # causal's flag, in another command
    q = argparse.ArgumentParser()
    q.add_argument("--prompts")
    found = problems([*flags([("demo", p)]), *flags([("record", q)])])
    assert any("several spellings" in f for f in found)
    assert any("--bogus is not in" in f for f in found)
    assert any("--prompts takes int (demo) and str (record)" in f for f in found)
    assert any(f.startswith("demo: --layer means") for f in found)
    assert not problems(flags([("record", q)]))


def test_each_meaning_has_one_flag_and_each_flag_is_used(walked):
    meanings = [f.meaning.lower() for f in vocabulary.FLAGS.values()]
    assert len(set(meanings)) == len(meanings)
    used = {a.option_strings[0] for _, a in flags(walked)}
    assert not set(vocabulary.FLAGS) - used, "flags in the table that no command has"


def test_old_spellings_are_not_current_flags_and_each_is_refused_somewhere(walked):
    refused = {(c, a.option_strings[0]) for c, p in walked for a in p._actions if isinstance(a, vocabulary.Refused)}
    for old, where in vocabulary.RENAMED.items():
        for scope in where:
            hits = [c for c, o in refused if o == old and vocabulary.applies((scope,), c)]
            assert hits, f"{old} of {scope} is refused nowhere (its new spelling is missing there?)"
    for command, p in walked:
        current = {o for a in p._actions if not isinstance(a, vocabulary.Refused) for o in a.option_strings}
        assert not current & {o for c, o in refused if c == command}


def _refusals():
    walked = parsers(cli.build_parser())
    return sorted((c, a.option_strings[0], a.new) for c, p in walked for a in p._actions
                  if isinstance(a, vocabulary.Refused))


@pytest.mark.parametrize("command, old, new", _refusals(), ids=lambda x: x if isinstance(x, str) else None)
def test_an_old_spelling_is_refused_in_one_line_naming_the_new_one(command, old, new):
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = cli.main([*command.split(), old, "1"])
    assert code == 2 and out.getvalue() == ""
    assert err.getvalue() == f"icrl-interp {command}: error: {vocabulary.message(old, new)}\n"
    assert new == vocabulary.renamed_in(command)[old] and new


def test_the_message_names_every_new_spelling():
    assert vocabulary.message("--seed", ("--prompt-seed",)) == "--seed is now --prompt-seed"
    assert (vocabulary.message("--seed", ("--prompt-seed", "--split-seed", "--direction-seed"))
            == "--seed is now --prompt-seed, --split-seed and --direction-seed")


def test_the_issue_s_seeds_have_one_spelling():
    """The sampler's seed was `record --seed`, `analyze --live --prompt-seed` and `verdict --record-seed`;
    `causal --seed` seeded tasks, split and directions at once."""
    renamed = vocabulary.renamed_in
    assert renamed("record")["--seed"] == ("--prompt-seed",) and renamed("verdict")["--record-seed"] == ("--prompt-seed",)
    assert renamed("causal")["--seed"] == ("--prompt-seed", "--split-seed", "--direction-seed")
    assert "--seed" not in renamed("train linear-td")  # the training run's seed keeps its name


@dataclasses.dataclass
class Opts:
    n_states: int = 3
    """States."""
    tied: bool = True
    """Shared weights."""
    seed: int = dataclasses.field(default=0, metadata={"flag": "--split-seed"})
    """A field whose name is kept in a file format."""


def test_a_field_s_flag_is_its_name_or_its_metadata_and_old_option_keys_are_read_with_a_warning():
    p = argparse.ArgumentParser()
    names = cli_fields.add_fields(p, Opts)
    assert cli_fields.given(p.parse_args(["--split-seed", "4"]), names) == {"seed": 4}
    assert cli_fields.flag(Opts, "seed") == "--split-seed" and cli_fields.flag(Opts, "n_states") == "--n-states"
    with pytest.warns(DeprecationWarning, match="'states' is now 'n_states'"):
        assert cli_fields.build(Opts, {"states": 7}).n_states == 7
    with pytest.warns(DeprecationWarning, match="'untied' is now 'tied' \\(negated\\)"):
        assert cli_fields.build(Opts, {"untied": True}).tied is False
    with pytest.warns(DeprecationWarning):
        assert cli_fields.build(Opts, {"states": 7, "n_states": 5}).n_states == 5  # the new key wins


def test_construct_options_keep_their_old_python_keys_for_one_release():
    from icrl_interp.models.construct import task_config

    with pytest.warns(DeprecationWarning, match="'layers' is now 'n_layers'"):
        old = task_config("linear-td", {"layers": 2, "states": 4, "untied": True})
    new = task_config("linear-td", {"n_layers": 2, "n_states": 4, "tied": False})
    assert old.model == new.model and old.task == new.task and new.model.n_layers == 2 and not new.model.tied
    assert registry.get("sarsa").construct(n_states=2, n_actions=3).plan().task["n_actions"] == 3
