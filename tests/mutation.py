"""The project's mutation run: one-line mutants of the package, each run against the tests that cover it.

    .venv/bin/python tests/mutation.py --group integrity --max 120 --out /tmp/mut.json
    .venv/bin/python tests/mutation.py --modules 'icrl_interp/verdicts/behaviour.py' --max 40 --out /tmp/x.json
    .venv/bin/python tests/mutation.py --out /tmp/x.json --report          # scores and survivors, no runs

How it works (docs/development.md, "Mutation run"):
- The working tree (tracked and untracked-not-ignored files) is copied into a temporary directory; the
  mutants are written there and pytest runs there, with the copy first on PYTHONPATH (so subprocesses
  import the copy too). The checkout itself is never written.
- Mutants are one-line edits of the kinds a real slip makes: comparisons flipped or relaxed, arithmetic
  operators swapped, numeric constants changed (2.5 -> 5.0, 0.975 -> 0.95, 1 -> 0, axis 0 <-> 1), a
  condition negated, min <-> max, and <-> or, a call statement or a `raise` removed, `return x` ->
  `return None`, a slice bound moved by one.
- Each module maps to its tests (tests/ mirrors the package: by name and by imports, plus OVERRIDES).
  A baseline run of those tests under a line tracer records which test functions (and which fixtures)
  execute each line, and which tests start subprocesses; a mutant then runs, with `-x`, only the tests
  that execute its line plus the subprocess-starting ones (all of them for module-level lines). A mutant
  whose line no test reaches is `no-tests` (a survivor). A run past its timeout counts as killed.
- Sampling is deterministic (`--seed`, `--max`: the mutants with the smallest hash of seed and id, so a
  sample barely moves when unrelated code changes); results go to a JSON file after every mutant, and a
  rerun with the same `--out` resumes. Equivalent mutants are listed, with a reason, in
  tests/mutation_excluded.json and left out of the score.
"""
from __future__ import annotations

import argparse
import ast
import fnmatch
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from queue import Queue

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "icrl_interp"
EXCLUDED_FILE = ROOT / "tests" / "mutation_excluded.json"

GROUPS: dict[str, list[str]] = {
    # selectors: a module path glob, optionally `::` and a glob over the enclosing qualified name
    "science": ["icrl_interp/tasks/reference.py", "icrl_interp/verdicts/candidates.py", "icrl_interp/analyzers/*.py",
                "icrl_interp/families/*.py", "icrl_interp/interventions/*.py"],
    "baselines": ["icrl_interp/verdicts/behaviour.py", "icrl_interp/verdicts/causal_evidence.py",
                  "icrl_interp/analyzers/td_probe.py", "icrl_interp/interventions/baseline.py",
                  "icrl_interp/interventions/*.py::*permut*", "icrl_interp/interventions/*.py::*null*"],
    "integrity": ["icrl_interp/core/files.py", "icrl_interp/core/outputs.py", "icrl_interp/recording/format.py",
                  "icrl_interp/recording/integrity.py", "icrl_interp/recording/shards.py",
                  "icrl_interp/models/checkpoint.py",
                  "icrl_interp/recording/recorder.py::_prepare*", "icrl_interp/recording/recorder.py::_record_file",
                  "icrl_interp/recording/recorder.py::_record_sharded*", "icrl_interp/recording/recorder.py::_stream",
                  "icrl_interp/recording/recorder.py::_check_positive",
                  "icrl_interp/recording/episodes.py::_record_file", "icrl_interp/recording/episodes.py::_record_sharded*",
                  "icrl_interp/recording/episodes.py::_Job*",
                  "icrl_interp/train/trainer.py::list_checkpoints", "icrl_interp/train/trainer.py::save_checkpoint",
                  "icrl_interp/train/trainer.py::load_resume_state", "icrl_interp/train/trainer.py::_truncate_metrics",
                  "icrl_interp/train/trainer.py::is_run_dir"],
    "live-cli": ["icrl_interp/recording/live.py", "icrl_interp/commands/*.py", "icrl_interp/cli.py"],
}
"""Module groups of the score. A mutant counts in every group whose selector it matches; the glob
over families/ skips the registry (science names the numpy homes of the families)."""
SCIENCE_SKIP = "icrl_interp/families/registry.py"

