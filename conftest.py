"""Root conftest: wiring only. It must stay import-light (no torch, no vLLM): every fast test
pays for whatever is imported here.

specgate's pytest plugin is normally loaded through its ``pytest11`` entry point (named
``specgate.plugin``). Where the package is only on ``PYTHONPATH`` (the GPU lab, a fresh checkout
without ``pip install``), the entry point does not exist; naming the module here loads it then,
and pytest skips it when the entry point already registered it under the same name.
"""

pytest_plugins = ["specgate.plugin"]
