"""serve: vLLM server processes: start, health, sleep mode, kept servers, GPUs, host memory, model.

May import: config and the bottom modules.
"""
