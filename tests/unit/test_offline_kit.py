"""scripts/offline-kit: what goes into a kit, how big it says it is, and what install refuses.

Nothing here needs a package index: the resolution placeholders are checked with pip
against a folder, the Debian side against recorded ``apt-cache depends`` output and a
package built here with dpkg-deb. The whole round (build with the indexes, install with
``--no-index``, broker, warren run) is ``scripts/offline-kit selftest`` (docs/deploy.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from scripts.offline_kit.build import pip_failure, prepare_kit_dir
from scripts.offline_kit.contents import (
    Wheel,
    deb_closure,
    extra_sizes,
    installed_version,
    manifest_of,
    parse_apt_depends,
    read_wheel,
    report,
    stub_versions,
    write_stub_wheel,
)
from scripts.offline_kit.install import check_target, extract_deb, load_manifest, relocate_erlang
from scripts.offline_kit.kit import (
    SERVER_PACKAGE,
    KitError,
    parse_without,
    platform_tags,
    python_version,
    target_environment,
    telling_line,
)
from scripts.rabbit_node import STANDALONE_MARKER, Ports, standalone_layout

MIB = 1024 * 1024
ENV = target_environment("3.12")


def _wheel(folder: Path, name: str, version: str, requires: list[str], size: int, *extras: str) -> Wheel:
    """A wheel file of ``size`` bytes with this metadata (its payload: incompressible padding)."""
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    lines = [f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}"]
    lines += [f"Provides-Extra: {e}" for e in extras] + [f"Requires-Dist: {r}" for r in requires]
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", "\n".join(lines) + "\n")
        archive.writestr("padding.bin", os.urandom(size))
    return read_wheel(path)


@pytest.fixture
def wheels(tmp_path: Path) -> dict[str, Wheel]:
    """A small kit's wheels: warren with two extras, and what they pull in (torch, numpy left out)."""
    made = [
        _wheel(
            tmp_path,
            "warren",
            "0.1.0",
            [
                "pika>=1.3,<2",
                "torch>=2.2",
                "numpy>=1.24",
                "gymnasium>=1.0",
                'ale-py>=0.9; extra == "atari"',
                'lz4>=4; extra == "atari"',
                'gymnasium[mujoco]>=1.0; extra == "mujoco"',
            ],
            10_000,
            "atari",
            "mujoco",
        ),
        _wheel(tmp_path, "pika", "1.4.4", [], 20_000),
        _wheel(
            tmp_path,
            "gymnasium",
            "1.4.0",
            [
                "numpy>=1.21.0",
                "cloudpickle>=1.2.0",
                'typing-extensions>=4.3.0; python_version < "3.11"',
                'mujoco>=2.1.5; extra == "mujoco"',
            ],
            30_000,
            "mujoco",
        ),
        _wheel(tmp_path, "cloudpickle", "3.1.3", [], 5_000),
        _wheel(tmp_path, "ale-py", "0.12.1", ["numpy>1.20"], 3 * MIB),
        _wheel(tmp_path, "lz4", "4.4.5", [], MIB),
        _wheel(tmp_path, "mujoco", "4.0.1", ["numpy"], 2 * MIB),
    ]
    return {w.name: w for w in made}


