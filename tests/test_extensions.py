"""The product's extension points (specgate.serve.extensions): entry-point groups another distribution
registers, as an installed plugin would, read without specgate naming the plugin."""

import sys
import textwrap

import pytest

from specgate.errors import SpecgateError
from specgate.serve import extensions

pytestmark = pytest.mark.fast


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """Install a plugin distribution for one test: a module and its dist-info on sys.path."""

    def install(module: str, entry_points: str) -> None:
        (tmp_path / "example_plugin.py").write_text(textwrap.dedent(module))
        info = tmp_path / "example_plugin-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: example-plugin\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
        monkeypatch.syspath_prepend(str(tmp_path))
        extensions.server_env_prefixes.cache_clear()

    yield install
    sys.modules.pop("example_plugin", None)
    extensions.server_env_prefixes.cache_clear()


def test_a_plugin_s_server_variables_and_model_hook_are_found_through_its_entry_points(installed, tmp_path):
    installed("""
        ENV_PREFIXES = ("EXAMPLE_SLOWDOWN", "EXAMPLE_GPU_")
        seen = []

        def prepared(model_dir):
            seen.append(model_dir)
    """, """
        [specgate.server_env]
        example = example_plugin:ENV_PREFIXES
        [specgate.model_prepared]
        example = example_plugin:prepared
    """)
    assert {"EXAMPLE_SLOWDOWN", "EXAMPLE_GPU_"} <= set(extensions.server_env_prefixes())
    extensions.run_model_prepared(tmp_path / "model")
    assert sys.modules["example_plugin"].seen == [tmp_path / "model"]


def test_a_malformed_plugin_is_named(installed):
    installed("ENV_PREFIXES = 'EXAMPLE_'\n", """
        [specgate.server_env]
        example = example_plugin:ENV_PREFIXES
    """)
    with pytest.raises(SpecgateError, match=r"example \(example_plugin:ENV_PREFIXES\) of group specgate.server_env"):
        extensions.server_env_prefixes()


def test_a_plugin_that_cannot_load_is_named(installed):
    installed("", """
        [specgate.model_prepared]
        example = example_plugin:missing
    """)
    with pytest.raises(SpecgateError, match=r"example = example_plugin:missing of group specgate.model_prepared"):
        extensions.model_prepared_hooks()
