"""Reproducible OCI image layers and image-layout archives, written without a container engine.

A layer is a gzip'd tar of a directory tree (or of some paths in it) whose bytes depend only on
the files' contents, names, modes and link targets: entries sorted by path, uid/gid as given
(owner names empty), every mtime set to `SOURCE_DATE_EPOCH` (0 unless set), gzip's own header
time 0 and no file name. An archive is an OCI image layout (`oci-layout`, `index.json`,
`blobs/sha256/…`) in a plain tar, as `ctr images import` and `skopeo copy oci-archive:` read it;
`index.json` names the image (`org.opencontainers.image.ref.name` and containerd's
`io.containerd.image.name`), so the import tags it.

`read_archive` checks an archive the way a registry would (every descriptor's digest and size)
and is what the tests use.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
import tarfile
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"
CONTAINERD_NAME = "io.containerd.image.name"
BASE_NAME = "org.opencontainers.image.base.name"
CHUNK = 1 << 20


def source_date_epoch() -> int:
    """`SOURCE_DATE_EPOCH` (reproducible-builds.org), else 0: every mtime in a layer."""
    return int(os.environ.get("SOURCE_DATE_EPOCH", "0"))


@dataclass(frozen=True)
class Layer:
    """A written layer blob: `digest` of the gzip'd bytes, `diff_id` of the tar inside."""

    path: Path
    digest: str
    diff_id: str
    size: int
    uncompressed: int

    def descriptor(self) -> dict[str, Any]:
        return {"mediaType": MEDIA_LAYER, "digest": self.digest, "size": self.size}

    def to_json(self) -> dict[str, Any]:
        return {
            "digest": self.digest, "diff_id": self.diff_id, "size": self.size,
            "uncompressed": self.uncompressed,
        }  # fmt: skip

    @classmethod
    def from_json(cls, path: Path, data: Mapping[str, Any]) -> Layer:
        return cls(path, data["digest"], data["diff_id"], data["size"], data["uncompressed"])


