"""The envs of a collector worker: one batch kept from collect task to collect task, a fresh one per eval.

Collect tasks reuse the worker's env batch while the env stays the same, so episodes go
on across tasks (a task's ``n_sample`` need not end on an episode's end). Eval tasks get
a fresh batch, closed when they end: every eval starts from the same episodes, so evals
compare. A task stuck in its envs, or failed in plug-in code, leaves the kept batch
behind: the next task gets new envs.
"""

from __future__ import annotations

import logging

from worker.collector.run import CollectorRun
from worker.plugins import EnvPlugin
from worker.plugins.binding import make_env_context
from worker.protocol import CollectorSpec
from worker.rl.envs import VecEnvBatch, worker_seed

logger = logging.getLogger(__name__)


class WorkerEnvs:
    """The env batch a worker keeps for its collect tasks (see the module docstring).

    Not thread-safe: the worker calls it under its own lock.

    Args:
        worker_id: seeds the kept batch apart from other workers' (:func:`~worker.rl.envs.worker_seed`).
        threads: the vector env's threads (``--env-threads``).
    """

    def __init__(self, worker_id: str, threads: int) -> None:
        self.worker_id = worker_id
        self.threads = threads
        self.kept: VecEnvBatch | None = None

    def for_task(self, spec: CollectorSpec, plugin: EnvPlugin) -> VecEnvBatch:
        """The envs of a task: a fresh batch for an eval, else the kept one (made anew if the env changed)."""
        env = spec.env
        threads = self.threads
        if spec.eval_flag:  # every eval starts from the same episodes, so evals compare
            ctx = make_env_context(env.id, env.env_num, kwargs=env.kwargs, seed=env.seed, threads=threads)
            return VecEnvBatch(plugin, ctx)
        seed = None if env.seed is None else worker_seed(env.seed, self.worker_id)
        ctx = make_env_context(env.id, env.env_num, kwargs=env.kwargs, seed=seed, threads=threads)
        envs = self.kept
        if envs is not None and (envs.ctx != ctx or envs.plugin is not plugin):
            envs.close()
            envs = self.kept = None
        if envs is None:
            envs = VecEnvBatch(plugin, ctx)
        self.kept = envs
        return envs

    def after(self, run: CollectorRun) -> None:
        """A task was closed: keep its envs for the next one only if it ended cleanly."""
        if run.stuck and self.kept is not None and self.kept is run.envs:
            # Its thread still steps these envs: the next task must not share them. They
            # are left to that thread (closing them under it could crash the process).
            logger.warning("task %s is stuck: the next task gets new envs", run.task_id)
            self.kept = None
        elif run.envs_suspect and self.kept is run.envs:
            # Plug-in code failed mid-task: the envs may be broken (an env that raised in
            # step fails every later step). The next task gets new ones.
            logger.warning("task %s failed in plug-in code: the next task gets new envs", run.task_id)
            self.kept = None
            try:
                run.envs.close()
            except Exception as exc:  # a broken env may fail to close too
                logger.warning("closing the envs of task %s: %s: %s", run.task_id, type(exc).__name__, exc)

    def close(self, run: CollectorRun | None) -> None:
        """The worker stops: close the kept envs, unless ``run`` (the task it ran last) is stuck in them."""
        if run is not None and run.stuck and run.envs is self.kept:
            logger.warning("task %s is stuck in its envs: leaving them to its thread", run.task_id)
        elif self.kept is not None:
            self.kept.close()
