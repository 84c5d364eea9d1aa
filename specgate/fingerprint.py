"""The fingerprint of a measurement: which machine (accelerator, CPU), software (driver, vLLM,
torch, CUDA), model and config, and what was measured how (prompt texts, protocol, server
arguments, environment). ``baselines.comparability`` decides what a difference means."""

from __future__ import annotations

import datetime as dt
import hashlib
import importlib.util
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

import httpx

from specgate.baselines import Fingerprint, PromptDigest
from specgate.client import auth_headers, tls_context
from specgate.gpu import is_gpu_id, nvml


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_info(visible: str | None = None) -> tuple[str, int, str | None]:
    """(model name, count, driver) through NVML; ("unknown", 0, None) where there is none.
    With ``visible`` (the server's CUDA_VISIBLE_DEVICES) the count is the server's GPUs, not the host's."""
    try:
        with nvml() as pynvml:
            count = pynvml.nvmlDeviceGetCount()
            first = pynvml.nvmlDeviceGetHandleByIndex(0) if count else None
            if visible is not None:
                entries = [e.strip() for e in visible.split(",") if is_gpu_id(e.strip())]
                entries = [e for e in entries if not e.isdigit() or int(e) < count]
                count = len(entries)
                if entries:  # a UUID (GPU-..., MIG-...) must be whole for NVML's lookup
                    first = (pynvml.nvmlDeviceGetHandleByIndex(int(entries[0])) if entries[0].isdigit()
                             else pynvml.nvmlDeviceGetHandleByUUID(entries[0]))
            name = pynvml.nvmlDeviceGetName(first) if count else "none"
            driver = pynvml.nvmlSystemGetDriverVersion()
            return (name.decode() if isinstance(name, bytes) else name, count,
                    driver.decode() if isinstance(driver, bytes) else driver)
    except Exception:  # no NVML, no driver, no GPU: the fingerprint says unknown
        return "unknown", 0, None


def machine_id(tier: str, visible: str | None = None) -> str | None:
    """Which machine this is, not only its kind: on the gpu tier the UUIDs of the server's GPUs (two
    hosts of one GPU model read apart, so a history of starts belongs to one), else the host's
    /etc/machine-id or its name. None where none can be read."""
    if tier == "gpu":
        try:
            with nvml() as pynvml:
                count = pynvml.nvmlDeviceGetCount()
                entries = [e.strip() for e in (visible or "").split(",") if is_gpu_id(e.strip())] or \
                    [str(i) for i in range(count)]
                uuids = []
                for e in entries:
                    handle = (pynvml.nvmlDeviceGetHandleByIndex(int(e)) if e.isdigit()
                              else pynvml.nvmlDeviceGetHandleByUUID(e))
                    uuid = pynvml.nvmlDeviceGetUUID(handle)
                    uuids.append(uuid.decode() if isinstance(uuid, bytes) else uuid)
                if uuids:
                    return ",".join(sorted(uuids))
        except Exception:  # no NVML: fall back to the host
            pass
    try:
        text = Path("/etc/machine-id").read_text().strip()
        if text:
            return f"machine-id {text}"
    except OSError:
        pass
    return f"host {platform.node()}" if platform.node() else None


def git_commit(cwd: Path) -> str | None:
    """The commit under test: ``SPECGATE_COMMIT`` when set (a copied tree whose ``.git`` is not the
    code's), else ``git describe --always --dirty`` ("651a65d-dirty"
    when tracked files differ from that commit)."""
    if os.environ.get("SPECGATE_COMMIT"):
        return os.environ["SPECGATE_COMMIT"]
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], cwd=cwd,
                             capture_output=True, text=True, timeout=10, check=False)
        return out.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def server_vllm_version(base_url: str, api_key: str | None = None) -> str | None:
    headers = auth_headers(api_key)
    try:
        response = httpx.get(f"{base_url}/version", headers=headers, timeout=10, verify=tls_context())
        return response.json().get("version") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


# Protocol keys that change what a window measures (timeouts and the seed at temperature 0 do not).
PROTOCOL_KEYS = ("api", "max_tokens", "ignore_eos", "temperature", "warmup_requests", "repeats", "concurrency",
                 "prefix_caching")
# Inherited variables the server reads that change its speed (thread counts, vLLM's own knobs).
_ENV_PATTERN = re.compile(r"^(VLLM_|OMP_NUM_THREADS$|MKL_NUM_THREADS$)")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def prompt_digest(prompt_class: Any) -> PromptDigest:
    """A class's prompt texts as a hash of all of them (ids and texts, in order) and one per id."""
    joined = "\n".join(f"{p.id}\n{p.text}" for p in prompt_class.prompts)
    return PromptDigest(sha256=_sha(joined), prompts={p.id: _sha(p.text)[:12] for p in prompt_class.prompts})


def torch_cuda_versions() -> tuple[str | None, str | None]:
    """torch's version and the CUDA it was built with, read from ``torch/version.py`` without
    importing torch (seconds, and this runs in the pytest process). The harness's environment is
    the server's in every tox env; a rig whose server runs elsewhere records that env's none."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None, None
    if spec is None or not spec.submodule_search_locations:
        return None, None
    try:
        text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text()
    except OSError:
        return None, None
    found = dict(re.findall(r"^(__version__|cuda)\s*(?::\s*\S+)?\s*=\s*['\"]([^'\"]*)['\"]", text, re.M))
    return found.get("__version__"), found.get("cuda")


def measured_with(rig: Any, mode: Any, environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The fingerprint fields that say what ``rig`` measures in ``mode`` and how: the prompt
    texts of every class, the protocol, the extra server arguments and the environment (the
    rig's, the mode's, and inherited vLLM/thread-count variables)."""
    environ = os.environ if environ is None else environ
    inherited = {k: v for k, v in environ.items() if _ENV_PATTERN.match(k)}
    protocol = rig.protocol.model_dump(mode="json")
    return {
        "prompts": {c.name: prompt_digest(c) for c in rig.prompt_classes},
        "protocol": {k: protocol[k] for k in PROTOCOL_KEYS if k in protocol},
        "server_args": [*getattr(rig, "extra_args", ()), *rig.mode_extra_args.get(mode.name, ())],
        "env": dict(sorted({**inherited, **rig.env, **getattr(rig, "mode_env", {}).get(mode.name, {})}.items())),
    }


def collect(*, tier: str, model: str, speculative_config: dict[str, Any] | None,
            vllm_version: str | None, repo: Path, gpus: str | None = None,
            concurrent_servers: int = 1, **measurement: Any) -> Fingerprint:
    """``measurement``: the fields of :func:`measured_with`."""
    if tier == "gpu":
        accelerator, count, driver = gpu_info(gpus)
    else:
        accelerator, count, driver = cpu_model(), os.cpu_count() or 0, None
    torch_version, cuda_version = torch_cuda_versions()
    return Fingerprint(
        accelerator=accelerator, accelerator_count=count, driver=driver, vllm_version=vllm_version,
        model=Path(model).name, speculative_config=speculative_config, concurrent_servers=concurrent_servers,
        torch_version=torch_version, cuda_version=cuda_version, cpu_model=cpu_model(),
        machine=machine_id(tier, gpus), date=dt.date.today().isoformat(), commit=git_commit(repo), **measurement,
    )
