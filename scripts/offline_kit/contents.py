"""What goes into a kit: the wheels of warren's dependencies for the target, the Debian packages
of RabbitMQ and Erlang, and the manifest that lists them and what the kit leaves to the target."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import time
import urllib.parse
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path
from typing import Any

from .kit import SERVER_PACKAGE, STUB_LABEL, KitError, canonical, mib, platform_tags

# -- wheels -------------------------------------------------------------------------


@dataclass(frozen=True)
class Wheel:
    """One wheel file of the kit: its distribution, version, size and declared requirements."""

    file: str
    name: str
    version: str
    size: int
    requires: tuple[str, ...] = ()
    extras: tuple[str, ...] = ()


def read_wheel(path: Path) -> Wheel:
    """Name, version and Requires-Dist from a wheel's METADATA (KitError when it has none)."""
    try:
        with zipfile.ZipFile(path) as archive:
            entry = next(n for n in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
            text = archive.read(entry).decode("utf-8", errors="replace")
    except (OSError, zipfile.BadZipFile, StopIteration) as exc:
        raise KitError(f"{path.name} is not a wheel with metadata ({exc or 'no METADATA'})") from exc
    meta = Parser().parsestr(text, headersonly=True)
    return Wheel(
        file=path.name,
        name=canonical(meta["Name"] or path.name.split("-")[0]),
        version=meta["Version"] or "",
        size=path.stat().st_size,
        requires=tuple(meta.get_all("Requires-Dist") or ()),
        extras=tuple(canonical(e) for e in meta.get_all("Provides-Extra") or ()),
    )


def write_stub_wheel(folder: Path, name: str, version: str) -> Path:
    """A wheel of ``name`` at ``version+kitstub`` with no files and no dependencies.

    It stands, during the resolution, for a package the target already has: pip takes it
    for the real thing (the constraint pins it) and never looks at that package's own
    requirements, so torch's CUDA wheels and the like are never fetched.
    """
    stub_version = f"{version}+{STUB_LABEL}"
    dist = re.sub(r"[-_.]+", "_", name)
    info = f"{dist}-{stub_version}.dist-info"
    path = folder / f"{dist}-{stub_version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {stub_version}\n")
        archive.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: offline-kit\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        archive.writestr(f"{info}/RECORD", "")
    return path


def installed_version(name: str) -> str | None:
    """The version this Python has of ``name`` (without a local label such as ``+cpu``), or None."""
    try:
        return importlib.metadata.version(name).split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        return None


def stub_versions(without: Mapping[str, str | None]) -> dict[str, str]:
    """The version each left-out package stands at: the one given, else the one installed here."""
    versions: dict[str, str] = {}
    for name, given in without.items():
        version = given or installed_version(name)
        if version is None:
            raise KitError(
                f"cannot tell which {name} the target has (not installed here): give it as --without {name}==VERSION"
            )
        versions[name] = version
    return versions


def packaging_requirements() -> Any:
    """``packaging`` (installed, else pip's own copy) for requirements and markers."""
    try:
        import packaging.requirements

        return packaging.requirements
    except ImportError:  # pip's vendored copy: there is one wherever a kit is built
        import pip._vendor.packaging.requirements

        return pip._vendor.packaging.requirements


@dataclass
class Reach:
    """What a set of requirements pulls in, given the kit's wheels (see :func:`reach`)."""

    #: Kit packages reached (canonical names).
    packages: set[str] = field(default_factory=set)
    #: Packages reached that the kit leaves out: name → {specifier: requiring packages}.
    assumed: dict[str, dict[str, set[str]]] = field(default_factory=dict)


