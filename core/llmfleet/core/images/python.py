"""Python in an image without running the image: wheels downloaded once, a venv laid out as
`python -m venv` lays it out, and pip installing into it for the image's interpreter.

`pip download` (the only step that needs the network) fills a wheelhouse keyed by the
requirements and the target interpreter; everything after runs with `--no-index` from it, so a
rebuild works offline (inside `llmfleet isolated`) and resolves to the same wheels.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from llmfleet.core.images.errors import ImageError
from llmfleet.core.images.recipe import PACKAGING, VENV


@dataclass(frozen=True)
class Interpreter:
    """The image's Python: where it is and which wheels it takes."""

    executable: str
    version: str
    """`3.11`."""
    glibc: tuple[int, int]
    """The base's glibc: the newest manylinux wheels it runs."""

    @property
    def tag(self) -> str:
        return "cp" + self.version.replace(".", "")

    def pip_target_options(self) -> list[str]:
        platforms = [f"manylinux_2_{minor}_x86_64" for minor in range(17, self.glibc[1] + 1)]
        return [
            "--only-binary=:all:", "--implementation=cp", f"--python-version={self.version}",
            f"--abi={self.tag}", "--abi=abi3", "--abi=none",
            *(f"--platform={platform}" for platform in ["manylinux2014_x86_64", *platforms]),
            "--platform=any",
        ]  # fmt: skip

    @property
    def same_as_host(self) -> bool:
        """This process's Python can compile bytecode for it (same minor version)."""
        return f"{sys.version_info.major}.{sys.version_info.minor}" == self.version


BOOKWORM_PYTHON = Interpreter("/usr/bin/python3", "3.11", (2, 36))
VLLM_PYTHON = Interpreter("/usr/bin/python3", "3.12", (2, 35))
"""vLLM's image: Ubuntu 22.04 (glibc 2.35) with CPython 3.12 as /usr/bin/python3, as vLLM's
Dockerfile makes it (not checked against the pinned image, which cannot be pulled here)."""


def _pip(args: Sequence[str], what: str, timeout: float = 900) -> None:
    argv = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args]
    env = {**os.environ, "PIP_NO_CACHE_DIR": "1", "SOURCE_DATE_EPOCH": os.environ.get(
        "SOURCE_DATE_EPOCH", "0")}  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, env=env, check=False,
                            timeout=timeout)  # fmt: skip
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-6:]
        raise ImageError(f"{what} failed (pip exit {result.returncode}): " + " | ".join(tail))


def wheelhouse_key(requirements: Sequence[str], python: Interpreter) -> str:
    text = json.dumps({"requirements": sorted(requirements), "packaging": PACKAGING,
                       "python": python.version, "glibc": python.glibc})  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def download(requirements: Sequence[str], python: Interpreter, into: Path) -> None:
    """`pip download` the requirements (and pip's build backend) as wheels for `python`."""
    into.mkdir(parents=True, exist_ok=True)
    options = python.pip_target_options()
    _pip(["download", "--dest", str(into), *options, *requirements, *PACKAGING],
         f"downloading wheels for Python {python.version}")  # fmt: skip


