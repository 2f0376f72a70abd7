"""The site files at the repository root are exactly what ``_pth`` renders from linted code."""

from __future__ import annotations

import ast

import pytest

import _reloadpg_autopatch_boot as _boot
import reloadpg_autopatch._startup as _bootstrap
from reloadpg_autopatch._startup import pth as _pth
from tests.support.venv import ROOT

pytestmark = pytest.mark.startup


def test_pth_and_start_files_match_their_source() -> None:
    assert (ROOT / _pth.PTH_NAME).read_text(encoding="utf-8") == _pth.render_pth()
    assert (ROOT / _pth.START_NAME).read_text(encoding="utf-8") == _pth.render_start()


def test_pth_is_one_import_line_that_reads_the_gate_first() -> None:
    text = _pth.render_pth()
    assert text.count("\n") == 1
    assert text.endswith("\n")
    assert text.startswith("import ")  # site.py runs only lines starting with "import "
    tree = ast.parse(text)
    assert [type(node).__name__ for node in tree.body] == ["Import", "Expr"]
    assert [alias.name for alias in tree.body[0].names] == ["os", "sys"]
    # The gate is compared before anything of ours can be imported: `<off test> or exec(...)`.
    test = tree.body[1].value
    assert isinstance(test, ast.BoolOp)
    assert isinstance(test.op, ast.Or)
    assert _bootstrap.GATE in ast.unparse(test.values[0])
    assert "reloadpg_autopatch" not in ast.unparse(test.values[0])
    assert ast.literal_eval(test.values[0].comparators[0]) == _bootstrap.OFF_VALUES
    # A second pass over the file (a venv) stops before compiling the guard.
    assert ast.unparse(test.values[1]) == f"getattr(sys, {_pth.RAN!r}, False)"


def test_guard_source_compiles_and_catches_everything() -> None:
    source = _pth._guard_source()
    compile(source, "<guard>", "exec")
    assert "except BaseException" in source
    assert "#" not in source  # no comment is compiled at each start
    # The body sets the flag the line reads before it tries anything that could fail.
    assert source.startswith(f"import sys\nsys.{_pth.RAN} = True\ntry:\n")


def test_start_entry_point_names_the_bootstrap_callable() -> None:
    module, _, name = _pth.ENTRY_POINT.partition(":")
    assert module == _boot.__name__
    assert callable(getattr(_boot, name))
