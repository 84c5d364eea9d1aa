"""specgate: performance-regression gates for vLLM speculative decoding."""

__version__ = "0.1.0"
