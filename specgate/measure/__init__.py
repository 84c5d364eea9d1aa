"""measure: the streaming client, the measurement protocol, vLLM's metrics, telemetry, raw records.

May import: serve, config and the bottom modules.
"""