OVERRIDES: dict[str, list[str]] = {
    # tests that exercise a module without importing it (through the CLI, a reader, a writer ...)
    "icrl_interp/core/files.py": ["tests/core/test_files.py", "tests/recording/test_recording_integrity.py", "tests/models/test_checkpoint.py",
                             "tests/commands/test_bad_inputs.py", "tests/recording/test_shards.py"],
    "icrl_interp/core/outputs.py": ["tests/core/test_files.py", "tests/commands/test_bad_inputs.py", "tests/test_cli.py",
                               "tests/models/test_checkpoint.py", "tests/commands/test_construct.py",
                               "tests/commands/test_train.py", "tests/report/test_report_batch.py"],
    "icrl_interp/recording/format.py": ["tests/recording/test_recording_integrity.py", "tests/recording/test_recording.py",
                                 "tests/recording/test_shards.py", "tests/recording/test_recorder.py",
                                 "tests/analyzers/test_format_v1.py", "tests/commands/test_bad_inputs.py"],
    "icrl_interp/recording/shards.py": ["tests/recording/test_shards.py", "tests/recording/test_recording_integrity.py"],
    "icrl_interp/recording/integrity.py": ["tests/recording/test_recording_integrity.py", "tests/recording/test_recording.py",
                                    "tests/recording/test_shards.py", "tests/commands/test_bad_inputs.py"],
    "icrl_interp/recording/prompts.py": ["tests/recording/test_recorder.py", "tests/recording/test_recorder_refusals.py",
                                  "tests/commands/test_bad_inputs.py"],
    "icrl_interp/models/user.py": ["tests/recording/test_byom_record.py", "tests/recording/test_recorder_refusals.py",
                            "tests/commands/test_bad_inputs.py"],
    "icrl_interp/interventions/*.py": ["tests/interventions/test_causal.py", "tests/interventions/test_mutants_causal.py"],
    "icrl_interp/models/checkpoint.py": ["tests/models/test_checkpoint.py", "tests/commands/test_bad_inputs.py",
                                  "tests/commands/test_construct.py", "tests/analyzers/test_format_v1.py"],
    "icrl_interp/recording/recorder.py": ["tests/recording/test_recorder.py", "tests/recording/test_shards.py",
                                "tests/recording/test_byom_record.py", "tests/recording/test_recording_integrity.py"],
    "icrl_interp/recording/live.py": ["tests/analyzers/test_live.py", "tests/commands/test_bad_inputs.py",
                                      "tests/analyzers/test_resolve_once.py"],
    "icrl_interp/analyzers/probes.py": ["tests/analyzers/test_td_probe.py", "tests/analyzers/test_td_probe_honest.py",
                                        "tests/analyzers/test_mutants_probes.py", "tests/analyzers/test_analyze.py"],
    "icrl_interp/analyzers/[abk]*.py": ["tests/analyzers/test_analyzer_plugin.py", "tests/analyzers/test_analyze.py",
                                        "tests/analyzers/test_readout.py", "tests/analyzers/test_resolve_once.py"],
    "icrl_interp/analyzers/registry.py": ["tests/analyzers/test_analyzer_plugin.py"],
    "icrl_interp/models/config.py": ["tests/analyzers/test_resolve_once.py"],
    "icrl_interp/cli.py": ["tests/test_cli.py", "tests/commands/test_bad_inputs.py"],
    "icrl_interp/commands/*.py": ["tests/test_cli.py", "tests/commands/test_bad_inputs.py"],
    "icrl_interp/train/trainer.py": ["tests/train/test_trainer.py", "tests/commands/test_train.py"],
}
"""Extra tests per module glob, added to those found by name and by imports."""
ONLY: dict[str, list[str]] = {
    # modules imported by a great many tests (to build fixtures): their map is these files (plus the
    # name-matched ones), not every importer; a baseline of two dozen files costs half an hour
    "icrl_interp/models/checkpoint.py": ["tests/models/test_checkpoint.py", "tests/commands/test_bad_inputs.py",
                                  "tests/commands/test_construct.py", "tests/commands/test_inspect.py",
                                  "tests/analyzers/test_format_v1.py", "tests/train/test_trainer.py"],
    "icrl_interp/recording/format.py": ["tests/recording/test_recording.py", "tests/recording/test_shards.py",
                                 "tests/recording/test_shards_refused.py", "tests/recording/test_recorder.py",
                                 "tests/analyzers/test_format_v1.py", "tests/commands/test_bad_inputs.py",
                                 "tests/recording/test_recording_integrity.py"],
    "icrl_interp/core/files.py": ["tests/core/test_files.py", "tests/recording/test_recording_integrity.py", "tests/models/test_checkpoint.py",
                             "tests/commands/test_bad_inputs.py", "tests/recording/test_shards.py",
                             "tests/report/test_report_dir.py"],
    "icrl_interp/recording/recorder.py": ["tests/recording/test_recorder.py", "tests/recording/test_shards.py",
                                "tests/recording/test_shards_refused.py", "tests/recording/test_shard_kills.py",
                                "tests/recording/test_byom_record.py", "tests/recording/test_recording_integrity.py",
                                "tests/analyzers/test_live.py", "tests/commands/test_bad_inputs.py"],
}
"""Modules whose test map is exactly the listed files (those that exist) plus the name-matched ones."""
NEVER = {"tests/test_docs.py", "tests/test_packaging.py", "tests/test_layering.py", "tests/test_reproductions.py"}
"""Tests that build the docs or the wheel, or read the import graph: slow, and no test of behaviour."""

# ------------------------------------------------------------------------------------------ mutants


@dataclass
class Mutant:
    id: str
    module: str          # path relative to the repository root
    qualname: str        # enclosing def/class, '<module>' at top level
    line: int            # first changed line (1-based)
    kind: str
    before: str          # the changed lines, stripped (' / ' between lines)
    after: str
    start: int = field(repr=False, default=0)   # byte offsets of the replaced span
    stop: int = field(repr=False, default=0)
    text: bytes = field(repr=False, default=b"")
    cover: tuple[int, ...] = field(repr=False, default=())   # lines whose execution reaches the mutant
    module_level: bool = field(repr=False, default=False)    # runs at import: every test may see it

    def apply(self, source: bytes) -> bytes:
        return source[:self.start] + self.text + source[self.stop:]


CMP_SWAPS = {ast.Lt: ["<=", ">"], ast.LtE: ["<", ">="], ast.Gt: [">=", "<"], ast.GtE: [">", "<="],
             ast.Eq: ["!="], ast.NotEq: ["=="], ast.Is: ["is not"], ast.IsNot: ["is"],
             ast.In: ["not in"], ast.NotIn: ["in"]}
CMP_TEXT = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
            ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in"}
BIN_SWAPS = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "/"), ast.Div: ("/", "*"),
             ast.FloorDiv: ("//", "/"), ast.Mod: ("%", "//"), ast.Pow: ("**", "*"),
             ast.BitAnd: ("&", "|"), ast.BitOr: ("|", "&")}
NAME_SWAPS = {"min": "max", "max": "min", "any": "all", "all": "any"}
ATTR_SWAPS = {"min": "max", "max": "min", "argmin": "argmax", "argmax": "argmin", "minimum": "maximum",
              "maximum": "minimum", "nanmin": "nanmax", "nanmax": "nanmin", "amin": "amax", "amax": "amin",
              "any": "all", "all": "any", "floor": "ceil", "ceil": "floor"}
AXIS_WORDS = {"axis", "dim", "ddof", "axes"}


def new_number(v):
    """The changed constant: 1 -> 0, 0 -> 1, n -> n + 1 (toward zero for negatives), 2.5 -> 5.0,
    0.975 -> 0.95, 0.025 -> 0.05, a small tolerance 1e-12 -> 1e-11."""
    if isinstance(v, int):
        return {0: 1, 1: 0, -1: 0}.get(v, v + 1)
    if v == 0.0:
        return 1.0
    a = abs(v)
    if a < 0.01:
        return v * 10
    if 0.5 < a < 1:
        return (1 - 2 * (1 - a)) * (1 if v > 0 else -1)
    return v * 2


