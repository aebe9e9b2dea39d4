"""The binary cache: real `go build` of a tiny module, done-stamps, locking, clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from llmfleet.core.cluster import build
from llmfleet.core.cluster.errors import ClusterError
from llmfleet.core.cluster.toolchain import DebTool, GoTool


@pytest.fixture
def hello(tmp_path: Path) -> GoTool:
    module = tmp_path / "src"
    module.mkdir()
    (module / "go.mod").write_text("module example.com/hello\n\ngo 1.26\n")
    (module / "main.go").write_text('package main\n\nfunc main() { println("hello") }\n')
    return GoTool(name="hello", version="v1", packages=("example.com/hello",), module=str(module))


def test_builds_once_then_uses_the_stamp(hello: GoTool, tmp_path: Path) -> None:
    root = tmp_path / "cache"
    lines: list[str] = []
    spent = build.ensure_tools([hello], root, progress=lambda tool, line: lines.append(line))
    assert list(spent) == ["hello-v1"]
    binary = build.binary(hello, "hello", root)
    run = subprocess.run([binary], capture_output=True, text=True, check=True)
    assert run.stderr.strip() == "hello"
    stamp = json.loads((root / "hello-v1" / ".done").read_text())
    assert stamp["version"] == "v1"
    assert lines
    assert "building" in lines[0]

    assert build.ensure_tools([hello], root) == {}


def test_a_missing_binary_is_rebuilt(hello: GoTool, tmp_path: Path) -> None:
    root = tmp_path / "cache"
    build.ensure_tools([hello], root)
    build.binary(hello, "hello", root).unlink()
    assert not build.is_built(hello, root)
    assert list(build.ensure_tools([hello], root)) == ["hello-v1"]
    assert build.is_built(hello, root)


def test_concurrent_builders_build_once(hello: GoTool, tmp_path: Path) -> None:
    root = tmp_path / "cache"
    results: list[float] = []
    threads = [
        threading.Thread(target=lambda: results.append(build.build_tool(hello, root)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(result > 0 for result in results) == [False, True]


def test_a_failing_build_says_why_and_leaves_no_stamp(tmp_path: Path) -> None:
    module = tmp_path / "broken"
    module.mkdir()
    (module / "go.mod").write_text("module example.com/broken\n\ngo 1.26\n")
    (module / "main.go").write_text("package main\n\nfunc main() { undefined() }\n")
    tool = GoTool(name="broken", version="v1", packages=("example.com/broken",), module=str(module))
    with pytest.raises(ClusterError, match="building broken-v1 failed") as caught:
        build.ensure_tools([tool], tmp_path / "cache")
    assert "undefined" in str(caught.value)
    assert not build.is_built(tool, tmp_path / "cache")


def test_missing_go_is_a_clear_error(
    hello: GoTool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ClusterError, match="the Go toolchain is not on PATH"):
        build.ensure_tools([hello], tmp_path / "cache")


def test_too_old_go_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "go").write_text("#!/bin/sh\necho go version go1.21.0 linux/amd64\n")
    (fake / "go").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}/usr/bin:/bin")
    with pytest.raises(ClusterError, match=r"needs Go >= 1\.26"):
        build.check_go()


def test_a_failing_apt_download_says_why_and_leaves_no_stamp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    script = '#!/bin/sh\n[ "$2" = update ] && exit 0\necho "E: Version \'9\' was not found" >&2\n'
    (fake / "apt-get").write_text(script + "exit 100\n")
    (fake / "apt-get").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}/usr/bin:/bin")
    tool = DebTool("prometheus", "9", "prometheus", "9", ("usr/bin/prometheus",))
    with pytest.raises(ClusterError, match="apt-get download exited 100") as caught:
        build.ensure_tools([tool], tmp_path / "cache")
    assert "prometheus=9" in str(caught.value)
    assert "Version '9' was not found" in str(caught.value)
    assert not build.is_built(tool, tmp_path / "cache")


def test_ensure_binary_gives_the_cached_prometheus_that_runs() -> None:
    prometheus = build.ensure_binary("prometheus")
    assert prometheus.name == "prometheus"
    run = subprocess.run([prometheus, "--version"], capture_output=True, text=True, check=True)
    assert "2.42.0" in run.stdout + run.stderr
