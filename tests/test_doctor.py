"""``mldbg doctor``: real interpreters, a real editable install and its git checkout."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from editable_repo import EditableRepo, git, make_editable_repo
from mldbg.errors import MldbgError
from mldbg.tools import doctor


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> EditableRepo:
    return make_editable_repo(tmp_path_factory.mktemp("doctor"))


def test_doctor_finds_the_editable_checkout_and_its_git_state(cli, lib: EditableRepo) -> None:
    report = cli("doctor", "--python", str(lib.venv_python), "toylib", json_out=True)
    assert report["python"]["executable"] == str(lib.venv_python)
    assert report["python"]["virtualenv"] == str(lib.venv_python.parent.parent)
    toy = next(p for p in report["packages"] if p["name"] == "toylib")
    assert toy["found"] and toy["editable"] and toy["version"] == "0.3.1"
    assert toy["source"] == str(lib.repo) and toy["imported_from"] == str(lib.repo / "toylib")
    assert toy["git"]["branch"] == "main" and toy["git"]["dirty"] is False
    assert toy["git"]["commit"] == git(lib.repo, "rev-parse", "--short", "HEAD").strip()
    torch_entry = next(p for p in report["packages"] if p["name"] == "torch")
    assert torch_entry["found"] is False  # the fresh venv has no torch
    assert report["daemon"]["running"] is True  # the test daemon of conftest

    (lib.repo / "toylib" / "core.py").write_text("# changed\n")
    try:
        toy = next(
            p
            for p in doctor.doctor(["toylib"], python=str(lib.venv_python))["packages"]
            if p["name"] == "toylib"
        )
        assert toy["git"]["dirty"] and toy["git"]["dirty_files"] == ["toylib/core.py"]
    finally:
        git(lib.repo, "checkout", "--", "toylib/core.py")
    human = cli("doctor", "--python", str(lib.venv_python), "toylib").stdout
    assert "editable" in human and str(lib.repo) in human and "on main" in human


def test_doctor_reports_regular_installs_of_this_interpreter() -> None:
    torch = pytest.importorskip("torch")
    report = doctor.doctor(python=sys.executable)
    entry = next(p for p in report["packages"] if p["name"] == "torch")
    assert entry["found"] and entry["version"] == torch.__version__ and not entry["editable"]
    assert entry["imported_from"] == str(Path(torch.__file__).resolve().parent)
    mlx_lm = next(p for p in report["packages"] if p["name"] == "mlx-lm")
    assert mlx_lm["found"] == _has("mlx_lm")  # the dist name with "-", imported as mlx_lm


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_imported_copy_flags_a_breakpoint_in_a_copy_that_never_runs(
    lib: EditableRepo, tmp_path: Path
) -> None:
    py = str(lib.venv_python)
    real = lib.repo / "toylib" / "layers" / "attention.py"
    same = doctor.imported_copy(py, str(real))
    assert same["same"] is True and same["module"] == "toylib.layers.attention"
    assert same["warning"] is None
    copy = tmp_path / "copy"
    shutil.copytree(lib.repo, copy)
    other = doctor.imported_copy(py, str(copy / "toylib" / "layers" / "attention.py"))
    assert other["same"] is False and other["imported_file"] == str(real)
    assert "will not hit" in other["warning"] and str(real) in other["warning"]
    loose = tmp_path / "loose.py"
    loose.write_text("x = 1\n")
    assert doctor.imported_copy(py, str(loose))["same"] is None


def test_require_editable(lib: EditableRepo) -> None:
    assert doctor.require_editable(str(lib.venv_python), "toylib") is None
    with pytest.raises(MldbgError) as missing:
        doctor.require_editable(str(lib.venv_python), "no_such_package_here")
    assert missing.value.code == "not_editable" and "pip install -e" in missing.value.message
    pytest.importorskip("torch")
    with pytest.raises(MldbgError) as regular:
        doctor.require_editable(sys.executable, "torch")
    assert regular.value.code == "not_editable" and "regular install" in regular.value.message


def test_doctor_python_reports_that_interpreters_virtualenv(
    cli, lib: EditableRepo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run from another activated virtualenv, ``--python X`` reports X's, not the caller's."""
    monkeypatch.setenv("VIRTUAL_ENV", sys.prefix)  # the caller's (this test's) environment
    report = cli("doctor", "--python", str(lib.venv_python), json_out=True)
    assert report["python"]["virtualenv"] == str(lib.venv_python.parent.parent)
    assert report["python"]["prefix"] == str(lib.venv_python.parent.parent)


def test_a_copy_shadowing_the_editable_checkout_is_labelled_shadowed(cli, tmp_path: Path) -> None:
    lib = make_editable_repo(tmp_path)
    site = next((lib.venv_python.parent.parent / "lib").glob("python*/site-packages"))
    shutil.copytree(lib.repo / "toylib", site / "toylib")  # a stray copy installed over it
    report = cli("doctor", "--python", str(lib.venv_python), "toylib", json_out=True)
    toy = next(p for p in report["packages"] if p["name"] == "toylib")
    assert toy["imported_from"] == str((site / "toylib").resolve())
    assert toy["shadowed"] is True and toy["editable"] is False
    assert toy["source"] == str(lib.repo) and "shadows the checkout" in toy["warnings"][0]
    line = next(
        line
        for line in cli("doctor", "--python", str(lib.venv_python), "toylib").stdout.splitlines()
        if "toylib" in line and "0.3.1" in line
    )
    assert "shadowed" in line and "editable" not in line
    with pytest.raises(MldbgError) as refused:
        doctor.require_editable(str(lib.venv_python), "toylib")
    assert "shadows the checkout" in refused.value.message
