"""Finding plug-ins by name: warren's built-ins, then the entry points of installed packages.

A plug-in is a class that an installed distribution names as a Python entry point in
one of three groups (``warren.envs``, ``warren.models``, ``warren.algorithms``)::

    [project.entry-points."warren.algorithms"]
    reinforce = "my_rl.reinforce:Reinforce"

A process discovers its plug-ins once, at start, and imports every one it is allowed to
(``plugins``: distribution names, ``*`` for every installed one). From then on a message
can only *choose* among what is loaded: it names a plug-in and its version, never a
module, so no message ever makes a worker import anything. A name the process does not
have, or has at another version, is a :class:`MissingPlugin` naming both. Import
failures are kept and reported (in logs and ``warren check``), not raised: one broken
package does not take the worker down with it.

``env_packages`` are modules imported at start for their side effect of registering
gymnasium ids (``ale_py`` registers ``ALE/Pong-v5``...); gymnasium 1.x no longer finds
them by itself.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from messaging import ConfigurationError
from worker.errors import TaskError
from worker.plugins.contract import Algorithm, EnvPlugin, ModelPlugin
from worker.plugins.faults import PluginRef

logger = logging.getLogger(__name__)


class PluginKind(StrEnum):
    """The three kinds, named as in the entry point groups and the ``resource`` reply."""

    ENV = "env"
    MODEL = "model"
    ALGORITHM = "algorithm"

    @property
    def group(self) -> str:
        return f"warren.{self.value}s"


#: warren's own plug-ins, by kind and name: ``module:attribute``. They go through the same
#: contract as third-party ones (and the same loading, minus the entry point lookup, so a
#: source checkout that was never installed still has them).
BUILTINS: Final[Mapping[PluginKind, Mapping[str, str]]] = {
    PluginKind.ENV: {"gymnasium": "worker.envs.gymnasium:GymnasiumEnvs"},
    PluginKind.MODEL: {
        "mlp": "worker.models.mlp:MLP",
        "nature_cnn": "worker.models.nature_cnn:NatureCNN",
        "lstm": "worker.models.lstm:LSTM",
    },
    PluginKind.ALGORITHM: {
        "dqn": "worker.algorithms.dqn:DQN",
        "ppo": "worker.algorithms.ppo:PPO",
        "sac": "worker.algorithms.sac:SAC",
        "random": "worker.algorithms.random:RandomActions",
    },
}
#: The env plug-in of a task or job that names none: gymnasium's registry.
GYMNASIUM: Final = "gymnasium"
#: Env packages imported at start when installed (and ``env_packages`` is left as it is).
DEFAULT_ENV_PACKAGES: Final = "ale_py"
_BASES: Final = {PluginKind.ENV: EnvPlugin, PluginKind.MODEL: ModelPlugin, PluginKind.ALGORITHM: Algorithm}


class MissingPlugin(TaskError):
    """A plug-in this process does not have, or has at another version."""


@dataclass(frozen=True)
class LoadedPlugin:
    """One plug-in as imported: the class (algorithms) or an instance (envs, models)."""

    kind: PluginKind
    name: str
    version: str
    distribution: str
    obj: Any

    def describe(self) -> str:
        return f"{self.kind} plug-in {self.name!r} {self.version} (from {self.distribution})"

    def ref(self, env_id: str | None = None) -> PluginRef:
        """How a failure of this plug-in's code names it (``env_id``: the env an env plug-in made)."""
        module = self.obj.__module__ if isinstance(self.obj, type) else type(self.obj).__module__
        package = module.rpartition(".")[0] or module
        return PluginRef(self.kind.value, self.name, self.version, self.distribution, env_id, package)


