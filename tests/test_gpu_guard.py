"""Tests for specgate.serve.gpu.require_free_gpus with injected NVML readings."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specgate.errors import ServerStartError
from specgate.serve.gpu import FREE_THRESHOLD_MIB, GpuReading, require_free_gpus

pytestmark = pytest.mark.fast


def _free(index: int, name: str = "NVIDIA H200") -> GpuReading:
    return GpuReading(index=index, name=name, used_mib=512.0, processes=())


def _held(index: int, mib: float = 70_123.4, pids: tuple[tuple[int, float], ...] = ((4242, 70_000.0),),
          name: str = "NVIDIA H200") -> GpuReading:
    return GpuReading(index=index, name=name, used_mib=mib, processes=pids)


def test_free_gpus_pass() -> None:
    readings = [_free(i) for i in range(8)]
    require_free_gpus(None, count=8, read=lambda: readings)
    require_free_gpus(None, count=1, read=lambda: readings)


def test_threshold_is_inclusive_of_idle_contexts() -> None:
    at = GpuReading(0, "NVIDIA H200", float(FREE_THRESHOLD_MIB), ())
    require_free_gpus(None, count=1, read=lambda: [at])
    above = GpuReading(0, "NVIDIA H200", FREE_THRESHOLD_MIB + 1.0, ())
    with pytest.raises(ServerStartError):
        require_free_gpus(None, count=1, read=lambda: [above])


def test_held_gpu_is_named_with_memory_and_pids() -> None:
    readings = [_free(0), _held(1, pids=((4242, 60_000.0), (4343, 10_000.0))), _free(2), _free(3)]
    with pytest.raises(ServerStartError) as info:
        require_free_gpus(None, count=4, read=lambda: readings)
    message = str(info.value)
    assert message.startswith("refusing to start a server: GPU memory is still held")
    assert "GPU 1 (NVIDIA H200): 70123 MiB used by pid 4242 (60000 MiB), pid 4343 (10000 MiB)" in message
    assert "GPU 0" not in message and "GPU 2" not in message


def test_every_held_gpu_is_listed_and_unknown_holders_are_said() -> None:
    readings = [_held(0, mib=2048.0, pids=()), _held(1, name="NVIDIA RTX PRO 6000")]
    with pytest.raises(ServerStartError) as info:
        require_free_gpus(None, count=2, read=lambda: readings)
    lines = str(info.value).splitlines()
    assert lines[1] == "GPU 0 (NVIDIA H200): 2048 MiB used by unknown processes"
    assert lines[2].startswith("GPU 1 (NVIDIA RTX PRO 6000): 70123 MiB used by pid 4242")


def test_only_the_gpus_the_server_uses_are_checked() -> None:
    """A held GPU beyond the first ``count`` visible ones is someone else's business."""
    readings = [_free(0), _free(1), _held(2)]
    require_free_gpus(None, count=2, read=lambda: readings)
    with pytest.raises(ServerStartError, match="GPU 2"):
        require_free_gpus(None, count=3, read=lambda: readings)


def test_cuda_visible_devices_filters_the_readings() -> None:
    readings = [_held(0), _free(1), _held(2), _free(3)]
    require_free_gpus("1,3", count=2, read=lambda: readings)
    require_free_gpus(" 1, 3 ", count=2, read=lambda: readings)
    require_free_gpus("3", count=1, read=lambda: readings)
    with pytest.raises(ServerStartError) as info:
        require_free_gpus("1,2", count=2, read=lambda: readings)
    assert "GPU 2" in str(info.value) and "GPU 0" not in str(info.value)


def test_too_few_gpus_visible() -> None:
    readings = [_free(i) for i in range(4)]
    with pytest.raises(ServerStartError) as info:
        require_free_gpus("0,1", count=8, read=lambda: readings)
    assert str(info.value) == "the rig needs 8 GPU(s) but 2 are visible (CUDA_VISIBLE_DEVICES='0,1')"
    with pytest.raises(ServerStartError) as info:
        require_free_gpus(None, count=8, read=lambda: readings)
    assert "needs 8 GPU(s) but 4 are visible (CUDA_VISIBLE_DEVICES=None)" in str(info.value)
    with pytest.raises(ServerStartError, match="but 0 are visible"):
        require_free_gpus(None, count=1, read=lambda: [])
    # An index that does not exist does not count as visible.
    with pytest.raises(ServerStartError, match=r"needs 2 GPU\(s\) but 1 are visible"):
        require_free_gpus("3,7", count=2, read=lambda: readings)


def test_the_reading_is_taken_once_per_check() -> None:
    calls = []

    def read() -> list[GpuReading]:
        calls.append(1)
        return [_free(0)]

    require_free_gpus(None, count=1, read=read)
    assert calls == [1]


@given(used=st.lists(st.floats(min_value=0, max_value=150_000), min_size=1, max_size=8),
       data=st.data())
def test_raises_exactly_when_a_used_gpu_is_held(used: list[float], data: st.DataObject) -> None:
    readings = [GpuReading(i, "GPU", mib, ((1000 + i, mib),)) for i, mib in enumerate(used)]
    count = data.draw(st.integers(min_value=1, max_value=len(used)))
    held = [i for i in range(count) if used[i] > FREE_THRESHOLD_MIB]
    if held:
        with pytest.raises(ServerStartError) as info:
            require_free_gpus(None, count=count, read=lambda: readings)
        named = [line.split()[1] for line in str(info.value).splitlines()[1:]]
        assert named == [str(i) for i in held]
        for i in held:
            assert f"pid {1000 + i}" in str(info.value)
    else:
        require_free_gpus(None, count=count, read=lambda: readings)


