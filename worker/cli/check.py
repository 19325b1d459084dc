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

Exit code 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import re
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

from worker.cli.flags import add_job_flags, add_output_flags, job_config, log_level

#: Env steps of the rollout check, and the most it runs while the learner cannot update yet.
CHECK_STEPS = 1000
MAX_STEPS_TO_FIRST_UPDATE = 100_000


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "check",
        help="check a job's env, model and algorithm plug-ins before running them",
        description=(
            "Import the plug-ins in a fresh process, load the job, run gymnasium's env checker, "
            "build the actor and learner from the encoded spaces, round-trip the weights through a "
            "policy file, run 1000 env steps and one learner update; print what passed and what did "
            "not. Exit code 0 when everything passed, 1 otherwise."
        ),
    )
    add_job_flags(parser, run_end=False)
    add_output_flags(parser)
    parser.set_defaults(run=run)


class Report:
    """The lines printed so far, and whether any failed."""

    def __init__(self) -> None:
        self.failed = False

    def line(self, ok: bool, what: str, detail: str = "") -> None:
        self.failed |= not ok
        mark = "ok  " if ok else "FAIL"
        print(f"{mark} {what}{': ' + detail if detail else ''}", flush=True)

    def attempt(self, what: str, check: Callable[[], str]) -> bool:
        """Run ``check``; its return value is the detail of an ``ok`` line, an exception the reason of a ``FAIL``."""
        try:
            detail = check()
        except Exception as exc:
            reason = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
            self.line(False, what, reason)
            last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
            for frame in last:
                print(f"       at {frame.filename}:{frame.lineno} in {frame.name}", flush=True)
            return False
        self.line(True, what, detail)
        return True


def run(args: argparse.Namespace) -> int:
    from worker.logs import setup_logging

    setup_logging("check", log_level(args) if args.verbose else "WARNING")
    report = Report()
    report.attempt("plug-ins import in a fresh process", fresh_process_imports)
    jobs: list[Any] = []

    def load() -> str:
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
        return 1
    job = jobs[0]
    report.attempt("gymnasium's env checker passes", lambda: env_checker(job))
    report.attempt(
        "actor and learner build from the encoded spaces; weights round-trip", lambda: weights_round_trip(job)
    )
    report.attempt(f"{CHECK_STEPS} env steps and one learner update", lambda: steps_and_update(job))
    print("all checks passed" if not report.failed else "some checks FAILED", flush=True)
    return 1 if report.failed else 0


def spaces_of(job: Any) -> Any:
    assert job.spaces is not None  # a loaded job has them
    return job.spaces


def fresh_process_imports() -> str:
    """Discover the plug-ins in a new interpreter (not this one, which may have more on its path)."""
    program = (
        "import json\n"
        "from worker.plugins import PluginRegistry\n"
        "r = PluginRegistry.discover()\n"
        "found = {'inventory': r.inventory(), 'failures': list(r.failures), 'env_packages': r.env_packages}\n"
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

    from worker.inprocess import job_envs
    from worker.plugins import Spaces
    from worker.plugins.binding import build_algorithm
    from worker.plugins.registry import installed
    from worker.storage import PolicyStore

    # Built again from the spaces' wire form, as a collector and a learner elsewhere build it.
    spaces = Spaces.from_wire(json.loads(json.dumps(job.spaces.to_wire())))
    spec = job.policy_spec()
    algorithm = build_algorithm(
        installed(),
        spaces,
        algorithm=spec.type,
        algorithm_version=spec.version,
        config=spec.config,
        model=spec.model,
        model_version=spec.model_version,
        model_config=spec.model_config,
    )
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


def steps_and_update(job: Any) -> str:
    from worker.inprocess import InProcessJob

    if job.bound.kind == "none":
        return "nothing to learn: steps only"
    small = replace(job.env, collector_env_num=min(job.env.collector_env_num, 16))
    job = replace(job, env=small, collector=replace(job.collector, n_sample=CHECK_STEPS))
    run = InProcessJob(job)
    start = time.perf_counter()
    try:
        run.collect()
        steps = run.env_steps
        while not run.learner.can_update() and run.env_steps < MAX_STEPS_TO_FIRST_UPDATE:
            run.collect()
        if not run.learner.can_update():
            raise RuntimeError(f"the learner cannot update after {run.env_steps:,} env steps")
        metrics = run.learner.update()
    finally:
        run.close()
    bad = [name for name, value in metrics.items() if not math.isfinite(value)]
    if bad:
        raise RuntimeError(f"the update gave non-finite {', '.join(bad)}")
    shown = ", ".join(f"{k} {v:.3g}" for k, v in sorted(metrics.items())[:4])
    more = f" (the learner started after {run.env_steps:,} steps)" if run.env_steps > steps else ""
    return f"{steps:,} env steps, update {run.learner.version}: {shown}{more}; {time.perf_counter() - start:.1f} s"
