"""Layers and archives without a container engine: the same tree gives the same bytes whatever
its files' times and the order they were made in, and an archive whose blobs do not match its
descriptors is refused, saying which."""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from llmfleet.core.images import oci

CONFIG = oci.ImageConfig(user="10001:10001", entrypoint=("app",), cmd=(), env=(("A", "1"),),
                         workdir="/", ports=(8000,), labels=())  # fmt: skip


def _tree(root: Path, names: list[str], mtime: int) -> Path:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"content of {name}\n")
        os.utime(path, (mtime, mtime))
    (root / "link").symlink_to("a/b.txt")
    return root


def _archive(tmp_path: Path, names: list[str], mtime: int) -> tuple[Path, str]:
    root = _tree(tmp_path / f"tree-{mtime}", names, mtime)
    layer = oci.write_layer(root, tmp_path / f"layer-{mtime}.tar.gz", owner=lambda *_: (0, 0))
    out = tmp_path / f"image-{mtime}.tar"
    return out, oci.write_archive(out, "example.test/app:1", [layer], CONFIG)


def test_the_same_tree_gives_the_same_digest(tmp_path: Path) -> None:
    first, digest = _archive(tmp_path, ["a/b.txt", "c.txt"], mtime=1_000_000)
    second, again = _archive(tmp_path, ["c.txt", "a/b.txt"], mtime=2_000_000)
    assert digest == again
    assert first.read_bytes() == second.read_bytes()
    image = oci.read_archive(first)
    assert (image.reference, image.digest) == ("example.test/app:1", digest)
    assert image.config["config"]["User"] == "10001:10001"


def _rewrite(archive: Path, change: Callable[[dict[str, bytes]], None]) -> None:
    with tarfile.open(archive) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    change(files)
    with tarfile.open(archive, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _layer_name(files: dict[str, bytes]) -> str:
    index = json.loads(files["index.json"])
    manifest = json.loads(files["blobs/" + index["manifests"][0]["digest"].replace(":", "/")])
    return "blobs/" + manifest["layers"][0]["digest"].replace(":", "/")


@pytest.mark.parametrize(
    ("change", "says"),
    [
        pytest.param(lambda f: f.update({_layer_name(f): f[_layer_name(f)][:-1] + b"x"}),
                     "layer blob", id="layer-changed"),
        pytest.param(lambda f: f.pop(_layer_name(f)), "is missing", id="layer-missing"),
        pytest.param(lambda f: f.update({"oci-layout": b"{}"}), "oci-layout", id="no-layout"),
    ],
)  # fmt: skip
def test_a_broken_archive_is_refused(
    tmp_path: Path, change: Callable[[dict[str, bytes]], None], says: str
) -> None:
    archive, _ = _archive(tmp_path, ["a/b.txt"], mtime=1)
    _rewrite(archive, change)
    with pytest.raises(oci.ArchiveError, match=says):
        oci.read_archive(archive)
