"""Every error specgate raises on purpose. Each message names what it is about
(file and key, mode, request) so a failure can be acted on without a debugger."""

from __future__ import annotations

from pathlib import Path


class SpecgateError(Exception):
    """Base class: an expected failure with a message meant for the user."""


class ConfigError(SpecgateError):
    """A user-edited file (rig, mode, prompts, baselines), or a saved report handed back to
    specgate, is missing, unreadable or invalid."""

    def __init__(self, path: object, key: str | None, message: str) -> None:
        self.path = str(path)
        self.key = key
        where = f"{self.path}: {key}" if key else self.path
        super().__init__(f"{where}: {message}")


class ServerError(SpecgateError):
    """A vLLM server could not be started, died, or could not be stopped cleanly."""


class ServerStartError(ServerError):
    """The server exited or missed its deadline before it became ready."""


class ServerDiedError(ServerError):
    """The server exited after it had become ready (for example killed mid-run)."""


class RequestError(SpecgateError):
    """One HTTP request to the server failed; the message names request and mode."""


class MetricsError(SpecgateError):
    """The server's /metrics text could not be parsed or its counters are inconsistent."""


class OutputError(SpecgateError):
    """A folder given for a command's output (``--out``) where its file cannot be written."""

    def __init__(self, folder: object, exc: OSError, option: str = "--out") -> None:
        self.path = str(folder)
        blocker = next((p for p in (Path(self.path), *Path(self.path).parents)
                        if p.exists() and not p.is_dir()), None)
        why = (f"{blocker} is a file, not a folder" if blocker is not None
               else exc.strerror or str(exc))
        super().__init__(f"{self.path}: cannot write there ({option}): {why}")
