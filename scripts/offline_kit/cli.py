"""The command line of ``offline-kit``, and ``selftest``: the whole round on this machine."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from .build import build, repo_root
from .contents import packaging_requirements
from .install import broker_command, install
from .kit import (
    BROKER_DATA,
    DEFAULT_EXTRAS,
    DEFAULT_GLIBC,
    DEFAULT_PREFIX,
    DEFAULT_WITHOUT,
    DESCRIPTION,
    KitError,
    canonical,
    parse_without,
    python_version,
    run_tool,
    target_environment,
    telling_line,
)

# -- selftest -----------------------------------------------------------------------


def assumed_site(names: Iterable[str], folder: Path) -> Path:
    """A folder of links to this Python's installs of ``names`` and all they need.

    A scratch virtualenv that sees it (a .pth file) has what a GPU machine has (torch,
    numpy...) and nothing else of warren's dependencies: those must come from the kit.
    """
    requirements = packaging_requirements()
    env = {k: v for k, v in target_environment(f"{sys.version_info[0]}.{sys.version_info[1]}").items()}
    folder.mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()
    todo = [canonical(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for text in dist.requires or []:
            requirement = requirements.Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({**env, "extra": ""}):
                todo.append(canonical(requirement.name))
        site = Path(str(dist.locate_file("")))
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            link = folder / top
            if not link.exists() and (site / top).exists() and top != "bin":
                link.symlink_to(site / top)
    return folder


def selftest(keep: Path | None, extras: Sequence[str]) -> None:
    """Build, install into a scratch venv without an index, start the broker, run warren, stop."""
    timings: dict[str, float] = {}
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    with tempfile.TemporaryDirectory(prefix="offline-kit-selftest-") as tmp_text:
        tmp = Path(tmp_text)
        kit = keep or tmp / "kit"
        mark = time.monotonic()
        manifest = build(kit, python=python, extras=extras, without=parse_without(DEFAULT_WITHOUT), glibc=DEFAULT_GLIBC)
        timings["build"] = time.monotonic() - mark
        mark = time.monotonic()
        venv = tmp / "venv"
        run_tool([sys.executable, "-m", "venv", str(venv)], "making a scratch virtualenv")
        vpython = str(venv / "bin/python")
        # The venv's own old setuptools would hide the linked one that torch needs.
        run_tool([vpython, "-m", "pip", "uninstall", "-q", "-y", "setuptools"], "scratch virtualenv")
        site = Path(
            run_tool([vpython, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], "venv").strip()
        )
        linked = assumed_site([a["name"] for a in manifest["assumed"]], tmp / "assumed")
        (site / "assumed-by-the-kit.pth").write_text(f"{linked}\n")
        timings["venv"] = time.monotonic() - mark
        mark = time.monotonic()
        prefix = install(kit, python_exe=vpython)
        timings["install"] = time.monotonic() - mark
        if prefix is None:
            raise KitError("the kit has no broker")
        if "atari" in extras:  # the ROMs come in ale-py's wheel: nothing to fetch at run time
            pong = (
                "import ale_py, gymnasium; gymnasium.register_envs(ale_py); gymnasium.make('ALE/Pong-v5').reset(seed=0)"
            )
            run_tool([vpython, "-c", pong], "making ALE/Pong-v5 in the scratch virtualenv")
        data = tmp / "broker"
        mark = time.monotonic()
        if broker_command("start", kit, data) != 0:
            raise KitError("start-broker failed (its output is above)")
        timings["broker start"] = time.monotonic() - mark
        try:
            env_file = dict(line.split("=", 1) for line in (data / "broker.env").read_text().splitlines() if line)
            vm = int((data / "rabbit.pid").read_text())
            exe = os.readlink(f"/proc/{vm}/exe")
            if not exe.startswith(str(prefix)):
                raise KitError(f"the broker's VM runs {exe}, not the kit's Erlang under {prefix}")
            # Every file it maps and every path on its command line (code paths, plugins) is the kit's.
            used = {line.split()[-1] for line in Path(f"/proc/{vm}/maps").read_text().splitlines()}
            used |= set(Path(f"/proc/{vm}/cmdline").read_bytes().decode(errors="replace").split("\0"))
            system = sorted(p for p in used if p.startswith(("/usr/lib/erlang", "/usr/lib/rabbitmq", "/etc/rabbitmq")))
            if system:
                raise KitError(f"the broker's VM uses the system's {system[0]}, not the kit's files")
            mark = time.monotonic()
            run_env = {**os.environ, **env_file, "PATH": f"{venv / 'bin'}:{os.environ['PATH']}"}
            run_env.pop("PYTHONPATH", None)
            argv = [str(venv / "bin/warren"), "run", "--collectors", "1", "--progress", "log"]
            argv += ["--max-env-steps", "3000", "--workdir", str(tmp / "run"), "--prefix", "offline-kit-selftest"]
            done = subprocess.run(argv, env=run_env, cwd=tmp, capture_output=True, text=True, timeout=600, check=False)
            timings["warren run"] = time.monotonic() - mark
            if done.returncode not in (0, 3):  # the stop value, or the step budget
                raise KitError(
                    f"warren run against the kit's broker exited {done.returncode}: {telling_line(done.stderr)}"
                )
            print(f"warren run against {env_file['WARREN_AMQP_URL']}: exit {done.returncode}")
        finally:
            mark = time.monotonic()
            broker_command("stop", kit, data)
            timings["broker stop"] = time.monotonic() - mark
    print("selftest passed: " + ", ".join(f"{what} {seconds:.0f} s" for what, seconds in timings.items()))


# -- command line -------------------------------------------------------------------


def _names(text: str) -> list[str]:
    return [item for item in text.split(",") if item.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="offline-kit", description=DESCRIPTION)
    verbs = parser.add_subparsers(dest="verb", required=True)
    this_python = f"{sys.version_info[0]}.{sys.version_info[1]}"

    build_p = verbs.add_parser("build", help="make a kit (needs the package indexes)")
    build_p.add_argument(
        "dir",
        type=Path,
        nargs="?",
        default=repo_root() / "offline-kit",
        help="the kit (default: offline-kit/ in the repo)",
    )
    build_p.add_argument("--python", default=this_python, help="the target's CPython version (default: %(default)s)")
    build_p.add_argument(
        "--extras",
        default=",".join(DEFAULT_EXTRAS),
        help="warren's extras to include, comma-separated (default: %(default)s; '' for none)",
    )
    build_p.add_argument(
        "--without",
        default=",".join(DEFAULT_WITHOUT),
        help="what the target has, left out: NAME or NAME==VERSION, comma-separated (default: %(default)s)",
    )
    build_p.add_argument("--glibc", default=DEFAULT_GLIBC, help="the target's glibc, at least (default: %(default)s)")
    build_p.add_argument("--no-broker", action="store_true", help="leave RabbitMQ and Erlang out")

    install_p = verbs.add_parser("install", help="install a kit here (no index needed)")
    install_p.add_argument("dir", type=Path)
    install_p.add_argument("--prefix", type=Path, help=f"where the Debian packages go (default: DIR/{DEFAULT_PREFIX})")
    install_p.add_argument("--target", type=Path, help="install the wheels into this folder (pip --target) instead")
    install_p.add_argument(
        "--python-exe", default=sys.executable, help="the Python to install into (default: this one)"
    )

    for verb, what in (("start-broker", "start the kit's RabbitMQ"), ("stop-broker", "stop it")):
        broker_p = verbs.add_parser(verb, help=what)
        broker_p.add_argument("place", type=Path, metavar="DIR|PREFIX")
        broker_p.add_argument("--data", type=Path, help=f"the broker's directory (default: PREFIX/{BROKER_DATA})")
        if verb == "start-broker":
            broker_p.add_argument("--amqp-port", type=int, help="AMQP port (default: a free one; the last one if free)")

    selftest_p = verbs.add_parser("selftest", help="build, install in a scratch venv, start the broker, run warren")
    selftest_p.add_argument("--keep", type=Path, help="build the kit here (kept) instead of a temporary directory")
    selftest_p.add_argument("--extras", default=",".join(DEFAULT_EXTRAS))

    args = parser.parse_args(argv)
    try:
        if args.verb == "build":
            build(
                args.dir,
                python=python_version(args.python),
                extras=_names(args.extras),
                without=parse_without(_names(args.without)),
                glibc=args.glibc,
                broker=not args.no_broker,
            )
        elif args.verb == "install":
            install(args.dir, prefix=args.prefix, target=args.target, python_exe=args.python_exe)
        elif args.verb in ("start-broker", "stop-broker"):
            extra = ["--amqp-port", str(args.amqp_port)] if getattr(args, "amqp_port", None) else []
            return broker_command(args.verb.removesuffix("-broker"), args.place, args.data, extra)
        else:
            selftest(args.keep, _names(args.extras))
    except KitError as exc:
        print(f"offline-kit: {exc}", file=sys.stderr)
        return 1
    return 0
