"""A test's private copy of fixtures/ to edit or corrupt.

Every file is copied except the large read-only data, which is symlinked: the EAGLE-3 head's
weights (fixtures/heads, 15 MB) and the recorded runs (fixtures/recorded, 2.5 MB). No test edits
them, and copying all 17 MB per test cost the fast tier several seconds (the copies, then pytest
deleting old temporary directories). The copy keeps every path the original has.
"""

from __future__ import annotations

import shutil
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SHARED = ("heads", "recorded")


def copy_fixtures(dest: Path) -> Path:
    """Copy fixtures/ to ``dest`` (which must not exist), linking SHARED; returns ``dest``."""

    def shared(directory: str, names: list[str]) -> list[str]:
        return [n for n in names if n in SHARED] if Path(directory) == FIXTURES else []

    shutil.copytree(FIXTURES, dest, ignore=shared)
    for name in SHARED:
        (dest / name).symlink_to(FIXTURES / name, target_is_directory=True)
    return Path(dest)


def quick_rig_with_a_declared_backfire(fixtures: Path) -> Path:
    """The quick rig of a copy as the declared-backfire tests read it: classes coding (ngram's backfire
    declared there, break-even on 2 cores) and extraction, with every gate (the committed quick rig runs
    the copy classes and leaves out what cannot decide in its minutes). Returns ``fixtures``."""
    rig_file = fixtures / "rigs" / "cpu-smollm2-quick.toml"
    text = rig_file.read_text()
    classes = 'classes = ["extraction", "summarization"]'
    left_out = text[text.index("[gates.left_out]"):]
    assert classes in text and left_out.count("[") == 1, f"{rig_file} changed: update this helper"
    rig_file.write_text(text.replace(classes, 'classes = ["coding", "extraction"]').replace(left_out, "") +
                        '[[declared_backfire]]\nmode = "ngram"\nclasses = ["coding"]\n'
                        'reason = "break-even on 2 CPU cores for non-copy classes"\n')
    return fixtures
