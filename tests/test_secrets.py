"""Issue 63, point 1: secrets never leave the process. A fingerprint records an allowlist of the inherited
variables that change vLLM's speed, and never a variable whose name holds KEY, TOKEN, SECRET, PASSWORD or
CREDENTIAL, inherited or set by the rig (the server still gets it); a server specgate starts that
inherits VLLM_API_KEY is called with it; a report an older specgate wrote renders without its secrets; no
report or baselines file the repository keeps holds one. The end-to-end run against real vLLM is
tests/test_secrets_in_a_real_run.py (cpu tier)."""

from __future__ import annotations

import gzip
import json
import secrets
from pathlib import Path

import httpx
import psutil
import pytest
from test_server import _spec

import specgate.serve.server as server_mod
import specgate.store.fingerprint as fingerprint_mod
from specgate.config.rig import load_rig
from specgate.plugin.output import render_saved_report, rendered_dir
from specgate.redaction import REDACTED, is_secret_name, redact, redacted_argv
from specgate.serve import registry
from specgate.serve.registry import KeptVLLMServer, ReusedServer, kept_or_started, load_all
from specgate.serve.server import VLLMServer
from specgate.store.baselines import Fingerprint

pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]

ROOT = Path(__file__).resolve().parent.parent
# What the repository keeps of reports and baselines (issue 63: scanned for secrets)
KEPT = [ROOT / "baselines.json", *(p for folder in ("docs/evidence", "fixtures/recorded", "tests/data")
                                   for p in sorted((ROOT / folder).rglob("*.json*")) if p.is_file())]


@pytest.fixture(autouse=True)
def fast_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_mod, "POLL_EVERY_S", 0.005)  # a fake server is ready in ~50 ms


def _unique(what: str) -> str:
    return f"{what}-{secrets.token_hex(12)}"


# -- the rule ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "secret"), [
    ("VLLM_API_KEY", True), ("HF_TOKEN", True), ("hf_token", True), ("HUGGING_FACE_HUB_TOKEN", True),
    ("AWS_SECRET_ACCESS_KEY", True), ("PGPASSWORD", True), ("GOOGLE_APPLICATION_CREDENTIALS", True),
    ("My_Credential", True), ("VLLM_USE_KEYRING", True),
    ("VLLM_CPU_KVCACHE_SPACE", False), ("OMP_NUM_THREADS", False), ("HF_HUB_OFFLINE", False),
    ("SPECGATE_SLOWDOWN", False), ("VLLM_ATTENTION_BACKEND", False),
])
def test_a_secret_is_a_name_holding_key_token_secret_password_or_credential(name, secret):
    assert is_secret_name(name) is secret


def test_only_a_secret_option_s_value_is_redacted_in_arguments():
    key = _unique("sk")
    argv = ["--dtype", "float32", "--api-key", key, "--max-num-batched-tokens", "512", "--tokenizer", "/t",
            f"--hf-token={key}", "--hf-token", "--enforce-eager"]
    assert redacted_argv(argv) == ["--dtype", "float32", "--api-key", REDACTED, "--max-num-batched-tokens", "512",
                                   "--tokenizer", "/t", f"--hf-token={REDACTED}", "--hf-token", "--enforce-eager"]


# -- what a fingerprint records -------------------------------------------------------------------
@pytest.fixture(scope="module")
def rig():
    return load_rig("cpu-smollm2", ROOT / "fixtures")