def test_visible_order_decides_which_gpus_the_server_uses() -> None:
    """CUDA_VISIBLE_DEVICES='3,1' makes GPU 3 the server's device 0: with count=1 it is GPU 3
    that must be free, not the lower-numbered GPU 1."""
    readings = [_free(0), _free(1), _free(2), _held(3)]
    with pytest.raises(ServerStartError, match="GPU 3"):
        require_free_gpus("3,1", count=1, read=lambda: readings)
    require_free_gpus("1,3", count=1, read=lambda: readings)


def test_empty_visible_devices_means_no_gpu() -> None:
    """CUDA reads CUDA_VISIBLE_DEVICES='' as "no GPU", not as unset."""
    with pytest.raises(ServerStartError, match="but 0 are visible"):
        require_free_gpus("", count=1, read=lambda: [_free(0)])


def test_fingerprint_counts_the_servers_gpus_not_the_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    from specgate.store.fingerprint import gpu_info

    names = ["NVIDIA H200", "NVIDIA H100"]
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetName=lambda h: names[h],
        nvmlSystemGetDriverVersion=lambda: "580.159.04")
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert gpu_info() == ("NVIDIA H200", 2, "580.159.04")  # the host
    assert gpu_info("1") == ("NVIDIA H100", 1, "580.159.04")  # an xdist worker's server on GPU 1
    assert gpu_info("0,1") == ("NVIDIA H200", 2, "580.159.04")


def test_uuid_and_mig_entries_select_their_gpu_or_instance() -> None:
    """CUDA_VISIBLE_DEVICES also takes GPU UUIDs (any unique prefix) and MIG instances; a MIG
    instance is judged by its own memory, not by its busy parent GPU's."""
    readings = [
        GpuReading(0, "NVIDIA H200", 512.0, (), uuid="GPU-aaaa1111-0000"),
        GpuReading(1, "NVIDIA H200", 70_000.0, ((4242, 69_000.0),), uuid="GPU-bbbb2222-0000"),
        GpuReading(1, "NVIDIA H200 MIG 1g.18gb", 10.0, (), uuid="MIG-cccc3333-0000"),
    ]
    require_free_gpus("GPU-aaaa1111", count=1, read=lambda: readings)
    require_free_gpus("MIG-cccc3333-0000", count=1, read=lambda: readings)
    with pytest.raises(ServerStartError, match=r"GPU 1 \(NVIDIA H200\): 70000 MiB used by pid 4242"):
        require_free_gpus("GPU-bbbb2222-0000,GPU-aaaa1111", count=1, read=lambda: readings)
    with pytest.raises(ServerStartError, match="needs 1 GPU"):
        require_free_gpus("GPU-ffff", count=1, read=lambda: readings)
    # Unset: the host's whole GPUs, in index order; MIG instances are not extra GPUs.
    with pytest.raises(ServerStartError, match=r"needs 3 GPU\(s\) but 2 are visible"):
        require_free_gpus(None, count=3, read=lambda: readings)


def test_telemetry_resolves_uuid_and_mig_entries_to_nvml_indices() -> None:
    """Telemetry reads clocks per NVML index: a GPU UUID (or a unique prefix) is its GPU, a MIG
    instance its parent GPU; an entry NVML does not know reads every GPU (None)."""
    from specgate.serve.gpu import nvml_indices

    readings = [GpuReading(0, "NVIDIA H200", 0.0, (), uuid="GPU-aaaa1111-0000"),
                GpuReading(1, "NVIDIA H200", 0.0, (), uuid="GPU-bbbb2222-0000"),
                GpuReading(1, "NVIDIA H200 MIG 1g.18gb", 0.0, (), uuid="MIG-cccc3333-0000")]
    assert nvml_indices(["GPU-bbbb2222", "0"], read=lambda: readings) == [1, 0]
    assert nvml_indices(["MIG-cccc3333-0000"], read=lambda: readings) == [1]
    assert nvml_indices(["3", "1"], read=lambda: readings) == [3, 1]
    assert nvml_indices(["GPU-ffff"], read=lambda: readings) is None
    assert nvml_indices([], read=lambda: readings) is None


@pytest.mark.parametrize("value", ["0,1", "GPU-8f2a1b3c-aaaa", "MIG-5d2e7c1a-bbbb,3"])
def test_gpu_option_takes_indices_and_uuids(value: str) -> None:
    from specgate.plugin.options import parse_gpu_list

    assert parse_gpu_list(value) == value.split(",")


@pytest.mark.parametrize("value", ["", "0,0", "gpu0", "0,x"])
def test_gpu_option_refuses_what_cuda_would_not_take(value: str) -> None:
    import argparse

    from specgate.plugin.options import parse_gpu_list

    with pytest.raises(argparse.ArgumentTypeError, match="GPU-<uuid>"):
        parse_gpu_list(value)


def test_fingerprint_counts_uuid_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    from specgate.store.fingerprint import gpu_info

    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetHandleByUUID=lambda u: {"GPU-b": 1}[u],
        nvmlDeviceGetName=lambda h: ["NVIDIA H200", "NVIDIA H100"][h],
        nvmlSystemGetDriverVersion=lambda: "580.159.04")
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert gpu_info("GPU-b") == ("NVIDIA H100", 1, "580.159.04")
    assert gpu_info("GPU-b,0") == ("NVIDIA H100", 2, "580.159.04")
