"""``offline-kit build``: make a kit where pip and apt reach their indexes."""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .contents import deb_closure, manifest_of, parse_apt_depends, read_wheel, report, stub_versions, write_stub_wheel
from .kit import (
    DEBS,
    DEFAULT_PREFIX,
    FORMER_TOOL_FILES,
    INSTALLED,
    MANIFEST,
    SERVER_PACKAGE,
    STUB_LABEL,
    TOOL_FILES,
    TOOLS,
    WHEELS,
    KitError,
    canonical,
    platform_tags,
    run_tool,
    target_environment,
    telling_line,
)


def pip_failure(output: str, python: str, glibc: str) -> str:
    """One line for a failed ``pip download``: the index unreachable, or which wheel is missing."""
    if re.search(
        r"NewConnectionError|Failed to establish|Temporary failure in name resolution|"
        r"Name or service not known|ConnectTimeout|Max retries exceeded|Could not fetch URL|"
        r"HTTP error 40[34]|HTTP error 5\d\d|SSLError",
        output,
    ):
        reason = re.search(
            r"Failed to establish a new connection: ([^'\"]+)|(Temporary failure in name resolution)|"
            r"(Name or service not known)|(SSLError\([^)]*)|(HTTP error \d+ while getting \S+)|"
            r"Could not fetch URL (\S+)",
            output,
        )
        why = next((g for g in reason.groups() if g), "") if reason else ""
        return f"the package index is unreachable ({why.rstrip(':')}); pip config list shows the index pip uses"
    match = re.search(r"No matching distribution found for ([A-Za-z0-9._-]+)([^;\s]*)", output)
    if match:
        wanted = f"{match.group(1)} {match.group(2)}".strip()
        return (
            f"no wheel of {wanted} for CPython {python} on manylinux x86_64 with glibc <= {glibc}"
            " (a newer --glibc, another --python, or leave its extra out)"
        )
    match = re.search(r"ResolutionImpossible|conflict", output)
    if match:
        return f"pip found no set of versions that fits: {telling_line(output)}"
    return telling_line(output)


# -- build --------------------------------------------------------------------------


def repo_root() -> Path:
    return TOOLS.parent


def build_warren_wheel(repo: Path, out: Path) -> Path:
    """warren's wheel, built from a copy of this tree (the shared tree gets no build/ folder)."""
    if not (repo / "pyproject.toml").is_file() or not (repo / "worker").is_dir():
        raise KitError(f"no warren source tree at {repo} (build runs from the repository's scripts/)")
    source = out / "source"
    source.mkdir()
    try:
        listed = subprocess.run(
            [
                "git",
                "ls-files",
                "-z",
                "-co",
                "--exclude-standard",
                "--",
                "pyproject.toml",
                "README.md",
                "messaging",
                "worker",
            ],
            cwd=repo,
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout.split(b"\0")
        files = [Path(os.fsdecode(name)) for name in listed if name]
    except (OSError, subprocess.SubprocessError):  # no git (an unpacked source archive): take the folders
        files = [
            p.relative_to(repo) for part in ("messaging", "worker") for p in (repo / part).rglob("*") if p.is_file()
        ]
        files += [Path("pyproject.toml"), Path("README.md")]
    for name in files:
        if name.suffix == ".pyc" or "__pycache__" in name.parts or not (repo / name).is_file():
            continue
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / name, source / name)
    built = out / "warren-wheel"
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(built), str(source)]
    if importlib.util.find_spec("setuptools") is not None:
        argv.insert(4, "--no-build-isolation")  # this Python's setuptools builds it: quicker
    run_tool(argv, "building warren's wheel")
    wheels = sorted(built.glob("warren-*.whl"))
    if not wheels:
        raise KitError("building warren's wheel: pip made no wheel")
    return wheels[0]


def download_wheels(
    warren_wheel: Path,
    extras: Sequence[str],
    *,
    python: str,
    glibc: str,
    stubs: Mapping[str, str],
    out: Path,
    tmp: Path,
) -> None:
    """warren's wheel and its dependencies' for the target into ``out``, placeholders standing for ``stubs``."""
    stub_dir = tmp / "stubs"
    stub_dir.mkdir()
    for name, version in stubs.items():
        write_stub_wheel(stub_dir, name, version)
    constraints = tmp / "constraints.txt"
    constraints.write_text("".join(f"{name}=={version}+{STUB_LABEL}\n" for name, version in stubs.items()))
    requirement = f"{warren_wheel}[{','.join(extras)}]" if extras else str(warren_wheel)
    argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--only-binary=:all:"]
    argv += ["--python-version", python, "--implementation", "cp", "--abi", f"cp{python.replace('.', '')}"]
    for tag in platform_tags(glibc):
        argv += ["--platform", tag]
    argv += ["--find-links", str(stub_dir), "--constraint", str(constraints), "-d", str(out), requirement]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise KitError(pip_failure(done.stdout + done.stderr, python, glibc))
    for stub in out.glob(f"*+{STUB_LABEL}-*.whl"):
        stub.unlink()


