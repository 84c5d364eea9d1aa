"""specgate: performance-regression gates for vLLM speculative decoding.

The product, by layer:

- config: ``config`` (rigs, modes, prompt classes, validated on load), ``locations`` (the fixtures
  folder, a rig file), ``errors``, ``durations``;
- serve: ``server`` (a vLLM server as a context manager), ``sleep``, ``registry`` (kept servers),
  ``gpu``, ``design``, ``model_prep`` (the cpu tier's SmolLM2);
- measure: ``client`` (the streaming client), ``measure``, ``duet``, ``metrics``, ``telemetry``,
  ``spells``;
- decide: ``gates``, ``paired``, ``stats``, ``outcome``, ``breakeven``;
- store: ``baselines``, ``fingerprint``;
- report: ``report``, ``report_figures``, ``plots``;
- plan and progress: ``plan``, ``progress``, ``session`` (one run's state);
- ``plugin/``: the pytest plugin (options, fixtures, parametrization, the gatekeeper, the output);
- ``record``: a running server's raw responses, for replay tests;
- ``extensions``: the entry-point groups other distributions plug into (specgate imports none by name);
- ``cli``: ``python -m specgate`` (prepare-model, run, plan, servers, adopt-baselines).
"""

__version__ = "0.1.0"
