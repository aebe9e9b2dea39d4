"""What the local system does with the processes it runs in place of a kubelet (the supervisor's
components, the pod runner's engines): restart back-off and stopping."""

from __future__ import annotations

import signal
import subprocess

RESTART_BACKOFF_MAX = 10.0


def restart_backoff(restarts: int) -> float:
    """Seconds before restart number `restarts` (1, 2, 4, 8, then 10 s), as a kubelet's
    CrashLoopBackOff grows, capped lower."""
    return float(min(RESTART_BACKOFF_MAX, 2 ** min(restarts - 1, 4)))


def stop(process: subprocess.Popen[bytes] | None, grace: float) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds, as a pod's termination does; a process that
    already exited (or none) needs nothing."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)
