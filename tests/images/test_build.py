"""The control-plane and engine-local images built here: valid OCI archives that name
themselves, configs as their recipes say, the same digest when rebuilt from the same inputs,
and entrypoints that run as uid 10001 on a read-only root filesystem, the engine-local one
all the way (launcher → `vllm` shim → simulator → warmed up, ready, answering, drained).

`make test` runs `llmfleet images build` first, outside the loopback-only namespace: the base
layer and the wheels are downloaded there; here every build runs from the cache.
"""

from __future__ import annotations

import gzip
import io
import json
import signal
import subprocess
import tarfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from llmfleet.core.images import IMAGE_NAMES, BuiltImage, build_image, ensure_image
from llmfleet.core.images.oci import (
    BASE_NAME,
    CONTAINERD_NAME,
    REF_NAME,
    ArchiveImage,
    read_archive,
)
from llmfleet.core.images.recipe import RECIPES, USER, ExternalBase, Recipe
from tests.images.rootfs import run_in, start_in, unpack
from tests.net import free_port, require_isolation, status, wait_for

REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
BUILT = ("control-plane", "engine-local")


@dataclass(frozen=True)
class Image:
    recipe: Recipe
    built: BuiltImage
    archive: ArchiveImage
    root: Path
    """Its layers unpacked (the root filesystem a container would get)."""

    @property
    def env(self) -> dict[str, str]:
        return dict(entry.split("=", 1) for entry in self.archive.config["config"]["Env"])

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return run_in(self.root, argv, user=USER, env=self.env)


@pytest.fixture(scope="module", params=BUILT)
def image(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Image:
    require_isolation()
    name: str = request.param
    built = ensure_image(name)
    archive = read_archive(built.archive)  # verifies every digest and size on the way
    root = unpack(archive, tmp_path_factory.mktemp(name))
    return Image(RECIPES[name], built, archive, root)


def test_the_archive_names_the_image_and_its_digest(image: Image) -> None:
    assert image.archive.reference == image.recipe.reference(VERSION)
    assert image.archive.digest == image.built.digest
    assert image.built.archive.name == f"{image.built.digest.replace(':', '-')}.tar"
    with tarfile.open(image.built.archive) as tar:
        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
    annotations = index["manifests"][0]["annotations"]
    assert annotations[REF_NAME] == annotations[CONTAINERD_NAME] == image.recipe.reference(VERSION)


def test_the_config_is_the_recipes(image: Image) -> None:
    config = image.archive.config["config"]
    assert config["User"] == USER
    assert tuple(config["Entrypoint"]) == image.recipe.entrypoint
    assert tuple(config["Cmd"]) == image.recipe.cmd
    assert config["WorkingDir"] == image.recipe.workdir
    assert set(config["ExposedPorts"]) == {f"{port}/tcp" for port in image.recipe.ports}
    assert config["Labels"]["dev.llmfleet.writable-volumes"] == ",".join(image.recipe.writable)


def test_a_rebuild_of_the_same_inputs_has_the_same_digest(image: Image) -> None:
    again = build_image(image.recipe.name, force=True)
    assert again.seconds > 0, "--force must build again"
    assert again.digest == image.built.digest


@pytest.mark.parametrize(
    ("image", "argv", "code", "says"),
    [
        ("control-plane", ["id", "-u"], 0, "10001"),
        ("control-plane", ["llmfleet", "--help"], 0, "gateway"),
        ("control-plane", ["llmfleet", "operator", "--help"], 0, "--standalone"),
        ("control-plane", ["llmfleet", "cluster", "up"], 1, "not in this image"),
        ("control-plane", ["llmfleet", "sim"], 1, "not in this image"),
        ("control-plane", ["python", "-c", "import kopf, fastapi, uvloop, "
         "llmfleet.gateway.app, llmfleet.operator.handlers, llmfleet.autoscaler.loop; "
         "print('imported')"], 0, "imported"),
        ("control-plane", ["python", "-c", "import psutil"], 1, "No module named 'psutil'"),
        ("control-plane", ["sh", "-c", "touch /opt/llmfleet/x"], 1, "Read-only file system"),
        ("engine-local", ["llmfleet-runtime", "--help"], 0, "serve"),
        ("engine-local", ["llm-d-inference-sim", "--help"], 0, "--max-num-seqs"),
        ("engine-local", ["vllm", "chat"], 2, "expected `vllm serve MODEL"),
        ("engine-local", ["python", "-c", "import torch"], 1, "No module named 'torch'"),
    ],
    indirect=["image"],
    ids=lambda value: " ".join(value)[:40] if isinstance(value, list) else str(value),
)  # fmt: skip
def test_commands_run_as_the_user_on_a_read_only_root(
    image: Image, argv: list[str], code: int, says: str
) -> None:
    result = image.run(*argv)
    assert result.returncode == code, result.stderr[-2000:]
    assert says in result.stdout + result.stderr


@pytest.fixture
def serving(image: Image, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """The engine-local image's entrypoint serving a config as the operator mounts it: the
    engine's URL and the side port's."""
    port, side = free_port(), free_port()
    config = {"model": {"name": "llama"}, "warmup": {"requests": 1, "maxTokens": 1},
              "serving": {"port": port, "launcherPort": side, "host": "127.0.0.1"}}  # fmt: skip
    etc = image.root / "etc" / "llmfleet"
    etc.mkdir(exist_ok=True)
    (etc / "runtime.yaml").write_text(json.dumps(config))
    # POD_IP as the operator sets it (status.podIP): the simulator's KV cache needs it.
    env = {**image.env, "LLMFLEET_RUNTIME_GPU": "H100:1", "POD_IP": "127.0.0.1",
           "LLMFLEET_LOCAL_ENGINE_ARGS": "--startup-duration=0s"}  # fmt: skip
    log = tmp_path / "launcher.log"
    argv = [*image.recipe.entrypoint, *image.recipe.cmd]
    process = start_in(image.root, argv, user=USER, env=env, log=log)
    try:
        yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{side}"
    finally:
        if process.poll() is None:  # as the kubelet stops a pod: SIGTERM, then wait
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
    assert process.returncode == 0, log.read_text()[-3000:]


@pytest.mark.parametrize("image", ["engine-local"], indirect=True)
def test_the_engine_local_entrypoint_serves_through_the_shim(serving: tuple[str, str]) -> None:
    engine, side = serving
    wait_for(lambda: status(f"{side}/ready") == 200 or None, 60, "the launcher's /ready")
    reply = httpx.post(f"{engine}/v1/completions", timeout=30,
                       json={"model": "llama", "prompt": "hello", "max_tokens": 2})  # fmt: skip
    assert reply.status_code == 200, reply.text
    assert reply.json()["model"] == "llama"
    metrics = httpx.get(f"{engine}/metrics", timeout=10).text
    assert "vllm:num_requests_running" in metrics


def _members(archive: ArchiveImage) -> dict[str, tarfile.TarInfo]:
    """Every path of every layer (the last layer's entry wins), without a leading `./`."""
    members: dict[str, tarfile.TarInfo] = {}
    for blob in archive.layers:
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob))) as tar:
            members.update((member.name, member) for member in tar.getmembers())
    return members


