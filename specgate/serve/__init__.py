"""serve: vLLM server processes: starting, health, sleep mode, kept servers, GPUs, host memory, the model.

May import: config and the bottom modules.
"""
