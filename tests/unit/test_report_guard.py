"""The test suite's own guard (tests/conftest.py `pytest_runtest_makereport`): a failing test is reported as one
failure even when the garbage collector, while pytest parses the test's source to format the failure, runs a
finalizer that parses source itself (as logging a traceback does on CPython 3.11). Without the guard CPython 3.11
fails pytest's parse ("AST constructor recursion depth mismatch") and pytest ends the whole session with an
INTERNALERROR, the other tests never run: what stopped a CI run after 16 minutes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

INNER = '''
import ast
import gc


class Finalized:
    """Garbage in a cycle whose finalizer parses source, and leaves such garbage again: there is always some."""

    def __init__(self):
        self.me = self

    def __del__(self):
        ast.parse("x = (1 + 2) * f(y)")
        Finalized()


def test_fails_with_garbage_pending():
    gc.set_threshold(10, 1, 1)
    Finalized()
    assert 1 + 1 == 3


def test_runs_after_it():
    assert True
'''


def run_inner(tmp_path: Path, *plugin: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_inner.py").write_text(
        INNER + "".join(f"\n\ndef pad_{i}(a):\n    return a + {i}\n" for i in range(200))
    )
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin, "-q", "--tb=short",
         "test_inner.py"],
        cwd=tmp_path, env={"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def test_a_failure_formatted_during_a_collection_is_one_failed_test(tmp_path: Path) -> None:
    guarded = run_inner(tmp_path, "-p", "conftest")  # tests/conftest.py, as every run of this suite loads it
    assert "INTERNALERROR" not in guarded.stdout + guarded.stderr
    assert "1 failed, 1 passed" in guarded.stdout, guarded.stdout[-2000:]


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the nested-parse fault is CPython 3.11's (3.11.2, 3.11.7)")
def test_without_the_guard_this_python_stops_the_session(tmp_path: Path) -> None:
    """The inner test does reach the fault: unguarded, pytest stops at the failure (exit 3) and runs nothing more."""
    bare = run_inner(tmp_path)
    assert bare.returncode == 3 and "AST constructor recursion depth mismatch" in bare.stdout + bare.stderr
