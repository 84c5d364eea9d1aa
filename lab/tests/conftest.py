"""The lab's tests reuse the product's test helpers (tests/standins.py: a stand-in vLLM server) rather
than copying them: the repository's tests/ folder goes on the import path."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
