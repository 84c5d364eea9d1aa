"""Text a user can see in specgate/ (messages, help, report text, docstrings) speaks of the user's rig:
it cites no lab history (docs/journal, a lab visit, the lab's machine) and no lab tool; the journal
holds that story (docs/journal/)."""

import ast
import re
from pathlib import Path

import pytest
from sources import parsed

pytestmark = pytest.mark.fast

PACKAGE = Path(__file__).resolve().parent.parent / "specgate"
LAB_HISTORY = re.compile(r"journal|\bvisits?\b|\bH200\b|\blab\b|specgate[_-]lab", re.IGNORECASE)


def citations(tree: ast.AST, name: str) -> list[str]:
    """``name:line: text`` for every string literal (docstrings and f-string parts included) citing lab history."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for match in LAB_HISTORY.finditer(node.value):
                line = node.lineno + node.value.count("\n", 0, match.start())
                text = node.value[max(0, match.start() - 40):match.end() + 40].replace("\n", " ")
                found.append(f"{name}:{line}: {text!r}")
    return found


def test_no_string_in_the_product_cites_lab_history():
    found = [c for path in sorted(PACKAGE.rglob("*.py"))
             for c in citations(parsed(path), str(path.relative_to(PACKAGE.parent)))]
    assert found == [], "\n".join(found)


def test_the_scan_finds_each_kind_of_citation_and_leaves_labels_alone():
    source = '''
"""Module help (docs/journal/lab/x.md)."""
def f(label):
    """Measured on the H200."""
    raise ValueError(f"{label}: seen on a lab visit")
HELP = "the label, the labels, a collaborator"
'''
    found = citations(ast.parse(source), "m.py")
    assert [c.split(": ", 1)[0] for c in found] == ["m.py:2", "m.py:2", "m.py:4", "m.py:5", "m.py:5"]
