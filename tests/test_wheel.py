"""The built wheel is a complete lcx: installed into a fresh venv (no checkout, no editable
install in sight) it finds its Hydra YAML through ``pkg://lcx.conf`` and trains one step.

Hydra's ``examples/advanced/hydra_app_example`` ships the same kind of test: configs inside the
installed package, and a check that the installed app runs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import tomllib

import pytest
import setuptools

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _build_backend_is_local() -> bool:
    """A wheel builds without downloads (``--no-build-isolation``): setuptools >= 70.1 writes
    wheels itself, older ones need the ``wheel`` package."""
    major, minor = (int(x) for x in setuptools.__version__.split(".")[:2])
    return (major, minor) >= (70, 1) or importlib.util.find_spec("wheel") is not None


def test_pyproject_lists_every_package():
    """``[tool.setuptools] packages`` is a list (``lcx.conf`` maps from conf/, which find cannot
    express): every package under lcx/ must be in it, or the wheel silently lacks it."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = set(setuptools.find_packages(str(ROOT), include=["lcx", "lcx.*"])) | {"lcx.conf"}
    assert found <= listed, (
        f"add {sorted(found - listed)} to [tool.setuptools] packages in pyproject.toml "
        "(the wheel ships only the packages listed there)"
    )
    assert listed <= found, f"pyproject.toml lists packages that do not exist: {sorted(listed - found)}"


@pytest.mark.slow
@pytest.mark.skipif(
    not _build_backend_is_local(),
    reason="building the wheel offline needs setuptools>=70.1 or the wheel package (pip install wheel)",
)
def test_installed_wheel_trains_one_step_outside_the_checkout(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "HYDRA"))}
    # build from a copy of the files git sees (tracked, or untracked and not ignored), as they are in
    # the working tree: setuptools builds in the source tree, and a stale build/ would leak into the wheel
    src = tmp_path / "src"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        check=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    (wheel,) = (tmp_path / "dist").glob("lcx-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = pathlib.Path(
        subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    # this environment's dependencies (jax, hydra, ...) without its editable lcx: site dirs named
    # in a .pth are added, but the .pth files inside them (the editable finder) are not run
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)],
        check=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    where = subprocess.run(
        [str(py), "-c", "import lcx, lcx.conf; print(lcx.__file__); print(lcx.conf.__file__)"],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    ).stdout.split()
    assert all(pathlib.Path(p).is_relative_to(venv) for p in where), f"lcx not imported from the wheel: {where}"
    run_dir = tmp_path / "run"
    r = subprocess.run(
        [
            str(py),
            "-m",
            "lcx.train",
            "train.steps=1",
            "train.seq_len=64",
            "train.global_batch=2",
            "train.eval_every=0",
            "checkpoint.dir=null",
            f"hydra.run.dir={run_dir}",
        ],
        check=False,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows and rows[-1]["step"] == 1
