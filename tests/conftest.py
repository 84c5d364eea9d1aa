"""Settings for specgate's own tests (tests/ only: the perf tiers never load this file).

Hypothesis runs under a profile, so the example count is chosen in one place:

- ``fast`` (the default, what every PR runs): 30 examples per property test. Part of keeping the
  fast tier under 20 s on 2 cores; a property test that held for 30 examples in every run so far
  is unlikely to break on example 31, and the example database replays any failure it finds.
- ``thorough``: 500 examples each, for a release or after touching the parsers and the statistics:
  ``SPECGATE_HYPOTHESIS=thorough tox -e fast`` (tox passes SPECGATE_* through).

Both drop Hypothesis's per-example deadline: on a shared 2-core machine a slow example is load,
not a finding. A test's own ``@settings`` sets only what differs from the profile (health checks).
"""

import os

from hypothesis import settings

settings.register_profile("fast", max_examples=30, deadline=None)
settings.register_profile("thorough", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("SPECGATE_HYPOTHESIS", "fast"))