def number_text(v) -> str:
    return repr(v) if isinstance(v, float) else str(v)


class _Enumerator(ast.NodeVisitor):
    def __init__(self, module: str, source: bytes):
        self.module, self.src = module, source
        self.tree = ast.parse(source)
        self.starts = [0]
        for line in source.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))
        self.lines = source.decode().splitlines()
        self.out: list[tuple] = []   # (start, stop, text, kind, qualname, cover, module_level)
        self.scope: list[str] = []
        self.in_function = 0
        self.cover: tuple[int, ...] = ()

    # -- positions
    def off(self, lineno: int, col: int) -> int:
        return self.starts[lineno - 1] + col

    def span(self, node) -> tuple[int, int]:
        return self.off(node.lineno, node.col_offset), self.off(node.end_lineno, node.end_col_offset)

    def seg(self, node) -> bytes:
        a, b = self.span(node)
        return self.src[a:b]

    def add(self, a: int, b: int, text: str | bytes, kind: str) -> None:
        if isinstance(text, str):
            text = text.encode()
        if self.src[a:b] == text:
            return
        line = self.src.count(b"\n", 0, a) + 1
        if "pragma: no mutate" in self.lines[line - 1]:
            return
        self.out.append((a, b, text, kind, ".".join(self.scope) or "<module>", self.cover, not self.in_function))

    def op_span(self, gap_a: int, gap_b: int, op: str) -> tuple[int, int] | None:
        """The operator token `op` in the source between two operands (only parentheses, spaces,
        line continuations and comments besides it)."""
        gap = self.src[gap_a:gap_b].decode()
        pattern = r"\s+".join(re.escape(w) for w in op.split())
        if op[0].isalpha():
            pattern = r"\b" + pattern + r"\b"
        code = re.sub(r"#[^\n]*", lambda m: " " * len(m.group()), gap)
        hits = [m for m in re.finditer(pattern, code)]
        for m in hits:
            rest = code[:m.start()] + code[m.end():]
            if re.fullmatch(r"[\s()\\]*", rest):
                a = gap_a + len(gap[:m.start()].encode())
                return a, a + len(gap[m.start():m.end()].encode())
        return None

    def set_cover(self, first: int, last: int) -> None:
        self.cover = tuple(range(first, last + 1))

    # -- scopes and statements
    def _scoped(self, node, function: bool):
        self.set_cover(node.lineno, node.lineno)
        for d in node.decorator_list:
            self.visit(d)
        if function:
            # a default is evaluated at import, but it matters where the function runs without that
            # argument: its tests are those that run the function's body
            self.set_cover(node.body[0].lineno, node.end_lineno)
            self.in_function += 1
            self.visit(node.args)
            self.in_function -= 1
        else:
            for b in node.bases + node.keywords:
                self.visit(b)
        self.scope.append(node.name)
        self.in_function += function
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            body = body[1:]   # the docstring
        for stmt in body:
            self.visit(stmt)
        self.in_function -= function
        self.scope.pop()

    def visit_FunctionDef(self, node):
        self._scoped(node, True)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        self._scoped(node, False)

    def visit_arguments(self, node):
        for d in node.defaults + [d for d in node.kw_defaults if d is not None]:
            self.visit(d)

    def visit_arg(self, node):
        pass   # annotations

    def visit_AnnAssign(self, node):
        self.set_cover(node.lineno, node.end_lineno)
        if node.value is not None:
            self.visit(node.value)

    def generic_visit(self, node):
        if isinstance(node, ast.stmt):
            header = {ast.If: "test", ast.While: "test", ast.For: "iter", ast.With: "items",
                      ast.Try: None, ast.Match: "subject"}
            kind = type(node)
            if kind in header:
                attr = header[kind]
                last = node.lineno
                if attr == "items":
                    last = max(i.context_expr.end_lineno for i in node.items)
                elif attr:
                    last = getattr(node, attr).end_lineno
                self.set_cover(node.lineno, last)
            else:
                self.set_cover(node.lineno, node.end_lineno)
        super().generic_visit(node)

    def visit_Module(self, node):
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]
        for stmt in body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in stmt.targets):
                continue
            self.visit(stmt)

    def visit_If(self, node):
        t = node.test
        text = ast.unparse(t)
        if text == "TYPE_CHECKING" or "__name__" in text:
            return
        self.generic_visit_stmt_header(node, node.lineno, t.end_lineno)
        self.negate(t)
        self.visit(t)
        for s in node.body + node.orelse:
            self.visit(s)

    def visit_While(self, node):
        self.generic_visit_stmt_header(node, node.lineno, node.test.end_lineno)
        self.negate(node.test)
        self.generic_visit(node)

    def generic_visit_stmt_header(self, node, first, last):
        self.set_cover(first, last)

    def visit_IfExp(self, node):
        self.negate(node.test)
        self.generic_visit(node)

    def visit_comprehension(self, node):
        for cond in node.ifs:
            self.negate(cond)
        self.generic_visit(node)

    def negate(self, test):
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return   # removing the `not` is its own mutant
        a, b = self.span(test)
        self.add(a, b, b"not (" + self.src[a:b] + b")", "negate")

    def visit_Expr(self, node):
        self.set_cover(node.lineno, node.end_lineno)
        if isinstance(node.value, (ast.Call, ast.Await)):
            a, b = self.span(node)
            self.add(a, b, "pass", "remove-call")
        self.generic_visit(node)

    def visit_Raise(self, node):
        self.set_cover(node.lineno, node.end_lineno)
        a, b = self.span(node)
        self.add(a, b, "pass", "remove-raise")
        self.generic_visit(node)

    def visit_Return(self, node):
        self.set_cover(node.lineno, node.end_lineno)
        v = node.value
        if v is not None and not (isinstance(v, ast.Constant) and v.value is None):
            a, b = self.span(v)
            self.add(a, b, "None", "return-none")
        self.generic_visit(node)

    def visit_Assert(self, node):
        pass   # internal invariants: negating one fails everywhere, removing one changes nothing

    # -- expressions
    def visit_Compare(self, node):
        left = node.left
        for op, right in zip(node.ops, node.comparators):
            found = self.op_span(self.span(left)[1], self.span(right)[0], CMP_TEXT[type(op)])
            if found:
                for repl in CMP_SWAPS[type(op)]:
                    self.add(*found, repl, "compare")
            left = right
        self.generic_visit(node)

    def visit_BinOp(self, node):
        # a path join `d / "x.json"` or a string `+`, swapped, only raises a TypeError: not worth a mutant
        if type(node.op) in BIN_SWAPS and not (_is_text(node.left) or _is_text(node.right)):
            op, repl = BIN_SWAPS[type(node.op)]
            found = self.op_span(self.span(node.left)[1], self.span(node.right)[0], op)
            if found:
                self.add(*found, repl, "arith")
        self.generic_visit(node)

    def visit_AugAssign(self, node):
        self.set_cover(node.lineno, node.end_lineno)
        if type(node.op) in BIN_SWAPS:
            op, repl = BIN_SWAPS[type(node.op)]
            found = self.op_span(self.span(node.target)[1], self.span(node.value)[0], op + "=")
            if found:
                self.add(*found, repl + "=", "arith")
        self.generic_visit(node)

    def visit_BoolOp(self, node):
        op, repl = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
        found = self.op_span(self.span(node.values[0])[1], self.span(node.values[1])[0], op)
        if found:
            self.add(*found, repl, "and-or")
        self.generic_visit(node)

    def visit_UnaryOp(self, node):
        a, b = self.span(node)
        if isinstance(node.op, ast.Not):
            self.add(a, b, b"(" + self.seg(node.operand) + b")", "remove-not")
        elif isinstance(node.op, ast.USub):
            c = node.operand
            if isinstance(c, ast.Constant) and type(c.value) in (int, float):
                self.number(node, -c.value)
                return
            self.add(a, b, b"(" + self.seg(c) + b")", "remove-minus")
        self.generic_visit(node)

    def visit_Constant(self, node):
        if type(node.value) in (int, float):
            self.number(node, node.value)
        elif type(node.value) is bool:
            a, b = self.span(node)
            self.add(a, b, str(not node.value), "bool")

    def number(self, node, value):
        a, b = self.span(node)
        new = new_number(value)
        text = number_text(new)
        old = self.src[a:b].decode().lstrip("-")
        if isinstance(new, int) and old[:2].lower() in ("0o", "0x", "0b"):
            text = format(new, "#" + old[1].lower())   # 0o644 -> 0o645, in the literal's own base
        if new < 0 or (isinstance(new, float) and text.startswith("-")):
            text = f"({text})"
        self.add(a, b, text, self.number_kind)

    number_kind = "constant"

    def visit_keyword(self, node):
        if node.arg in AXIS_WORDS:
            self.number_kind = "axis"
            self.visit(node.value)
            self.number_kind = "constant"
        else:
            self.visit(node.value)

    def visit_Call(self, node):
        f = node.func
        if isinstance(f, ast.Name) and f.id in NAME_SWAPS:
            a, b = self.span(f)
            self.add(a, b, NAME_SWAPS[f.id], "min-max")
        elif isinstance(f, ast.Attribute) and f.attr in ATTR_SWAPS:
            b = self.span(f)[1]
            if self.src[b - len(f.attr):b].decode() == f.attr:
                self.add(b - len(f.attr), b, ATTR_SWAPS[f.attr], "min-max")
        self.generic_visit(node)

    def visit_JoinedStr(self, node):
        pass   # messages; and expression positions inside f-strings are unreliable before Python 3.12

    def visit_Slice(self, node):
        s = node
        if s.step is None:
            lo = self.seg(s.lower).decode() if s.lower else ""
            hi = self.seg(s.upper).decode() if s.upper else ""
            a, b = self.span(s)
            variants = []
            if s.lower is None and s.upper is not None:
                variants.append(f"1:{hi}")
            if s.upper is None and s.lower is not None:
                variants.append(f"{lo}:-1")
            if s.lower is not None and not _is_number(s.lower):
                variants.append(f"({lo}) + 1:{hi}")
            if s.upper is not None and not _is_number(s.upper):
                variants.append(f"{lo}:({hi}) - 1")
            if _is_number(s.lower) and s.upper is not None:
                variants.append(f":{hi}")
            if _is_number(s.upper) and s.lower is not None:
                variants.append(f"{lo}:")
            for v in variants:
                self.add(a, b, v, "slice")
        self.generic_visit(node)


