"""The mutation run's own parts (tests/mutation.py, docs/development.md "Mutation run"): the mutants it
makes of a known snippet, the deterministic sample, the module -> tests map, the staging of a mutant's
tests from a baseline trace, and the score. No mutant is run here (that takes minutes)."""
from __future__ import annotations

import mutation as M

SNIPPET = b'''"""A docstring: never mutated, nor are 1 or 2.5 in it."""
import os

LIMIT = 2.5


def f(x: int = 1, xs=(), f=None) -> int:
    """Its docstring."""
    if x < 3 and xs:
        os.fsync(x)
    y = min(xs[1:], default=0.975) + x * 2
    return xs[-1] if x >= 0 else y.sum(axis=0)
'''


def _mutants():
    return M.enumerate_mutants("pkg/m.py", SNIPPET)


def test_the_kinds_of_one_line_mutants():
    got = {(m.kind, m.before, m.after) for m in _mutants()}
    want = {
        ("compare", "if x < 3 and xs:", "if x <= 3 and xs:"),
        ("compare", "if x < 3 and xs:", "if x > 3 and xs:"),
        ("compare", "return xs[-1] if x >= 0 else y.sum(axis=0)", "return xs[-1] if x > 0 else y.sum(axis=0)"),
        ("and-or", "if x < 3 and xs:", "if x < 3 or xs:"),
        ("negate", "if x < 3 and xs:", "if not (x < 3 and xs):"),
        ("remove-call", "os.fsync(x)", "pass"),
        ("min-max", "y = min(xs[1:], default=0.975) + x * 2", "y = max(xs[1:], default=0.975) + x * 2"),
        ("constant", "y = min(xs[1:], default=0.975) + x * 2", "y = min(xs[1:], default=0.95) + x * 2"),
        ("constant", "y = min(xs[1:], default=0.975) + x * 2", "y = min(xs[1:], default=0.975) + x * 3"),
        ("arith", "y = min(xs[1:], default=0.975) + x * 2", "y = min(xs[1:], default=0.975) - x * 2"),
        ("arith", "y = min(xs[1:], default=0.975) + x * 2", "y = min(xs[1:], default=0.975) + x / 2"),
        ("slice", "y = min(xs[1:], default=0.975) + x * 2", "y = min(xs[1:-1], default=0.975) + x * 2"),
        ("constant", "y = min(xs[1:], default=0.975) + x * 2", "y = min(xs[0:], default=0.975) + x * 2"),
        ("constant", "return xs[-1] if x >= 0 else y.sum(axis=0)", "return xs[0] if x >= 0 else y.sum(axis=0)"),
        ("axis", "return xs[-1] if x >= 0 else y.sum(axis=0)", "return xs[-1] if x >= 0 else y.sum(axis=1)"),
        ("return-none", "return xs[-1] if x >= 0 else y.sum(axis=0)", "return None"),
        ("constant", "LIMIT = 2.5", "LIMIT = 5.0"),
        ("constant", "def f(x: int = 1, xs=(), f=None) -> int:", "def f(x: int = 0, xs=(), f=None) -> int:"),
    }
    assert want <= got, sorted(want - got)
    assert not any("docstring" in m.before or m.before.startswith("import") for m in _mutants())


def test_a_mutant_is_one_edit_of_the_source_and_knows_where_it_runs():
    by = {(m.kind, m.after): m for m in _mutants()}
    fsync = by[("remove-call", "pass")]
    assert fsync.apply(SNIPPET) == SNIPPET.replace(b"os.fsync(x)", b"pass")
    assert fsync.qualname == "f" and not fsync.module_level and fsync.line == 10
    limit = by[("constant", "LIMIT = 5.0")]
    assert limit.module_level  # runs at import: every test may see it
    default = by[("constant", "def f(x: int = 0, xs=(), f=None) -> int:")]
    assert not default.module_level and set(default.cover) >= set(range(8, 13))  # where f runs without x
    assert len({m.id for m in _mutants()}) == len(_mutants())


