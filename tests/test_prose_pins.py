"""Tests that pin a message's words pin them in one place (issue 53): a phrase asserted to appear in
a message, an output or a rendered line is checked by one test file; the others check the figures
(a result's details) or compose the words from the code that writes them."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest
from sources import parsed

pytestmark = pytest.mark.fast

TESTS = Path(__file__).resolve().parent
# Shorter literals are punctuation, names or units ("::", "FAILED"), not a message's wording.
MIN_PHRASE = 20
# What pytest itself prints (its --setup-plan lines), not specgate's words.
NOT_OURS = ("SETUP    ",)


def pinned_phrases(path: Path) -> set[str]:
    """The string literals ``path`` asserts to be ``in`` something (a message, an output, a line)."""
    found = set()
    for node in ast.walk(parsed(path)):
        if not isinstance(node, ast.Assert):
            continue
        for compare in ast.walk(node.test):
            if (isinstance(compare, ast.Compare) and any(isinstance(op, ast.In) for op in compare.ops)
                    and isinstance(compare.left, ast.Constant) and isinstance(compare.left.value, str)):
                phrase = compare.left.value
                if len(phrase) >= MIN_PHRASE and not phrase.startswith(NOT_OURS):
                    found.add(phrase)
    return found


def phrases_pinned_twice(root: Path) -> dict[str, list[str]]:
    where = defaultdict(list)
    for path in sorted(root.glob("test_*.py")):
        for phrase in pinned_phrases(path):
            where[phrase].append(path.name)
    return {phrase: files for phrase, files in where.items() if len(files) > 1}


def test_each_phrase_of_a_message_is_pinned_by_one_test_file():
    twice = phrases_pinned_twice(TESTS)
    assert not twice, "phrases pinned in more than one test file (keep one, check figures elsewhere):\n" + "\n".join(
        f"  {phrase!r}: {', '.join(files)}" for phrase, files in sorted(twice.items()))


def test_the_scan_finds_a_phrase_pinned_twice(tmp_path):
    check = 'def test_x(result):\n    assert "the gate decided nothing here" in result.message\n'
    (tmp_path / "test_a.py").write_text(check)
    (tmp_path / "test_b.py").write_text(check + '    assert "::" in result.message\n')
    pytest_line = 'def test_y(out):\n    assert "SETUP    S vllm_server (fixtures used)" in out\n'
    (tmp_path / "test_c.py").write_text(pytest_line)
    (tmp_path / "test_d.py").write_text(pytest_line)
    assert phrases_pinned_twice(tmp_path) == {"the gate decided nothing here": ["test_a.py", "test_b.py"]}
