"""``warren check``: try a job's plug-ins the way a run will use them, before any worker starts.

Each check prints one line, ``ok`` or ``FAIL`` and what it found, in plain words:

1. the plug-ins import in a fresh Python process (so they are installed where this
   command runs, not just importable from the current directory), and which are there;
2. the job loads: the env is made once, its spaces are ones warren carries, the
   algorithm and the model accept them and every config key;
3. gymnasium's env checker passes on one env;
4. the actor and the learner build from the spaces as the wire carries them (decoded,
   not taken from the env), and the actor's weights survive a safetensors round trip
   through the policy store (same actions before and after);
5. a thousand env steps run with the actor, their chunks pass the learner's checks, and
   one learner update runs with finite metrics (the learner gets more steps if it needs
   more to start, up to a bound).

The checks run in a child process that this one watches (:mod:`worker.cli.watchdog`):
each check, and each 1,000 env steps of the last one, must finish within
``--check-timeout-s`` (an env whose reset or step never returns is a ``FAIL``, not a
command that never ends), and the first SIGTERM or SIGINT kills the child and ends the
command at once.

Exit code 0 when every check passed, 1 otherwise, 143 (SIGTERM) or 130 (SIGINT) when a
signal stopped it.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from messaging import ConfigurationError
from worker.cli.exit_codes import ExitCode, by_signal
from worker.cli.flags import add_job_flags, add_output_flags, job_config, log_level, positive_float
from worker.cli.watchdog import Progress, run_watched
from worker.lifecycle import stop_signal

#: Env steps of the rollout check, and the most it runs while the learner cannot update yet.
CHECK_STEPS = 1000
MAX_STEPS_TO_FIRST_UPDATE = 100_000
#: Seconds each check (and each CHECK_STEPS env steps of the last) may take unless --check-timeout-s says otherwise.
CHECK_TIMEOUT_S = 120.0


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "check",
        help="check a job's env, model and algorithm plug-ins before running them",
        description=(
            "Import the plug-ins in a fresh process, load the job, run gymnasium's env checker, "
            "build the actor and learner from the encoded spaces, round-trip the weights through a "
            "policy file, run 1000 env steps and one learner update; print what passed and what did "
            "not. The checks run in a child process: each check, and each 1000 env steps of the last, must "
            f"finish within --check-timeout-s (default {CHECK_TIMEOUT_S:g} s), or it fails and the child is "
            "killed (an env whose reset or step never returns); the first SIGTERM or Ctrl-C stops everything "
            "at once. Exit code 0 when everything passed, 1 otherwise, 143 on SIGTERM, 130 on Ctrl-C."
        ),
    )
    add_job_flags(parser, run_end=False)
    parser.add_argument(
        "--check-timeout-s",
        type=positive_float,
        default=CHECK_TIMEOUT_S,
        help="the most seconds each check, and each 1000 env steps of the last, may take before it fails "
        f"(default {CHECK_TIMEOUT_S:g})",
    )
    add_output_flags(parser)
    parser.set_defaults(run=run)


class Report:
    """The lines printed so far, and whether any failed; each check's start goes to ``progress``."""

    def __init__(self, progress: Progress | None = None) -> None:
        self.failed = False
        self.progress = progress

    def line(self, ok: bool, what: str, detail: str = "") -> None:
        self.failed |= not ok
        mark = "ok  " if ok else "FAIL"
        print(f"{mark} {what}{': ' + detail if detail else ''}", flush=True)

    def attempt(self, what: str, check: Callable[[], str]) -> bool:
        """Run ``check``; its return value is the detail of an ``ok`` line, an exception the reason of a ``FAIL``."""
        if self.progress is not None:
            self.progress.begin(what)
        try:
            detail = check()
        except Exception as exc:
            reason = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
            self.line(False, what, reason)
            # Where it failed helps with a plug-in's bug; a refused config is the user's, said in full above.
            last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
            for frame in [] if isinstance(exc, ConfigurationError) else last:
                print(f"       at {frame.filename}:{frame.lineno} in {frame.name}", flush=True)
            return False
        self.line(True, what, detail)
        return True


