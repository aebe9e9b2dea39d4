"""Build a recipe's image into an OCI archive, content-addressed in the cache, without Docker.

Cache layout (`<cache>/images/`, the cache of cluster/build.py):
- `base/<key>/layer.tar.gz`: the Debian base layer (rootfs.py), keyed by its inputs;
- `wheels/<key>/`: the wheels of one requirement set for one interpreter (python.py);
- `venv/<key>/layer.tar.gz`: the venv layer of those wheels (built once per wheelhouse);
- `<name>/<manifest digest>.tar`: the archives, named by their digest;
- `<name>/inputs/<key>.json`: which archive these inputs built (the next build with the same
  sources, wheels, base and binaries reads it and builds nothing);
- `<name>.lock`: serialises builders of one image (a second waits, then finds the first's).

Layers, lowest first: the base (Debian only), the venv with the requirements, llmfleet itself,
then the recipe's extras. A code change rebuilds the last two (seconds: the base and the venv
are cached layers); new requirements the venv too; the base only when its packages change.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from llmfleet.core import netns
from llmfleet.core.cluster import build as cluster_build
from llmfleet.core.images import oci, python, rootfs
from llmfleet.core.images.errors import ImageError
from llmfleet.core.images.recipe import (
    RECIPES,
    SRC,
    USER,
    Copy,
    DebianBase,
    Extra,
    Recipe,
)

Progress = Callable[[str], None]
"""Called with a line saying what the build is doing."""

BUILDER_VERSION = "2"
"""Part of every inputs key: bumped when the builder lays out images differently."""
VENV_LAYOUT = "1"
"""Part of the venv layer's key: bumped when that layer is made differently."""


@dataclass(frozen=True)
class BuiltImage:
    name: str
    reference: str
    """`ghcr.io/llmfleet/llmfleet:<version>`: the name `ctr images import` gives it."""
    digest: str
    """The manifest's sha256, as a registry reports it."""
    archive: Path
    size: int
    """The archive's bytes (the compressed layers plus a few small JSON blobs)."""
    unpacked: int
    """The layers' uncompressed bytes (about what the image takes on a node's disk)."""
    seconds: float = 0.0
    """Spent building it now (0: it was already built)."""

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name, "reference": self.reference, "digest": self.digest,
            "archive": str(self.archive), "size": self.size, "unpacked": self.unpacked,
        }  # fmt: skip


def source_root() -> Path:
    """The source checkout this llmfleet runs from (images are built from its files)."""
    root = Path(__file__).resolve().parents[4]
    if not (root / "pyproject.toml").is_file():
        raise ImageError(f"{root} is not llmfleet's source checkout: images build from one")
    return root


def package_version(root: Path | None = None) -> str:
    data = tomllib.loads(((root or source_root()) / "pyproject.toml").read_text())
    return str(data["project"]["version"])


def requirements(recipe: Recipe, root: Path | None = None) -> tuple[str, ...]:
    """The recipe's requirements; the control plane's are pyproject.toml's dependencies."""
    if recipe.requirements:
        return recipe.requirements
    data = tomllib.loads(((root or source_root()) / "pyproject.toml").read_text())
    return tuple(data["project"]["dependencies"])


def images_dir() -> Path:
    return cluster_build.cache_root() / "images"


def interpreter(recipe: Recipe) -> python.Interpreter:
    return python.BOOKWORM_PYTHON if isinstance(recipe.base, DebianBase) else python.VLLM_PYTHON


def _offline_hint(what: str) -> ImageError:
    return ImageError(
        f"{what} is not in the cache and this process has no network (a loopback-only "
        "namespace, `llmfleet isolated`): run `llmfleet images build` outside it first "
        "(make test does)"
    )


def ensure_base(base: DebianBase, progress: Progress | None = None) -> oci.Layer:
    directory = images_dir() / "base" / rootfs.base_key(base)
    with cluster_build.locked(directory.parent / f"{directory.name}.lock"):
        if not (directory / ".done").is_file():
            if netns.interfaces() == ["lo"]:
                raise _offline_hint(f"the Debian {base.suite} base layer")
            shutil.rmtree(directory, ignore_errors=True)
            rootfs.build_base(base, directory, progress)
            (directory / ".done").write_text("")
        data = json.loads((directory / "layer.json").read_text())
        return oci.Layer.from_json(directory / "layer.tar.gz", data)