def reach(roots: Iterable[str], wheels: Mapping[str, Wheel], env: Mapping[str, str], by: str = "warren") -> Reach:
    """Follow requirement strings through the wheels' own Requires-Dist, with their extras.

    A requirement whose marker is false on the target (``python_version < "3.11"``, an
    extra nobody asked for) is not followed; one on a package the kit does not hold is
    recorded as assumed (the target must have it) and not followed further.
    """
    requirements = packaging_requirements()
    result = Reach()
    done: set[tuple[str, frozenset[str]]] = set()
    todo: list[tuple[str, str]] = [(text, by) for text in roots]
    while todo:
        text, parent = todo.pop()
        requirement = requirements.Requirement(text)
        name = canonical(requirement.name)
        extras = frozenset(canonical(e) for e in requirement.extras)
        if (name, extras) in done:
            continue
        wheel = wheels.get(name)
        if wheel is None:
            specs = result.assumed.setdefault(name, {})
            specs.setdefault(str(requirement.specifier), set()).add(parent)
            continue
        done.add((name, extras))
        result.packages.add(name)
        for child in wheel.requires:
            marker = requirements.Requirement(child).marker
            if marker is None or any(marker.evaluate({**env, "extra": e}) for e in ("", *sorted(extras))):
                todo.append((child, name))
    return result


