"""The wheel installs one package, ``recap``, that lives beside any host project.

A Django project's most common app is called ``core``, and Celery users often have a ``workers``
module: Recap's wheel must not install top-level packages of those names, nor be shadowed by
them. The wheel is built from the checkout, installed into a fresh virtual environment (its
dependencies taken from this one, so no registry is reached), and run from a folder that holds
``core/__init__.py`` and ``workers/__init__.py``: the import, the CLI, the schema, a whole demo
run through an in-process Celery worker, and ``recap serve --help``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 120) -> str:
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{argv}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    source = tmp_path_factory.mktemp("source")
    # a copy of the tracked tree (links kept as links), so the build leaves the checkout alone
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, files):
        src, dst = ROOT / os.fsdecode(name), source / os.fsdecode(name)
        if not os.path.lexists(src):
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.symlink_to(os.readlink(src))
        else:
            dst.write_bytes(src.read_bytes())
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(source),
        ],
        cwd=out,
        env=dict(os.environ),
        timeout=300,
    )
    (built,) = out.glob("recap-*.whl")
    return built


def test_the_wheel_installs_only_the_recap_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
        names = set(archive.namelist())
    assert {t for t in tops if not t.endswith(".dist-info")} == {"recap"}
    assert "recap/core/migrations/versions/0001_initial_schema.py" in names
    assert "recap/workers/ui/templates/base.html" in names or any(
        n.startswith("recap/workers/ui/templates/") for n in names
    )
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    with zipfile.ZipFile(wheel) as archive:
        text = archive.read(entry_points).decode()
    assert "recap = recap.workers.cli:main" in text
    assert "parts = recap.workers.compress:worker_parts" in text


def test_a_host_project_with_core_and_workers_packages_runs_recap(
    wheel: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path, env={})
    bin_dir = venv / "bin"
    python = bin_dir / "python"
    # the wheel alone into the new environment; its dependencies are this environment's
    target = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target, str(wheel)],
        cwd=tmp_path,
        env=dict(os.environ),
        timeout=300,
    )
    Path(target, "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # console scripts are not written by --target: the one the wheel declares, by hand
    recap = bin_dir / "recap"
    recap.write_text(
        f"#!{python}\nimport sys\nfrom recap.workers.cli import main\nsys.exit(main())\n"
    )
    recap.chmod(0o755)

    host = tmp_path / "host"
    for package in ("core", "workers"):
        (host / package).mkdir(parents=True)
        (host / package / "__init__.py").write_text("raise ImportError('the host project')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECAP_", "PYTHON", "VIRTUAL"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", COLUMNS="120")

    where = run(
        [str(python), "-c", "import recap, recap.core.client as c; print(recap.Recap, c.__file__)"],
        cwd=host,
        env=env,
    )
    assert "recap.core.client.Recap" in where and target in where
    assert "Usage: recap" in run([str(recap), "--help"], cwd=host, env=env)
    assert '"revision"' in run([str(recap), "init", "--json"], cwd=host, env=env)
    demo = run([str(recap), "demo", "--window", "6000"], cwd=host, env=env, timeout=240)
    assert "summarized" in demo
    assert "--port" in run([str(recap), "serve", "--help"], cwd=host, env=env)
    # and the host's own packages are still its own
    assert (
        "the host project"
        in subprocess.run(
            [str(python), "-c", "import core"], cwd=host, env=env, capture_output=True, text=True
        ).stderr
    )
