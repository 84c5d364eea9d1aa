"""Issue 61, item 5: one word per idea. Every ``specgate.<dotted>`` name the code, the docs, the
README and the tests cite is a module or an attribute that exists (a module gone since was cited in 8
places); "sleep level" is never a bare "level"; the arrangement of the
servers is never called a "design" (its older spelling, still read from old rigs and reports, aside);
no session object is named after the package."""

from __future__ import annotations

import ast
import functools
import importlib
import io
import re
import tokenize
from pathlib import Path

import pytest
from sources import parsed

from specgate.serve.extensions import MODEL_PREPARED, SERVER_ENV

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "specgate"
CITED = re.compile(r"(?<![\w./-])specgate(?:\.[A-Za-z_]\w*)+")
# Cited names that are not modules: the entry-point groups other distributions plug into, and the
# stand-in modules of the import-graph tests.
NOT_MODULES = {SERVER_ENV, MODEL_PREPARED, "specgate.x", "specgate.y"}


def _cited_in() -> list[Path]:
    return [*sorted(PACKAGE.rglob("*.py")), *sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md",
            *sorted((ROOT / "tests").rglob("*.py"))]


@functools.cache
def resolves(name: str) -> bool:
    """``name`` is a module, or a module's attribute (or an attribute of one)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(found, attr):  # a dataclass's or pydantic model's field without a default is one too
                return attr in {*getattr(found, "__dataclass_fields__", {}), *getattr(found, "model_fields", {})}
            found = getattr(found, attr)
        return True
    return False


def test_every_cited_specgate_name_exists():
    missing = {}
    for path in _cited_in():
        for match in CITED.finditer(path.read_text(errors="replace")):
            name = match.group(0)
            if name not in NOT_MODULES and not resolves(name):
                missing.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert missing == {}, f"cited, but no such module or attribute: {missing}"


def test_the_citation_check_tells_a_module_and_an_attribute_from_a_name_that_is_gone():
    gone = "specgate." + "gating"  # written so that this file cites nothing that is gone
    assert resolves("specgate.decide.settings") and resolves("specgate.decide.settings.RunSettings.window")
    assert resolves("specgate.decide.settings.RunSettings.rig")  # a dataclass field without a default
    assert not resolves(gone) and not resolves("specgate.decide.settings." + "settings_for")
    assert [m.group(0) for m in CITED.finditer(f"see {gone}.GATES, specgate/gating.py, pytest_specgate.x")] \
        == [f"{gone}.GATES"]


def _prose(path: Path) -> list[tuple[int, str]]:
    """The strings and comments of a module: what a user or a reader reads."""
    kinds = {tokenize.STRING, tokenize.COMMENT, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}
    return [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
            if tok.type in kinds]


# "level" in a text about sleep mode, not preceded by "sleep" (nor a name: level=, .level, ``level``,
# sleep_level, module level)
BARE_LEVEL = re.compile(r"(?i)(?<!sleep )(?<!sleep-)(?<![\w?.(`])(?<!module )(?<!module-)levels?\b(?![_=`)\]])")


def test_a_sleep_level_is_never_a_bare_level():
    found = [f"{path.relative_to(ROOT)}:{line}: {match.group(0)!r} in {text.strip()[:100]!r}"
             for path in sorted(PACKAGE.rglob("*.py")) for line, text in _prose(path)
             if re.search(r"(?i)\bsleep|\balternation", text) for match in BARE_LEVEL.finditer(text)]
    assert found == []


def test_the_bare_level_check_sees_what_it_should():
    assert [m.group(0) for m in BARE_LEVEL.finditer(
        "it sleeps at level 2; Levels: sleep level 1, sleep-level-1 servers, ``level``, sleep_level, "
        "/sleep?level=1, module level")] == ["level", "Levels"]


# "design" for the arrangement of the servers: its older spelling (a rig's key, an option's alias, a
# report's key before 2026-12-05) is still read, and named so; the word's other senses are fine
DESIGN_OTHER_SENSES = re.compile(r"design[ _]effect|by design|of the design|older spelling|before 2026-12-05"
                                 r"|--specgate-design|rig\.design|['\"]design['\"]|``design``")


def test_the_arrangement_is_never_called_a_design():
    found = [f"{path.relative_to(ROOT)}:{line}: {text.strip()[:100]!r}"
             for path in sorted(PACKAGE.rglob("*.py")) for line, text in _prose(path)
             if re.search(r"(?i)\bdesigns?\b", DESIGN_OTHER_SENSES.sub("", text))
             and not re.search("older spelling|before 2026-12-05", text)]
    assert found == []


def _session_named_after_the_package(tree: ast.AST) -> list[int]:
    """Lines where a name, parameter or attribute called ``specgate`` is bound (a module's own
    ``import specgate`` aside)."""
    found = []
    for node in ast.walk(tree):
        bound = isinstance(node, ast.arg) or (isinstance(node, ast.Name | ast.Attribute)
                                              and isinstance(node.ctx, ast.Store))
        if bound and getattr(node, "arg", getattr(node, "id", getattr(node, "attr", None))) == "specgate":
            found.append(node.lineno)
    return found


def test_no_session_object_is_named_after_the_package():
    paths = [*PACKAGE.rglob("*.py"), *(ROOT / "lab").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]
    found = [f"{path.relative_to(ROOT)}:{line}" for path in sorted(paths)
             for line in _session_named_after_the_package(parsed(path))]
    assert found == []
    assert _session_named_after_the_package(ast.parse("def f(specgate):\n    self.specgate = specgate\n")) == [1, 2]