def run(args: argparse.Namespace) -> int:
    """Watch the checks (:func:`run_checks`) run in a child process; see the module docstring."""
    if args.stop.is_set():  # a signal came while the command started
        return by_signal(stop_signal() or signal.SIGTERM)
    timeout_s = args.check_timeout_s
    watched = run_watched(lambda progress: run_checks(args, progress), step_timeout_s=timeout_s)
    if watched.signum is not None:
        print(f"warren check: stopped by {signal.Signals(watched.signum).name}", file=sys.stderr, flush=True)
        return by_signal(watched.signum)
    if watched.stalled is not None:
        what, _, progress = watched.stalled.partition("\t")
        Report().line(
            False,
            what,
            f"no end within {timeout_s:g} s{' after ' + progress if progress else ''} (--check-timeout-s): "
            "an env call that never returns? The checks were stopped",
        )
        print("some checks FAILED", flush=True)
        return ExitCode.FAILED
    if watched.code not in (ExitCode.OK, ExitCode.FAILED):
        print(f"FAIL the checks' process ended with status {watched.code}", flush=True)
        return ExitCode.FAILED
    return int(watched.code)


def run_checks(args: argparse.Namespace, progress: Progress) -> int:
    """Every check in turn, in the watched child; each says when it begins."""
    from worker.config import import_env_packages_of
    from worker.logs import setup_logging

    setup_logging("check", log_level(args) if args.verbose else "WARNING")
    report = Report(progress)
    report.attempt("plug-ins import in a fresh process", fresh_process_imports)
    jobs: list[Any] = []

    def load() -> str:
        import_env_packages_of()  # as every process of a run does, before its job
        # The stop value plays no part here (and an env without a reward_threshold has none).
        job = job_config(args, extra={"env.stop_value": math.inf})
        jobs.append(job)
        algorithm = job.bound
        return (
            f"{job.env.id} ({job.env.plugin or 'gymnasium'}), {spaces_of(job).describe()}; algorithm "
            f"{job.algorithm.name} {job.algorithm.version}, model {job.model.name} {job.model.version}, "
            f"{algorithm.kind.replace('_', '-')}"
        )

    if not report.attempt("the job loads and its plug-ins accept the env's spaces", load):
        return ExitCode.FAILED
    job = jobs[0]
    report.attempt("gymnasium's env checker passes", lambda: env_checker(job))
    report.attempt(
        "actor and learner build from the encoded spaces; weights round-trip", lambda: weights_round_trip(job)
    )
    steps = f"{CHECK_STEPS} env steps and one learner update"
    report.attempt(steps, lambda: steps_and_update(job, lambda done: progress.begin(f"{steps}\t{done}")))
    print("all checks passed" if not report.failed else "some checks FAILED", flush=True)
    return ExitCode.FAILED if report.failed else ExitCode.OK


def spaces_of(job: Any) -> Any:
    assert job.spaces is not None  # a loaded job has them
    return job.spaces