def ensure_wheels(
    wanted: tuple[str, ...], interp: python.Interpreter, progress: Progress | None = None
) -> Path:
    directory = images_dir() / "wheels" / python.wheelhouse_key(wanted, interp)
    with cluster_build.locked(directory.parent / f"{directory.name}.lock"):
        if not (directory / ".done").is_file():
            if netns.interfaces() == ["lo"]:
                raise _offline_hint(f"the wheels for Python {interp.version}")
            shutil.rmtree(directory, ignore_errors=True)
            if progress is not None:
                progress(f"pip download {len(wanted)} requirements for Python {interp.version}")
            python.download(wanted, interp, directory)
            (directory / ".done").write_text("")
    return directory


def ensure_venv(
    wanted: tuple[str, ...], interp: python.Interpreter, wheels: Path, say: Progress
) -> oci.Layer:
    """The venv layer of these requirements installed from this wheelhouse, built once: a code
    change rebuilds only the layers above it."""
    key = hashlib.sha256(json.dumps({
        "layout": VENV_LAYOUT, "requirements": wanted, "wheels": python.wheel_digest(wheels),
        "python": repr(interp), "epoch": oci.source_date_epoch(),
    }).encode()).hexdigest()[:16]  # fmt: skip
    directory = images_dir() / "venv" / key
    with cluster_build.locked(directory.parent / f"{key}.lock"):
        if not (directory / ".done").is_file():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
            say(f"the venv with {len(wanted)} requirements for Python {interp.version}")
            with tempfile.TemporaryDirectory(prefix="venv-", dir=directory) as scratch:
                stage = Path(scratch)
                python.make_venv(stage, interp)
                python.install(stage, interp, wheels, wanted)
                python.compile_bytecode(stage, interp)
                layer = oci.write_layer(stage, directory / "layer.tar.gz", owner=_root_owned)
            (directory / "layer.json").write_text(json.dumps(layer.to_json()) + "\n")
            (directory / ".done").write_text("")
        data = json.loads((directory / "layer.json").read_text())
        return oci.Layer.from_json(directory / "layer.tar.gz", data)


