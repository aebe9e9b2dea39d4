"""Each image's Dockerfile says what its recipe says, so `docker build` and `llmfleet images
build` give the same image: base, Debian packages, Python requirements, what is copied from the
source tree, extras, user, environment, working directory, ports, entrypoint and command."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from llmfleet.core.images import builder
from llmfleet.core.images.recipe import (
    LAUNCHER_REQUIREMENTS,
    RECIPES,
    SRC,
    USER,
    VENV,
    DebianBase,
    ExternalBase,
    Recipe,
)
from llmfleet.operator.settings import OperatorSettings
from tests.images import dockerfile

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
RECIPE_LIST = list(RECIPES.values())


def _stage(recipe: Recipe) -> dockerfile.Stage:
    return dockerfile.final(REPO / recipe.dockerfile)


@pytest.mark.parametrize("recipe", RECIPE_LIST, ids=lambda r: r.name)
def test_base(recipe: Recipe) -> None:
    assert _stage(recipe).base == recipe.base.docker_image


@pytest.mark.parametrize(
    "recipe", [r for r in RECIPE_LIST if isinstance(r.base, DebianBase)], ids=lambda r: r.name
)
def test_debian_packages_and_user(recipe: Recipe) -> None:
    stage = _stage(recipe)
    assert isinstance(recipe.base, DebianBase)
    assert dockerfile.apt_packages(stage) == recipe.base.packages
    uid, gid = USER.split(":")
    users = " ".join(stage.all("RUN"))
    assert f"groupadd --gid {gid} llmfleet" in users
    assert f"useradd --uid {uid} --gid {gid}" in users


@pytest.mark.parametrize("recipe", RECIPE_LIST, ids=lambda r: r.name)
def test_requirements_then_llmfleet_without_dependencies(recipe: Recipe) -> None:
    installs = dockerfile.pip_installs(_stage(recipe))
    assert installs == [list(builder.requirements(recipe)), [SRC]]
    assert f"-m venv --without-pip {VENV}" in " ".join(_stage(recipe).all("RUN"))


@pytest.mark.parametrize("recipe", RECIPE_LIST, ids=lambda r: r.name)
def test_copies(recipe: Recipe) -> None:
    expected = [(copy.source, f"{SRC}/{copy.target}") for copy in recipe.copies]
    extras = [(e.source, e.path) for e in recipe.extras if not e.source.startswith("tool:")]
    assert dockerfile.copies(_stage(recipe)) == expected + extras


@pytest.mark.parametrize("recipe", RECIPE_LIST, ids=lambda r: r.name)
def test_extras_built_from_the_pinned_module(recipe: Recipe) -> None:
    tools = [e for e in recipe.extras if e.source.startswith("tool:")]
    from_stages = dockerfile.copies_from(_stage(recipe))
    assert [destination for _, _, destination in from_stages] == [e.path for e in tools]
    if tools:  # the Go build copies the local cluster's wrapper module (same pinned version)
        text = (REPO / recipe.dockerfile).read_text()
        assert "COPY core/llmfleet/core/cluster/gomod/inference-sim /build" in text


@pytest.mark.parametrize("recipe", RECIPE_LIST, ids=lambda r: r.name)
def test_config(recipe: Recipe) -> None:
    stage = _stage(recipe)
    assert stage.one("USER") == USER
    assert dockerfile.env(stage) == recipe.env
    assert stage.one("WORKDIR") == recipe.workdir
    assert tuple(int(port) for port in stage.one("EXPOSE").split()) == recipe.ports
    assert dockerfile.exec_form(stage.one("ENTRYPOINT")) == recipe.entrypoint
    assert dockerfile.exec_form(stage.one("CMD")) == recipe.cmd


@pytest.mark.parametrize("recipe", RECIPE_LIST, ids=lambda r: r.name)
def test_owned_directories(recipe: Recipe) -> None:
    runs = " ".join(_stage(recipe).all("RUN"))
    for directory in recipe.owned:
        assert f"mkdir -p {directory} && chown {USER} {directory}" in runs


def test_the_control_plane_installs_pyprojects_dependencies() -> None:
    assert builder.requirements(RECIPES["control-plane"]) == tuple(
        PYPROJECT["project"]["dependencies"]
    )


def test_the_launchers_requirements_are_pinned_as_in_pyproject() -> None:
    assert set(LAUNCHER_REQUIREMENTS) <= set(PYPROJECT["project"]["dependencies"])


def test_the_runtime_base_is_the_vllm_of_the_runtime_extra() -> None:
    base = RECIPES["runtime"].base
    assert isinstance(base, ExternalBase)
    pin = next(p for p in PYPROJECT["project"]["optional-dependencies"]["runtime"] if "vllm" in p)
    assert base.docker_image == f"vllm/vllm-openai:v{pin.split('==')[1]}"


@pytest.mark.parametrize("recipe", RECIPE_LIST, ids=lambda r: r.name)
def test_no_local_tooling_is_copied(recipe: Recipe) -> None:
    for source, _ in dockerfile.copies(_stage(recipe)):
        assert not re.match(r"core/llmfleet/core/(cluster|images)", source), source
        assert "autoscaler/llmfleet/autoscaler/sim" not in source


@pytest.mark.parametrize("recipe", RECIPE_LIST, ids=lambda r: r.name)
def test_the_reference_is_tagged_with_the_package_version(recipe: Recipe) -> None:
    version = PYPROJECT["project"]["version"]
    reference = recipe.reference(version)
    assert reference.startswith("ghcr.io/llmfleet/")
    assert re.fullmatch(r"[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}", reference.rsplit(":", 1)[1])


def test_the_operators_default_engine_image_is_the_runtime_image() -> None:
    version = PYPROJECT["project"]["version"]
    assert OperatorSettings().runtime_image == RECIPES["runtime"].reference(version)


def test_the_charts_image_is_the_control_plane_image() -> None:
    """The chart's tag defaults to its appVersion, the package version (tests/chart checks)."""
    values = yaml.safe_load((REPO / "charts" / "llmfleet" / "values.yaml").read_text())
    assert values["image"]["repository"] == RECIPES["control-plane"].repository
    assert values["image"]["tag"] == ""
