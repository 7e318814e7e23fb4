"""The report directory under faults: a report killed at any point is the package's own and is taken
over by the next one (its temporary files removed), a directory of the user's never is, and two
reports never write one directory at once."""
from __future__ import annotations

import os

import pytest
from matplotlib.figure import Figure

from icrl_interp.core import files
from icrl_interp.core.errors import UserError
from icrl_interp.core.outputs import is_ours
from icrl_interp.report.batch import REPORT_LOCK, claim_out_dir, is_report_dir, writing_report
from icrl_interp.report.causal import save


def _figure(path):
    fig = Figure(figsize=(1, 1))
    fig.add_subplot().axis("off")
    return save(fig, path)


def test_a_killed_report_is_taken_over_and_its_temporary_files_removed(tmp_path):
    rep = tmp_path / "rep"
    with writing_report(rep):  # what a report killed before its summary leaves
        (rep / "cache").mkdir()
        (rep / "cache" / "ab.json").write_text("{}")
        (rep / "figures").mkdir()
        _figure(rep / "figures" / "linear-td-a.png")
        _figure(rep / "figures" / "linear-td-a.svg")
        (rep / ".summary.json.abcd_123.tmp").write_text("half")
        (rep / "cache" / ".cd.json.abcd_123.tmp").write_text("half")
        (rep / "figures" / ".linear-td-b.png.abcd_123.png").write_bytes(b"\x89PNG\r\n\x1a\nhalf")
    assert (rep / REPORT_LOCK).is_file() and not (rep / "summary.json").exists()
    assert is_report_dir(rep) and claim_out_dir(rep) == rep  # no manifest: its figures are marked as ours
    assert all(is_ours(p) for p in (rep / "figures").glob("linear-td-a.*"))
    with writing_report(rep):
        pass
    assert sorted(str(p.relative_to(rep)) for p in rep.rglob("*")) == [
        REPORT_LOCK, "cache", "cache/ab.json", "figures", "figures/linear-td-a.png", "figures/linear-td-a.svg"]

    (rep / "figures" / "mine.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 32)  # unmarked: the user's
    with pytest.raises(UserError, match="mine.png is not a figure this report wrote"):
        claim_out_dir(rep)


def test_a_directory_of_the_users_is_never_taken_for_a_report(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    (mine / ".a.json.abcd_123.tmp").write_text("mine, named like a temporary file")
    assert not is_report_dir(mine)
    with pytest.raises(UserError, match="holds files that are not a report icrl-interp wrote"):
        claim_out_dir(mine)
    with writing_report(mine):  # build_report writes where its caller says; it removes nothing of the user's
        pass
    assert sorted(p.name for p in mine.iterdir()) == [".a.json.abcd_123.tmp", "notes.txt"]  # no lock file left
    (mine / REPORT_LOCK).write_text('{"schema": "icrl_interp.other/1"}')  # not a lock file of ours
    assert not is_report_dir(mine)


def test_two_reports_never_write_one_directory_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "LOCK_WAIT_S", 0.05)
    rep = tmp_path / "rep"
    with writing_report(rep):
        with pytest.raises(UserError, match=rf"the report directory {rep} is being written by process {os.getpid()}"):
            with writing_report(rep):
                pass
