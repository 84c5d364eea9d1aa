"""Defaults the rig files fall back on, measured or derived elsewhere; light (no import)."""

# What a swap is expected to cost before one was measured (the H200's 0.7 s + 0.9 s, rounded up).
EXPECTED_SWAP_S = 2.0
MIN_PAIRS = 6  # below this the signed-rank interval at 95 % does not exist
