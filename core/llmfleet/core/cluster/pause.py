"""The pod sandbox ("pause") image of the real node, built here: no registry is reachable.

A pause container only holds a pod's namespaces and reaps orphans. Ours is a 30-line C program
linked statically with gcc (~800 KB) and packed as a one-layer OCI image archive, cached under
`<cache>/pause-<hash>/` keyed by the source, so the same source gives the same archive.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from llmfleet.core.cluster import build, oci
from llmfleet.core.cluster.errors import ClusterError
from llmfleet.core.cluster.realnode_config import SANDBOX_IMAGE

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
    oci.write_archive(
        partial,
        reference=SANDBOX_IMAGE,
        files=[oci.File("pause", program.read_bytes(), mode=0o755)],
        entrypoint=["/pause"],
    )
    partial.rename(target)
    return target
