"""The Debian base layer: `mmdebstrap --variant=minbase` of a recipe's suite and packages, with
the images' user added, written once as a reproducible layer and cached by its inputs.

The packages come from the apt mirror this machine is configured with (its apt sources), so the
repository names no mirror. The layer is what Docker's `debian:<suite>-slim` plus `apt-get
install` would give: no documentation, man pages or locales, no apt lists or logs. It takes
about a minute on two cores, cold; every image build after that reuses it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from llmfleet.core.images import oci
from llmfleet.core.images.errors import ImageError
from llmfleet.core.images.recipe import HOME, USER, USER_NAME, DebianBase

Progress = Callable[[str], None]

LAYOUT_VERSION = "1"
"""Part of the cache key: bumped when what this module puts in the layer changes."""

SLIM = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
    "path-exclude=/usr/share/lintian/*",
)
"""dpkg filters as in Docker's slim Debian images."""

LEFT_OUT = re.compile(r"^(dev|proc|sys|run|tmp|var/tmp|var/log|var/cache|var/lib/apt/lists)/")
"""Contents (not the directories) that no layer carries: the runtime mounts /dev, /proc, /sys
and /run; logs, caches and apt's package lists are the build's, not the image's."""


def base_key(base: DebianBase) -> str:
    text = json.dumps(
        {"suite": base.suite, "packages": sorted(base.packages), "slim": SLIM, "user": USER,
         "layout": LAYOUT_VERSION, "epoch": oci.source_date_epoch()},
        sort_keys=True,
    )  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def apt_sources(suite: str, sources_dir: Path = Path("/etc/apt")) -> list[str]:
    """One-line `deb URI SUITE COMPONENTS` entries of this machine's apt sources whose suite is
    `suite` or one of its updates/security suites; an ImageError when there is none."""
    lines: list[str] = []
    listed = sorted((sources_dir / "sources.list.d").glob("*.list"))
    legacy = [sources_dir / "sources.list", *listed]
    for path in legacy:
        if path.is_file():
            for line in path.read_text().splitlines():
                words = line.split("#", 1)[0].split()
                if words[:1] == ["deb"] and not words[1].startswith("["):
                    lines.append(" ".join(words))
    for path in sorted((sources_dir / "sources.list.d").glob("*.sources")):
        for stanza in re.split(r"\n\s*\n", path.read_text()):
            fields = dict(
                (key.strip().lower(), value.strip())
                for key, _, value in (
                    line.partition(":") for line in stanza.splitlines()
                    if ":" in line and not line.startswith("#")
                )
            )  # fmt: skip
            if "deb" not in fields.get("types", "").split():
                continue
            for uri in fields.get("uris", "").split():
                for each in fields.get("suites", "").split():
                    lines.append(f"deb {uri} {each} {fields.get('components', 'main')}")
    ours = re.compile(rf"{re.escape(suite)}(-[a-z]+)?")
    mine = [line for line in lines if ours.fullmatch(line.split()[2])]
    if not mine:
        raise ImageError(
            f"no apt source for Debian {suite} on this machine (/etc/apt/sources.list*): the "
            "base image's packages come from this machine's own Debian mirror"
        )
    return mine


def ensure_mmdebstrap(progress: Progress | None) -> str:
    """The path of mmdebstrap, installed from Debian's archive with apt when missing (root)."""
    found = shutil.which("mmdebstrap")
    if found:
        return found
    if os.geteuid() != 0:
        raise ImageError("mmdebstrap is not installed: `sudo apt-get install mmdebstrap`")
    if progress is not None:
        progress("installing mmdebstrap (apt-get install)")
    for argv in (["apt-get", "install", "-y", "-q", "mmdebstrap"], ["apt-get", "update", "-q"],
                 ["apt-get", "install", "-y", "-q", "mmdebstrap"]):  # fmt: skip
        result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=900)
        if result.returncode == 0 and argv[1] == "install":
            break
    found = shutil.which("mmdebstrap")
    if found is None:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise ImageError(f"apt-get install mmdebstrap failed: {' | '.join(tail)}")
    return found


def build_base(base: DebianBase, out_dir: Path, progress: Progress | None = None) -> oci.Layer:
    """Run mmdebstrap into a scratch directory and write the base layer into `out_dir`
    (`layer.tar.gz`, `layer.json`)."""
    mmdebstrap = ensure_mmdebstrap(progress)
    uid, gid = USER.split(":")
    hooks = [
        f'chroot "$1" groupadd --gid {gid} {USER_NAME}',
        f'chroot "$1" useradd --uid {uid} --gid {gid} --home-dir {HOME} --no-create-home '
        f"--shell /usr/sbin/nologin {USER_NAME}",
    ]
    with tempfile.TemporaryDirectory(prefix="rootfs-", dir=out_dir.parent) as scratch:
        root = Path(scratch) / "root"
        argv = [
            mmdebstrap, "--variant=minbase", "--mode=root", "--quiet",
            f"--include={','.join(base.packages)}",
            *(f"--dpkgopt={option}" for option in SLIM),
            *(f"--customize-hook={hook}" for hook in hooks),
            base.suite, str(root), *apt_sources(base.suite),
        ]  # fmt: skip
        if progress is not None:
            progress(f"mmdebstrap {base.suite} with {', '.join(base.packages)} (about a minute)")
        env = {**os.environ, "SOURCE_DATE_EPOCH": str(oci.source_date_epoch())}
        result = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        if result.returncode != 0:
            tail = (result.stderr or result.stdout).strip().splitlines()[-6:]
            raise ImageError(f"mmdebstrap failed (exit {result.returncode}): " + " | ".join(tail))
        # The user's shadow entries carry the day they were made: the same day for everyone.
        for backup in ("etc/shadow-", "etc/passwd-", "etc/group-", "etc/gshadow-"):
            (root / backup).unlink(missing_ok=True)
        _normalise_shadow(root / "etc" / "shadow")
        (root / "etc" / "machine-id").write_text("")
        out_dir.mkdir(parents=True, exist_ok=True)
        if progress is not None:
            progress("writing the base layer")
        layer = oci.write_layer(
            root, out_dir / "layer.tar.gz", lambda rel: not LEFT_OUT.match(rel),
            owner=lambda _rel, st: (st.st_uid, st.st_gid),
        )  # fmt: skip
    (out_dir / "layer.json").write_text(json.dumps(layer.to_json()) + "\n")
    return layer


def _normalise_shadow(path: Path) -> None:
    """Field 3 of each shadow entry (the day of the last password change) -> empty."""
    if not path.is_file():
        return
    lines = []
    for line in path.read_text().splitlines():
        fields = line.split(":")
        if len(fields) > 2:
            fields[2] = ""
        lines.append(":".join(fields))
    path.write_text("\n".join(lines) + "\n")
