"""Decisions apart from words (issue 61, build item 3): the deciding layer (specgate/decide/) returns
outcomes, rules and figures, and specgate/report/ words them. This test scans the deciding layer's
source for a sentence composed at run time.

The rule: in specgate/decide/, no expression builds a string out of parts where the string's fixed
text holds a space, namely

- an f-string (``ast.JoinedStr``) whose literal parts, joined, hold a space;
- ``"...".format(...)`` on a string literal;
- ``"..." % ...`` on a string literal;

except inside a ``raise`` statement (an error for the caller, about its arguments: an exception's
message is not a verdict). A string built with no space in its fixed text is a key or an identifier
(``f"pos{n}"``, ``f"{mode}@{side}"``) and is allowed; so are plain string constants (a method's name,
a rule's name), which compose nothing.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

DECIDE = Path(__file__).resolve().parents[1] / "specgate" / "decide"


def sentences(source: str) -> list[int]:
    """The lines of ``source`` where a sentence is composed (see the module's docstring)."""
    tree = ast.parse(source)
    raised = {id(node) for r in ast.walk(tree) if isinstance(r, ast.Raise) and r.exc is not None
              for node in ast.walk(r.exc)}
    found = []
    for node in ast.walk(tree):
        if id(node) in raised:
            continue
        literal = None
        if isinstance(node, ast.JoinedStr):
            literal = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
            literal = literal if " " in literal else None
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
            literal = node.func.value.value if isinstance(node.func.value, ast.Constant) else None
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant):
            literal = node.left.value
        if isinstance(literal, str):
            found.append(node.lineno)
    return sorted(found)


def test_the_deciding_layer_composes_no_sentence() -> None:
    paths = sorted(DECIDE.rglob("*.py"))
    assert len(paths) >= 10  # the layer is there
    found = {str(p.relative_to(DECIDE.parent)): lines for p in paths if (lines := sentences(p.read_text()))}
    assert found == {}, f"sentences composed in the deciding layer (word them in specgate/report/): {found}"


def test_the_scan_finds_each_kind_of_sentence_and_leaves_keys_and_errors_alone() -> None:
    source = '''
x = f"{a} is {b:.1f} % slower"
y = "{} of {}".format(a, b)
z = "%s pairs" % n
key = f"pos{n}"
pair = f"{mode}@{side}"
name = "prompts as strata"
if bad:
    raise ValueError(f"threshold must be positive, got {t!r}")
'''
    assert sentences(source) == [2, 3, 4]
