"""The fingerprint of a measurement: which accelerator, driver, vLLM, model and config."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import httpx

from specgate.baselines import Fingerprint


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
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
            first = 0
            if visible is not None:
                indices = [int(i) for i in visible.split(",") if i.strip().isdigit() and int(i) < count]
                count, first = len(indices), (indices[0] if indices else 0)
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(first)) if count else "none"
            driver = pynvml.nvmlSystemGetDriverVersion()
            return (name.decode() if isinstance(name, bytes) else name, count,
                    driver.decode() if isinstance(driver, bytes) else driver)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML, no driver, no GPU: the fingerprint says unknown
        return "unknown", 0, None


def git_commit(cwd: Path) -> str | None:
    """The commit under test: ``SPECGATE_COMMIT`` when set (a copied tree whose ``.git`` is not the
    code's, as on the GPU lab machine), else ``git describe --always --dirty`` ("651a65d-dirty"
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
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{base_url}/version", headers=headers, timeout=10)
        return response.json().get("version") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def collect(*, tier: str, model: str, speculative_config: dict[str, Any] | None,
            vllm_version: str | None, repo: Path, gpus: str | None = None,
            concurrent_servers: int = 1) -> Fingerprint:
    if tier == "gpu":
        accelerator, count, driver = gpu_info(gpus)
    else:
        import os

        accelerator, count, driver = cpu_model(), os.cpu_count() or 0, None
    return Fingerprint(
        accelerator=accelerator, accelerator_count=count, driver=driver, vllm_version=vllm_version,
        model=Path(model).name, speculative_config=speculative_config, concurrent_servers=concurrent_servers,
        date=dt.date.today().isoformat(), commit=git_commit(repo),
    )
