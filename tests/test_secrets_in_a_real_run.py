"""Issue 63, done when: a real run against vLLM on CPU, with VLLM_API_KEY and HF_TOKEN set to strings of
its own (and a third secret in the rig's [env]), passes, and none of them is in its terminal output or in
any file it writes (report.json, summary.md, report.html, baselines.json, the server's log). The server
inherits VLLM_API_KEY, so it demands the key: the run passes only if specgate calls it with the key.
One server (no_spec, the quick rig's extraction class, --specgate-regen-baselines: its figures stored and the
test passed): about two minutes on 2 vCPUs, most of it vLLM's start. The server is kept
(--specgate-keep-servers), so the secrets enter its fingerprint (an HMAC under the state folder's key), and a
second run with the same secrets reuses it."""

from __future__ import annotations

import gzip
import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fixture_copy import copy_fixtures

from specgate.redaction import is_secret_name

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[1]


def _text(path: Path) -> str:
    raw = path.read_bytes()
    return (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode(errors="replace")


def test_a_real_run_with_secrets_in_its_environment_writes_none_of_them(tmp_path: Path, record_property) -> None:
    key, token, password = (f"{what}-{secrets.token_hex(16)}" for what in ("sk", "hf", "pw"))
    fixtures = copy_fixtures(tmp_path / "fixtures")
    rig_file = fixtures / "rigs" / "cpu-smollm2-quick.toml"
    rig_file.write_text(rig_file.read_text().replace(
        '[env]\n', f'[env]\nSPECGATE_E2E_DB_PASSWORD = "{password}"\n', 1))
    out = tmp_path / "out"  # everything the run writes goes under it
    baselines = out / "baselines.json"
    out.mkdir()
    shutil.copy(ROOT / "baselines.json", baselines)
    env = {**os.environ, "VLLM_API_KEY": key, "HF_TOKEN": token, "SPECGATE_STATE_DIR": str(out / "state")}
    argv = [sys.executable, "-m", "pytest", str(ROOT / "perf_tests" / "test_speculative_perf.py"), "-m", "cpu",
            "-k", "throughput and no_spec and extraction", "-p", "no:cacheprovider",
            "--specgate-rig", "cpu-smollm2-quick",
            f"--specgate-fixtures={fixtures}", f"--specgate-baselines={baselines}", f"--specgate-run-dir={out / 'run'}",
            "--specgate-regen-baselines", "--specgate-keep-servers"]
    try:
        run = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
        terminal = run.stdout + run.stderr
        assert run.returncode == 0, terminal[-6000:]
        assert "1 passed" in terminal
        again = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
        terminal += again.stdout + again.stderr
        assert again.returncode == 0 and "reusing the kept server" in again.stdout, again.stdout[-6000:]
    finally:
        subprocess.run([sys.executable, "-m", "specgate", "servers", "--stop-all"], cwd=ROOT, env=env,
                       capture_output=True, timeout=120, check=False)
    assert len((out / "state" / "fingerprint.key").read_bytes()) == 32

    written = {p.relative_to(out).as_posix(): _text(p) for p in out.rglob("*") if p.is_file()}
    names = set(written)
    assert {"baselines.json", "run/report.json", "run/summary.md", "run/report.html"} <= names
    assert any(name.startswith("state/logs/") for name in names), names  # the kept server's log, scanned too
    leaked = {name: [s for s in (key, token, password) if s in text]
              for name, text in {"terminal": terminal, **written}.items()}
    assert {name: found for name, found in leaked.items() if found} == {}

    # what was written: the fingerprint has the rig's env, and none of the secrets' names either
    env = json.loads(written["run/report.json"])["fingerprints"]["no_spec"]["env"]
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert not any(is_secret_name(name) for name in env), env
    assert "VLLM_API_KEY" not in written["baselines.json"] and "HF_TOKEN" not in written["baselines.json"]
    record_property("files_scanned", len(written))
