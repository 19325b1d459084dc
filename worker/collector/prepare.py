"""A start task on this worker: its algorithm and envs, or the refusal that says why it cannot run it.

A worker refuses what it cannot run before it takes the task (``missing plugin``: it lacks
a plug-in or the version named; ``unsupported env``: the env's spaces are not the task's,
or not ones warren carries; ``bad collector_cfg``: the algorithm refuses its settings), so
the coordinator can send the task to a worker that can, or end a run nobody can run.
"""

from __future__ import annotations

from worker.collector.envs import WorkerEnvs
from worker.errors import TaskError
from worker.lifecycle import limit_torch_threads
from worker.plugins import Algorithm, MissingPlugin, PluginRegistry, Spaces, UnsupportedSpace
from worker.plugins.binding import build_algorithm, env_plugin, task_plugins
from worker.plugins.faults import TaskPlugins
from worker.protocol import CollectorSpec, PolicySpec, Refusal
from worker.rl.envs import VecEnvBatch


def prepare_task(
    registry: PluginRegistry, envs: WorkerEnvs, spec: CollectorSpec, worker: str
) -> tuple[Algorithm, VecEnvBatch]:
    """The task's algorithm and env batch, or the refusal that says why this worker cannot run it.

    Collect tasks reuse the worker's env batch while the env stays the same (episodes
    continue across tasks); eval tasks get a fresh one, closed when they end.
    """
    try:
        plugin = env_plugin(registry, spec.env.plugin, spec.env.plugin_version)
        batch = envs.for_task(spec, plugin)
        try:
            algorithm = bind_algorithm(registry, spec, batch.spaces, worker)
        except BaseException:
            if spec.eval_flag:
                batch.close()
            raise
    except MissingPlugin as exc:
        message = f"worker {worker}: {exc.message}"
        raise Refusal.MISSING_PLUGIN.error(message, worker_id=worker, **exc.result) from None
    except UnsupportedSpace as exc:
        raise Refusal.UNSUPPORTED_ENV.error(exc.message) from None
    if algorithm.kind != "none" and algorithm.weights_format == "torch":
        # Its actor runs torch: capped before it is built, so that it leaves the learner the cores.
        limit_torch_threads(1)
    return algorithm, batch


def bind_algorithm(registry: PluginRegistry, spec: CollectorSpec, env_spaces: Spaces, worker: str) -> Algorithm:
    """The task's algorithm on this worker's plug-ins, for the env's spaces, or the refusal that says why not."""
    if spec.spaces is not None and spec.spaces.digest != env_spaces.digest:
        raise Refusal.UNSUPPORTED_ENV.error(
            f"env {spec.env.id!r} on worker {worker} has {env_spaces.describe()}; the task's "
            f"spaces are {spec.spaces.describe()} (another version of the env?)"
        )
    policy = spec.policy
    try:
        algorithm = build_policy(registry, spec.spaces or env_spaces, policy)
        algorithm.check_collect_settings(spec.collect_setting)
    except (MissingPlugin, UnsupportedSpace):
        raise
    except TaskError as exc:
        raise Refusal.BAD_COLLECTOR_CFG.error(exc.message) from None
    if algorithm.kind != "none" and spec.policy_update_path is None:
        raise Refusal.BAD_COLLECTOR_CFG.error(
            f"collector_cfg.policy_update_path is missing (algorithm {policy.type!r} acts with learned weights)"
        )
    return algorithm


def build_policy(registry: PluginRegistry, spaces: Spaces, policy: PolicySpec) -> Algorithm:
    """The algorithm a task's (or a job's) ``policy`` names, on its model, for ``spaces``.

    Raises:
        MissingPlugin, UnsupportedSpace, TaskError: as :func:`~worker.plugins.binding.build_algorithm`.
    """
    return build_algorithm(
        registry,
        spaces,
        algorithm=policy.type,
        algorithm_version=policy.version,
        config=policy.config,
        model=policy.model,
        model_version=policy.model_version,
        model_config=policy.model_config,
    )


def task_plugins_of(registry: PluginRegistry, spec: CollectorSpec) -> TaskPlugins:
    """The task's plug-ins as this worker has them: what its failures name."""
    env, policy = spec.env, spec.policy
    return task_plugins(
        registry,
        env=env.plugin,
        env_version=env.plugin_version,
        env_id=env.id,
        algorithm=policy.type,
        algorithm_version=policy.version,
        model=policy.model,
        model_version=policy.model_version,
    )