def test_new_numbers():
    assert [M.new_number(v) for v in (0, 1, -1, 2, -3, 7)] == [1, 0, 0, 3, -2, 8]
    assert [M.new_number(v) for v in (0.0, 2.5, 0.975, 0.025, 0.5, 1e-12, -0.9)] == \
        [1.0, 5.0, 1 - 2 * (1 - 0.975), 0.05, 1.0, 1e-11, -(1 - 2 * (1 - 0.9))]


def test_the_sample_is_deterministic_and_stable_under_unrelated_mutants():
    ms = _mutants()
    src = {"pkg/m.py": SNIPPET}
    a, b = M.sample(ms, 0, 5, src), M.sample(list(reversed(ms)), 0, 5, src)
    assert [m.id for m in a] == [m.id for m in b] and len(a) == 5
    assert [m.id for m in M.sample(ms, 1, 5, src)] != [m.id for m in a]
    # more mutants elsewhere: the sample of n + k keeps every mutant of the sample of n it can
    more = M.sample(ms, 0, 8, src)
    assert {m.id for m in a} <= {m.id for m in more}


def test_the_map_follows_names_imports_and_overrides():
    tmap = M.module_tests(M.ROOT)
    assert "tests/core/test_files.py" in tmap["icrl_interp/core/files.py"]
    assert "tests/recording/test_shards_refused.py" in tmap["icrl_interp/recording/shards.py"]  # test_<name>_*
    assert "tests/core/test_outputs.py" in tmap["icrl_interp/core/outputs.py"]
    assert "tests/recording/test_live_rows.py" in tmap["icrl_interp/recording/live.py"]
    assert not any(t in M.NEVER for ts in tmap.values() for t in ts)


def test_a_mutant_runs_the_tests_that_reach_its_line_cheapest_file_first():
    m = next(m for m in _mutants() if m.kind == "remove-call")   # line 10, inside f
    base = {"lines": {"t/a.py::t1": [10], "t/b.py::t2": [10, 11], "t/b.py::t3": [4], "fixture:fx": [10]},
            "durations": {"t/a.py::t1": 5.0, "t/b.py::t2": 0.1, "t/b.py::t3": 0.1, "t/b.py::t4": 0.1,
                          "t/c.py::t5": 1.0, "t/c.py::t6": 0.5},
            "fixtures": {"t/c.py::t5": ["fx"], "t/c.py::t6": []}, "spawned": ["t/c.py::t6"], "failed": [],
            "collect": {"t/a.py": 0.1, "t/b.py": 0.1, "t/c.py": 9.0}}
    stages = M.tests_for_mutant(m, base)
    assert stages == [["t/b.py::t2"], ["t/a.py::t1", "t/c.py::t5", "t/c.py::t6"]]
    nowhere = next(x for x in _mutants() if x.line == 12 and x.kind == "return-none")
    assert M.tests_for_mutant(nowhere, {**base, "spawned": []}) == []   # no test reaches line 12: no-tests
    base["failed"] = ["t/b.py::t2"]  # failing without a mutant: never counted as a kill
    assert M.tests_for_mutant(m, base)[0] == ["t/a.py::t1"]


def test_the_score_counts_timeouts_as_kills_and_leaves_out_exclusions():
    ms = M.sample(_mutants(), 0, 4, {"pkg/m.py": SNIPPET})
    results = {ms[0].id: {"status": "killed"}, ms[1].id: {"status": "timeout"}, ms[2].id: {"status": "survived"}}
    excluded = {(ms[3].module, ms[3].before, ms[3].after): "equivalent"}
    row = M.score(ms, results, excluded)["all"]
    assert row["killed"] == 1 and row["timeout"] == 1 and row["survived"] == 1 and row["excluded"] == 1
    assert row["score"] == round(2 / 3, 3)