def _copy_sources(root: Path, copies: tuple[Copy, ...], src: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for copy in copies:
        target = src / copy.target
        target.mkdir(parents=True, exist_ok=True)
        if copy.source.endswith("*.py"):
            for path in sorted((root / copy.source).parent.glob("*.py")):
                shutil.copy2(path, target / path.name)
        elif (root / copy.source).is_dir():
            shutil.copytree(root / copy.source, target, ignore=ignore, dirs_exist_ok=True)
        else:
            shutil.copy2(root / copy.source, target / Path(copy.source).name)


def _tree_digest(directory: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = path.relative_to(directory).as_posix()
        digest.update(rel.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _extra_source(root: Path, source: str, progress: Progress | None) -> Path:
    if source.startswith("tool:"):
        if progress is not None:
            progress(f"the {source[5:]} binary (built by `llmfleet cluster build`)")
        return cluster_build.ensure_binary(source[5:])
    return root / source


def _root_owned(_rel: str, _st: object) -> tuple[int, int]:
    return 0, 0


def _owner(recipe: Recipe) -> Callable[[str, object], tuple[int, int]]:
    """root owns everything but the recipe's `owned` directories (the image's user does)."""
    uid, gid = (int(part) for part in USER.split(":"))
    owned = {directory.lstrip("/") for directory in recipe.owned}
    return lambda rel, _st: (uid, gid) if rel in owned else (0, 0)


def build_image(name: str, progress: Progress | None = None, force: bool = False) -> BuiltImage:
    """The image `name` built from the current sources, unless an archive of the same inputs is
    in the cache (or `force`); waits while another process builds it."""
    recipe = RECIPES.get(name)
    if recipe is None:
        raise ImageError(f"unknown image {name!r}: choose from {', '.join(RECIPES)}")
    root = source_root()
    version = package_version(root)
    interp = interpreter(recipe)
    with cluster_build.locked(images_dir() / f"{name}.lock"):
        started = time.monotonic()
        base = ensure_base(recipe.base, progress) if isinstance(recipe.base, DebianBase) else None
        wanted = requirements(recipe, root)
        wheels = ensure_wheels(wanted, interp, progress)
        extras = [(extra, _extra_source(root, extra.source, progress)) for extra in recipe.extras]
        with tempfile.TemporaryDirectory(prefix=f"{name}-", dir=images_dir()) as scratch:
            work = Path(scratch)
            src = work / SRC.lstrip("/")
            _copy_sources(root, recipe.copies, src)
            key = _inputs_key(recipe, version=version, base=base, wheels=wheels, src=src,
                              extras=extras)  # fmt: skip
            record = images_dir() / name / "inputs" / f"{key}.json"
            if not force and record.is_file():
                built = _read_record(record)
                if built.archive.is_file():
                    return built
            built = _build(recipe, version=version, interp=interp, base=base, wheels=wheels,
                           extras=extras, work=work, progress=progress)  # fmt: skip
            built = replace(built, seconds=time.monotonic() - started)
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(built.to_json()) + "\n")
        (images_dir() / f"{name}.json").write_text(json.dumps(built.to_json()) + "\n")
        return built


def _read_record(path: Path) -> BuiltImage:
    data = json.loads(path.read_text())
    return BuiltImage(
        name=data["name"], reference=data["reference"], digest=data["digest"],
        archive=Path(data["archive"]), size=data["size"], unpacked=data["unpacked"],
    )  # fmt: skip


def _inputs_key(
    recipe: Recipe,
    *,
    version: str,
    base: oci.Layer | None,
    wheels: Path,
    src: Path,
    extras: list[tuple[Extra, Path]],
) -> str:
    text = json.dumps({
        "builder": BUILDER_VERSION, "recipe": repr(recipe), "version": version,
        "base": base.digest if base else None, "wheels": python.wheel_digest(wheels),
        "sources": _tree_digest(src), "epoch": oci.source_date_epoch(),
        "extras": [hashlib.sha256(path.read_bytes()).hexdigest() for _, path in extras],
    })  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _build(
    recipe: Recipe,
    *,
    version: str,
    interp: python.Interpreter,
    base: oci.Layer | None,
    wheels: Path,
    extras: list[tuple[Extra, Path]],
    work: Path,
    progress: Progress | None,
) -> BuiltImage:
    say = progress or (lambda _line: None)
    layers = [base] if base else []
    app_stage, extra_stage = work / "app", work / "extras"
    layers.append(ensure_venv(requirements(recipe), interp, wheels, say))
    say(f"{recipe.name}: llmfleet {version}")
    dist = work / "dist"
    python.build_wheel(work / SRC.lstrip("/"), wheels, dist)
    python.install(app_stage, interp, wheels, [f"llmfleet=={version}"], no_deps=True,
                   find_links=[dist])  # fmt: skip
    python.compile_bytecode(app_stage, interp)
    # The layers rebuilt on every code change: gzip's default level, a few times faster than 9
    # (the cached base and venv layers) on the simulator's 60 MB binary.
    layers.append(oci.write_layer(app_stage, work / "app.tar.gz", owner=_root_owned, level=6))
    if extras or recipe.owned:
        for directory in recipe.owned:
            (extra_stage / directory.lstrip("/")).mkdir(parents=True)
        for extra, path in extras:
            target = extra_stage / extra.path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            target.chmod(extra.mode)
        layers.append(
            oci.write_layer(extra_stage, work / "extras.tar.gz", owner=_owner(recipe), level=6)
        )
    say(f"{recipe.name}: the archive")
    config = oci.ImageConfig(
        user=USER, entrypoint=recipe.entrypoint, cmd=recipe.cmd, env=recipe.env,
        workdir=recipe.workdir, ports=recipe.ports, labels=recipe.labels(version),
    )  # fmt: skip
    annotations = {}
    if not isinstance(recipe.base, DebianBase):
        annotations[oci.BASE_NAME] = recipe.base.docker_image
    partial = work / "image.tar"
    reference = recipe.reference(version)
    digest = oci.write_archive(partial, reference, layers, config, annotations)
    final = images_dir() / recipe.name / f"{digest.replace(':', '-')}.tar"
    final.parent.mkdir(parents=True, exist_ok=True)
    partial.replace(final)
    return BuiltImage(
        recipe.name, reference, digest, final, final.stat().st_size,
        sum(layer.uncompressed for layer in layers),
    )  # fmt: skip


def ensure_image(name: str, progress: Progress | None = None) -> BuiltImage:
    """The image `name` (one of `IMAGE_NAMES`) for the current sources: built if missing,
    waiting on a build another process runs; its archive imports with `ctr images import`."""
    return build_image(name, progress)


def built_images() -> list[BuiltImage]:
    """The last image built of each name (what `llmfleet images list` shows)."""
    found = []
    for name in RECIPES:
        record = images_dir() / f"{name}.json"
        if record.is_file():
            found.append(_read_record(record))
    return found
