"""The three images as data: what each holds, and the settings its config carries.

One recipe is built two ways: `llmfleet images build` here (builder.py, without a container
engine) and `docker build -f <recipe.dockerfile>` by users with Docker; tests/images checks that
each Dockerfile says what its recipe says (base, packages, copies, user, entrypoint, env,
workdir, ports), so the two cannot drift apart.

Every image has the same shape: a base (Debian bookworm's minimal root filesystem with Python,
or vLLM's image), a virtualenv at `VENV` made from the base's Python with `requirements` (third-
party distributions, as pip specifiers), llmfleet itself installed there from `copies` of the
source tree without its dependencies (what a copy leaves out is not in the image: the local-
cluster tooling never is), then `extras` (the engine simulator and the `vllm` shim of
engine-local).
"""

from __future__ import annotations

from dataclasses import dataclass

VENV = "/opt/llmfleet"
"""The virtualenv every image installs llmfleet into (its `bin` is first on PATH)."""
SRC = "/src"
"""Where the copies go before `pip install --no-deps` (removed afterwards)."""
USER = "10001:10001"
"""uid:gid of every image: non-root, the same number the chart's securityContext uses."""
USER_NAME = "llmfleet"
HOME = "/nonexistent"
"""The user's home, which does not exist (Debian's convention for system users): nothing may
expect to write under it on a read-only root filesystem."""
PATH = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

DEBIAN_PACKAGES = ("python3", "python3-venv")
"""python3 is bookworm's CPython 3.11 (cp311 wheels); python3-venv brings `venv` and the pip
wheel the Dockerfiles run (`python <wheel>/pip install`: the venv holds no pip of its own)."""

REAL_VLLM_LIBRARIES = ("libnuma1", "libgomp1")
"""What vLLM's CPU build links from the system (its `_C` extensions: libnuma; one of its wheels:
libgomp), for engine-local's real-vLLM mode (a venv on a volume, core/vllm_shim.py); libstdc++
and zlib come with the base (apt needs them)."""

LAUNCHER_REQUIREMENTS = (
    "typer>=0.12",
    "rich>=13",
    "pydantic>=2.7",
    "pydantic-settings>=2.3",
    "pyyaml>=6",
    "httpx>=0.27",
    "starlette>=0.37",
    "uvicorn>=0.30",
)
"""What `llmfleet-runtime` imports (and the core modules it uses: loopback, vllm_metrics,
capacity_profile), each as pyproject.toml pins it; a test keeps this a subset of pyproject's
dependencies."""

PACKAGING = ("setuptools>=69", "wheel")
"""The build backend pip needs to install llmfleet from its source (pyproject's build-system);
only in pip's temporary build environment, never in the image."""


@dataclass(frozen=True)
class DebianBase:
    """A Debian root filesystem from `mmdebstrap --variant=minbase`, docs, man pages and
    locales left out as in Docker's `debian:<suite>-slim`, with the image's user added. In the
    Dockerfile: `FROM debian:<suite>-slim` plus `apt-get install` of the same packages."""

    suite: str = "bookworm"
    packages: tuple[str, ...] = DEBIAN_PACKAGES

    @property
    def docker_image(self) -> str:
        return f"debian:{self.suite}-slim"


@dataclass(frozen=True)
class ExternalBase:
    """A base image that cannot be pulled here: only the layers above it are built, and the
    archive's manifest names it (`org.opencontainers.image.base.name`)."""

    docker_image: str
    python: str
    """The base's interpreter the venv is made from (`python3 -m venv`)."""


@dataclass(frozen=True)
class Copy:
    """`COPY <source> <SRC>/<target>`: a repository path or a `*.py` glob of one directory."""

    source: str
    target: str


@dataclass(frozen=True)
class Extra:
    """A file put at `path` in the image after llmfleet: `source` is a repository path, or
    `tool:<name>` for the binary of the local cluster's pinned tool of that name."""

    source: str
    path: str
    mode: int = 0o755


