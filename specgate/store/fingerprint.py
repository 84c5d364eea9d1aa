"""The fingerprint of a measurement: which machine (accelerator, CPU), software (driver, vLLM,
torch, CUDA), model and config, and what was measured how (prompt texts, protocol, server
arguments, environment). ``baselines.comparability`` decides what a difference means."""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import importlib.util
import os
import platform
import re
import secrets
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from specgate.redaction import is_secret_name, redacted_argv, without_secrets
from specgate.serve.extensions import server_env_prefixes
from specgate.serve.gpu import is_gpu_id, nvml
from specgate.serve.http import auth_headers, tls_context
from specgate.store.baselines import Fingerprint, PromptDigest


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _handle(pynvml: Any, entry: str) -> Any:
    """NVML's handle of a GPU named by index or UUID (GPU-..., MIG-..., whole for the lookup)."""
    return (pynvml.nvmlDeviceGetHandleByIndex(int(entry)) if entry.isdigit()
            else pynvml.nvmlDeviceGetHandleByUUID(entry))


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def gpu_info(visible: str | None = None) -> tuple[str, int, str | None]:
    """(model name, count, driver) through NVML; ("unknown", 0, None) where there is none. With
    ``visible`` (the server's CUDA_VISIBLE_DEVICES) the count is the server's GPUs."""
    try:
        with nvml() as pynvml:
            count = pynvml.nvmlDeviceGetCount()
            first = pynvml.nvmlDeviceGetHandleByIndex(0) if count else None
            if visible is not None:
                entries = [e.strip() for e in visible.split(",") if is_gpu_id(e.strip())]
                entries = [e for e in entries if not e.isdigit() or int(e) < count]
                count = len(entries)
                if entries:
                    first = _handle(pynvml, entries[0])
            name = pynvml.nvmlDeviceGetName(first) if count else "none"
            return _text(name), count, _text(pynvml.nvmlSystemGetDriverVersion())
    except Exception:  # no NVML, no driver, no GPU: the fingerprint says unknown
        return "unknown", 0, None


def machine_id(tier: str, visible: str | None = None, root: Path = Path("/")) -> str | None:
    """Which machine this is, not only its kind: on the gpu tier the UUIDs of the server's GPUs,
    else :func:`host_id`. None where none can be read."""
    if tier == "gpu":
        try:
            with nvml() as pynvml:
                count = pynvml.nvmlDeviceGetCount()
                entries = ([e.strip() for e in (visible or "").split(",") if is_gpu_id(e.strip())]
                           or [str(i) for i in range(count)])
                uuids = [_text(pynvml.nvmlDeviceGetUUID(_handle(pynvml, e))) for e in entries]
                if uuids:
                    return ",".join(sorted(uuids))
        except Exception:  # no NVML: fall back to the host
            pass
    return host_id(root)


UNSURE = "unsure"  # in a host id that a clone of this machine's image may share


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def host_id(root: Path = Path("/")) -> str | None:
    """The host: /etc/machine-id with a hash of its permanent, non-virtual network card addresses;
    the host name added and :data:`UNSURE` said where none is universally administered."""
    nics = []
    for link in sorted((root / "sys/class/net").glob("*")):
        if "/devices/virtual/" in str(link.resolve()) or _read(link / "addr_assign_type") != "0":
            continue
        address = _read(link / "address").lower()
        is_mac = re.fullmatch(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}", address)
        if is_mac and address != "00:00:00:00:00:00":
            nics.append(address)
    mid = _read(root / "etc/machine-id")
    parts = [f"machine-id {mid}"] if mid else []
    if nics:
        parts.append(f"nic {hashlib.sha256(' '.join(nics).encode()).hexdigest()[:12]}")
    if any(int(a[:2], 16) & 2 == 0 for a in nics):
        return ", ".join(parts)
    if node := _read(root / "etc/hostname") or (platform.node() if root == Path("/") else ""):
        parts.append(f"host {node}")
    return ", ".join([*parts, f"{UNSURE}: a clone may share it"]) if parts else None


SITTING_ENV = "SPECGATE_SITTING"


@functools.cache
def _minted() -> str:
    return f"{dt.datetime.now(dt.UTC):%Y-%m-%dT%H:%MZ} {secrets.token_hex(3)}"


def sitting_id() -> str:
    """The sitting (one uninterrupted series of starts on one machine): ``SPECGATE_SITTING``, else
    the pytest-xdist run, else one minted per process (UTC time and 6 random hex digits)."""
    if os.environ.get(SITTING_ENV):
        return os.environ[SITTING_ENV]
    if run := os.environ.get("PYTEST_XDIST_TESTRUNUID"):
        return f"pytest-xdist run {run[:12]}"
    return _minted()


def git_commit(cwd: Path) -> str | None:
    """The commit under test: ``SPECGATE_COMMIT`` when set (a copied tree), else
    ``git describe --always --dirty`` ("651a65d-dirty")."""
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
        response = httpx.get(f"{base_url}/version", headers=headers, timeout=10,
                             verify=tls_context())
        return response.json().get("version") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


# Protocol keys that change what a window measures (timeouts and the seed at temperature 0 do not).
PROTOCOL_KEYS = ("api", "max_tokens", "ignore_eos", "temperature", "warmup_requests", "repeats",
                 "concurrency", "prefix_caching")
