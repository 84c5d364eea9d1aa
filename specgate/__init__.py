"""specgate: performance-regression gates for vLLM speculative decoding.

The product, one subpackage per layer, each importing only those below it (the import-linter
contract in pyproject.toml); each ``__init__`` says its job:

- ``plugin``: the pytest plugin (hooks, options, fixtures, the session's state, the gatekeeper);
- ``advise``: the best k and the speculation schedule, from measured windows;
- ``report``: every sentence, table, plot and page a user reads, and report.json;
- ``plan``: what a run will cost before it starts, and its progress;
- ``decide``: the run's settings, the gates, statistics and outcomes;
- ``store``: baselines.json, fingerprints, saved reports, the queued stored figures;
- ``measure``: the streaming client, the measurement protocol, vLLM's metrics, telemetry;
- ``serve``: vLLM servers (start, health, sleep mode, kept servers), GPUs, host memory, the model;
- ``config``: the rig, mode and prompt files, loaded and validated;
- at the top: ``cli`` (``python -m specgate``), and the helpers every layer may use: ``lazy``,
  ``durations``, ``files``, ``redaction``, ``exit_codes``, ``errors``.
"""

__version__ = "0.1.0"
