"""The launcher's exit codes and its one error type.

Every way the launcher ends has its own exit code, so a pod's `lastState.terminated.exitCode`
already says what happened; the log's last line says it in words.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    USAGE = 2
    """Bad command line (typer's own code)."""
    BAD_CONFIG = 3
    """The config file is missing, not YAML/JSON, or fails the schema."""
    UNKNOWN_GPU = 4
    """The GPU type (configured or detected) is not one the launcher has defaults for."""
    BAD_PARALLELISM = 5
    """Tensor parallel larger than the GPUs present, or not dividing their count."""
    UNKNOWN_KV_CONNECTOR = 6
    """A KV connector other than NixlConnector or LMCacheConnectorV1, or a role without one."""
    CONFLICTING_ARGS = 7
    """extraArgs contradict the spec, each other, or an option the launcher owns."""
    BAD_SPEC = 8
    """Another invalid value (speculative method, quantization, KV-cache dtype)."""
    SIDE_PORT_FAILED = 9
    """The launcher's side port (readiness, drain) cannot be bound (in use, or not allowed)."""
    ENGINE_FAILED = 10
    """The engine exited, or did not become healthy within the startup timeout."""
    WARMUP_FAILED = 11
    """A warm-up request failed, or warm-up overran its timeout."""
    DRAIN_TIMEOUT = 12
    """SIGTERM: requests were still in flight when the grace period ended."""
    PROFILE_FAILED = 13
    """The profiler could not measure the engine."""


class LauncherError(Exception):
    """A problem stated in one line; the CLI prints it and exits with `code`."""

    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code