def root_requirements(warren: Wheel, extras: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """Warren's requirements with the chosen extras, as requirement strings on the target."""
    requirements = packaging_requirements()
    roots = []
    for text in warren.requires:
        marker = requirements.Requirement(text).marker
        if marker is None or any(marker.evaluate({**env, "extra": e}) for e in ("", *extras)):
            roots.append(text)
    return roots


def extra_sizes(
    warren: Wheel, extras: Sequence[str], wheels: Mapping[str, Wheel], env: Mapping[str, str]
) -> dict[str, dict[str, Any]]:
    """What each extra adds over warren alone: ``{extra: {"bytes": n, "packages": [...]}}``."""
    base = reach(root_requirements(warren, (), env), wheels, env).packages
    sizes = {}
    for extra in extras:
        added = reach(root_requirements(warren, (extra,), env), wheels, env).packages - base - {warren.name}
        sizes[extra] = {"bytes": sum(wheels[n].size for n in added), "packages": sorted(added)}
    return sizes


# -- Debian packages ----------------------------------------------------------------


def parse_apt_depends(text: str) -> dict[str, list[list[str]]]:
    """``apt-cache depends`` output → package → its Depends/PreDepends as groups of alternatives.

    ``|Depends: a`` followed by ``Depends: b`` is one group (a or b); a virtual package is
    written ``<name>`` and kept so (it cannot be downloaded); the providers listed under it
    are left out.
    """
    result: dict[str, list[list[str]]] = {}
    current: list[list[str]] | None = None
    open_group = False
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            current = result.setdefault(line.strip(), [])
            open_group = False
            continue
        match = re.fullmatch(r"\s*(\|)?(?:Pre)?Depends: (\S+)", line)
        if current is None or match is None:
            continue  # another relation (Recommends...), or a provider of a virtual package
        if open_group:
            current[-1].append(match.group(2))
        else:
            current.append([match.group(2)])
        open_group = match.group(1) == "|"
    return result


def in_kit(package: str) -> bool:
    """The Debian packages the kit carries: the server and Erlang's; the rest the system has."""
    return package == SERVER_PACKAGE or package.startswith("erlang-")


def deb_closure(depends: Mapping[str, list[list[str]]], root: str = SERVER_PACKAGE) -> tuple[list[str], list[str]]:
    """(packages to carry, system packages assumed) from ``root`` through ``depends``.

    In each group of alternatives the first real (not virtual) package is taken, preferring
    one the kit carries; only packages the kit carries are followed further.
    """
    carried: list[str] = []
    assumed: set[str] = set()
    todo = [root]
    while todo:
        package = todo.pop(0)
        if package in carried:
            continue
        carried.append(package)
        for group in depends.get(package, []):
            real = [name.split(":")[0] for name in group if not name.startswith("<")]
            if not real:
                continue
            chosen = next((name for name in real if in_kit(name)), real[0])
            if in_kit(chosen):
                todo.append(chosen)
            else:
                assumed.add(chosen)
    return carried, sorted(assumed)


def deb_fields(file_name: str) -> tuple[str, str, str]:
    """(package, version, architecture) from a ``name_version_arch.deb`` name (apt quotes ``:``)."""
    stem = urllib.parse.unquote(file_name).removesuffix(".deb")
    parts = stem.split("_")
    if len(parts) != 3:
        raise KitError(f"{file_name} is not named package_version_arch.deb")
    return parts[0], parts[1], parts[2]


# -- manifest and report --------------------------------------------------------------


def manifest_of(
    *,
    python: str,
    glibc: str,
    extras: Sequence[str],
    wheels: Sequence[Wheel],
    debs: Sequence[Path],
    assumed_system: Sequence[str],
    env: Mapping[str, str],
) -> dict[str, Any]:
    """The kit's manifest: what it holds (versions, sizes), for which target, and what it assumes."""
    by_name = {w.name: w for w in wheels}
    warren = by_name.get("warren")
    if warren is None:
        raise KitError("the kit has no warren wheel")
    needed = reach(root_requirements(warren, extras, env), by_name, env)
    stray = sorted(set(by_name) - needed.packages - {"warren"})
    if stray:
        raise KitError(f"wheels nothing in the kit needs: {', '.join(stray)}")
    deb_rows: list[dict[str, Any]] = []
    for deb in debs:
        package, version, arch = deb_fields(deb.name)
        deb_rows.append(
            {"file": deb.name, "package": package, "version": version, "arch": arch, "bytes": deb.stat().st_size}
        )
    wheel_bytes = sum(w.size for w in wheels)
    deb_bytes = sum(int(row["bytes"]) for row in deb_rows)
    return {
        "kit": 1,
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": python,
        "implementation": "cp",
        "glibc": glibc,
        "platforms": platform_tags(glibc),
        "warren": {"version": warren.version, "extras": list(extras)},
        "wheels": [
            {"file": w.file, "name": w.name, "version": w.version, "bytes": w.size}
            for w in sorted(wheels, key=lambda w: w.name)
        ],
        "extras": extra_sizes(warren, extras, by_name, env),
        "assumed": [
            {
                "name": name,
                "requirement": ", ".join(sorted(s for s in specs if s)),
                "by": sorted(set().union(*specs.values())),
            }
            for name, specs in sorted(needed.assumed.items())
        ],
        "debs": sorted(deb_rows, key=lambda row: row["package"]),
        "assumed_system": list(assumed_system),
        "bytes": {"wheels": wheel_bytes, "debs": deb_bytes, "total": wheel_bytes + deb_bytes},
    }


def report(manifest: Mapping[str, Any], where: Path | str, biggest: int = 8) -> str:
    """What ``build`` prints: size, target, extras, the biggest items, what the target must have."""
    size = manifest["bytes"]
    lines = [
        f"kit {where}: {mib(size['total'])} (wheels {mib(size['wheels'])}, Debian packages {mib(size['debs'])})",
        f"for CPython {manifest['python']} on Linux x86_64 with glibc {manifest['glibc']} or newer;"
        f" warren {manifest['warren']['version']}",
    ]
    for extra, added in manifest["extras"].items():
        packages = ", ".join(added["packages"]) or "nothing more"
        lines.append(f"extra {extra}: +{mib(added['bytes'])} ({packages})")
    items = [(w["bytes"], f"{w['name']} {w['version']} (wheel)") for w in manifest["wheels"]]
    items += [(d["bytes"], f"{d['package']} {d['version']} (deb)") for d in manifest["debs"]]
    lines.append("biggest:")
    lines += [f"  {mib(size):>9}  {what}" for size, what in sorted(items, reverse=True)[:biggest]]
    if manifest["assumed"]:
        needs = [f"{a['name']} {a['requirement']}".strip() for a in manifest["assumed"]]
        lines.append("the target must already have (Python): " + ", ".join(needs))
    if manifest["assumed_system"]:
        lines.append(
            "left to the system (install checks the shared libraries Erlang needs): "
            + ", ".join(manifest["assumed_system"])
        )
    return "\n".join(lines)