def fresh_process_imports() -> str:
    """Discover the plug-ins in a new interpreter (not this one, which may have more on its path)."""
    program = (
        "import json\n"
        "from worker.config import import_env_packages_of\n"
        "from worker.plugins import PluginRegistry\n"
        "packages = import_env_packages_of()\n"
        "r = PluginRegistry.discover(env_packages='')\n"
        "found = {'inventory': r.inventory(), 'failures': list(r.failures), 'env_packages': packages}\n"
        "print(json.dumps(found))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tempfile.gettempdir(),
    )
    if done.returncode != 0:
        raise RuntimeError(f"the fresh process failed: {done.stderr.strip().splitlines()[-1:]}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    if found["failures"]:
        raise RuntimeError("; ".join(found["failures"]))
    kinds = ", ".join(f"{kind} {', '.join(names) or '-'}" for kind, names in found["inventory"].items())
    packages = ", ".join(found["env_packages"]) or "none"
    return f"{kinds}; env packages imported: {packages}"


def env_checker(job: Any) -> str:
    import gymnasium as gym
    from gymnasium.utils.env_checker import check_env

    from worker.plugins import installed
    from worker.plugins.binding import env_plugin, make_env_context

    plugin = env_plugin(installed(), job.env.plugin, job.env.plugin_version)
    env = plugin.make_env(make_env_context(job.env.id, 1, kwargs=job.env.kwargs, seed=job.env.seed))
    try:
        with warnings.catch_warnings(record=True) as records:
            warnings.simplefilter("always")
            check_env(env.unwrapped if isinstance(env, gym.Wrapper) else env, skip_render_check=True)
    finally:
        env.close()
    # gymnasium colours its warnings for a terminal: keep the words.
    notes = [re.sub(r"\x1b\[[0-9;]*m", "", str(r.message)).strip().split("\n")[0][:160] for r in records]
    return f"{len(notes)} warnings: {'; '.join(notes[:3])}" if notes else "no warnings"


def weights_round_trip(job: Any) -> str:
    import numpy as np

    from worker.collector.prepare import build_policy
    from worker.inprocess import job_envs
    from worker.plugins import Spaces
    from worker.plugins.registry import installed
    from worker.storage import PolicyStore

    # Built again from the spaces' wire form, as a collector and a learner elsewhere build it.
    spaces = Spaces.from_wire(json.loads(json.dumps(job.spaces.to_wire())))
    spec = job.policy_spec()
    algorithm = build_policy(installed(), spaces, spec)
    if algorithm.kind == "none":
        return "nothing to learn: no weights"
    learner = algorithm.make_learner(job.env.seed)
    weights = learner.actor_weights()
    with tempfile.TemporaryDirectory() as tmp:
        store = PolicyStore(Path(tmp))
        header = {"algorithm": spec.type, "spaces_digest": spaces.digest}
        path = store.write("check", weights, learner.version, header)
        size = path.stat().st_size
        loaded = store.read("check", numpy=algorithm.weights_format == "numpy")  # as collectors read it
    assert loaded is not None
    first, second = algorithm.make_actor(seed=1), algorithm.make_actor(seed=1)
    first.load_weights(weights)
    second.load_weights(loaded.state_dict)
    envs = job_envs(job, 4, job.env.seed)
    try:
        obs = envs.reset()
        a1, _ = first.act(obs, explore=False, settings={})
        a2, _ = second.act(obs, explore=False, settings={})
    finally:
        envs.close()
    if not np.array_equal(a1, a2):
        raise RuntimeError("the actor acts differently after the weights went through the policy file")
    tensors = sum(int(t.numel()) for t in weights.values())
    return f"{len(weights)} tensors, {tensors:,} numbers, {size:,} bytes on disk; same actions after loading"


def steps_and_update(job: Any, progress: Callable[[str], None] = lambda done: None) -> str:
    """Collect CHECK_STEPS env steps (more while the learner cannot update), then one update.

    ``progress`` hears of each CHECK_STEPS env steps done, and of the update's start. An
    algorithm with nothing to learn (``random``) gets the steps only.
    """
    from worker.inprocess import InProcessJob

    small = replace(job.env, collector_env_num=min(job.env.collector_env_num, 16))
    # The check's one collect task of CHECK_STEPS runs in-process; the job's rate limit must let it start.
    ahead = max(job.coordinator.max_run_ahead_samples, CHECK_STEPS)
    job = replace(
        job,
        env=small,
        collector=replace(job.collector, n_sample=CHECK_STEPS),
        coordinator=replace(job.coordinator, max_run_ahead_samples=ahead),
    )
    run = InProcessJob(job)
    start = time.perf_counter()
    try:
        run.collect()
        steps = run.env_steps
        if job.bound.kind == "none":
            return f"{steps:,} env steps; nothing to learn, no update; {time.perf_counter() - start:.1f} s"
        while not run.learner.can_update() and run.env_steps < MAX_STEPS_TO_FIRST_UPDATE:
            progress(f"{run.env_steps:,} env steps")
            run.collect()
        if not run.learner.can_update():
            raise RuntimeError(f"the learner cannot update after {run.env_steps:,} env steps")
        progress(f"{run.env_steps:,} env steps, in the update")
        metrics = run.learner.update()
    finally:
        run.close()
    bad = [name for name, value in metrics.items() if not math.isfinite(value)]
    if bad:
        raise RuntimeError(f"the update gave non-finite {', '.join(bad)}")
    shown = ", ".join(f"{k} {v:.3g}" for k, v in sorted(metrics.items())[:4])
    more = f" (the learner started after {run.env_steps:,} steps)" if run.env_steps > steps else ""
    return f"{steps:,} env steps, update {run.learner.version}: {shown}{more}; {time.perf_counter() - start:.1f} s"