def _is_text(node) -> bool:
    return isinstance(node, ast.JoinedStr) or isinstance(node, ast.Constant) and isinstance(node.value, str)


def _is_number(node) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant) and type(node.value) in (int, float)


def _changed_lines(source: bytes, a: int, b: int, text: bytes) -> tuple[str, str, int]:
    first = source.rfind(b"\n", 0, a) + 1
    end = source.find(b"\n", max(a, b))
    end = len(source) if end < 0 else end
    before = source[first:end]
    after = source[first:a] + text + source[b:end]
    def flat(x: bytes) -> str:
        return " / ".join(s.strip() for s in x.decode().splitlines() if s.strip())
    return flat(before), flat(after), source.count(b"\n", 0, a) + 1


def enumerate_mutants(module: str, source: bytes) -> list[Mutant]:
    """Every mutant of one module, in source order (each differs from the original source; whether it parses
    is checked when it is sampled, `parses`)."""
    e = _Enumerator(module, source)
    e.visit(e.tree)
    seen, counts, out = set(), {}, []
    for a, b, text, kind, qual, cover, top in sorted(e.out, key=lambda t: (t[0], t[1], t[2])):
        if (a, b, text) in seen:
            continue
        seen.add((a, b, text))
        before, after, line = _changed_lines(source, a, b, text)
        key = (module, before, after)
        n = counts[key] = counts.get(key, -1) + 1
        mid = hashlib.sha1("\0".join([module, before, after, str(n)]).encode()).hexdigest()[:12]
        out.append(Mutant(mid, module, qual, line, kind, before, after, a, b, text,
                          tuple(sorted(set(cover) | {line})), top))
    return out


