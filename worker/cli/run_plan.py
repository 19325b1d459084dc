"""What ``warren run`` is made of, decided before anything starts: the plan of a run.

Its own prefix and workdir (:mod:`worker.cli.named_run`), the job, the coordinator's
settings, how many collectors, the children's environment and ``/metrics`` ports, and
whether the workdir may be used. :mod:`worker.cli.run` then carries the plan out.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from messaging import ConfigurationError, Settings
from messaging.settings import to_env
from worker.cli.flags import ENV_FLAGS, env_variable, flag_values, job_config
from worker.cli.named_run import RUNS_DIR, RunIdentity, run_identity
from worker.cli.run_dir import RunState, describe_runs, read_record, state_of
from worker.config import CoordinatorConfig, cpu_budget, import_env_packages_of, role_config
from worker.devices import run_device_refusal
from worker.job import JobConfig

#: Collector processes unless ``--collectors`` or ``WARREN_COLLECTORS`` say otherwise.
DEFAULT_COLLECTORS = 2
#: Variables ``warren run`` sets itself for its processes, and why (a value given is ignored, with a warning).
RUN_SETS = {
    "WARREN_PATH_DATA": "the run's own <workdir>/data",
    "WARREN_PATH_POLICY": "the run's own <workdir>/policy",
    "WARREN_RUN_LOG": "the run's own <workdir>/run.jsonl",
    "WARREN_WORKER_ID": "its collectors are c0, c1...",
    "WARREN_COLLECT_TASKS": "one collect task per collector (per listening collector with --name)",
}
#: The run directory's sub-directory of TensorBoard event files (one per role inside).
TENSORBOARD_DIR = "tensorboard"


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """Everything a run is made of, decided before anything starts."""

    config: CoordinatorConfig
    """The coordinator's settings: the run's own prefix and run log, the job."""
    identity: RunIdentity
    collectors: int
    children_env: dict[str, str]
    """The environment of the learner and the collectors (see :func:`child_env`)."""
    ignored: dict[str, str]
    """Variables of :data:`RUN_SETS` that were set, and why the run sets them itself."""
    resume: bool = False
    """Continue the run of the workdir (``--resume``): its counters, policy and logs."""

    @property
    def job(self) -> JobConfig:
        return self.config.job

    @property
    def base_prefix(self) -> str:
        """The prefix the run's own is made from (``WARREN_PREFIX``, ``--prefix``)."""
        return self.config.transport.prefix.removesuffix("-" + self.identity.run_id)


