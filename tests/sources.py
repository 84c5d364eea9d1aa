"""Source files read and parsed once per test process: several test modules scan every module of the
product (and the lab's and the tests'), each for its own rule."""

from __future__ import annotations

import ast
import functools
from pathlib import Path


@functools.cache
def parsed(path: Path) -> ast.Module:
    """``path``'s syntax tree (shared: the scans only read it)."""
    return ast.parse(path.read_text(), str(path))
