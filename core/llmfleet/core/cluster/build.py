"""Build the local cluster's binaries from Go modules, once, into a per-tool cache.

Layout: `<cache>/<tool>-<version>/bin/<binary>` plus a `.done` stamp written only after every
binary of the tool is in place, and a `<tool>-<version>.lock` that serialises builders (two test
sessions, or CI's background build and the test fixture, never build the same tool twice: the
second waits for the first and then finds the stamp).

Go tools are built with `go`; Debian tools (Prometheus) are fetched with `apt-get download` and
unpacked with `dpkg-deb -x` under the same lock and stamp, so `llmfleet cluster build` and test
fixtures get every tool the same way.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from llmfleet.core import netns
from llmfleet.core.cluster.errors import ClusterError
from llmfleet.core.cluster.toolchain import (
    TOOLS,
    TOOLS_BY_NAME,
    DebTool,
    GoTool,
    Tool,
    go_binary_name,
)

MIN_GO = (1, 26)

Progress = Callable[[Tool, str], None]
"""Called with a tool and a line of what is happening (a step, or the build's latest output)."""


def cache_root() -> Path:
    """`$LLMFLEET_CACHE_DIR`, else `~/.cache/llmfleet`."""
    configured = os.environ.get("LLMFLEET_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "llmfleet"


def tool_dir(tool: Tool, root: Path | None = None) -> Path:
    return (root or cache_root()) / tool.key


def bin_dir(tool: Tool, root: Path | None = None) -> Path:
    return tool_dir(tool, root) / "bin"


def binary(tool: Tool, name: str, root: Path | None = None) -> Path:
    return bin_dir(tool, root) / name


def is_built(tool: Tool, root: Path | None = None) -> bool:
    directory = tool_dir(tool, root)
    if not (directory / ".done").is_file():
        return False
    return all(os.access(directory / "bin" / name, os.X_OK) for name in tool.binaries)


def missing_tools(tools: Sequence[Tool] = TOOLS, root: Path | None = None) -> list[Tool]:
    return [tool for tool in tools if not is_built(tool, root)]


def check_go() -> str:
    """The path of a usable `go`, or a ClusterError saying what to install."""
    go = shutil.which("go")
    if go is None:
        raise ClusterError(
            "the Go toolchain is not on PATH: the local cluster's binaries are built from Go "
            f"modules; install Go >= {MIN_GO[0]}.{MIN_GO[1]} and retry"
        )
    output = subprocess.run([go, "version"], capture_output=True, text=True, check=False).stdout
    match = re.search(r"go(\d+)\.(\d+)", output)
    if match is None or (int(match[1]), int(match[2])) < MIN_GO:
        raise ClusterError(
            f"`go version` says {output.strip()!r}; the pinned Kubernetes needs Go >= "
            f"{MIN_GO[0]}.{MIN_GO[1]}"
        )
    return go


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file `path` (made with its folder if missing): builders of
    one cached thing wait for each other instead of building it twice (images use it too)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _offline() -> bool:
    """Only loopback here (a namespace of `llmfleet isolated`): nothing can be downloaded."""
    return netns.isolation_problem(environ={}) is None


def _go_env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    if _offline():  # fail at once, saying so, instead of Go's lookups of the module proxy
        env["GOPROXY"] = "off"
    # Build with the machine's toolchain only (never download another one) and keep the module
    # cache deletable by a plain `rm -rf`.
    env["GOTOOLCHAIN"] = "local"
    flags = env.get("GOFLAGS", "").split()
    if "-modcacherw" not in flags:
        flags.append("-modcacherw")
    env["GOFLAGS"] = " ".join(flags)
    env.update(extra)
    return env


def build_tool(tool: Tool, root: Path | None = None, progress: Progress | None = None) -> float:
    """Build (or fetch) one tool unless its stamp is there; returns seconds spent (0 if cached)."""
    directory = tool_dir(tool, root)
    with locked(directory.parent / f"{tool.key}.lock"):
        if is_built(tool, root):
            return 0.0
        partial = directory / "bin.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        started = time.monotonic()
        stamp: dict[str, object] = {"tool": tool.name, "version": tool.version}
        try:
            if isinstance(tool, DebTool):
                stamp["package"] = tool.pin
                _fetch_deb(tool, partial, progress)
                lines: list[str] = []
            else:
                go = check_go()
                _ensure_apt_build_deps(tool, progress)
                argv, cwd, extra_env = tool.command(partial)
                argv[0] = go
                lines = _run_streaming(argv, cwd, _go_env(extra_env), tool, progress)
        except ClusterError as error:
            if _offline():
                raise ClusterError(
                    f"{error}\n{tool.key} is not built and this process has no network (a "
                    "loopback-only namespace, `llmfleet isolated`): run `llmfleet cluster build` "
                    "outside it first (make test does)"
                ) from None
            raise
        seconds = time.monotonic() - started
        _install(tool, partial, directory, lines)
        stamp["seconds"] = round(seconds, 1)
        (directory / ".done").write_text(json.dumps(stamp) + "\n")
        return seconds


def ensure_binary(
    tool_name: str, name: str | None = None, progress: Progress | None = None
) -> Path:
    """The cached path of one binary (default: the tool's first), built or fetched if missing
    (waiting on a build already running elsewhere)."""
    tool = TOOLS_BY_NAME[tool_name]
    build_tool(tool, progress=progress)
    return binary(tool, name or tool.binaries[0])


def _apt(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    apt_get = shutil.which("apt-get")
    if apt_get is None:
        raise ClusterError(
            "apt-get is not on PATH: Prometheus is taken from Debian's package "
            "(a Debian or Ubuntu machine with Debian's bookworm archive is needed)"
        )
    return subprocess.run(
        [apt_get, "-q", *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=600
    )


def _fetch_deb(tool: DebTool, out_dir: Path, progress: Progress | None) -> None:
    """`apt-get download` the pinned package into a temporary directory, unpack it with
    `dpkg-deb -x`, copy its binaries into `out_dir` and check that each one runs."""
    dpkg_deb = shutil.which("dpkg-deb")
    if dpkg_deb is None:
        raise ClusterError(f"dpkg-deb is not on PATH: it unpacks {tool.pin}")
    with tempfile.TemporaryDirectory(prefix=f"{tool.key}-", dir=out_dir.parent) as scratch:
        # NOTE: as root apt would rather fetch as the `_apt` user; it cannot write here, so apt
        # warns and fetches as root. Harmless: the package is only unpacked, never installed.
        work = Path(scratch)
        if progress is not None:
            progress(tool, f"apt-get download {tool.pin}")
        result = _apt(["download", tool.pin], work)
        if result.returncode != 0 and os.geteuid() == 0:
            # Most often the package lists are missing (a fresh image): fetch them, then retry.
            if progress is not None:
                progress(tool, "apt-get update (package lists missing or outdated)")
            updated = _apt(["update"], work)
            if updated.returncode != 0:
                raise ClusterError(_apt_failure(tool, "apt-get update", updated))
            result = _apt(["download", tool.pin], work)
        if result.returncode != 0:
            hint = "" if os.geteuid() == 0 else " (run `sudo apt-get update` first?)"
            raise ClusterError(_apt_failure(tool, "apt-get download", result) + hint)
        debs = list(work.glob(f"{tool.package}_*.deb"))
        if len(debs) != 1:
            raise ClusterError(f"apt-get download {tool.pin} left {len(debs)} .deb files")
        unpacked = work / "root"
        if progress is not None:
            progress(tool, f"dpkg-deb -x {debs[0].name}")
        subprocess.run(
            [dpkg_deb, "-x", str(debs[0]), str(unpacked)],
            capture_output=True, text=True, check=True, timeout=300,
        )  # fmt: skip
        for path in tool.paths:
            source = unpacked / path
            if not source.is_file():
                raise ClusterError(f"{tool.pin} holds no {path}")
            target = out_dir / source.name
            shutil.copyfile(source, target)
            target.chmod(0o755)
    for name in tool.binaries:
        _check_runs(tool, out_dir / name, tool.check_args)


def _ensure_apt_build_deps(tool: GoTool, progress: Progress | None) -> None:
    """Install the Debian packages a cgo build needs (headers), unless they are installed."""
    missing = [package for package in tool.apt_build_deps if not _deb_installed(package)]
    if not missing:
        return
    if os.geteuid() != 0:
        raise ClusterError(
            f"building {tool.key} needs the Debian packages {', '.join(missing)}: "
            f"`sudo apt-get install {' '.join(missing)}` and retry"
        )
    if progress is not None:
        progress(tool, f"apt-get install {' '.join(missing)} (needed by the build)")
    work = Path(tempfile.gettempdir())
    result = _apt(["install", "-y", *missing], work)
    if result.returncode != 0:
        _apt(["update"], work)
        result = _apt(["install", "-y", *missing], work)
    if result.returncode != 0:
        said = (result.stderr or result.stdout).strip().splitlines()
        raise ClusterError(
            f"apt-get install {' '.join(missing)} failed (exit {result.returncode}): "
            + (" | ".join(said[-3:]) or "no output")
        )


def _deb_installed(package: str) -> bool:
    result = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", package],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return result.returncode == 0 and "install ok installed" in result.stdout


def _apt_failure(tool: DebTool, what: str, result: subprocess.CompletedProcess[str]) -> str:
    output = (result.stderr or result.stdout).strip().splitlines()
    return f"fetching {tool.key} ({tool.pin}) failed: {what} exited {result.returncode}: " + (
        " | ".join(output[-4:]) or "no output"
    )


def _check_runs(tool: Tool, path: Path, args: tuple[str, ...] = ("--version",)) -> None:
    """`<binary> --version` must succeed here (a missing shared library shows up now, not when a
    test starts it)."""
    try:
        result = subprocess.run(
            [str(path), *args], capture_output=True, text=True, check=False, timeout=30
        )
    except OSError as error:
        raise ClusterError(f"{tool.key}: {path.name} does not run here: {error}") from error
    if result.returncode != 0:
        output = (result.stderr or result.stdout).strip()
        shown = " ".join([path.name, *args])
        raise ClusterError(f"{tool.key}: `{shown}` failed: {output[-300:]}")


def _run_streaming(
    argv: list[str], cwd: Path | None, env: dict[str, str], tool: GoTool, progress: Progress | None
) -> list[str]:
    """Run the Go command, forwarding each output line to `progress`; keep the tail for errors."""
    tail: list[str] = []
    with subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            tail = [*tail[-39:], line.rstrip()]
            if progress is not None:
                progress(tool, line.rstrip())
        code = process.wait()
    if code != 0:
        shown = "\n".join(tail[-15:])
        raise ClusterError(f"building {tool.key} failed (exit {code}):\n{shown}")
    return tail


def _install(tool: Tool, partial: Path, directory: Path, lines: list[str]) -> None:
    built = {path.name: path for path in partial.iterdir()}
    if isinstance(tool, GoTool):
        for package, name in zip(tool.packages, tool.binaries, strict=True):
            produced = go_binary_name(package)
            if name not in built and produced in built:
                built[produced].rename(partial / name)
            elif name not in built:
                raise ClusterError(
                    f"building {tool.key} produced no {name}: {' '.join(lines[-5:])}"
                )
    final = directory / "bin"
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)


def ensure_tools(
    tools: Sequence[Tool] = TOOLS, root: Path | None = None, progress: Progress | None = None
) -> dict[str, float]:
    """Build every tool that is not cached yet; returns seconds spent per tool built."""
    spent: dict[str, float] = {}
    for tool in tools:
        if is_built(tool, root):
            continue
        if progress is not None and isinstance(tool, DebTool):
            progress(tool, f"building from Debian's {tool.pin} (download and unpack)")
        elif progress is not None:
            progress(tool, f"building (about {_about(tool.estimated_seconds)} on 2 cores, cold)")
        spent[tool.key] = build_tool(tool, root, progress)
    return spent


def _about(seconds: float) -> str:
    """A build estimate as a person reads it: `40 s`, `4 min`."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"
