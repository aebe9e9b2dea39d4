"""Run a built image's commands without a container engine: its layers unpacked into a
directory, then `chroot` into it as the image's user, in a private mount namespace where the
root is mounted read-only with a tmpfs on /tmp (what the chart and the engine pods mount)."""

from __future__ import annotations

import gzip
import io
import subprocess
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from llmfleet.core.images.oci import ArchiveImage

SCRIPT = r"""
set -e
root=$1; user=$2; shift 2
mount --bind "$root" "$root"
mount -o remount,bind,ro "$root"
mount -t tmpfs -o size=64m tmpfs "$root/tmp"
mount -t proc proc "$root/proc"
exec chroot --userspec="$user" "$root" "$@"
"""


def unpack(image: ArchiveImage, into: Path) -> Path:
    """The image's root filesystem: every layer extracted in order, lowest first."""
    for blob in image.layers:
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob))) as tar:
            tar.extractall(into, filter="fully_trusted")
    into.chmod(0o755)  # as a runtime makes it; a temporary directory is 0700
    for mount_point in ("tmp", "proc"):
        (into / mount_point).mkdir(exist_ok=True)
    return into


def run_in(
    root: Path,
    argv: Sequence[str],
    *,
    user: str,
    env: Mapping[str, str],
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """`argv` run in the image's root as `user` (uid:gid), with the image's environment."""
    command = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", SCRIPT,
               "image", str(root), user, "env", "-i", *(f"{k}={v}" for k, v in env.items()),
               *argv]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


def start_in(
    root: Path, argv: Sequence[str], *, user: str, env: Mapping[str, str], log: Path
) -> subprocess.Popen[bytes]:
    """`argv` started in the image's root (as `run_in` runs it); its pid is the command's own
    (each step execs the next), so a signal reaches it as a kubelet's would."""
    command = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", SCRIPT,
               "image", str(root), user, "env", "-i", *(f"{k}={v}" for k, v in env.items()),
               *argv]  # fmt: skip
    with log.open("wb") as sink:
        return subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