def test_a_fingerprint_records_the_speed_allowlist_and_the_rigs_env_but_never_a_secret(rig):
    key, token, password = _unique("sk"), _unique("hf"), _unique("pw")
    with_secrets = rig.model_copy(update={
        "env": {**rig.env, "HF_TOKEN": token, "DB_PASSWORD": password},
        "mode_env": {"ngram": {"SPECGATE_SLOWDOWN": "0.1", "S3_SECRET_ACCESS_KEY": key}},
        "extra_args": (*rig.extra_args, "--api-key", key)})
    environ = {
        # on the allowlist: vLLM's speed knobs (named, and the VLLM_USE_/VLLM_CPU_ families), thread counts
        "VLLM_ATTENTION_BACKEND": "TORCH_SDPA", "VLLM_USE_V1": "1", "VLLM_CPU_OMP_THREADS_BIND": "0-1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "2",
        # a plugin's declared variable (the lab's injector)
        "SPECGATE_GPU_SLOWDOWN": "0.05",
        # vLLM's, but no speed knob; not vLLM's at all
        "VLLM_HOST_IP": "10.0.0.1", "VLLM_LOGGING_LEVEL": "DEBUG", "HOME": "/root", "https_proxy": "http://p:3128",
        # secrets, on an allowlisted family or a plugin's prefix or not
        "VLLM_API_KEY": key, "HF_TOKEN": token, "VLLM_USE_SECRET_SAUCE": key, "SPECGATE_GPU_SLOWDOWN_TOKEN": key,
    }
    fields = fingerprint_mod.measured_with(with_secrets, with_secrets.mode("ngram"), environ=environ,
                                           plugin_prefixes=("SPECGATE_SLOWDOWN", "SPECGATE_GPU_SLOWDOWN"))
    assert fields["env"] == {
        "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",  # the rig's [env]
        "SPECGATE_SLOWDOWN": "0.1",  # the mode's env
        "VLLM_ATTENTION_BACKEND": "TORCH_SDPA", "VLLM_USE_V1": "1", "VLLM_CPU_OMP_THREADS_BIND": "0-1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "2", "SPECGATE_GPU_SLOWDOWN": "0.05"}
    assert fields["server_args"][-2:] == ["--api-key", REDACTED]
    written = Fingerprint(**fields).model_dump_json()
    assert not any(s in written for s in (key, token, password))


def test_the_installed_plugins_declare_which_inherited_variables_count(rig, monkeypatch):
    monkeypatch.setattr(fingerprint_mod, "server_env_prefixes", lambda: ("SPECGATE_SLOWDOWN",))
    fields = fingerprint_mod.measured_with(rig, rig.mode("ngram"), environ={"SPECGATE_SLOWDOWN_FILE": "/tmp/f"})
    assert fields["env"]["SPECGATE_SLOWDOWN_FILE"] == "/tmp/f"


def test_a_fingerprint_an_older_specgate_stored_drops_its_secrets_as_it_is_read():
    key = _unique("sk")
    old = Fingerprint.model_validate({"env": {"VLLM_API_KEY": key, "HF_HUB_OFFLINE": "1"},
                                      "server_args": ["--api-key", key]})
    assert old.env == {"HF_HUB_OFFLINE": "1"} and old.server_args == ["--api-key", REDACTED]


def test_a_kept_server_s_record_holds_no_secret_and_its_hash_tells_secrets_apart_under_a_local_key(fake, tmp_path):
    key, token, folder = _unique("sk"), _unique("hf"), tmp_path / "state"

    def digest_of(api_key: str, hf_token: str, **environ: str) -> tuple[str, dict]:
        return registry.fingerprint(_spec(fake, tmp_path, "--api-key", api_key, env={"HF_TOKEN": hf_token}),
                                    rig="r", label="ngram", model="m", build="b", plugin_env=(), folder=folder,
                                    environ={"VLLM_API_KEY": api_key, "HF_HUB_OFFLINE": "1", **environ})

    digest, parts = digest_of(key, token)
    assert parts["env"] == {"HF_HUB_OFFLINE": "1"} and not any(s in json.dumps(parts) for s in (key, token))
    assert digest_of(key, token)[0] == digest
    assert digest_of("another", token)[0] != digest and digest_of(key, "another")[0] != digest
    # a knob whose name only looks secret (vLLM's own) is left out of what is written, yet tells servers apart
    knob = "VLLM_MAX_TOKENS_PER_EXPERT_FP4_MOE"
    assert digest_of(key, token, **{knob: "8"})[0] != digest_of(key, token, **{knob: "16"})[0]
    # the HMAC's key is the state folder's own, readable only by its owner, and holds none of the secrets
    local = folder / "fingerprint.key"
    assert local.stat().st_mode & 0o077 == 0 and len(local.read_bytes()) == 32
    assert [p.name for p in folder.iterdir()] == ["fingerprint.key"]
    # a damaged key (empty, open to others) is made again; the hash moves with it
    local.write_bytes(b"")
    assert digest_of(key, token)[0] != digest and len(local.read_bytes()) == 32
    again = digest_of(key, token)[0]
    local.chmod(0o644)
    assert digest_of(key, token)[0] != again and local.stat().st_mode & 0o077 == 0
    elsewhere = tmp_path / "other-state"
    assert registry.fingerprint(_spec(fake, tmp_path, "--api-key", key, env={"HF_TOKEN": token}), rig="r",
                                label="ngram", model="m", build="b", plugin_env=(), folder=elsewhere,
                                environ={"VLLM_API_KEY": key, "HF_HUB_OFFLINE": "1"})[0] != digest


# -- the key reaches a server specgate starts ---------------------------------------------------------
def test_a_started_server_that_inherits_vllm_api_key_is_called_with_it(fake, tmp_path, reaper, monkeypatch):
    """The fake demands the key on every path, so readiness (/health, /v1/models, a first generation)
    passes only if each call carries it; before, this server never became ready (401)."""
    key = _unique("sk")
    monkeypatch.setenv("VLLM_API_KEY", key)
    spec = _spec(fake, tmp_path, timeout_s=10.0)
    with VLLMServer(spec) as server:
        reaper.append(psutil.Process(server.process.pid))
        assert server.api_key == key and server.ready_after_s is not None
        assert httpx.get(f"{server.base_url}/health").status_code == 401  # it does demand it
    assert key not in server.log_path.read_text()


def test_a_key_given_as_an_argument_is_used_and_left_out_of_specgate_s_log_lines(fake, tmp_path, reaper):
    key = _unique("sk")
    with VLLMServer(_spec(fake, tmp_path, "--api-key", key, timeout_s=10.0)) as server:
        reaper.append(psutil.Process(server.process.pid))
        assert server.api_key == key
    [argv_line] = [line for line in server.log_path.read_text().splitlines() if line.startswith("# argv:")]
    assert key not in argv_line and REDACTED in argv_line


def test_a_kept_server_is_reused_with_the_key_and_replaced_for_another(fake, tmp_path, reaper, monkeypatch):
    folder = tmp_path / "state"
    monkeypatch.setenv(registry.STATE_ENV, str(folder))
    model = tmp_path / "model"
    model.mkdir()
    rig, lines = type("Rig", (), {"name": "stand-in", "model": str(model)}), []

    def session(key: str):
        monkeypatch.setenv("VLLM_API_KEY", key)
        return kept_or_started(_spec(fake, tmp_path, timeout_s=10.0), rig=rig, mode_label="ngram",
                               progress=lines.append, before_start=None, folder=folder)

    key = _unique("sk")
    try:
        first = session(key)
        assert isinstance(first, KeptVLLMServer)
        with first:
            reaper.append(psutil.Process(first.process.pid))
        assert key not in "".join(p.read_text() for p in folder.glob("*.json"))
        [kept] = load_all(folder)
        assert kept.healthy(api_key=key) and not kept.healthy(api_key="wrong")

        again = session(key)
        assert isinstance(again, ReusedServer) and again.api_key == key
        httpx.post(f"{again.base_url}/sleep", params={"level": 1}, headers={"Authorization": f"Bearer {key}"})
        again.kept.sleep_level = 1
        assert again.asleep_at() == 1  # /is_sleeping answered: the call carried the key
        assert registry.awake_or_why(again.kept, api_key=key) is None

        replaced = session(_unique("sk"))
        assert isinstance(replaced, KeptVLLMServer)
        assert lines[-1].endswith("differs (a secret's value, or the state folder's fingerprint.key)")  # not the value
    finally:
        for kept in load_all(folder):
            registry.stop_kept(kept, folder, grace_s=5.0)


# -- reports an older specgate wrote ------------------------------------------------------------------
def test_report_only_renders_an_older_report_without_its_secrets(tmp_path, no_plots, capsys):
    key, token = _unique("sk"), _unique("hf")
    report = json.loads(gzip.decompress(
        (ROOT / "tests/data/lab/2026-12-01-h200-draft4l/s1b/report.json.gz").read_bytes()))
    for fp in report["fingerprints"].values():  # as a version that copied every inherited VLLM_* wrote it
        fp["env"] = {**(fp.get("env") or {}), "VLLM_API_KEY": key, "hf_token": token}
        fp["server_args"] = [*(fp.get("server_args") or []), "--api-key", key]
    report["rig"]["HF_TOKEN"] = token
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    assert render_saved_report(path) == 0
    out = capsys.readouterr()
    written = [p for p in rendered_dir(path).rglob("*") if p.is_file()]
    assert {p.name for p in written} >= {"summary.md", "report.html"}
    assert "VLLM_CACHE_ROOT" in (rendered_dir(path) / "report.html").read_text()  # the env is shown
    for text in (out.out, out.err, *(p.read_text(errors="replace") for p in written)):
        assert key not in text and token not in text


def test_redact_names_where_each_secret_was():
    data = {"fingerprints": {"ngram": {"env": {"VLLM_API_KEY": "k", "OMP_NUM_THREADS": "2"},
                                       "server_args": ["--api-key", "k"]}},
            "rig": {"HF_TOKEN": "t", "max_tokens": 48}, "records": [{"decode_tokens_per_s": 50.0}]}
    assert redact(data) == ["fingerprints.ngram.env.VLLM_API_KEY", "fingerprints.ngram.server_args", "rig.HF_TOKEN"]
    assert data == {"fingerprints": {"ngram": {"env": {"OMP_NUM_THREADS": "2"},
                                               "server_args": ["--api-key", REDACTED]}},
                    "rig": {"max_tokens": 48}, "records": [{"decode_tokens_per_s": 50.0}]}


def test_no_report_or_baselines_the_repository_keeps_holds_a_secret():
    names = [p.name for p in KEPT]  # plain and compressed, whole documents and one per line
    assert len(KEPT) > 100 and "baselines.json" in names
    assert any(n.endswith(".json.gz") for n in names) and any(".jsonl" in n for n in names)
    found = {}
    for path in KEPT:
        raw = path.read_bytes()
        text = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode()
        documents = [json.loads(line) for line in text.splitlines() if line.strip()] \
            if ".jsonl" in path.name else [json.loads(text)]
        where = [w for document in documents for w in redact(document)]
        if where:
            found[str(path.relative_to(ROOT))] = where
    assert found == {}
