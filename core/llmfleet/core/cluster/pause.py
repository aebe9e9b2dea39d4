"""The pod sandbox ("pause") image of the real node, built here: no registry is reachable.

A pause container only holds a pod's namespaces and reaps orphans. Ours is a 30-line C program
linked statically with gcc (~800 KB) and packed as a one-layer OCI image archive, cached under
`<cache>/pause-<hash>/` keyed by the source, so the same source gives the same archive.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from llmfleet.core.cluster import build
from llmfleet.core.cluster.errors import ClusterError
from llmfleet.core.cluster.realnode_config import SANDBOX_IMAGE
from llmfleet.core.images import oci

SOURCE = r"""
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signo) { (void)signo; _exit(0); }

static void reap(int signo) {
    (void)signo;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction down = {.sa_handler = stop};
    struct sigaction child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
    if (sigaction(SIGINT, &down, NULL) < 0 || sigaction(SIGTERM, &down, NULL) < 0 ||
        sigaction(SIGCHLD, &child, NULL) < 0) {
        return 1;
    }
    for (;;) {
        pause();
    }
}
"""


def archive() -> Path:
    """The pause image's OCI archive, compiled and packed once per source."""
    key = hashlib.sha256(SOURCE.encode()).hexdigest()[:16]
    directory = build.cache_root() / f"pause-{key}"
    target = directory / "pause.oci.tar"
    if target.is_file():
        return target
    gcc = shutil.which("gcc")
    if gcc is None:
        raise ClusterError("gcc is not on PATH: the real node's pause image is compiled with it")
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / "pause.c"
    source.write_text(SOURCE)
    program = directory / "pause"
    compiled = subprocess.run(
        [gcc, "-static", "-Os", "-s", "-o", str(program), str(source)],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    if compiled.returncode != 0:
        raise ClusterError(f"compiling the pause program failed: {compiled.stderr.strip()[-300:]}")
    partial = directory / "pause.oci.tar.partial"
    write_file_image(partial, SANDBOX_IMAGE, {"pause": (program.read_bytes(), 0o755)}, ["/pause"])
    partial.rename(target)
    return target


def write_file_image(
    out: Path, reference: str, files: Mapping[str, tuple[bytes, int]], entrypoint: Sequence[str]
) -> str:
    """A one-layer image of a few files (path -> (bytes, mode)), owned by root, reproducible;
    returns its digest. For tiny images such as the pause program or a test's static binary."""
    with tempfile.TemporaryDirectory(prefix="file-image-") as scratch:
        root = Path(scratch) / "root"
        for name, (data, mode) in files.items():
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            path.chmod(mode)
        for directory in [root, *(path for path in root.rglob("*") if path.is_dir())]:
            directory.chmod(0o755)
        layer = oci.write_layer(root, Path(scratch) / "layer.tar.gz", owner=lambda *_: (0, 0))
        config = oci.ImageConfig(
            user="0:0", entrypoint=tuple(entrypoint), cmd=(), env=(), workdir="/", ports=(),
            labels=(),
        )  # fmt: skip
        return oci.write_archive(out, reference, [layer], config)
