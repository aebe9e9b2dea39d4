"""The namespace layout never shadows the standard library (DESIGN.md §2)."""

from __future__ import annotations

import subprocess
import sysconfig
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COMPONENTS = ("core", "crds", "operator", "autoscaler", "gateway", "runtime_image")


def test_no_init_file_directly_in_a_component_folder() -> None:
    for component in COMPONENTS:
        assert (REPO / component).is_dir()
        assert not (REPO / component / "__init__.py").exists()
        assert not (REPO / component / "llmfleet" / "__init__.py").exists(), "llmfleet is PEP 420"


def test_a_fresh_venv_at_the_repo_root_imports_the_standard_library(tmp_path: Path) -> None:
    fresh = tmp_path / "venv"
    venv.create(fresh, with_pip=False)
    python = fresh / "bin" / "python"
    result = subprocess.run(
        [python, "-c", "import collections, operator; print(operator.__file__)"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).parent != REPO / "operator"
    assert result.stdout.strip().endswith("operator.py")


def test_python_m_pytest_runs_from_the_repo_root_in_a_fresh_venv(tmp_path: Path) -> None:
    fresh = tmp_path / "venv"
    venv.create(fresh, with_pip=False)
    # The fresh venv sees this environment's installed packages (pytest, llmfleet) through a
    # .pth file, as it would after `pip install -e .[dev]`, without another download.
    site = next((fresh / "lib").glob("python3*/site-packages"))
    dev_site = sysconfig.get_paths()["purelib"]
    (site / "dev-env.pth").write_text(f"import site; site.addsitedir({dev_site!r})\n")
    result = subprocess.run(
        [fresh / "bin" / "python", "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/unit/test_nodes.py"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert " passed" in result.stdout
