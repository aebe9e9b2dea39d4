"""Build the local cluster's binaries from Go modules, once, into a per-tool cache.

Layout: `<cache>/<tool>-<version>/bin/<binary>` plus a `.done` stamp written only after every
binary of the tool is in place, and a `<tool>-<version>.lock` that serialises builders (two test
sessions, or CI's background build and the test fixture, never build the same tool twice: the
second waits for the first and then finds the stamp).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from llmfleet.core.cluster.errors import ClusterError
from llmfleet.core.cluster.toolchain import TOOLS, GoTool, go_binary_name

MIN_GO = (1, 26)

Progress = Callable[[GoTool, str], None]
"""Called with a tool and a line of what is happening (a step, or the build's latest output)."""


def cache_root() -> Path:
    """`$LLMFLEET_CACHE_DIR`, else `~/.cache/llmfleet`."""
    configured = os.environ.get("LLMFLEET_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "llmfleet"


def tool_dir(tool: GoTool, root: Path | None = None) -> Path:
    return (root or cache_root()) / tool.key


def bin_dir(tool: GoTool, root: Path | None = None) -> Path:
    return tool_dir(tool, root) / "bin"


def binary(tool: GoTool, name: str, root: Path | None = None) -> Path:
    return bin_dir(tool, root) / name


def is_built(tool: GoTool, root: Path | None = None) -> bool:
    directory = tool_dir(tool, root)
    if not (directory / ".done").is_file():
        return False
    return all(os.access(directory / "bin" / name, os.X_OK) for name in tool.binaries)


def missing_tools(tools: Sequence[GoTool] = TOOLS, root: Path | None = None) -> list[GoTool]:
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
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _go_env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    # Build with the machine's toolchain only (never download another one) and keep the module
    # cache deletable by a plain `rm -rf`.
    env["GOTOOLCHAIN"] = "local"
    flags = env.get("GOFLAGS", "").split()
    if "-modcacherw" not in flags:
        flags.append("-modcacherw")
    env["GOFLAGS"] = " ".join(flags)
    env.update(extra)
    return env


def build_tool(tool: GoTool, root: Path | None = None, progress: Progress | None = None) -> float:
    """Build one tool unless its stamp is there; returns seconds spent building (0 if cached)."""
    directory = tool_dir(tool, root)
    with _locked(directory.parent / f"{tool.key}.lock"):
        if is_built(tool, root):
            return 0.0
        go = check_go()
        partial = directory / "bin.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        argv, cwd, extra_env = tool.command(partial)
        argv[0] = go
        started = time.monotonic()
        lines = _run_streaming(argv, cwd, _go_env(extra_env), tool, progress)
        seconds = time.monotonic() - started
        _install(tool, partial, directory, lines)
        stamp = {"tool": tool.name, "version": tool.version, "seconds": round(seconds, 1)}
        (directory / ".done").write_text(json.dumps(stamp) + "\n")
        return seconds


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


def _install(tool: GoTool, partial: Path, directory: Path, lines: list[str]) -> None:
    built = {path.name: path for path in partial.iterdir()}
    for package, name in zip(tool.packages, tool.binaries, strict=True):
        produced = go_binary_name(package)
        if name not in built and produced in built:
            built[produced].rename(partial / name)
        elif name not in built:
            raise ClusterError(f"building {tool.key} produced no {name}: {' '.join(lines[-5:])}")
    final = directory / "bin"
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)


def ensure_tools(
    tools: Sequence[GoTool] = TOOLS, root: Path | None = None, progress: Progress | None = None
) -> dict[str, float]:
    """Build every tool that is not cached yet; returns seconds spent per tool built."""
    spent: dict[str, float] = {}
    for tool in tools:
        if is_built(tool, root):
            continue
        if progress is not None:
            progress(tool, f"building (about {tool.estimated_minutes} min on 2 cores, cold)")
        spent[tool.key] = build_tool(tool, root, progress)
    return spent
