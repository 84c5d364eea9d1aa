"""specgate's lab: the tools that measured and calibrated the product, apart from it.

- ``calibrate``: false alarms and power of each gate on real servers (A/A duets, injected slowdowns);
- ``inject``: the vLLM general plugin that injects a slowdown of known size (CPU or GPU side);
- ``model_shapes``: dummy-weight models of large shapes for the GPU lab's GPU-bound rigs;
- ``eagle3``, ``eagle3_train``: an EAGLE-3 draft head, untrained (a backfire fixture) or trained;
- ``analyses/``: one-off analyses of lab runs, each ``python -m specgate_lab.analyses.NAME --help``;
- ``lab/scripts/`` (beside this package, not in it): the GPU lab machine's shell scripts, run from the
  repository root.

Commands: ``python -m specgate_lab --help``. A distribution of its own (lab/pyproject.toml): the product
(``specgate``) imports nothing from it; the lab plugs in through entry points (``specgate.serve.extensions``).
"""
