"""specgate: performance-regression gates for vLLM speculative decoding.

One subpackage per layer, each importing only those below it (the layers of the import-linter
contract in pyproject.toml: plugin, advise, report, plan, decide, store, measure, serve, config);
each ``__init__`` says its job. At the top: ``cli`` (``python -m specgate``), and the helpers every
layer may use: ``lazy``, ``durations``, ``files``, ``redaction``, ``exit_codes``, ``errors``.
"""

__version__ = "0.1.0"