@pytest.mark.parametrize("name", IMAGE_NAMES)
def test_no_local_tooling_in_any_image(name: str) -> None:
    require_isolation()
    members = _members(read_archive(ensure_image(name).archive))
    site = next(path for path in members if path.endswith("site-packages/llmfleet/runtime"))
    package = site.removesuffix("/runtime")
    for left_out in ("core/cluster", "core/images", "autoscaler/sim"):
        assert f"{package}/{left_out}" not in members
    assert not any(
        path.startswith(f"{package}/core/local/")
        and not path.endswith(("local/__init__.py", "local/engines.py", ".pyc", "__pycache__"))
        for path in members
    )


def test_the_runtime_image_is_the_launcher_layer_on_vllms_image() -> None:
    """Only the layers above vLLM's image are built here: a venv of Python 3.12 (the base's)
    with the launcher, named in the manifest as going on `vllm/vllm-openai`."""
    require_isolation()
    archive = read_archive(ensure_image("runtime").archive)
    recipe = RECIPES["runtime"]
    assert isinstance(recipe.base, ExternalBase)
    assert archive.manifest["annotations"][BASE_NAME] == recipe.base.docker_image
    members = _members(archive)
    assert members["opt/llmfleet/bin/python"].linkname == recipe.base.python
    assert "opt/llmfleet/lib/python3.12/site-packages/llmfleet/runtime/cli.py" in members
    assert not any("site-packages/vllm" in path or "site-packages/torch" in path
                   for path in members)  # fmt: skip
    home = members["home/llmfleet"]
    assert (home.uid, home.gid) == (10001, 10001)
    assert tuple(archive.config["config"]["Entrypoint"]) == recipe.entrypoint
