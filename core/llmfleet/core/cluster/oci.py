"""A minimal OCI image-layout archive writer for the real node's own small images (pure).

One layer of regular files, deterministic bytes (sorted entries, uid/gid 0, mtime 0, gzip with
no timestamp), so the same files give the same digests. containerd imports the archive with
`ctr images import` under the name in the index's `io.containerd.image.name` annotation.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"


@dataclass(frozen=True)
class File:
    path: str
    """Relative to the image's root."""
    data: bytes
    mode: int = 0o644


def _descriptor(media_type: str, blob: bytes) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": _digest(blob), "size": len(blob)}


def _digest(blob: bytes) -> str:
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def layer(files: Sequence[File]) -> tuple[bytes, bytes]:
    """(uncompressed tar, gzip) of the files, deterministic."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in sorted(files, key=lambda file: file.path):
            info = tarfile.TarInfo(entry.path)
            info.size, info.mode, info.mtime = len(entry.data), entry.mode, 0
            tar.addfile(info, io.BytesIO(entry.data))
    uncompressed = raw.getvalue()
    return uncompressed, gzip.compress(uncompressed, mtime=0)


def write_archive(
    target: Path, *, reference: str, files: Sequence[File], entrypoint: Sequence[str]
) -> str:
    """Write a one-layer image for linux/amd64; returns the manifest's digest."""
    uncompressed, compressed = layer(files)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": list(entrypoint)},
            "rootfs": {"type": "layers", "diff_ids": [_digest(uncompressed)]},
        },
        sort_keys=True,
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": _descriptor(CONFIG_TYPE, config),
            "layers": [_descriptor(LAYER_TYPE, compressed)],
        },
        sort_keys=True,
    ).encode()
    tag = reference.rsplit(":", 1)[1] if ":" in reference.rsplit("/", 1)[-1] else "latest"
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    **_descriptor(MANIFEST_TYPE, manifest),
                    "annotations": {
                        "io.containerd.image.name": reference,
                        "org.opencontainers.image.ref.name": tag,
                    },
                }
            ],
        },
        sort_keys=True,
    ).encode()
    entries = [File("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), File("index.json", index)]
    entries += [
        File(f"blobs/sha256/{_digest(blob).split(':')[1]}", blob)
        for blob in (compressed, config, manifest)
    ]
    with tarfile.open(target, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry.path)
            info.size, info.mode, info.mtime = len(entry.data), 0o644, 0
            tar.addfile(info, io.BytesIO(entry.data))
    return _digest(manifest)