def plan_run(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> RunPlan:
    """The run ``args`` ask for, with ``WARREN_*`` variables read as every role reads them.

    Raises:
        ConfigurationError: a flag, a variable or the job cannot be used; ``--resume`` names no run; the
            learner's device (``learner.device``, ``WARREN_DEVICE``) is a CUDA GPU this machine lacks.
    """
    env = os.environ if env is None else env
    if args.resume and args.name is None and args.workdir is None:
        # Without a name the run would get a fresh id: there is nothing it could continue.
        raise ConfigurationError(
            f"--resume continues a run: give its --name (or its --workdir); {describe_runs(RUNS_DIR)}"
        )
    collectors = args.collectors if args.collectors is not None else DEFAULT_COLLECTORS
    # A named run keeps one collect task per collector listening on its task queue, so
    # collectors that join from other machines get collect work too; an unnamed run has
    # only its own collectors, a fixed number.
    collect_tasks = 0 if args.name else collectors
    base = Settings.from_env(env, **flag_values(args, Settings))
    # The run's own prefix: its queues cannot meet those of any other deployment or run.
    identity = run_identity(base.prefix, args.name, args.workdir)
    resumed_job = identity.workdir / "job.json"
    # A resumed run trains the job it trained (a --config given instead is the user's call).
    config_file = resumed_job if args.resume and args.config is None and resumed_job.is_file() else args.config
    import_env_packages_of(env)  # as its collectors will: the job's env id may be one they register
    job = job_config(args, config_file=config_file, extra={"coordinator.collect_tasks": collect_tasks})
    no_device = run_device_refusal(job.learner.device, env)  # the learner runs here: its GPU must be here
    if no_device is not None:
        raise ConfigurationError(no_device)
    config = role_config(CoordinatorConfig, env, job=job, **flag_values(args, CoordinatorConfig))
    transport = config.transport.replace(prefix=identity.prefix)
    workdir = identity.workdir
    config = dataclasses.replace(
        config,
        transport=transport,
        run_log=workdir / "run.jsonl",
        path_policy=workdir / "policy",
        tensorboard_dir=workdir / TENSORBOARD_DIR,
    )
    ignored = {name: why for name, why in RUN_SETS.items() if env.get(name)}
    children_env = child_env(transport, identity.workdir, env)
    return RunPlan(config, identity, collectors, children_env, ignored, resume=bool(args.resume))


def crowded_collectors(collectors: int, cpus: int) -> str | None:
    """A warning when ``collectors`` processes would share fewer CPUs (``None``: they fit).

    Each collector is a whole process (an interpreter with gymnasium and numpy, its own
    start-up); past one per CPU they only take turns on the cores. 100 collectors on 2
    cores took 14 s to start and 3.6 GB, and 22 of them ever got a task.
    """
    if collectors <= cpus:
        return None
    return (
        f"{collectors} collectors on {cpus} CPUs (this process's): past one per CPU, collector processes only "
        "take turns on the cores, each with its own memory and start-up (100 on 2 cores took 14 s to start and "
        f"3.6 GB, and 22 of them ever got a task); give --collectors {cpus} or fewer unless the envs wait on "
        "something other than the CPU"
    )


def workdir_refusal(plan: RunPlan) -> str | None:
    """Why the run's workdir cannot be used (``None``: go ahead).

    A workdir another run used is refused unless ``--resume`` continues that run: a second
    run of one name would otherwise resume the policy but not the counters, and overwrite
    the first run's logs. A live run's workdir is refused either way, and ``--resume`` of a
    workdir no run used (a mistyped name) too, naming the runs there are: it would otherwise
    train from scratch under the wrong name.
    """
    identity = plan.identity
    state = state_of(identity.workdir)
    what = f"run {identity.run_id}" if identity.named else f"workdir {identity.workdir}"
    if state is RunState.RUNNING:
        record = read_record(identity.workdir)
        pid = f" (pid {record.pid})" if record is not None else ""
        return f"{what} is running{pid}; wait for it to end, or give another --name or --workdir"
    if plan.resume and state is RunState.NEW:
        flag = "--name" if identity.named else "--workdir"
        return (
            f"nothing to resume: no run used {identity.workdir}; {describe_runs(RUNS_DIR)}. Give {flag} of a "
            "run to continue, or leave out --resume to start a new one"
        )
    if state is RunState.NEW or plan.resume:
        return None
    how = "was interrupted (its process died)" if state is RunState.INTERRUPTED else "ended"
    return (
        f"{what} already has a run in {identity.workdir}, which {how}: --resume continues it (its policy, "
        "counters, budgets and logs), or give another --name or --workdir (or remove the directory)"
    )


def collector_env_threads(collectors: int, env: Mapping[str, str]) -> list[str]:
    """``--env-threads``: this machine's CPUs shared out among the run's collectors (unless ``WARREN_ENV_THREADS``).

    Without it each collector would take every CPU for its vector env (ale-py's thread pool),
    and N collectors would run N times as many env threads as there are cores.
    """
    if env.get("WARREN_ENV_THREADS"):
        return []
    return ["--env-threads", str(max(1, cpu_budget() // collectors))]


def metrics_ports(first: int, collectors: int) -> dict[str, int]:
    """The ``/metrics`` port of each process of the run, from ``first`` on: none when ``first`` is 0.

    The coordinator (this process) takes ``first``, the learner the next, then collector 0, 1...

    Raises:
        ConfigurationError: the last of them would be above 65535.
    """
    if not first:
        return {}
    names = ["coordinator", "learner", *(f"collector-{i}" for i in range(collectors))]
    if first + len(names) - 1 > 65535:
        raise ConfigurationError(
            f"--metrics-port {first}: the run's {len(names)} processes need ports {first} to "
            f"{first + len(names) - 1}, above 65535"
        )
    return {name: first + i for i, name in enumerate(names)}


def collector_id(index: int) -> str:
    """The worker id of the run's ``index``-th collector: ``c0``, ``c1``...

    Short, because the collector puts its role in front of it (connection
    ``warren-collector-c0@host:pid``, log lines ``[collector c0]``); its log file is
    ``logs/collector-<index>.log``.
    """
    return f"c{index}"


def child_env(transport: Settings, workdir: Path, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The children's environment: ``env`` (this process's), with every transport setting of the run.

    Every field of ``transport`` is passed (not a hand-picked subset), so a setting given
    to ``warren run`` as a flag reaches the collectors and the learner as it reaches the
    coordinator; the roles' own variables (``WARREN_STALL_TIMEOUT_S``,
    ``WARREN_TORCH_THREADS``...) pass as they are. The job's variables do not: the job
    reaches the learner whole, in ``job.json``, with the flags that overrode them applied.
    ``OMP_WAIT_POLICY`` is ``PASSIVE`` unless set: the children share the machine, and a
    learner's idle torch (OpenMP) threads would otherwise spin on the cores the
    collectors need.
    """
    env = os.environ if env is None else env
    job_variables = {env_variable(flag) for flag in ENV_FLAGS}
    return {
        **{name: value for name, value in env.items() if name not in job_variables},
        **to_env(transport),
        "WARREN_PATH_DATA": str(workdir / "data"),
        "WARREN_PATH_POLICY": str(workdir / "policy"),
        "PYTHONUNBUFFERED": "1",
        "OMP_WAIT_POLICY": env.get("OMP_WAIT_POLICY", "PASSIVE"),
    }
