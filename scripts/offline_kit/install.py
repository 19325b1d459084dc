"""``offline-kit install``, ``start-broker`` and ``stop-broker``: on the offline machine, from the kit alone."""

from __future__ import annotations

import contextlib
import io
import json
import lzma
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .kit import BROKER_DATA, DEBS, DEFAULT_PREFIX, INSTALLED, MANIFEST, TOOLS, WHEELS, KitError, run_tool

# -- install ------------------------------------------------------------------------


def load_manifest(kit: Path) -> dict[str, Any]:
    try:
        manifest: dict[str, Any] = json.loads((kit / MANIFEST).read_text())
    except FileNotFoundError as exc:
        raise KitError(f"{kit} is not a kit (no {MANIFEST}; scripts/offline-kit build makes one)") from exc
    except ValueError as exc:
        raise KitError(f"{kit / MANIFEST} is not valid JSON: {exc}") from exc
    return manifest


#: Run by the target's Python: its version, and what it lacks of the kit's assumed packages.
_TARGET_CHECK = r"""
import importlib.metadata, json, sys
try:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version
except ImportError:
    from pip._vendor.packaging.specifiers import SpecifierSet
    from pip._vendor.packaging.version import Version
missing, wrong = [], []
for item in json.loads(sys.argv[1]):
    try:
        have = importlib.metadata.version(item["name"])
    except importlib.metadata.PackageNotFoundError:
        missing.append(item["name"])
        continue
    if item["requirement"] and Version(have) not in SpecifierSet(item["requirement"]):
        wrong.append(f"{item['name']} {have} (the kit needs {item['requirement']})")
print(json.dumps({"python": "%d.%d" % sys.version_info[:2], "missing": missing, "wrong": wrong}))
"""


def check_target(manifest: Mapping[str, Any], python_exe: str) -> None:
    """KitError when the target's Python is not the kit's, or lacks what the kit assumes."""
    assumed = json.dumps(manifest["assumed"])
    found = json.loads(run_tool([python_exe, "-c", _TARGET_CHECK, assumed], f"asking {python_exe} what it has"))
    if found["python"] != manifest["python"]:
        raise KitError(
            f"the kit is for Python {manifest['python']}, {python_exe} is {found['python']}:"
            f" build one with --python {found['python']}"
        )
    if found["missing"]:
        raise KitError(
            f"{python_exe} lacks {', '.join(found['missing'])}, which the kit leaves out: install them,"
            " or build the kit with a shorter --without"
        )
    if found["wrong"]:
        raise KitError(f"{python_exe} has {', '.join(found['wrong'])}")


def install_wheels(kit: Path, manifest: Mapping[str, Any], python_exe: str, target: Path | None) -> None:
    wheels = kit / WHEELS
    files = [str(wheels / w["file"]) for w in manifest["wheels"]]
    pip = [python_exe, "-m", "pip", "install", "--disable-pip-version-check", "--no-index", "-q"]
    if target is not None:
        # --target ignores what the environment has, so no resolution: every wheel as it is.
        argv = [*pip, "--no-deps", "--upgrade", "--target", str(target), *files]
    else:
        warren = next(w["file"] for w in manifest["wheels"] if w["name"] == "warren")
        extras = manifest["warren"]["extras"]
        requirement = str(wheels / warren) + (f"[{','.join(extras)}]" if extras else "")
        argv = [*pip, "--find-links", str(wheels), requirement]
    run_tool(argv, "pip install from the kit")


