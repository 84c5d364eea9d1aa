"""What `pip install .` of the product ships and registers: the package specgate only, and no vLLM
plugin (the lab's slowdown injector is a distribution of its own, lab/, installed apart)."""

import importlib.metadata
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_product_registers_no_vllm_plugin_and_names_no_lab_module():
    project = _project()["project"]
    assert "vllm.general_plugins" not in project.get("entry-points", {})
    targets = [*project.get("scripts", {}).values(),
               *(v for group in project.get("entry-points", {}).values() for v in group.values())]
    assert [t for t in targets if not t.startswith("specgate.")] == []


def test_the_product_ships_the_specgate_package_only():
    from setuptools import find_packages

    include = _project()["tool"]["setuptools"]["packages"]["find"]["include"]
    found = find_packages(str(ROOT), include=include)
    assert "specgate" in found and "specgate.plugin" in found
    assert [p for p in found if p.split(".")[0] != "specgate"] == []


def test_the_installed_product_s_metadata_has_no_vllm_plugin():
    """The metadata pip wrote for the installed product (tox installs it): what `pip install .` registers."""
    try:
        dist = importlib.metadata.distribution(_project()["project"]["name"])
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the product is not installed here (run through tox)")
    groups = {e.group for e in dist.entry_points}
    assert "pytest11" in groups and "vllm.general_plugins" not in groups


def test_the_lab_is_its_own_distribution_with_the_vllm_plugin():
    lab = tomllib.loads((ROOT / "lab" / "pyproject.toml").read_text())["project"]
    assert lab["name"] != _project()["project"]["name"]
    assert lab["entry-points"]["vllm.general_plugins"] == {"specgate_slowdown": "specgate_lab.inject:register"}
    assert _project()["project"]["name"] in lab["dependencies"]