class _Hashing(io.RawIOBase):
    """A write-only stream that hashes and counts what passes through to `sink`."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink
        self.hash = hashlib.sha256()
        self.count = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.hash.update(view)
        self.count += len(view)
        self.sink.write(view)
        return len(view)


def _walk(root: Path, select: Callable[[str], bool]) -> list[str]:
    """Relative paths under `root` that `select` keeps, parents first, sorted; a directory that
    is not kept is not entered."""
    found: list[str] = []
    for directory, dirs, files in os.walk(root):
        base = os.path.relpath(directory, root)
        kept_dirs = []
        for name in dirs:
            rel = name if base == "." else f"{base}/{name}"
            if select(rel):
                found.append(rel)
                if not os.path.islink(os.path.join(directory, name)):
                    kept_dirs.append(name)
        dirs[:] = kept_dirs
        for name in files:
            rel = name if base == "." else f"{base}/{name}"
            if select(rel):
                found.append(rel)
    return sorted(found)


def write_layer(
    root: Path,
    out: Path,
    select: Callable[[str], bool] = lambda _: True,
    owner: Callable[[str, os.stat_result], tuple[int, int]] | None = None,
    level: int = 9,
) -> Layer:
    """Write the files under `root` that `select` keeps (relative paths, `/`-separated) as a
    reproducible layer at `out`. `owner` gives each entry's uid/gid (default: as on disk);
    `level` is gzip's (part of what the bytes depend on: fixed per kind of layer). Hard links
    become separate files; sockets and devices are left out."""
    mtime = source_date_epoch()
    paths = _walk(root, select)
    with out.open("wb") as raw:
        hashed_gz = _Hashing(raw)
        with gzip.GzipFile(
            filename="", mode="wb", fileobj=hashed_gz, mtime=0, compresslevel=level
        ) as gz:
            hashed_tar = _Hashing(gz)
            with tarfile.open(fileobj=hashed_tar, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                for rel in paths:
                    _add(tar, root / rel, rel, mtime, owner)
    return Layer(
        out, f"sha256:{hashed_gz.hash.hexdigest()}", f"sha256:{hashed_tar.hash.hexdigest()}",
        hashed_gz.count, hashed_tar.count,
    )  # fmt: skip


def _add(
    tar: tarfile.TarFile,
    path: Path,
    rel: str,
    mtime: int,
    owner: Callable[[str, os.stat_result], tuple[int, int]] | None,
) -> None:
    st = path.lstat()
    info = tarfile.TarInfo(rel)
    info.mtime = mtime  # one value for every entry: the same tree always gives the same bytes
    info.mode = stat.S_IMODE(st.st_mode)
    info.uid, info.gid = owner(rel, st) if owner else (st.st_uid, st.st_gid)
    info.uname = info.gname = ""
    if stat.S_ISLNK(st.st_mode):
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(path)
        tar.addfile(info)
    elif stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    elif stat.S_ISREG(st.st_mode):
        info.size = st.st_size
        with path.open("rb") as handle:
            tar.addfile(info, handle)


def _blob(data: bytes) -> tuple[str, bytes]:
    return f"sha256:{hashlib.sha256(data).hexdigest()}", data


def _json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class ImageConfig:
    """What the runtime reads from an image's config (the OCI image spec's `config`)."""

    user: str
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    workdir: str
    ports: tuple[int, ...]
    labels: tuple[tuple[str, str], ...]

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "User": self.user,
            "Entrypoint": list(self.entrypoint),
            "Env": [f"{key}={value}" for key, value in self.env],
            "WorkingDir": self.workdir,
            "ExposedPorts": {f"{port}/tcp": {} for port in self.ports},
            "Labels": dict(self.labels),
        }
        if self.cmd:
            body["Cmd"] = list(self.cmd)
        return body


def write_archive(
    out: Path,
    reference: str,
    layers: Iterable[Layer],
    config: ImageConfig,
    annotations: Mapping[str, str] | None = None,
) -> str:
    """Write the image as an OCI layout tar at `out`; returns the manifest's digest (the image's
    digest, as a registry would give it)."""
    layers = list(layers)
    created = source_date_epoch()
    config_doc = {
        "architecture": "amd64",
        "os": "linux",
        "created": f"{_rfc3339(created)}",
        "config": config.to_json(),
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": [{"created": _rfc3339(created), "created_by": "llmfleet images build"}
                    for _ in layers],
    }  # fmt: skip
    config_digest, config_bytes = _blob(_json(config_doc))
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": config_digest, "size": len(config_bytes)},
        "layers": [layer.descriptor() for layer in layers],
        "annotations": dict(annotations or {}),
    }
    manifest_digest, manifest_bytes = _blob(_json(manifest))
    index = {
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [{
            "mediaType": MEDIA_MANIFEST, "digest": manifest_digest, "size": len(manifest_bytes),
            "annotations": {REF_NAME: reference, CONTAINERD_NAME: reference},
        }],
    }  # fmt: skip
    small = {
        "oci-layout": _json({"imageLayoutVersion": "1.0.0"}),
        "index.json": _json(index),
        _blob_path(config_digest): config_bytes,
        _blob_path(manifest_digest): manifest_bytes,
    }
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, created
            tar.addfile(info)
        entries: list[tuple[str, bytes | Path]] = [*small.items()]
        entries += [(_blob_path(layer.digest), layer.path) for layer in layers]
        seen: set[str] = set()
        for name, content in sorted(entries, key=lambda entry: entry[0]):
            if name in seen:  # two equal layers are one blob
                continue
            seen.add(name)
            info = tarfile.TarInfo(name)
            info.mode, info.mtime = 0o644, created
            if isinstance(content, bytes):
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
            else:
                info.size = content.stat().st_size
                with content.open("rb") as handle:
                    tar.addfile(info, handle)
    return manifest_digest


def _blob_path(digest: str) -> str:
    return "blobs/" + digest.replace(":", "/", 1)


def _rfc3339(epoch: int) -> str:
    import datetime  # noqa: PLC0415  (only here)

    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ArchiveError(ValueError):
    """The archive is not a valid OCI image layout (the message says where)."""


@dataclass(frozen=True)
class ArchiveImage:
    """An archive read back and verified: its name, manifest digest, config and layer blobs."""

    reference: str
    digest: str
    manifest: dict[str, Any]
    config: dict[str, Any]
    layers: list[bytes]
    """Each layer's gzip'd bytes, in order (lowest first)."""


def read_archive(path: Path) -> ArchiveImage:
    """Read and verify an archive: index → manifest → config → layers, each descriptor's sha256
    and size matching its blob, and each layer's uncompressed sha256 its config's diff_id."""
    with tarfile.open(path) as tar:
        files = {m.name: tar.extractfile(m) for m in tar.getmembers() if m.isfile()}
        blobs = {name: handle.read() for name, handle in files.items() if handle is not None}
    if json.loads(blobs.get("oci-layout", b"{}")).get("imageLayoutVersion") != "1.0.0":
        raise ArchiveError("oci-layout is missing or not version 1.0.0")
    index = json.loads(blobs["index.json"])
    if len(index.get("manifests", [])) != 1:
        raise ArchiveError("index.json must name exactly one manifest")
    entry = index["manifests"][0]
    reference = entry.get("annotations", {}).get(REF_NAME, "")
    manifest = json.loads(_verified(blobs, entry, "manifest"))
    config = json.loads(_verified(blobs, manifest["config"], "config"))
    layers = [_verified(blobs, layer, "layer") for layer in manifest["layers"]]
    diff_ids = config["rootfs"]["diff_ids"]
    if len(diff_ids) != len(layers):
        raise ArchiveError(f"{len(layers)} layers but {len(diff_ids)} diff_ids")
    for number, (blob, diff_id) in enumerate(zip(layers, diff_ids, strict=True)):
        if f"sha256:{hashlib.sha256(zlib.decompress(blob, 31)).hexdigest()}" != diff_id:
            raise ArchiveError(f"layer {number}'s uncompressed digest is not {diff_id}")
    return ArchiveImage(reference, entry["digest"], manifest, config, layers)


def _verified(blobs: Mapping[str, bytes], descriptor: Mapping[str, Any], what: str) -> bytes:
    name = _blob_path(descriptor["digest"])
    if name not in blobs:
        raise ArchiveError(f"{what} blob {descriptor['digest']} is missing")
    data = blobs[name]
    if f"sha256:{hashlib.sha256(data).hexdigest()}" != descriptor["digest"]:
        raise ArchiveError(f"{what} blob {name} does not match its digest")
    if len(data) != descriptor["size"]:
        size = descriptor["size"]
        raise ArchiveError(f"{what} blob {name} is {len(data)} bytes, its descriptor {size}")
    return data