# What a fingerprint records of the inherited environment: the variables that change how fast vLLM
# runs (vllm/envs.py) and thread counts; anything else stays out. Whole families first.
SPEED_PREFIXES = ("VLLM_USE_", "VLLM_CPU_", "VLLM_ROCM_", "VLLM_FLASHINFER_", "VLLM_ZENTORCH_")
SPEED_VARIABLES = frozenset({
    # the engine, its processes and the kernels it picks
    "VLLM_ATTENTION_BACKEND", "VLLM_FLASH_ATTN_VERSION", "VLLM_ENABLE_V1_MULTIPROCESSING",
    "VLLM_WORKER_MULTIPROC_METHOD", "VLLM_V1_OUTPUT_PROC_CHUNK_SIZE",
    "VLLM_MSGPACK_ZERO_COPY_THRESHOLD", "VLLM_DISABLED_KERNELS", "VLLM_KV_CACHE_LAYOUT",
    "VLLM_MLA_DISABLE", "VLLM_MARLIN_USE_ATOMIC_ADD", "VLLM_FUSED_MOE_CHUNK_SIZE",
    "VLLM_ENABLE_FUSED_MOE_ACTIVATION_CHUNKING", "VLLM_MOE_DP_CHUNK_SIZE", "VLLM_ALL2ALL_BACKEND",
    "VLLM_PP_LAYER_PARTITION", "VLLM_TUNED_CONFIG_FOLDER", "VLLM_BATCH_INVARIANT",
    "VLLM_FLOAT32_MATMUL_PRECISION", "VLLM_COMPUTE_NANS_IN_LOGITS", "VLLM_SLEEP_WHEN_IDLE",
    "VLLM_LOGITS_PROCESSOR_THREADS", "VLLM_ALLREDUCE_USE_SYMM_MEM",
    # compilation (stored histories recorded VLLM_CACHE_ROOT: leaving it out would restart them)
    "VLLM_DISABLE_COMPILE_CACHE", "VLLM_CACHE_ROOT", "VLLM_ENABLE_INDUCTOR_MAX_AUTOTUNE",
    "VLLM_ENABLE_INDUCTOR_COORDINATE_DESCENT_TUNING",
    # what slows every step down: tracing, profiling, the general plugins loaded
    "VLLM_TRACE_FUNCTION", "VLLM_TORCH_PROFILER_DIR", "VLLM_PLUGINS",
    # thread counts
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"})


def is_speed_variable(name: str, plugin_prefixes: tuple[str, ...] = ()) -> bool:
    """Whether an inherited variable goes into a fingerprint: on the allowlist, or of a name a
    ``specgate.server_env`` plugin declares, and never a secret's (redaction.is_secret_name)."""
    return ((name in SPEED_VARIABLES or name.startswith(SPEED_PREFIXES + plugin_prefixes))
            and not is_secret_name(name))


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def prompt_digest(prompt_class: Any) -> PromptDigest:
    """A class's prompt texts as a hash of all of them (ids and texts, in order) and one per id."""
    joined = "\n".join(f"{p.id}\n{p.text}" for p in prompt_class.prompts)
    return PromptDigest(sha256=_sha(joined),
                        prompts={p.id: _sha(p.text)[:12] for p in prompt_class.prompts})


def torch_cuda_versions() -> tuple[str | None, str | None]:
    """torch's version and the CUDA it was built with, read from ``torch/version.py`` without
    importing torch (seconds, in the pytest process)."""
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
    pattern = r"^(__version__|cuda)\s*(?::\s*\S+)?\s*=\s*['\"]([^'\"]*)['\"]"
    found = dict(re.findall(pattern, text, re.M))
    return found.get("__version__"), found.get("cuda")


def measured_with(rig: Any, mode: Any, environ: Mapping[str, str] | None = None,
                  plugin_prefixes: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The fingerprint fields that say what ``rig`` measures in ``mode`` and how: prompt texts,
    protocol, extra server arguments and environment (no secret recorded)."""
    environ = os.environ if environ is None else environ
    prefixes = server_env_prefixes() if plugin_prefixes is None else plugin_prefixes
    inherited = {k: v for k, v in environ.items() if is_speed_variable(k, prefixes)}
    chosen = {**rig.env, **getattr(rig, "mode_env", {}).get(mode.name, {})}
    protocol = rig.protocol.model_dump(mode="json")
    return {
        "prompts": {c.name: prompt_digest(c) for c in rig.prompt_classes},
        "protocol": {k: protocol[k] for k in PROTOCOL_KEYS if k in protocol},
        "server_args": redacted_argv([*getattr(rig, "extra_args", ()),
                                      *rig.mode_extra_args.get(mode.name, ())]),
        "env": dict(sorted(without_secrets({**inherited, **chosen}).items()))}


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
        model=Path(model).name, speculative_config=speculative_config,
        concurrent_servers=concurrent_servers,
        torch_version=torch_version, cuda_version=cuda_version, cpu_model=cpu_model(),
        machine=machine_id(tier, gpus), date=dt.date.today().isoformat(), commit=git_commit(repo),
        sitting=sitting_id(), **measurement)
