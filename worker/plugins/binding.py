"""From names and plain data to working objects: an env plug-in and its context, an algorithm and its model.

The same steps run wherever a job or a task is turned into code, so the coordinator, the
learner, ``warren check`` and every collector accept and refuse the same things, with
the same words: which plug-in, which key, which space.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from worker.errors import TaskError
from worker.plugins.contract import Algorithm, EnvContext, EnvPlugin, Model, config_from_dict
from worker.plugins.faults import PluginRef, TaskPlugins
from worker.plugins.registry import GYMNASIUM, MissingPlugin, PluginKind, PluginRegistry
from worker.plugins.spaces import Spaces, UnsupportedSpace, describe_space


def env_plugin(registry: PluginRegistry, plugin: str | None, version: str | None = None) -> EnvPlugin:
    """The env plug-in a job or task names (gymnasium's registry when it names none).

    Raises:
        MissingPlugin: not here, or at another version.
    """
    found: EnvPlugin = registry.get(PluginKind.ENV, plugin or GYMNASIUM, version).obj
    return found


def make_env_context(
    env_id: str, num_envs: int, *, kwargs: Mapping[str, Any] | None = None, seed: int | None = None, threads: int = 1
) -> EnvContext:
    return EnvContext(env_id=env_id, num_envs=num_envs, kwargs=dict(kwargs or {}), seed=seed, threads=threads)


def build_algorithm(
    registry: PluginRegistry,
    spaces: Spaces,
    *,
    algorithm: str,
    algorithm_version: str | None = None,
    config: Mapping[str, Any] | None = None,
    model: str | None = None,
    model_version: str | None = None,
    model_config: Mapping[str, Any] | None = None,
) -> Algorithm:
    """The named algorithm, configured, on the named model, for these spaces.

    Raises:
        MissingPlugin: the algorithm or the model is not here (or at another version).
        UnsupportedSpace: the algorithm or the model cannot use these spaces; the message
            names both.
        TaskError: a config key is unknown or a value is wrong, or the model keeps a recurrent state the
            algorithm cannot use; the message names it.
    """
    found = registry.get(PluginKind.ALGORITHM, algorithm, algorithm_version)
    cls: type[Algorithm] = found.obj
    try:
        cls.check_spaces(spaces)
    except UnsupportedSpace as exc:
        raise UnsupportedSpace(f"algorithm {algorithm!r} cannot run this env: {exc.message}") from None
    algo_config = config_from_dict(cls.Config, config, "algorithm")
    model_name = model or cls.default_model
    model_plugin = registry.get(PluginKind.MODEL, model_name, model_version)
    settings = dict(model_config or {})
    if model_name == cls.default_model:
        settings = {**cls.default_model_config, **settings}
    model_config = config_from_dict(model_plugin.obj.Config, settings, "model")
    bound = Model(model_plugin.obj, model_config, model_name, ref=model_plugin.ref())
    try:
        bound.plugin.check_space(spaces.observation, bound.config)
    except UnsupportedSpace as exc:
        raise UnsupportedSpace(
            f"model {model_name!r} cannot take observations {describe_space(spaces.observation)}: {exc.message}"
        ) from None
    memory = bound.state_shapes(spaces.observation)
    if memory and not cls.recurrent_models:
        raise TaskError(
            f"algorithm {algorithm!r} cannot use model {model_name!r}: the model keeps a recurrent state "
            f"({', '.join(memory)}) and {algorithm!r} takes feed-forward models only; the built-in 'ppo' takes "
            "recurrent ones"
        )
    try:
        return cls(algo_config, spaces, bound)
    except (TaskError, ValueError, TypeError) as exc:
        raise TaskError(f"algorithm {algorithm!r}: {getattr(exc, 'message', exc)}") from None


def task_plugins(
    registry: PluginRegistry,
    *,
    env: str | None,
    env_version: str | None,
    env_id: str,
    algorithm: str,
    algorithm_version: str | None,
    model: str | None,
    model_version: str | None,
) -> TaskPlugins:
    """The plug-ins a task or a job names, as this process has them (a name it lacks keeps what the task says)."""

    def ref(kind: PluginKind, name: str, version: str | None, env_id: str | None = None) -> PluginRef:
        try:
            return registry.get(kind, name, version).ref(env_id)
        except MissingPlugin:
            return PluginRef(kind.value, name, version or "?", env_id=env_id)

    algorithm_ref = ref(PluginKind.ALGORITHM, algorithm, algorithm_version)
    model_name = model
    if model_name is None:
        try:
            model_name = registry.get(PluginKind.ALGORITHM, algorithm).obj.default_model
        except MissingPlugin:
            model_name = None
    return TaskPlugins(
        env=ref(PluginKind.ENV, env or GYMNASIUM, env_version, env_id),
        algorithm=algorithm_ref,
        model=ref(PluginKind.MODEL, model_name, model_version) if model_name else None,
    )