def extract_deb(deb: Path, prefix: Path) -> None:
    """``dpkg -x`` a package into ``prefix`` (plain Python where dpkg-deb is missing: ar, then tar)."""
    if shutil.which("dpkg-deb"):
        run_tool(["dpkg-deb", "-x", str(deb), str(prefix)], f"unpacking {deb.name}")
        return
    data = deb.read_bytes()
    if not data.startswith(b"!<arch>\n"):
        raise KitError(f"{deb.name} is not a Debian package")
    offset = 8
    while offset + 60 <= len(data):
        header = data[offset : offset + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        body = data[offset + 60 : offset + 60 + size]
        offset += 60 + size + (size % 2)
        if name.startswith("data.tar"):
            if name.endswith(".zst"):
                raise KitError(f"{deb.name}: zstd-compressed, and dpkg-deb is not installed to unpack it")
            raw = lzma.decompress(body) if name.endswith(".xz") else body
            with tarfile.open(fileobj=io.BytesIO(raw), mode="r:*") as archive:
                if hasattr(tarfile, "tar_filter"):  # Python 3.11.4 and later
                    archive.extractall(prefix, filter="tar")
                else:
                    archive.extractall(prefix)  # Debian's own archive, fetched by apt
            return
    raise KitError(f"{deb.name} has no data archive")


def relocate_erlang(prefix: Path) -> Path:
    """Point the unpacked Erlang's start scripts at ``prefix`` (Debian's hard-code /usr/lib/erlang)."""
    root = prefix / "usr/lib/erlang"
    if not (root / "bin/erl").is_file():
        raise KitError(f"no Erlang unpacked under {prefix} (usr/lib/erlang/bin/erl)")
    scripts = [root / "bin/erl", root / "bin/start", *root.glob("erts-*/bin/erl"), *root.glob("erts-*/bin/start")]
    for script in scripts:
        if script.is_file():
            text = script.read_text()
            script.write_text(re.sub(r"^(\s*)ROOTDIR=.*$", rf'\1ROOTDIR="{root}"', text, flags=re.MULTILINE))
    releases = root / "releases/RELEASES"
    if releases.is_file():
        releases.write_text(releases.read_text().replace('"/usr/lib/erlang/', f'"{root}/'))
    return root


def missing_libraries(root: Path) -> list[str]:
    """Shared libraries the unpacked Erlang needs and this machine lacks (``ldd``; empty without it)."""
    if shutil.which("ldd") is None:
        return []
    binaries = [*root.glob("erts-*/bin/beam.smp"), *root.glob("erts-*/bin/erl_child_setup")]
    binaries += list(root.glob("lib/crypto-*/priv/lib/*.so"))
    missing: set[str] = set()
    for binary in binaries:
        done = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, timeout=60, check=False)
        missing.update(line.split()[0] for line in done.stdout.splitlines() if "not found" in line)
    return sorted(missing)


def install(
    kit: Path, *, prefix: Path | None = None, target: Path | None = None, python_exe: str = sys.executable
) -> Path | None:
    """Install the kit's wheels and unpack its Debian packages; the prefix (None without packages)."""
    started = time.monotonic()
    manifest = load_manifest(kit)
    check_target(manifest, python_exe)
    print(f"installing {len(manifest['wheels'])} wheels with {python_exe} (no index)", flush=True)
    install_wheels(kit, manifest, python_exe, target)
    where = None
    if manifest["debs"]:
        where = (prefix or kit / DEFAULT_PREFIX).resolve()
        where.mkdir(parents=True, exist_ok=True)
        print(f"unpacking {len(manifest['debs'])} Debian packages into {where}", flush=True)
        for deb in manifest["debs"]:
            extract_deb(kit / DEBS / deb["file"], where)
        erlang = relocate_erlang(where)
        lacking = missing_libraries(erlang)
        if lacking:
            raise KitError(f"Erlang needs shared libraries this machine lacks: {', '.join(lacking)}")
        with contextlib.suppress(OSError):  # a read-only kit: start-broker then needs the prefix named
            (kit / INSTALLED).write_text(json.dumps({"prefix": str(where)}) + "\n")
    print(f"installed in {time.monotonic() - started:.0f} s")
    if target is not None:
        print(f"export PYTHONPATH={target}${{PYTHONPATH:+:$PYTHONPATH}} PATH={target}/bin:$PATH")
    if where is not None:
        print(f"next: {kit}/offline-kit start-broker {kit if prefix is None else where}")
    return where


# -- broker -------------------------------------------------------------------------


def broker_root(place: Path) -> Path:
    """The prefix the packages were unpacked into, from a kit directory or the prefix itself."""
    if (place / MANIFEST).is_file():
        with contextlib.suppress(OSError, ValueError, KeyError):
            return Path(json.loads((place / INSTALLED).read_text())["prefix"])
        place = place / DEFAULT_PREFIX
    if not (place / "usr/lib/erlang/bin/erl").is_file():
        raise KitError(f"no unpacked RabbitMQ and Erlang under {place}: run offline-kit install first")
    return place.resolve()


def broker_command(verb: str, place: Path, data: Path | None, extra: Sequence[str] = ()) -> int:
    """Run scripts/rabbit_node.py (beside this file, in the repo and in a kit) for the prefix of ``place``."""
    root = broker_root(place)
    argv = [sys.executable, str(TOOLS / "rabbit_node.py"), verb, "--data", str(data or root / BROKER_DATA)]
    if verb == "start":
        argv += ["--root", str(root), *extra]
    return subprocess.run(argv, check=False).returncode