# ------------------------------------------------------------------------------------------ test map

def _imports(path: Path) -> set[str]:
    """Dotted names a test file imports (package modules and sibling helper modules)."""
    try:
        tree = ast.parse(path.read_bytes())
    except SyntaxError:
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                names.update(f"helper:{a.name}" for a in node.names)
                if base:
                    names.add(f"helper:{base}")
                continue
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
            if base.startswith("tests.") or "." not in base:
                names.add(f"helper:{base.split('.')[-1]}")
    return names


def module_tests(root: Path) -> dict[str, list[str]]:
    """module path -> test files (relative paths), by name, by imports (through helper modules) and OVERRIDES."""
    tests_dir = root / "tests"
    files = sorted(p for p in tests_dir.rglob("*.py") if "fixtures" not in p.parts)
    helpers = {p.stem: p for p in files if not p.name.startswith("test_") and p.name != "conftest.py"}
    imports = {p: _imports(p) for p in files}
    # helper modules pass on what they import (to a fixed point)
    reach = {p: set(imports[p]) for p in files}
    for _ in range(4):
        for p in files:
            for name in list(reach[p]):
                if name.startswith("helper:") and name[7:] in helpers:
                    reach[p] |= reach[helpers[name[7:]]]
    modules = sorted(str(p.relative_to(root)) for p in (root / PACKAGE).rglob("*.py"))
    out = {}
    for m in modules:
        dotted = m[:-3].replace("/", ".").removesuffix(".__init__")
        stem = Path(m).stem
        tests = [p for p in files if p.name.startswith("test_") and str(p.relative_to(root)) not in NEVER]
        by_name = {str(p.relative_to(root)) for p in tests if p.stem == f"test_{stem}" or p.stem.startswith(f"test_{stem}_")}
        if m in ONLY:
            out[m] = sorted(by_name | {f for f in ONLY[m] if (root / f).exists()})
            continue
        chosen = by_name | {str(p.relative_to(root)) for p in tests if dotted in imports[p]}
        if not chosen:   # only through a helper module (tests/helpers.py, analyzer_data.py, ...)
            chosen = {str(p.relative_to(root)) for p in tests if dotted in reach[p]}
        for pattern, extra in OVERRIDES.items():
            if fnmatch.fnmatch(m, pattern):
                chosen.update(e for e in extra if (root / e).exists())
        out[m] = sorted(chosen)
    return out


# ------------------------------------------------------------------------------------------ the copy

TRACER = textwrap.dedent('''
    """pytest plugin written into the mutation copy: which test (or fixture) executes which lines of the
    traced modules, how long each test takes, which tests start processes, which fail."""
    import json, os, sys, threading, time
    import pytest

    _TARGETS = set(os.environ["MUTATION_TRACE_FILES"].split(os.pathsep))
    _lines = {}
    _cur = set()
    _ctx = ["<collect>"]
    _spawned, _failed, _dur, _fixtures, _collect = set(), set(), {}, {}, {}

    def _local(frame, event, arg):
        if event == "line":
            _cur.add((frame.f_code.co_filename, frame.f_lineno))
        return _local

    def _global(frame, event, arg):
        if frame.f_code.co_filename in _TARGETS:
            return _local
        return None

    def _enter(ctx):
        global _cur
        _ctx.append(ctx)
        _cur = _lines.setdefault(ctx, set())

    def _leave():
        global _cur
        _ctx.pop()
        _cur = _lines.setdefault(_ctx[-1], set())

    def _wrap(owner, name):
        orig = getattr(owner, name, None)
        if orig is None:
            return
        def spawn(*a, **k):
            _spawned.add(_ctx[-1])
            return orig(*a, **k)
        setattr(owner, name, spawn)

    import subprocess, multiprocessing.process
    _wrap(subprocess.Popen, "__init__")
    _wrap(os, "fork")
    _wrap(os, "posix_spawn")
    _wrap(multiprocessing.process.BaseProcess, "start")
    sys.settrace(_global)
    threading.settrace(_global)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        _fixtures[item.nodeid] = list(getattr(item, "fixturenames", ()))
        _enter(item.nodeid)
        t = time.perf_counter()
        try:
            yield
        finally:
            _dur[item.nodeid] = time.perf_counter() - t
            _leave()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(fixturedef, request):
        # a fixture's lines belong to every test that uses it (a session fixture runs once)
        item = next((c for c in reversed(_ctx) if "::" in c and not c.startswith("fixture:")), "")
        _enter("fixture:" + fixturedef.argname + "@" + item.split("::")[0])
        try:
            yield
        finally:
            _leave()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_make_collect_report(collector):
        t = time.perf_counter()
        yield
        if isinstance(collector, pytest.Module):
            _collect[collector.nodeid] = time.perf_counter() - t

    def pytest_runtest_logreport(report):
        if report.failed:
            _failed.add(report.nodeid)

    def pytest_sessionfinish(session, exitstatus):
        sys.settrace(None)
        threading.settrace(None)
        lines = {}
        for ctx, hits in _lines.items():
            for file, line in hits:
                lines.setdefault(file, {}).setdefault(ctx, []).append(line)
        with open(os.environ["MUTATION_TRACE_OUT"], "w") as f:
            json.dump({"lines": lines, "spawned": sorted(_spawned), "failed": sorted(_failed),
                       "durations": _dur, "fixtures": _fixtures, "collect": _collect, "exit": int(exitstatus)}, f)
''')


def tree_files(root: Path) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         check=True, capture_output=True).stdout.decode().split("\0")
    return sorted({f for f in out if f and (root / f).is_file() and not (root / f).is_symlink()})