@dataclass(frozen=True)
class Recipe:
    name: str
    repository: str
    """Where the image is pushed; tagged with the package version."""
    dockerfile: str
    """The equivalent Dockerfile, relative to the repository root (its build context)."""
    description: str
    base: DebianBase | ExternalBase
    requirements: tuple[str, ...]
    copies: tuple[Copy, ...]
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    ports: tuple[int, ...]
    writable: tuple[str, ...]
    """Directories that must be volumes (the root filesystem is read-only); a label says so."""
    extras: tuple[Extra, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    """The whole environment of the config (an external base's PATH is the base's own)."""
    workdir: str = "/"
    owned: tuple[str, ...] = ()
    """Directories made in the image's top layer, owned by `USER` (a home for the user of an
    external base, whose /etc/passwd this build cannot change)."""

    def reference(self, version: str) -> str:
        return f"{self.repository}:{version}"

    def labels(self, version: str) -> tuple[tuple[str, str], ...]:
        labels = [
            ("org.opencontainers.image.title", self.name),
            ("org.opencontainers.image.description", self.description),
            ("org.opencontainers.image.version", version),
            ("org.opencontainers.image.source", "https://github.com/llmfleet/llmfleet"),
            ("dev.llmfleet.writable-volumes", ",".join(self.writable)),
        ]
        if isinstance(self.base, ExternalBase):
            labels.append(("org.opencontainers.image.base.name", self.base.docker_image))
        return tuple(labels)


PYTHON_ENV = (
    ("PYTHONUNBUFFERED", "1"),
    # The root filesystem is read-only: Python must not try to write bytecode next to sources
    # (the Debian images compile it at build time, in hash-checked form).
    ("PYTHONDONTWRITEBYTECODE", "1"),
)
DEBIAN_ENV = (("PATH", PATH), *PYTHON_ENV)

_CORE = Copy("core/llmfleet/core/*.py", "core/llmfleet/core/")
"""core's own modules only: its subpackages cluster/, local/ and images/ are the local-cluster
tooling (Go builds, kwok, the pod runner, this builder), never in an image."""
_META = Copy("pyproject.toml", "")
_README = Copy("README.md", "")
_RUNTIME = Copy("runtime_image/llmfleet/runtime", "runtime_image/llmfleet/runtime/")
_CRDS = Copy("crds/llmfleet", "crds/llmfleet/")
"""The API models: the launcher reads `runtime.extraArgs` with crds/engine_args.py, the very
checks admission runs."""

CONTROL_PLANE = Recipe(
    name="control-plane",
    repository="ghcr.io/llmfleet/llmfleet",
    dockerfile="images/control-plane.Dockerfile",
    description="llmfleet's operator, gateway and autoscaler (`llmfleet operator|gateway|"
    "autoscaler`)",
    base=DebianBase(),
    requirements=(),  # pyproject.toml's dependencies, filled in by control_plane_requirements()
    copies=(
        _META,
        _README,
        _CORE,
        _CRDS,
        Copy("operator/llmfleet", "operator/llmfleet/"),
        Copy("gateway/llmfleet", "gateway/llmfleet/"),
        # The autoscaler without its simulator (sim/: matplotlib and numpy, a workstation tool).
        Copy("autoscaler/llmfleet/autoscaler/*.py", "autoscaler/llmfleet/autoscaler/"),
        _RUNTIME,
    ),
    entrypoint=("llmfleet",),
    cmd=("--help",),
    # The gateway's API, then the operator's and the autoscaler's /metrics (their defaults).
    ports=(8080, 8081, 8082),
    writable=("/tmp",),
    env=DEBIAN_ENV,
)

ENGINE_LOCAL = Recipe(
    name="engine-local",
    repository="ghcr.io/llmfleet/llmfleet-engine-local",
    dockerfile="images/engine-local.Dockerfile",
    description="llmfleet's engine launcher with llm-d-inference-sim as its engine (a `vllm` "
    "shim): local engine pods without a GPU",
    base=DebianBase(packages=(*DEBIAN_PACKAGES, *REAL_VLLM_LIBRARIES)),
    requirements=LAUNCHER_REQUIREMENTS,
    copies=(
        _META,
        _README,
        _CORE,
        # The shim reuses the local pod runner's engine flags (pure, stdlib only).
        Copy("core/llmfleet/core/local/__init__.py", "core/llmfleet/core/local/"),
        Copy("core/llmfleet/core/local/engines.py", "core/llmfleet/core/local/"),
        _CRDS,
        _RUNTIME,
    ),
    extras=(
        Extra("tool:llm-d-inference-sim", "/usr/local/bin/llm-d-inference-sim"),
        Extra("images/engine-local/vllm", "/usr/local/bin/vllm"),
    ),
    entrypoint=("llmfleet-runtime",),
    cmd=("serve", "--config", "/etc/llmfleet/runtime.yaml"),
    # 8000: the engine (OpenAI API, /health, /metrics); 8001: the launcher's side port.
    ports=(8000, 8001),
    writable=("/tmp",),
    env=DEBIAN_ENV,
)

RUNTIME = Recipe(
    name="runtime",
    repository="ghcr.io/llmfleet/llmfleet-runtime",
    dockerfile="runtime_image/Dockerfile",
    description="llmfleet's engine launcher on vLLM's OpenAI server image (the launcher in a "
    "venv of its own; vLLM's Python untouched)",
    # Must match the `vllm==` pin of the `runtime` extra in pyproject.toml (a test checks it).
    base=ExternalBase("vllm/vllm-openai:v0.33.0", python="/usr/bin/python3"),
    requirements=LAUNCHER_REQUIREMENTS,
    copies=(_META, _README, _CORE, _CRDS, _RUNTIME),
    # By its path: PATH stays the base's (vLLM's `vllm` and Python first), never the venv's.
    entrypoint=(f"{VENV}/bin/llmfleet-runtime",),
    cmd=("serve", "--config", "/etc/llmfleet/runtime.yaml"),
    ports=(8000, 8001),
    # Hugging Face's cache and vLLM's compile caches live under HOME.
    writable=("/tmp", "/home/llmfleet"),
    env=(
        *PYTHON_ENV,
        ("HOME", "/home/llmfleet"),
        ("HF_HOME", "/home/llmfleet/.cache/huggingface"),
    ),
    workdir="/home/llmfleet",
    owned=("/home/llmfleet",),
)

RECIPES = {recipe.name: recipe for recipe in (CONTROL_PLANE, ENGINE_LOCAL, RUNTIME)}
IMAGE_NAMES = tuple(RECIPES)