@dataclass(frozen=True)
class PluginRegistry:
    """The plug-ins one process has; build it once with :meth:`discover`."""

    plugins: Mapping[PluginKind, Mapping[str, LoadedPlugin]]
    failures: tuple[str, ...] = ()
    """Plug-ins that could not be loaded, one sentence each."""
    env_packages: tuple[str, ...] = field(default=())
    """Env packages imported at start."""

    @classmethod
    def discover(cls, allow: str = "*", env_packages: str = DEFAULT_ENV_PACKAGES) -> PluginRegistry:
        """Import warren's built-ins and every allowed entry point, and the env packages.

        Args:
            allow: comma-separated distribution names whose entry points may be loaded
                (``*``: every installed distribution; warren's built-ins always are).
            env_packages: comma-separated modules to import for their gymnasium
                registrations; missing ones are skipped.
        """
        allowed = {name.strip().lower().replace("_", "-") for name in allow.split(",") if name.strip()}
        found: dict[PluginKind, dict[str, LoadedPlugin]] = {kind: {} for kind in PluginKind}
        failures: list[str] = []
        version = warren_version()
        for kind, builtins in BUILTINS.items():
            for name, target in builtins.items():
                _load(found, failures, kind, name, version, "warren", lambda target=target: _import(target))
        for kind in PluginKind:
            for entry in importlib.metadata.entry_points(group=kind.group):
                dist = entry.dist.name if entry.dist is not None else "(unknown)"
                if "*" not in allowed and dist.lower().replace("_", "-") not in allowed:
                    logger.info("not loading %s plug-in %r from %s: not in WARREN_PLUGINS", kind, entry.name, dist)
                    continue
                if entry.name in found[kind]:
                    failures.append(f"{kind} plug-in {entry.name!r} from {dist}: the name is taken by a built-in")
                    continue
                dist_version = entry.dist.version if entry.dist is not None else "0"
                _load(found, failures, kind, entry.name, dist_version, dist, entry.load)
        for failure in failures:
            logger.error("plug-in not loaded: %s", failure)
        return cls(plugins=found, failures=tuple(failures), env_packages=import_env_packages(env_packages))

    def get(self, kind: PluginKind, name: str, version: str | None = None) -> LoadedPlugin:
        """The plug-in of that kind and name, at that version if one is given.

        Raises:
            MissingPlugin: not here, or here at another version; the message names what is.
        """
        have = self.plugins[kind]
        plugin = have.get(name)
        if plugin is None:
            raise MissingPlugin(
                f"{kind} plug-in {name!r} is not installed here (have: {', '.join(sorted(have)) or 'none'})",
                {"plugin": {"kind": kind.value, "name": name, "version": version}, "have": None},
            )
        if version is not None and version != plugin.version:
            raise MissingPlugin(
                f"{kind} plug-in {name!r} is {plugin.version} here, the task wants {version}",
                {"plugin": {"kind": kind.value, "name": name, "version": version}, "have": plugin.version},
            )
        return plugin

    def inventory(self) -> dict[str, dict[str, str]]:
        """``{"envs": {name: version}, "models": {...}, "algorithms": {...}}``: the ``resource`` reply's ``plugins``."""
        return {
            f"{kind.value}s": {name: p.version for name, p in sorted(self.plugins[kind].items())} for kind in PluginKind
        }


def _load(  # noqa: PLR0917  (one private helper, called twice)
    found: dict[PluginKind, dict[str, LoadedPlugin]],
    failures: list[str],
    kind: PluginKind,
    name: str,
    version: str,
    dist: str,
    load: Any,
) -> None:
    where = f"{kind} plug-in {name!r} from {dist}"
    try:
        obj = load()
    except Exception as exc:  # a broken plug-in package must not take the process down
        failures.append(f"{where}: import failed: {type(exc).__name__}: {exc}")
        return
    base = _BASES[kind]
    if not (isinstance(obj, type) and issubclass(obj, base)):
        failures.append(f"{where}: {obj!r} is not a subclass of {base.__module__}.{base.__name__}")
        return
    if kind is not PluginKind.ALGORITHM:
        try:
            obj = obj()
        except Exception as exc:
            failures.append(f"{where}: cannot be instantiated: {type(exc).__name__}: {exc}")
            return
    found[kind][name] = LoadedPlugin(kind, name, version, dist, obj)


def _import(target: str) -> Any:
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def import_env_packages(names: str, *, strict: bool = False) -> tuple[str, ...]:
    """Import each installed module of ``names`` (comma-separated); returns the ones imported.

    A module that is not installed is skipped (``ale_py``, the default, is optional). One
    that is installed but fails to import is logged and skipped, so a collector keeps
    serving the other envs; with ``strict`` (a process about to check a job against the
    registrations) it is a :class:`ConfigurationError` naming the module instead.
    """
    imported = []
    for name in (part.strip() for part in names.split(",")):
        if not name:
            continue
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):  # "pkg.mod" whose "pkg" is missing, or a name that is no module's
            spec = None
        if spec is None:
            level = logging.WARNING if strict and name not in DEFAULT_ENV_PACKAGES.split(",") else logging.DEBUG
            logger.log(level, "env package %s is not installed here (WARREN_ENV_PACKAGES): skipped", name)
            continue
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            failure = f"env package {name} failed to import: {type(exc).__name__}: {exc} (from WARREN_ENV_PACKAGES)"
            if strict:
                raise ConfigurationError(failure) from exc
            logger.error("%s", failure)
            continue
        _register_gymnasium_envs(module)
        imported.append(name)
    return tuple(imported)


def _register_gymnasium_envs(module: Any) -> None:
    # gymnasium.register_envs(module) is the documented no-op that keeps linters from
    # dropping the import; the registrations ran when the module was imported.
    import gymnasium as gym

    gym.register_envs(module)


def warren_version() -> str:
    """The installed warren's version (built-in plug-ins carry it)."""
    try:
        return importlib.metadata.version("warren")
    except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
        return "0+source"


@functools.cache
def installed() -> PluginRegistry:
    """Every installed plug-in and the default env packages, discovered once per process.

    For the roles that read a job from the operator (``warren run``, the coordinator, the
    learner); a collector, which takes tasks from the wire, discovers with its own
    ``WARREN_PLUGINS`` allowlist instead.
    """
    return PluginRegistry.discover()


def describe_inventory(inventory: Mapping[str, Mapping[str, str]]) -> Iterable[str]:
    for kind, plugins in inventory.items():
        yield f"{kind}: " + ", ".join(f"{name} {version}" for name, version in plugins.items())