def test_the_resolution_placeholders_are_wheels_pip_takes_for_the_package_they_stand_for(tmp_path: Path) -> None:
    # Given a placeholder for torch at the target's version, and a constraint pinning it
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    write_stub_wheel(stubs, "torch", "2.11.0")
    (tmp_path / "c.txt").write_text("torch==2.11.0+kitstub\n")
    # When pip resolves a requirement on torch from that folder alone
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--find-links", str(stubs)),
            *("--constraint", str(tmp_path / "c.txt"), "--target", str(tmp_path / "t"), "--report", "-", "-q"),
            *("--disable-pip-version-check", "torch>=2.2"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    # Then it settles on the placeholder, which pulls in nothing
    installs = json.loads(done.stdout)["install"]
    assert [(i["metadata"]["name"], i["metadata"]["version"]) for i in installs] == [("torch", "2.11.0+kitstub")]


def test_a_left_out_package_stands_at_the_version_given_or_the_one_installed_here() -> None:
    assert stub_versions({"torch": "2.11.0"}) == {"torch": "2.11.0"}
    assert stub_versions({"pytest": None})["pytest"] == installed_version("pytest")
    with pytest.raises(KitError, match=r"--without no-such-dist-xyz==VERSION"):
        stub_versions({"no-such-dist-xyz": None})
    assert parse_without(["Prometheus_Client", " torch==2.11.0 "]) == {
        "prometheus-client": None,
        "torch": "2.11.0",
    }
    with pytest.raises(KitError, match="NAME==VERSION"):
        parse_without(["torch=="])


def test_the_wheels_are_for_the_target_glibc_and_older_manylinux_tags() -> None:
    tags = platform_tags("2.28")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert "manylinux_2_29_x86_64" not in tags
    assert "manylinux2014_x86_64" not in platform_tags("2.12")
    with pytest.raises(KitError, match="--glibc"):
        platform_tags("2.x")
    assert python_version("3.12.3") == python_version("312") == "3.12"
    with pytest.raises(KitError, match="--python"):
        python_version("2.7")


def test_each_extra_is_sized_by_the_wheels_only_it_brings(wheels: dict[str, Wheel]) -> None:
    sizes = extra_sizes(wheels["warren"], ["atari", "mujoco"], wheels, ENV)
    # ale-py and lz4 come with atari alone; mujoco comes through gymnasium's own extra
    assert sizes["atari"] == {"bytes": wheels["ale-py"].size + wheels["lz4"].size, "packages": ["ale-py", "lz4"]}
    assert sizes["mujoco"] == {"bytes": wheels["mujoco"].size, "packages": ["mujoco"]}


def test_the_manifest_names_what_the_target_must_have_and_refuses_wheels_nothing_needs(
    wheels: dict[str, Wheel], tmp_path: Path
) -> None:
    kept = [w for w in wheels.values() if w.name != "mujoco"]
    manifest = manifest_of(
        python="3.12", glibc="2.28", extras=["atari"], wheels=kept, debs=[], assumed_system=["libc6"], env=ENV
    )
    assumed = {a["name"]: a for a in manifest["assumed"]}
    # Then torch and numpy are assumed, with every requirement the kit's packages put on them
    assert assumed["torch"] == {"name": "torch", "requirement": ">=2.2", "by": ["warren"]}
    assert assumed["numpy"]["requirement"] == ">1.20, >=1.21.0, >=1.24"
    assert assumed["numpy"]["by"] == ["ale-py", "gymnasium", "warren"]
    # and typing-extensions is not needed on 3.12 (its marker is false there)
    assert "typing-extensions" not in assumed
    assert manifest["bytes"]["total"] == sum(w.size for w in kept)
    # A wheel no requirement reaches (mujoco without its extra) is a broken kit
    with pytest.raises(KitError, match="wheels nothing in the kit needs: mujoco"):
        manifest_of(
            python="3.12",
            glibc="2.28",
            extras=["atari"],
            wheels=list(wheels.values()),
            debs=[],
            assumed_system=[],
            env=ENV,
        )


def test_the_report_says_the_total_the_biggest_items_first_and_what_the_target_must_have(
    wheels: dict[str, Wheel], tmp_path: Path
) -> None:
    debs = tmp_path / "debs"
    debs.mkdir()
    (debs / "erlang-base_1%3a25.2.3+dfsg-1+deb12u4_amd64.deb").write_bytes(b"x" * (9 * MIB))
    (debs / f"{SERVER_PACKAGE}_3.10.8-1.1+deb12u1_all.deb").write_bytes(b"x" * (14 * MIB))
    kept = [w for w in wheels.values() if w.name != "mujoco"]
    manifest = manifest_of(
        python="3.12",
        glibc="2.28",
        extras=["atari"],
        wheels=kept,
        debs=sorted(debs.iterdir()),
        assumed_system=["libc6", "libssl3"],
        env=ENV,
    )
    assert manifest["debs"][0]["version"] == "1:25.2.3+dfsg-1+deb12u4"  # apt's %3a is the epoch's colon
    text = report(manifest, "KIT", biggest=3).splitlines()
    total = sum(w.size for w in kept) + 23 * MIB
    assert (
        text[0]
        == f"kit KIT: {total / MIB:.1f} MiB (wheels {(total - 23 * MIB) / MIB:.1f} MiB, Debian packages 23.0 MiB)"
    )
    assert "CPython 3.12" in text[1] and "glibc 2.28" in text[1]
    assert text[2] == "extra atari: +4.0 MiB (ale-py, lz4)"
    biggest = text[text.index("biggest:") + 1 :][:3]
    assert [line.split()[2] for line in biggest] == [SERVER_PACKAGE, "erlang-base", "ale-py"]
    assert text[-2].startswith("the target must already have (Python): ") and "torch >=2.2" in text[-2]
    assert text[-1].startswith("left to the system") and text[-1].endswith(": libc6, libssl3")


def test_the_broker_packages_are_the_server_and_the_erlang_it_depends_on_nothing_else() -> None:
    # Given apt-cache depends output: alternatives, a virtual package with its provider, system packages
    depends = parse_apt_depends(
        f"{SERVER_PACKAGE}\n"
        "  Depends: adduser\n"
        " |Depends: erlang-base\n"
        "  Depends: <erlang-base-hipe>\n"
        "  Depends: erlang-ssl\n"
        "  Depends: lsb-base\n"
        "    sysvinit-utils\n"
        "  Depends: <python3:any>\n"
        "    python3\n"
        "  Recommends: erlang-doc\n"
        "erlang-base\n"
        "  PreDepends: libc6\n"
        "  Depends: libssl3\n"
        "erlang-ssl\n"
        "  Depends: erlang-crypto\n"
        "erlang-crypto\n"
        "  Depends: libc6\n"
    )
    assert depends[SERVER_PACKAGE][1] == ["erlang-base", "<erlang-base-hipe>"]
    carried, assumed = deb_closure(depends)
    # Then the kit carries the server and the Erlang packages it reaches, and assumes the rest
    assert carried == [SERVER_PACKAGE, "erlang-base", "erlang-ssl", "erlang-crypto"]
    assert assumed == ["adduser", "libc6", "libssl3", "lsb-base"]


def test_a_missing_wheel_or_an_unreachable_index_is_one_line_naming_it() -> None:
    missing = (
        "ERROR: Could not find a version that satisfies the requirement ale-py>=0.9 (from versions: none)\n"
        'ERROR: No matching distribution found for ale-py>=0.9; extra == "atari"\n'
    )
    assert pip_failure(missing, "3.14", "2.28").startswith(
        "no wheel of ale-py >=0.9 for CPython 3.14 on manylinux x86_64 with glibc <= 2.28 ("
    )
    offline = (
        "WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection"
        " broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object>: Failed to"
        " establish a new connection: [Errno -3] Temporary failure in name resolution')': /simple/pika/\n"
        "ERROR: No matching distribution found for pika\n"
    )
    assert pip_failure(offline, "3.12", "2.28") == (
        "the package index is unreachable ([Errno -3] Temporary failure in name resolution);"
        " pip config list shows the index pip uses"
    )
    assert telling_line("Reading package lists...\nE: Unable to locate package erlang-nope\n") == (
        "E: Unable to locate package erlang-nope"
    )


def test_install_refuses_a_kit_for_another_python_or_a_target_without_what_the_kit_leaves_out() -> None:
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    with pytest.raises(KitError, match=rf"the kit is for Python 3\.0, .* is {here}: build one with --python {here}"):
        check_target({"python": "3.0", "assumed": []}, sys.executable)
    lacking = [{"name": "no-such-dist-xyz", "requirement": ">=1"}, {"name": "pytest", "requirement": ""}]
    with pytest.raises(KitError, match=r"lacks no-such-dist-xyz, which the kit leaves out"):
        check_target({"python": here, "assumed": lacking}, sys.executable)
    too_new = [{"name": "pytest", "requirement": "<1"}]
    with pytest.raises(KitError, match=r"has pytest \S+ \(the kit needs <1\)"):
        check_target({"python": here, "assumed": too_new}, sys.executable)
    check_target({"python": here, "assumed": [{"name": "pytest", "requirement": ">=1"}]}, sys.executable)


def test_a_directory_that_holds_something_else_is_never_turned_into_a_kit(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(KitError, match="is not empty and holds no kit"):
        prepare_kit_dir(tmp_path)
    with pytest.raises(KitError, match="is not a kit"):
        load_manifest(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"
    # while a failed build's directory (wheels, no manifest yet) is built again, from scratch
    failed = tmp_path / "kit"
    (failed / "wheels").mkdir(parents=True)
    (failed / "wheels" / "old.whl").write_bytes(b"")
    prepare_kit_dir(failed)
    assert list((failed / "wheels").iterdir()) == [] and (failed / "debs").is_dir()


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb builds the test package")
@pytest.mark.parametrize("with_dpkg", [True, False], ids=["dpkg", "plain-python"])
def test_an_unpacked_erlang_is_pointed_at_its_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_dpkg: bool
) -> None:
    # Given a Debian package laid out like erlang-base: a start script naming /usr/lib/erlang, a link
    tree = tmp_path / "tree"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN/control").write_text(
        "Package: erlang-fake\nVersion: 1\nArchitecture: all\nMaintainer: t <t@t>\nDescription: t\n"
    )
    bin_dir = tree / "usr/lib/erlang/bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "erl").write_text(
        '#!/bin/sh\nif [ -z "$X" ]\nthen\n    ROOTDIR=/usr/lib/erlang\nfi\nexec "$ROOTDIR/x"\n'
    )
    (tree / "usr/bin").mkdir()
    (tree / "usr/bin/erl").symlink_to("../lib/erlang/bin/erl")
    deb = tmp_path / "erlang-fake_1_all.deb"
    subprocess.run(
        ["dpkg-deb", "-Zxz", "--root-owner-group", "-b", str(tree), str(deb)], check=True, capture_output=True
    )
    if not with_dpkg:
        real_which = shutil.which
        monkeypatch.setattr(shutil, "which", lambda name: None if name == "dpkg-deb" else real_which(name))
    # When it is unpacked under a prefix and relocated
    prefix = tmp_path / "prefix"
    extract_deb(deb, prefix)
    root = relocate_erlang(prefix)
    # Then the script's root is the prefix's copy, the link still leads to it, nothing else changed
    script = (prefix / "usr/bin/erl").read_text()
    assert f'    ROOTDIR="{root}"\n' in script and "/usr/lib/erlang\n" not in script
    assert script.startswith('#!/bin/sh\nif [ -z "$X" ]') and script.endswith('exec "$ROOTDIR/x"\n')


def test_a_standalone_node_keeps_its_files_cookie_and_port_mapper_to_itself(tmp_path: Path) -> None:
    layout = standalone_layout(
        tmp_path / "prefix", tmp_path / "data", "warren", Ports(21001, 21002, 21003, 21004), 21005
    )
    env = layout.server_env()
    data = (tmp_path / "data").resolve()
    assert env["ERL_EPMD_PORT"] == "21005" and layout.cli_env()["ERL_EPMD_PORT"] == "21005"
    assert env["HOME"] == str(data / "home") and env[STANDALONE_MARKER] == str(data)
    assert env["RABBITMQ_NODENAME"] == "warren@localhost" and env["RABBITMQ_NODE_PORT"] == "21001"
    for key, value in env.items():
        if key.endswith(("_FILE", "_BASE", "_FILES")):
            assert Path(value).is_relative_to(data), key
        assert "/etc/rabbitmq" not in value, key
    assert layout.amqp_url == "amqp://guest:guest@127.0.0.1:21001/%2F"
