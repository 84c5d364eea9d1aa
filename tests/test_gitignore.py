"""Issue 14, point 6: what tox leaves in the checkout is ignored by git."""

import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
@pytest.mark.parametrize(("name", "kind"), [(".venv", "file"), (".venv", "folder"), (".tox", "folder")])
def test_tox_leftovers_are_ignored(tmp_path, name, kind):
    # tox writes `.venv` as a file naming its env (".tox/cpu"); a virtualenv would be a folder
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    shutil.copy(ROOT / ".gitignore", tmp_path / ".gitignore")
    target = tmp_path / name
    if kind == "file":
        target.write_text(".tox/cpu\n")
    else:
        target.mkdir()
        (target / "pyvenv.cfg").write_text("home = /usr\n")
    status = subprocess.run(["git", "-C", str(tmp_path), "status", "--porcelain", "--untracked-files=all"],
                            capture_output=True, text=True, check=True).stdout
    assert status.splitlines() == ["?? .gitignore"]