def make_copy(root: Path, files: list[str]) -> Path:
    dest = Path(tempfile.mkdtemp(prefix="icrl-mutation-"))
    for f in files:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / f, dest / f)
    (dest / "_mutation_trace.py").write_text(TRACER)
    return dest


def child_env(copy: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(copy)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    env.pop("PYTEST_ADDOPTS", None)
    return env


def check_copy(copy: Path) -> None:
    """The copy's package, not the checkout's editable install, is the one imported (also in children)."""
    got = subprocess.run([sys.executable, "-c", f"import {PACKAGE}; print({PACKAGE}.__file__)"], cwd=copy,
                         env=child_env(copy), capture_output=True, text=True, timeout=120)
    where = got.stdout.strip()
    if got.returncode or not Path(where).resolve().is_relative_to(copy.resolve()):
        sys.exit(f"mutation: the copy imports {where or got.stderr.strip()[-300:]}, not {copy}")


LIVE: set[subprocess.Popen] = set()
"""Test runs in progress (each in its own session), killed with their children when the tool stops."""


def _kill(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _stop(signum, frame):
    raise SystemExit(f"mutation: stopped by signal {signum}; results so far are saved")


def run_pytest(copy: Path, args: list[str], timeout: float, extra_env: dict | None = None) -> tuple[str, float, str]:
    """('passed' | 'failed' | 'timeout' | 'error', seconds, tail of the output)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not slow",
           "--no-header", "-W", "ignore::pytest.PytestUnknownMarkWarning", *args]
    env = child_env(copy)
    env.update(extra_env or {})
    t = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=copy, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    LIVE.add(p)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(p)
        out, _ = p.communicate()
        return "timeout", time.perf_counter() - t, out.decode(errors="replace")[-2000:]
    finally:
        _kill(p)   # the test run's own children too (its session), on a timeout or when we are stopped
        LIVE.discard(p)
    dt = time.perf_counter() - t
    text = out.decode(errors="replace")[-2000:]
    # 0 passed, 1 tests failed, 2 interrupted (a collection error: the mutant broke an import), 5 none ran
    status = {0: "passed", 1: "failed", 2: "failed"}.get(p.returncode, "error")
    return status, dt, text


# ------------------------------------------------------------------------------------------ baseline

def _file_of(ctx: str) -> str:
    return ctx.rpartition("@")[2] if ctx.startswith("fixture:") else ctx.split("::")[0]


def trace(copy: Path, modules: list[str], tmap: dict[str, list[str]], traces: dict, timeout: float) -> dict:
    """The baselines of `modules`: their test files run under the line tracer, once for all modules.
    Traces are kept per module and test file (`traces[module][file]`, keyed by both files' SHA-256), so an
    edit re-traces only the test files it touched. Returns, per module, the merged baseline: lines per
    test / fixture context, durations, collection times, failing and process-starting tests."""
    sha = lambda f: hashlib.sha256((copy / f).read_bytes()).hexdigest()  # noqa: E731
    keys = {m: {f: [sha(m), sha(f)] for f in tmap[m]} for m in modules}
    need = {m: [f for f in tmap[m] if traces.setdefault(m, {}).get(f, {}).get("key") != keys[m][f]] for m in modules}
    files = sorted({f for fs in need.values() for f in fs})
    if files:
        out = copy / ".mutation-trace.json"
        out.unlink(missing_ok=True)
        traced = [m for m in modules if need[m]]
        print(f"baseline: {len(files)} test file(s) under the line tracer, for {len(traced)} module(s) ...", flush=True)
        status, dt, text = run_pytest(copy, ["-p", "_mutation_trace", "--continue-on-collection-errors",
                                             "--maxfail=1000000", *files], timeout,
                                      {"MUTATION_TRACE_FILES": os.pathsep.join(str((copy / m).resolve()) for m in traced),
                                       "MUTATION_TRACE_OUT": str(out)})
        if not out.exists():
            raise RuntimeError(f"the baseline wrote no trace ({status}):\n{text}")
        data = json.loads(out.read_text())
        overhead = max(0.0, dt - sum(data["durations"].values()) - sum(data["collect"].values()))
        for m in traced:
            lines = data["lines"].get(str((copy / m).resolve()), {})
            for f in tmap[m]:   # every file that ran, also those already traced (now fresh)
                if f not in files:
                    continue
                mine = lambda ctx: _file_of(ctx) == f   # noqa: E731
                traces[m][f] = {"key": keys[m][f], "startup": overhead,
                                "lines": {c: v for c, v in lines.items() if mine(c)},
                                "durations": {t: v for t, v in data["durations"].items() if mine(t)},
                                "fixtures": {t: v for t, v in data["fixtures"].items() if mine(t)},
                                "spawned": [t for t in data["spawned"] if mine(t)],
                                "failed": [t for t in data["failed"] if mine(t)],
                                "collect": data["collect"].get(f, 0.0)}
        failed = sorted(data["failed"])
        if failed:
            print(f"  warning: {len(failed)} test(s) fail without a mutant and are left out: "
                  + ", ".join(failed[:4]) + (" ..." if len(failed) > 4 else ""), flush=True)
        print(f"  {len(data['durations'])} tests, {dt:.0f} s", flush=True)
    return {m: _merge([traces[m][f] for f in tmap[m]]) for m in modules}


def _merge(parts: list[dict]) -> dict:
    base = {"lines": {}, "durations": {}, "fixtures": {}, "spawned": [], "failed": [], "collect": {},
            "startup": max([c["startup"] for c in parts] or [0.0])}
    for c in parts:
        for ctx, lines in c["lines"].items():
            base["lines"].setdefault(ctx.rpartition("@")[0] if ctx.startswith("fixture:") else ctx, []).extend(lines)
        for k in ("durations", "fixtures"):
            base[k].update(c[k])
        base["spawned"] += c["spawned"]
        base["failed"] += c["failed"]
        for t in c["durations"]:
            base["collect"].setdefault(t.split("::")[0], c["collect"])
    return base


def tests_for_mutant(m: Mutant, base: dict) -> list[list[str]]:
    """The tests to run, in stages: first the test file (of those whose tests execute the mutant's line,
    directly or in a fixture) that is cheapest to collect and run, then the other covering tests and the
    subprocess-starting ones; every test of the module for a module-level line. Empty: no test reaches it."""
    ran = [t for t in base["durations"] if t not in base["failed"]]
    if m.module_level:
        first = ran
    else:
        cover = set(m.cover)
        hit_ctx = {ctx for ctx, lines in base["lines"].items() if cover.intersection(lines)}
        fixtures = {c[8:] for c in hit_ctx if c.startswith("fixture:")}
        first = [t for t in ran if t in hit_ctx or fixtures.intersection(base["fixtures"].get(t, ()))]
    rest = [t for t in ran if t in base["spawned"] and t not in first]
    if not first:
        return [rest] if rest else []
    files: dict[str, list[str]] = {}
    for t in sorted(first, key=lambda t: base["durations"][t]):   # -x: the quickest killer first
        files.setdefault(t.split("::")[0], []).append(t)
    cost = {f: base.get("collect", {}).get(f, 0.0) + sum(base["durations"][t] for t in ts) for f, ts in files.items()}
    cheapest = min(files, key=cost.get)
    later = [t for f in sorted(files, key=cost.get) if f != cheapest for t in files[f]] + rest
    return [files[cheapest]] + ([later] if later else [])


# ------------------------------------------------------------------------------------------ selection

def parse_selector(sel: str) -> tuple[str, str]:
    path, _, qual = sel.partition("::")
    return path, qual or "*"


def matches(m: Mutant, selectors: list[str]) -> bool:
    for sel in selectors:
        path, qual = parse_selector(sel)
        if fnmatch.fnmatch(m.module, path) and (qual == "*" or fnmatch.fnmatch(m.qualname, qual)
                                                  or fnmatch.fnmatch(m.qualname.split(".")[0], qual)):
            if path.endswith("families/*.py") and fnmatch.fnmatch(m.module, SCIENCE_SKIP):
                continue
            return True
    return False


def groups_of(m: Mutant) -> list[str]:
    return [g for g, sels in GROUPS.items() if matches(m, sels)]


def collect(root: Path, selectors: list[str]) -> tuple[list[Mutant], dict[str, bytes]]:
    """The mutants of the selected modules, and the sources they were made from (a snapshot: other
    people may edit the checkout during a run)."""
    modules = sorted({str(p.relative_to(root)) for p in (root / PACKAGE).rglob("*.py")})
    out, sources = [], {}
    for mod in modules:
        if any(fnmatch.fnmatch(mod, parse_selector(s)[0]) for s in selectors):
            sources[mod] = (root / mod).read_bytes()
            out += [m for m in enumerate_mutants(mod, sources[mod]) if matches(m, selectors)]
    return out, sources


def parses(m: Mutant, source: bytes) -> bool:
    try:
        compile(m.apply(source), m.module, "exec", ast.PyCF_ONLY_AST)
    except SyntaxError:
        return False
    return True


def sample(mutants: list[Mutant], seed: int, n: int | None, sources: dict[str, bytes]) -> list[Mutant]:
    """The n mutants (that parse) with the smallest hash of (seed, id): deterministic, and stable under
    unrelated edits."""
    ranked = sorted(mutants, key=lambda m: hashlib.sha1(f"{seed}:{m.id}".encode()).hexdigest())
    chosen = []
    for m in ranked:
        if n is not None and len(chosen) == n:
            break
        if parses(m, sources[m.module]):
            chosen.append(m)
    return sorted(chosen, key=lambda m: (m.module, m.line, m.id))


def load_excluded(path: Path) -> dict[tuple[str, str, str], str]:
    if not path.exists():
        return {}
    return {(e["module"], e["before"], e["after"]): e["reason"] for e in json.loads(path.read_text())["excluded"]}


# ------------------------------------------------------------------------------------------ results

class Results:
    def __init__(self, path: Path):
        self.path = path
        self.data = json.loads(path.read_text()) if path.exists() else {"mutants": {}, "traces": {}}

    def save(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True))
        os.replace(tmp, self.path)


def score(mutants: list[Mutant], results: dict, excluded: dict) -> dict:
    """Per group (and 'all'): killed / (mutants - excluded - errors - not run)."""
    table = {}
    for m in mutants:
        r = results.get(m.id)
        status = "excluded" if (m.module, m.before, m.after) in excluded else (r or {}).get("status", "not-run")
        for g in groups_of(m) + ["all"]:
            row = table.setdefault(g, {})
            row[status] = row.get(status, 0) + 1
    for row in table.values():
        killed = row.get("killed", 0) + row.get("timeout", 0)
        counted = killed + row.get("survived", 0) + row.get("no-tests", 0)
        row["score"] = round(killed / counted, 3) if counted else None
    return table


def print_report(mutants, results, excluded, show_survivors=True) -> None:
    table = score(mutants, results, excluded)
    cols = ["killed", "timeout", "survived", "no-tests", "excluded", "error", "not-run"]
    print(f"\n{'group':<10} " + " ".join(f"{c:>8}" for c in cols) + "    score")
    for g, row in table.items():
        s = "   -" if row["score"] is None else f"{100 * row['score']:5.1f} %"
        print(f"{g:<10} " + " ".join(f"{row.get(c, 0):>8}" for c in cols) + f"  {s}")
    if show_survivors:
        surv = [m for m in mutants if results.get(m.id, {}).get("status") in ("survived", "no-tests")
                and (m.module, m.before, m.after) not in excluded]
        if surv:
            print(f"\nsurvivors ({len(surv)}):")
        for m in surv:
            r = results[m.id]
            print(f"  {m.module}:{m.line} [{m.kind}] {m.qualname} ({r['status']}, {len(r.get('tests', []))} tests)\n"
                  f"      - {m.before}\n      + {m.after}")


# ------------------------------------------------------------------------------------------ main

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modules", nargs="+", default=[], metavar="GLOB",
                    help="module path globs, optionally PATH::QUALNAME-GLOB (e.g. 'icrl_interp/recording/recorder.py::_stream')")
    ap.add_argument("--group", nargs="+", default=[], choices=sorted(GROUPS), help="the modules of score groups")
    ap.add_argument("--max", type=int, default=None, help="sample at most N mutants (deterministic in --seed)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kinds", nargs="+", default=None, help="only these mutant kinds (see --list)")
    ap.add_argument("--out", type=Path, default=Path("mutation-results.json"), help="results JSON (resumed)")
    ap.add_argument("--retry", nargs="*", default=["error"], metavar="STATUS",
                    help="rerun stored results with these statuses (default: error); e.g. --retry survived no-tests")
    ap.add_argument("--jobs", type=int, default=1, help="parallel mutants (each its own copy); default 1")
    ap.add_argument("--timeout-factor", type=float, default=3.0,
                    help="a mutant's timeout: factor x the baseline time of its tests + start-up + 30 s")
    ap.add_argument("--exclusions", type=Path, default=EXCLUDED_FILE)
    ap.add_argument("--list", action="store_true", help="list the sampled mutants and exit")
    ap.add_argument("--report", action="store_true", help="print scores and survivors from --out, run nothing")
    ap.add_argument("--keep", action="store_true", help="keep the temporary copy")
    ap.add_argument("--map", action="store_true", help="print the module -> tests map and exit")
    ap.add_argument("--skip-tests", nargs="+", default=[], metavar="GLOB",
                    help="leave these test files out of the map (e.g. to score the suite before new tests)")
    a = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)

    if a.map:
        for mod, tests in module_tests(ROOT).items():
            print(mod, "->", " ".join(tests) or "(none)")
        return 0
    selectors = a.modules + [s for g in a.group for s in GROUPS[g]]
    if not selectors:
        ap.error("name --modules or --group")
    mutants, sources = collect(ROOT, selectors)
    if a.kinds:
        mutants = [m for m in mutants if m.kind in a.kinds]
    chosen = sample(mutants, a.seed, a.max, sources)
    excluded = load_excluded(a.exclusions)
    print(f"{len(mutants)} mutants in {len({m.module for m in mutants})} module(s); {len(chosen)} sampled (seed {a.seed})")
    if a.list:
        for m in chosen:
            print(f"{m.id} {m.module}:{m.line} [{m.kind}] {m.qualname}\n    - {m.before}\n    + {m.after}")
        return 0
    res = Results(a.out)
    if a.report:
        print_report(chosen, res.data["mutants"], excluded)
        return 0

    todo = [m for m in chosen if (m.module, m.before, m.after) not in excluded
            and res.data["mutants"].get(m.id, {}).get("status", "not-run") in set(a.retry) | {"not-run"}]
    print(f"{len(chosen) - len(todo)} already in {a.out} or excluded; {len(todo)} to run")
    if not todo:
        print_report(chosen, res.data["mutants"], excluded)
        return 0
    files = tree_files(ROOT)
    tmap = {m: [t for t in ts if not any(fnmatch.fnmatch(t, g) for g in a.skip_tests)]
            for m, ts in module_tests(ROOT).items()}
    copies: Queue = Queue()
    made = [make_copy(ROOT, files) for _ in range(max(1, a.jobs))]
    try:
        for c in made:
            for mod, src in sources.items():
                (c / mod).write_bytes(src)
            check_copy(c)
            copies.put(c)
        res.data.pop("baselines", None)   # the format of an earlier version of this script
        bases = trace(made[0], sorted({m.module for m in todo}), tmap, res.data.setdefault("traces", {}), timeout=7200)
        res.save()

        def one(m: Mutant) -> dict:
            base = bases[m.module]
            stages = tests_for_mutant(m, base)
            tests = [t for s in stages for t in s]
            rec = {"module": m.module, "line": m.line, "kind": m.kind, "qualname": m.qualname,
                   "before": m.before, "after": m.after, "groups": groups_of(m), "tests": tests}
            if not tests:
                return rec | {"status": "no-tests", "seconds": 0.0}
            copy = copies.get()
            path = copy / m.module
            original = sources[m.module]
            try:
                path.write_bytes(m.apply(original))
                for pyc in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
                    pyc.unlink()   # a same-size mutant within one second would otherwise reuse a stale pyc
                dt = 0.0
                for stage in stages:
                    work = sum(base["durations"].get(t, 1.0) for t in stage) + \
                        sum(base["collect"].get(f, 0.0) for f in {t.split("::")[0] for t in stage})
                    limit = a.timeout_factor * work + base["startup"] + 30
                    status, sec, text = run_pytest(copy, stage, limit)
                    dt += sec
                    if status != "passed":
                        break
            finally:
                path.write_bytes(original)
                for pyc in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
                    pyc.unlink()
                copies.put(copy)
            status = {"failed": "killed", "passed": "survived"}.get(status, status)
            killer = re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.M)
            rec |= {"status": status, "seconds": round(dt, 2), "killed_by": killer[:1]}
            if status == "error":
                rec["output"] = text[-800:]
            return rec

        t0 = time.perf_counter()
        pool = ThreadPoolExecutor(a.jobs) if a.jobs > 1 else None
        results = pool.map(one, todo) if pool else map(one, todo)
        for done, (m, rec) in enumerate(zip(todo, results), 1):
            res.data["mutants"][m.id] = rec
            res.save()
            print(f"[{done}/{len(todo)} {time.perf_counter() - t0:5.0f}s] {rec['status']:<9} "
                  f"{m.module}:{m.line} [{m.kind}] {m.before[:60]!r} -> {m.after[:60]!r} "
                  f"({len(rec['tests'])} tests, {rec['seconds']:.1f} s)", flush=True)
        if pool:
            pool.shutdown()
    finally:
        for p in list(LIVE):
            _kill(p)
        if not a.keep:
            for c in made:
                shutil.rmtree(c, ignore_errors=True)
        else:
            print("kept:", *made)
    print_report(chosen, res.data["mutants"], excluded)
    return 0


if __name__ == "__main__":
    sys.exit(main())