def download_debs(out: Path) -> list[str]:
    """RabbitMQ's and Erlang's Debian packages into ``out``; the system packages they assume."""
    if shutil.which("apt-get") is None or shutil.which("apt-cache") is None:
        raise KitError("apt-get is not installed: the broker comes from Debian packages (or build with --no-broker)")
    arch = run_tool(["dpkg", "--print-architecture"], "asking dpkg for this machine's architecture").strip()
    if arch != "amd64":
        raise KitError(f"this machine's Debian packages are {arch}, the target is amd64: build on amd64 or --no-broker")
    relations = ["--no-recommends", "--no-suggests", "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances"]
    depends: dict[str, list[list[str]]] = {}
    todo = [SERVER_PACKAGE]
    while todo:
        text = run_tool(["apt-cache", "depends", *relations, *todo], f"apt-cache depends {' '.join(todo)}")
        found = parse_apt_depends(text)
        missing = [name for name in todo if name not in found]
        if missing:
            raise KitError(f"apt knows no package {missing[0]} (apt-get update, or a source that has it)")
        depends.update(found)
        carried, _ = deb_closure(depends)
        todo = [name for name in carried if name not in depends]
    carried, assumed = deb_closure(depends)
    try:
        run_tool(["apt-get", "download", *carried], "apt-get download", cwd=out)
    except KitError:
        for package in carried:  # which one: the first that fails alone
            if not list(out.glob(f"{package}_*.deb")):
                run_tool(["apt-get", "download", package], f"downloading the Debian package {package}", cwd=out)
        raise
    return assumed


def copy_tools(kit: Path) -> None:
    for name in TOOL_FILES:
        if (TOOLS / name).is_dir():
            shutil.copytree(TOOLS / name, kit / name, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(TOOLS / name, kit / name)


def prepare_kit_dir(kit: Path) -> None:
    """An empty or earlier kit directory (a failed build's too), its wheels and packages cleared.

    A directory holding anything a kit does not is refused: it is someone's, not a kit.
    """
    ours = {MANIFEST, WHEELS, DEBS, INSTALLED, DEFAULT_PREFIX, *TOOL_FILES, *FORMER_TOOL_FILES}
    if kit.exists() and any(entry.name not in ours for entry in kit.iterdir()):
        raise KitError(f"{kit} is not empty and holds no kit: choose a new directory")
    for part in (WHEELS, DEBS):
        shutil.rmtree(kit / part, ignore_errors=True)
        (kit / part).mkdir(parents=True)
    with contextlib.suppress(OSError):
        (kit / MANIFEST).unlink()


def build(
    kit: Path,
    *,
    python: str,
    extras: Sequence[str],
    without: Mapping[str, str | None],
    glibc: str,
    broker: bool = True,
    repo: Path | None = None,
) -> dict[str, Any]:
    """Build the kit into ``kit`` and return its manifest (also written to ``kit/manifest.json``)."""
    started = time.monotonic()
    stubs = stub_versions(without)
    prepare_kit_dir(kit)
    with tempfile.TemporaryDirectory(prefix="offline-kit-") as tmp_text:
        tmp = Path(tmp_text)
        print("building warren's wheel from this tree", flush=True)
        warren_wheel = build_warren_wheel(repo or repo_root(), tmp)
        warren = read_wheel(warren_wheel)
        unknown = [e for e in extras if canonical(e) not in warren.extras]
        if unknown:
            raise KitError(f"warren has no extra {unknown[0]} (it has: {', '.join(warren.extras)})")
        print(
            f"fetching wheels for CPython {python} (manylinux x86_64, glibc <= {glibc}), leaving out"
            f" {', '.join(f'{n} {v}' for n, v in stubs.items())}",
            flush=True,
        )
        download_wheels(warren_wheel, extras, python=python, glibc=glibc, stubs=stubs, out=kit / WHEELS, tmp=tmp)
    wheels = [read_wheel(path) for path in sorted((kit / WHEELS).glob("*.whl"))]
    names = [w.name for w in wheels]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise KitError(f"two versions of {twice[0]} in the kit's wheels (one stops the whole install)")
    assumed_system: list[str] = []
    if broker:
        print(f"fetching the Debian packages of {SERVER_PACKAGE} and the Erlang it needs", flush=True)
        assumed_system = download_debs(kit / DEBS)
    copy_tools(kit)
    manifest = manifest_of(
        python=python,
        glibc=glibc,
        extras=[canonical(e) for e in extras],
        wheels=wheels,
        debs=sorted((kit / DEBS).glob("*.deb")),
        assumed_system=assumed_system,
        env=target_environment(python),
    )
    (kit / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    print(report(manifest, kit))
    print(f"built in {time.monotonic() - started:.0f} s; on the offline machine: DIR/offline-kit install DIR")
    return manifest
