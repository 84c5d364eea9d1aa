"""What a clone of main gets: a tree within its size budget, and docs whose every cited path is in it."""

from __future__ import annotations

import glob
import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
TREE_BUDGET_BYTES = 21_000_000  # the whole tracked tree, evidence and fixtures included (20 MB until 2026-12-06)
# Where a cited repository path starts; anything else (/tmp/..., .specgate/runs/..., ~/...) is an
# output or a user's path, not the repository's.
TOP = ("docs", "specgate", "specgate_lab", "tests", "fixtures", "benchmarks", "perf_tests", ".ci", "lab")
CITED = re.compile(r"(?<![\w./$~-])((?:" + "|".join(map(re.escape, TOP)) + r")/[\w./*?{},\[\]-]*)")
# A path in git history (`git archive REV PATH`, `git show REV:PATH`): checked against that commit.
HISTORY = re.compile(r"git (?:archive (\S+) |show (\S+):)([\w./-]+)")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# Cited though not a path of the tree: the branch name a workflow example pushes baselines to.
NOT_IN_TREE = {"specgate/baselines-"}


def _docs() -> list[Path]:
    return [ROOT / "README.md", *(p for p in sorted((ROOT / "docs").rglob("*.md"))
                                  if (ROOT / "docs" / "evidence") not in p.parents)]


def _braces(path: str) -> list[str]:
    """``a/{b,c}/d`` -> ``a/b/d``, ``a/c/d`` (as a shell expands it)."""
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    return [out for part in match.group(1).split(",")
            for out in _braces(path[:match.start()] + part + path[match.end():])]


def _exists(path: str, base: Path) -> bool:
    return all(glob.glob(str(base / p)) if glob.has_magic(p) else (base / p).exists() for p in _braces(path))


def cited_paths(doc: Path) -> list[tuple[str, Path]]:
    """(path, the folder it is relative to) for every repository path a doc cites: in text, code
    spans and commands (relative to the repository root) and in Markdown links (relative to the doc)."""
    text = HISTORY.sub("", doc.read_text())
    # A Markdown link's text or target ([lab/x](lab/x.md)) is read as a link below.
    found = [(m.group(1).rstrip(".,;:"), ROOT) for m in CITED.finditer(text)
             if text[m.start() - 1:m.start()] != "[" and text[m.start() - 2:m.start()] != "]("
             and text[m.end():m.end() + 1] != "<"]  # docs/lab/<visit>: a pattern, not a path
    for m in LINK.finditer(text):
        target = m.group(1)
        if "://" not in target and not target.startswith(("mailto:", "/")):
            found.append((target, doc.parent))
    return [(p, base) for p, base in found if "<" not in p and p not in NOT_IN_TREE]


def test_every_path_the_docs_cite_is_in_the_tree() -> None:
    missing = [f"{doc.relative_to(ROOT)}: {path}" for doc in _docs() for path, base in cited_paths(doc)
               if not _exists(path, base)]
    assert not missing, "paths cited in the docs that a clone does not have:\n" + "\n".join(missing)


def test_every_path_the_docs_cite_in_history_is_there() -> None:
    """``git archive e43f83e^ docs/lab/...``: the commands that extract what the tree leaves out."""
    cited = {(m.group(1) or m.group(2), m.group(3)) for doc in _docs() for m in HISTORY.finditer(doc.read_text())}
    assert cited, "the journal cites no path in history; drop this test or the HISTORY pattern"
    for rev in {rev for rev, _ in cited}:
        if subprocess.run(["git", "cat-file", "-e", rev], cwd=ROOT, capture_output=True).returncode:
            pytest.skip(f"{rev} is not in this clone (a shallow clone?)")
    missing = [f"{rev}:{path}" for rev, path in sorted(cited)
               if subprocess.run(["git", "cat-file", "-e", f"{rev}:{path}"], cwd=ROOT, capture_output=True).returncode]
    assert not missing, "paths the docs extract from history that are not there:\n" + "\n".join(missing)


def test_the_check_finds_paths_in_text_commands_and_links(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("See docs/statistics.md, `python x.py docs/evidence/lab/{a,b}/r.json` and [j](journal/x.md).\n"
                   "Outputs: /tmp/docs/x, .specgate/runs/x/report.json, ${fixtures}/heads/x.\n")
    assert cited_paths(doc) == [("docs/statistics.md", ROOT), ("docs/evidence/lab/{a,b}/r.json", ROOT),
                                ("journal/x.md", tmp_path)]
    assert _braces("a/{b,c}/d") == ["a/b/d", "a/c/d"]
    assert _exists("docs/journal/*.md", ROOT) and not _exists("docs/{journal,nowhere}", ROOT)


def test_the_tracked_tree_stays_within_its_budget() -> None:
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout ({exc})")
    files = [ROOT / name for name in listed.decode().split("\0") if name]
    sizes = {f: f.stat().st_size for f in files if f.is_file()}
    total = sum(sizes.values())
    largest = sorted(sizes, key=sizes.get, reverse=True)[:5]
    assert total <= TREE_BUDGET_BYTES, (
        f"the tracked tree holds {total:,} bytes, over its {TREE_BUDGET_BYTES:,}; largest: "
        + ", ".join(f"{f.relative_to(ROOT)} ({sizes[f]:,})" for f in largest))


def test_every_specgate_command_the_docs_cite_exists(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m specgate NAME`` in README and docs, and the help's own description, name only
    subcommands the CLI has."""
    from specgate.cli import main

    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = capsys.readouterr().out
    commands = set(re.search(r"\{([a-z,-]+)\}", help_text).group(1).split(","))
    cited = {(doc.relative_to(ROOT), name) for doc in _docs()
             for name in re.findall(r"python -m specgate ([a-z][a-z-]*)", doc.read_text())}
    assert cited and not {c for c in cited if c[1] not in commands}, commands
    description = help_text.split("\n\n")[1]
    assert "render" not in description or "--specgate-report-only" in re.sub(r"\s+", "", description), description
