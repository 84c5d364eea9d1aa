"""report.html opened in a real headless browser (issue 55): the verdict table's rows, the three
plots inlined, the start order. A real program that takes seconds and both cores to start, so it runs
with the cpu tier (tox -e cpu-full; .ci/run installs Debian's chromium for it), not the fast one."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from specgate.report.comparisons import gate_comparisons
from specgate.report.terminal import render_all
from specgate.store.saved_report import read_saved_report

# Debian's package (apt-get install -y chromium), else a Chromium or Chrome on PATH (GitHub's runners
# carry google-chrome)
BROWSERS = ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM = next((found for name in BROWSERS if (found := shutil.which(name))), None)

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[1]
AB_WITH_TTFT = ROOT / "tests/data/calibration/cpu-2026-12-04-acceptance/k3-48-auto-report.json.gz"


def _chromium(*args: str, profile: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", f"--user-data-dir={profile}", *args],
        capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.skipif(CHROMIUM is None, reason=f"no headless browser: none of {', '.join(BROWSERS)} is installed "
                    "(apt-get install -y chromium)")
def test_the_page_opens_in_a_real_browser(tmp_path: Path) -> None:
    report = read_saved_report(AB_WITH_TTFT)
    written = render_all(report, tmp_path)
    url = written["html"].resolve().as_uri()
    shot = tmp_path / "page.png"
    # one browser, one load of the page: the screenshot to a file, the DOM on stdout
    browser = _chromium(f"--screenshot={shot}", "--window-size=1400,2000", "--dump-dom", url,
                        profile=tmp_path / "profile")
    assert browser.returncode == 0, browser.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000
    page = browser.stdout
    assert '<table id="verdicts">' in page
    for c in gate_comparisons(report):
        row = re.search(rf'<tr class="[a-z]+" data-gate="{c.gate}" data-where="{re.escape(c.where)}">(.*?)</tr>',
                        page, re.S)
        assert row is not None, c.label
        assert c.ratio_text in row.group(1) and c.outcome_text in row.group(1)
    assert page.count('src="data:image/png;base64,') == 3  # forest, throughput, acceptance: nothing fetched
    assert "<dt>start order</dt><dd>ngram: candidate side first (seed 1;" in page
