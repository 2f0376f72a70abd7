"""The tests' own layout (issue 40): test files are named for their subject and import no other.

A test file holds one subject and is named for it, so that a new test of a promise has one
obvious home (CONTRIBUTING.md, "Where a test goes"); a name that says how its tests came (a
list of promises, a round of fixes, blind spots) tells a newcomer nothing of where the next one
goes. And no file imports a test module, the benchmarks and scripts included: a helper that two
files use lives in ``tests/support``, where it has a public name and one home. The oracle is
the files themselves, read with ``ast``; nothing is imported.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

from tests.support import ROOT

#: The folders whose ``test_*.py`` files are test modules (``tests/conftest.py``'s kinds).
TEST_FOLDERS = ("ranks", "unit", "install")
#: A dotted name inside one of them: a test module, or the folder itself.
TEST_MODULE = re.compile(rf"^tests\.(?:{'|'.join(TEST_FOLDERS)})(?:\.|$)")
#: Words of a file name that say how its tests came, not what they are about. "round" is a
#: round of fixes ("round3"); the store's rounds ("test_store_rounds") are a subject.
HISTORY_WORDS = re.compile(
    r"^(?:promises?|round\d*|blind|spots|undefended|reliability|mutations?|issue\d*|misc)$"
)


def _python_files(root: Path) -> list[Path]:
    """Every Python file of the checkout (or of an unpacked sdist), venvs and builds aside."""
    skip = {"build", "dist", "node_modules", "__pycache__"}
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d[:1] != "." and d not in skip and "egg-info" not in d]
        found += [Path(folder, name) for name in files if name.endswith(".py")]
    return sorted(found)


def imported_test_modules(source: str) -> list[str]:
    """The test modules (or test folders) ``source`` imports, by their dotted names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if TEST_MODULE.match(alias.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if TEST_MODULE.match(node.module):
                found.append(node.module)
            elif node.module == "tests":
                found += [f"tests.{a.name}" for a in node.names if a.name in TEST_FOLDERS]
        elif isinstance(node, ast.Call) and node.args:
            called = ast.unparse(node.func)
            first = node.args[0]
            if called.endswith(("import_module", "__import__")) and (
                isinstance(first, ast.Constant)
                and isinstance(first.value, str)
                and TEST_MODULE.match(first.value)
            ):
                found.append(first.value)
    return found


def history_words(name: str) -> list[str]:
    """The words of a test file's name that say how its tests came."""
    stem = name.removesuffix(".py").removeprefix("test_")
    return [word for word in stem.split("_") if HISTORY_WORDS.match(word)]


def test_the_rule_finds_every_way_of_importing_a_test_module() -> None:
    """The check below is only as good as this reading of a file: each spelling is found, and
    the helpers' home is not."""
    source = "\n".join(
        [
            "import tests.ranks.test_a",
            "from tests.ranks.test_b import helper",
            "from tests.unit import test_c",
            "from tests import install",
            "def f():",
            "    from tests.install.test_d import x",
            "    importlib.import_module('tests.ranks.test_e')",
            "    __import__('tests.unit.test_f')",
            "from tests.support import ranks",
            "from tests.support.ranks import run_ranks",
            "import tests.support.stores",
            "from .test_g import y",
        ]
    )
    assert sorted(imported_test_modules(source)) == [
        "tests.install",
        "tests.install.test_d",
        "tests.ranks.test_a",
        "tests.ranks.test_b",
        "tests.ranks.test_e",
        "tests.unit",
        "tests.unit.test_f",
    ]
    assert history_words("test_promises_round3.py") == ["promises", "round3"]
    assert history_words("test_undefended_promises.py") == ["undefended", "promises"]
    assert history_words("test_blind_spots.py") == ["blind", "spots"]
    assert history_words("test_reliability.py") == ["reliability"]
    assert history_words("test_store_rounds.py") == []
    assert history_words("test_suspend_refusals.py") == []


def test_no_file_imports_a_test_module() -> None:
    """Tests, support modules, benchmarks, scripts and the package: none imports a module of
    ``tests/ranks``, ``tests/unit`` or ``tests/install``. A helper two files share goes to
    ``tests/support``, under a public name."""
    offenders = {}
    for path in _python_files(ROOT):
        found = imported_test_modules(path.read_text(encoding="utf-8"))
        if found:
            offenders[path.relative_to(ROOT).as_posix()] = found
    assert not offenders, (
        "test modules imported (move the helpers to a module of tests/support named for what "
        f"they hold): {offenders}"
    )


def test_every_test_file_is_named_for_its_subject() -> None:
    """No test file's name says how its tests came: CONTRIBUTING.md, "Where a test goes", lists
    the subjects of ``tests/ranks``."""
    named_by_history = {
        f"tests/{folder}/{path.name}": history_words(path.name)
        for folder in TEST_FOLDERS
        for path in sorted((ROOT / "tests" / folder).glob("test_*.py"))
        if history_words(path.name)
    }
    assert not named_by_history, named_by_history


def test_every_rank_test_file_says_which_promises_it_holds() -> None:
    """Each file of ``tests/ranks`` opens with a docstring: the promises of its subject."""
    bare = [
        path.name
        for path in sorted((ROOT / "tests" / "ranks").glob("test_*.py"))
        if not ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert not bare, bare