def wheel_digest(wheelhouse: Path) -> str:
    """What the wheelhouse holds, as one digest (names and contents)."""
    digest = hashlib.sha256()
    for path in sorted(wheelhouse.glob("*.whl")):
        digest.update(path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def make_venv(stage: Path, python: Interpreter) -> Path:
    """Lay out `VENV` under `stage` as `python -m venv --without-pip` would; returns its
    site-packages directory."""
    venv = stage / VENV.lstrip("/")
    bin_dir = venv / "bin"
    site = venv / "lib" / f"python{python.version}" / "site-packages"
    site.mkdir(parents=True)
    bin_dir.mkdir(parents=True)
    (venv / "lib64").symlink_to("lib")
    (bin_dir / "python").symlink_to(python.executable)
    (bin_dir / "python3").symlink_to("python")
    (bin_dir / f"python{python.version}").symlink_to("python")
    home = os.path.dirname(python.executable)
    (venv / "pyvenv.cfg").write_text(
        f"home = {home}\ninclude-system-site-packages = false\nversion = {python.version}\n"
    )
    return site


def install(
    stage: Path,
    python: Interpreter,
    wheelhouse: Path,
    requirements: Sequence[str],
    *,
    no_deps: bool = False,
    find_links: Sequence[Path] = (),
) -> None:
    """Install `requirements` from the wheelhouse into `stage`'s venv (which need not hold an
    interpreter: pip runs here, for `python`'s tags). Console scripts are moved to the venv's
    `bin` and point at its `python`."""
    venv = stage / VENV.lstrip("/")
    site = venv / "lib" / f"python{python.version}" / "site-packages"
    site.mkdir(parents=True, exist_ok=True)
    links = [f"--find-links={path}" for path in (wheelhouse, *find_links)]
    deps = ["--no-deps"] if no_deps else []
    _pip(["install", "--no-index", *links, "--no-compile", "--target", str(site), *deps,
          *python.pip_target_options(), *requirements],
         f"installing {', '.join(requirements)} for Python {python.version}")  # fmt: skip
    scripts = site / "bin"
    if scripts.is_dir():
        (venv / "bin").mkdir(exist_ok=True)
        for script in sorted(scripts.iterdir()):
            target = venv / "bin" / script.name
            content = script.read_bytes()
            if content.startswith(b"#!"):  # pip wrote this interpreter's path: the venv's instead
                content = f"#!{VENV}/bin/python".encode() + content[content.index(b"\n") :]
            target.write_bytes(content)
            target.chmod(0o755)
        shutil.rmtree(scripts)
        _record_scripts(site, venv / "bin")


def _record_scripts(site: Path, bin_dir: Path) -> None:
    """Give each distribution's RECORD the hash and size of its console scripts as they now are.

    NOTE: pip hashed the scripts it wrote, whose first line named the interpreter pip ran under
    (a path of the build machine, `.venv/bin/python` or `python3`, one character apart), so the
    RECORD, and with it the image's digest, changed with whoever built it."""
    for record in sorted(site.glob("*.dist-info/RECORD")):
        lines = []
        for entry in record.read_text().splitlines():
            path, _, rest = entry.partition(",")
            script = bin_dir / Path(path).name
            if "/bin/" in f"/{path}" and rest and script.is_file():
                data = script.read_bytes()
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
                entry = f"{path},sha256={digest.decode()},{len(data)}"  # noqa: PLW2901
            lines.append(entry)
        record.write_text("\n".join(lines) + "\n")


def build_wheel(src: Path, wheelhouse: Path, out: Path) -> None:
    """Build llmfleet's wheel from a source copy, offline, with the wheelhouse's setuptools."""
    _pip(["wheel", "--no-index", f"--find-links={wheelhouse}", "--no-deps", "--wheel-dir",
          str(out), str(src)], "building llmfleet's wheel")  # fmt: skip


def compile_bytecode(stage: Path, python: Interpreter) -> None:
    """Compile the venv's modules in hash-checked form (no timestamps): the read-only root
    filesystem could not take bytecode written at run time. Only for an interpreter of this
    process's version; otherwise the image starts from sources."""
    if not python.same_as_host:
        return
    lib = stage / VENV.lstrip("/") / "lib"
    # NOTE: one process, files in compileall's sorted order. marshal writes a reference flag
    # only for objects another reference holds, so a .pyc's bytes depend on what the compiling
    # process compiled before; with `-j 0` the files are dealt to worker processes as they come
    # free, which differs from run to run on a busy machine, and so did the image's digest.
    argv = [sys.executable, "-m", "compileall", "-q", "-j", "1", "--invalidation-mode",
            "unchecked-hash", "-s", str(stage), "-p", "/", str(lib)]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=900)
    if result.returncode != 0:
        raise ImageError(f"compiling bytecode failed: {result.stdout[-300:]}{result.stderr[-300:]}")
