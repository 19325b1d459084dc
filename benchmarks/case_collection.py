"""Collection at scale: N collectors against N bare env loops, and the cost of a task around its env steps.

Latency-bound (the scaling rows): ``SlowCartPole-v1`` (:mod:`benchmarks.slow_env`, CartPole
whose every step sleeps 2 ms, like a remote simulator), 8 envs per collector. warren: N
``warren collector`` processes (started before, all listening), then ``warren learner`` and
``warren coordinator`` with the ``random`` algorithm (its learner only counts and deletes the
step files: nothing holds collection back; the rate limit is lifted; no evals). Rate: the env
steps the coordinator counted over the steady window of its run log (from the N-th finished
task to the last; the run has a time budget). Baseline, in the same repeat: N processes each stepping the same 8 envs
in a bare vector-env loop (:mod:`benchmarks.bare_loop`), started together. CPU per env step:
each role's processes (user + system time from /proc) over the same window, the broker's
too (the process listening on the AMQP port, when it is on this machine).

CPU-bound (the per-task rows): one collector on the same env with no sleep, at 1, 8 and 64
envs: env steps/s inside its tasks (their step counts over their durations), the share of
its time spent in tasks (the gap between tasks is the rest), and both against the bare
loop of the same envs.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from benchmarks import procs
from benchmarks.broker import management_get, vhost_of
from benchmarks.common import CaseContext, CaseResult, alternate
from benchmarks.slow_env import ENV_ID
from benchmarks.stats import Row

NAME = "collection"
TITLE = "collection at scale"
COLLECTORS = (1, 2, 4, 8, 16, 32)
QUICK_COLLECTORS = (1, 2)
ENVS = 8
CPU_BOUND_ENVS = (1, 8, 64)
#: Steady collection per warren run (the budget is sized from the bare loop's rate).
SECONDS = 20.0
QUICK_SECONDS = 6.0
N_SAMPLE = 1024
#: The coordinator's time budget is the steady window plus this (its start and the learner's).
START_S = 5.0
ENV_PACKAGE = "benchmarks.slow_env"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def job_toml(env_num: int, n_sample: int, max_time_s: float, step_delay_s: float | None) -> str:
    """The benchmark's job: random actions, no evals, no rate limit, a time budget."""
    kwargs = "" if step_delay_s is None else f"kwargs = {{ step_delay_s = {step_delay_s} }}\n"
    return (
        f'[env]\nid = "{ENV_ID}"\ncollector_env_num = {env_num}\nstop_value = inf\nconfirm_episodes = 0\n{kwargs}'
        '[algorithm]\nname = "random"\n'
        f"[collector]\nn_sample = {n_sample}\ntraj_len = 32\n"
        f"[coordinator]\neval_interval_s = 1e9\nmax_env_steps = 1000000000\nmax_time_s = {max_time_s}\n"
        "max_run_ahead_samples = 1000000000\n"
        f"start_ahead = {int(os.environ.get('WARREN_BENCH_START_AHEAD', '-1'))}\n"
    )


# -- processes and their CPU ---------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def listener_pid(port: int) -> int | None:
    """The process listening on TCP ``port`` on this machine (the broker), or None."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (entry / "fd").iterdir()):
                return int(entry.name)
        except OSError:
            continue
    return None


class CpuSamples:
    """CPU seconds of each role's processes, sampled with wall-clock times, for windows read later."""

    def __init__(self, roles: dict[str, list[int]]) -> None:
        self.roles = roles
        self.samples: list[tuple[float, dict[str, float]]] = []

    def sample(self) -> None:
        self.samples.append((time.time(), {r: sum(cpu_seconds(p) for p in pids) for r, pids in self.roles.items()}))

    def window(self, start: float, end: float) -> dict[str, float]:
        """Each role's CPU seconds between the samples nearest ``start`` and ``end``."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return {}
        (_, first), (_, last) = inside[0], inside[-1]
        scale = (end - start) / (inside[-1][0] - inside[0][0])  # the samples' window to the rate's
        return {role: (last[role] - first[role]) * scale for role in self.roles}


# -- warren ---------------------------------------------------------------------------


class CollectorPool:
    """``warren collector`` processes on one prefix, grown as the case asks for more."""

    def __init__(self, ctx: CaseContext, workdir: Path, prefix: str) -> None:
        self.ctx = ctx
        self.workdir = workdir
        self.settings = ctx.broker.settings(prefix)
        self.env = {**procs.warren_env(self.settings, workdir), "WARREN_ENV_PACKAGES": ENV_PACKAGE}
        self.children: list[procs.Child] = []
        (workdir / "logs").mkdir(parents=True, exist_ok=True)

    def grow(self, n: int) -> None:
        """Start collectors until ``n`` run, and wait until every one listens on the task queue."""
        while len(self.children) < n:
            worker_id = f"c{len(self.children):02d}"
            argv = procs.python_module("worker.cli", "collector", "--worker-id", worker_id, "--log-level", "INFO")
            self.children.append(procs.Child(argv, env=self.env, log=self.workdir / "logs" / f"{worker_id}.log"))
        queue = f"{self.settings.prefix}.collector.tasks"
        path = f"/api/queues/{quote(vhost_of(self.settings.amqp_url), safe='')}/{quote(queue, safe='')}"
        deadline = time.monotonic() + 120 + 5 * n
        while time.monotonic() < deadline:
            try:
                if int(management_get(self.settings.amqp_url, path).get("consumers", 0)) >= n:
                    return
            except (OSError, ValueError):
                pass  # the queue is not declared yet
            if not all(child.alive() for child in self.children):
                raise RuntimeError(f"a collector exited; logs in {self.workdir / 'logs'}")
            time.sleep(0.5)
        raise RuntimeError(f"{n} collectors did not all listen within the deadline; logs in {self.workdir / 'logs'}")

    def pids(self) -> list[int]:
        return [child.pid for child in self.children]

    def close(self) -> None:
        procs.stop_all(self.children)


def run_warren(
    pool: CollectorPool, *, n: int, env_num: int, seconds: float, step_delay_s: float | None = None
) -> dict[str, float]:
    """One coordinator + learner run on the pool's first ``n`` collectors (the pool has exactly ``n``)."""
    ctx, workdir = pool.ctx, pool.workdir
    run = Path(os.path.join(workdir, f"run-{time.monotonic_ns()}"))
    run.mkdir()
    n_sample = max(N_SAMPLE, 32 * env_num)
    (run / "job.toml").write_text(job_toml(env_num, n_sample, seconds + START_S, step_delay_s))
    env = {**pool.env, "WARREN_PATH_DATA": str(workdir / "data"), "WARREN_PATH_POLICY": str(workdir / "policy")}
    common = ("--config", str(run / "job.toml"), "--log-level", "WARNING")
    learner = procs.Child(procs.python_module("worker.cli", "learner", *common), env=env, log=run / "learner.log")
    coordinator = procs.Child(
        procs.python_module("worker.cli", "coordinator", *common, "--run-log", str(run / "run.jsonl"),
                            "--progress", "off"),
        env=env, log=run / "coordinator.log",
    )  # fmt: skip
    port = ctx.broker.parameters().port
    broker = listener_pid(port)
    roles = {"collectors": pool.pids(), "coordinator": [coordinator.pid], "learner": [learner.pid]}
    if broker is not None:
        roles["broker"] = [broker]
    cpu = CpuSamples(roles)
    try:
        deadline = time.monotonic() + seconds * 6 + 120
        while coordinator.popen.poll() is None:
            cpu.sample()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the coordinator did not end; log: {run / 'coordinator.log'}")
            time.sleep(0.25)
    finally:
        procs.stop_all([coordinator, learner])
    return measured(run / "run.jsonl", cpu, n)


def measured(run_log: Path, cpu: CpuSamples, n: int) -> dict[str, float]:
    """The steady rate, the busy share, the in-task rate and CPU per env step of one run (see the module docstring)."""
    tasks = [r for r in map(json.loads, run_log.read_text().splitlines()) if r["kind"] == "task"]
    if len(tasks) < n + 2:
        raise RuntimeError(f"only {len(tasks)} tasks in {run_log}: too short a run to measure")
    tasks.sort(key=lambda r: r["time"])
    first, last = tasks[n - 1], tasks[-1]
    seconds = last["time"] - first["time"]
    steps = last["env_steps"] - first["env_steps"]
    result = {"steps_s": steps / seconds, "tasks": float(len(tasks))}
    per_step = cpu.window(first["time"], last["time"])
    for role, cpu_s in per_step.items():
        result[f"cpu_us_{role}"] = cpu_s / steps * 1e6
    busy, in_task = [], []
    for worker in {r["worker_id"] for r in tasks}:
        mine = [r for r in tasks if r["worker_id"] == worker]
        if len(mine) < 2:
            continue
        span = mine[-1]["finish_time"] - (mine[0]["finish_time"] - mine[0]["duration"])
        busy.append(sum(r["duration"] for r in mine) / span)
        in_task.append(sum(r["step_count"] for r in mine) / sum(r["duration"] for r in mine))
    result["busy_share"] = statistics.fmean(busy) if busy else float("nan")
    result["in_task_steps_s"] = statistics.fmean(in_task) if in_task else float("nan")
    return result


# -- the bare loops --------------------------------------------------------------------


def run_bare(
    workdir: Path, *, n: int, env_num: int, seconds: float, step_delay_s: float | None = None
) -> dict[str, float]:
    """N bare loops in N processes over the same window; their total rate and CPU per env step."""
    argv = ["--envs", str(env_num), "--seconds", str(seconds), "--env-package", ENV_PACKAGE, "--wait-go"]
    if step_delay_s is not None:
        argv += ["--kwargs", json.dumps({"step_delay_s": step_delay_s})]
    loops = [
        procs.Child(procs.python_module("benchmarks.bare_loop", ENV_ID, "--seed", str(i), *argv), env={},
                    log=workdir / f"bare-{i}.log", talk=True)
        for i in range(n)
    ]  # fmt: skip
    try:
        for loop in loops:
            loop.receive(120.0)  # ready: the envs are made
        for loop in loops:
            loop.send({"go": True})
        results = [loop.receive(seconds + 60.0) for loop in loops]
    finally:
        procs.stop_all(loops)
    steps = sum(r["env_steps"] for r in results)
    window = statistics.fmean(r["seconds"] for r in results)
    return {"steps_s": steps / window, "cpu_us": sum(r["cpu_s"] for r in results) / steps * 1e6}


# -- the case --------------------------------------------------------------------------


class Pair:
    """warren and the bare loops with the same collectors, envs and env."""

    def __init__(self, pool: CollectorPool, n: int, env_num: int, seconds: float, step_delay_s: float | None) -> None:
        self.pool, self.n, self.env_num, self.seconds, self.step_delay_s = pool, n, env_num, seconds, step_delay_s

    def bare(self) -> dict[str, float]:
        return run_bare(self.pool.workdir, n=self.n, env_num=self.env_num, seconds=self.seconds,
                        step_delay_s=self.step_delay_s)  # fmt: skip

    def warren(self) -> dict[str, float]:
        return run_warren(self.pool, n=self.n, env_num=self.env_num, seconds=self.seconds,
                          step_delay_s=self.step_delay_s)  # fmt: skip


@contextmanager
def collector_pool(ctx: CaseContext, name: str) -> Iterator[CollectorPool]:
    with ctx.scratch(name) as workdir:
        pool = CollectorPool(ctx, workdir, ctx.broker.sub_prefix(name))
        try:
            yield pool
        finally:
            pool.close()


def scaling_rows(ctx: CaseContext, counts: Sequence[int], seconds: float) -> tuple[list[Row], dict[str, Any]]:
    rows, details = [], {}
    with collector_pool(ctx, "scale") as pool:
        for n in counts:
            pool.grow(n)
            pair = Pair(pool, n, ENVS, seconds, None)
            trials = alternate(ctx.repeats, {"bare": pair.bare, "warren": pair.warren}, log=ctx.log)
            details[f"n{n}"] = trials.to_dict()
            cpu_notes = {
                key.removeprefix("cpu_us_"): trials.series("warren", key).median
                for key in trials.runs["warren"][0]
                if key.startswith("cpu_us_")
            }
            cpu_notes["bare loops"] = trials.series("bare", "cpu_us").median
            rows.append(Row(TITLE, f"{n} collectors x {ENVS} envs, 2 ms env", "env steps/s", "higher",
                            trials.series("warren", "steps_s"), trials.series("bare", "steps_s"),
                            f"{n} bare loops", reference="target >= 0.9x",
                            notes={"cpu_us_per_env_step": cpu_notes,
                                   "busy_share": trials.series("warren", "busy_share").median}))  # fmt: skip
            ctx.log(f"{n} collectors: CPU us per env step {cpu_notes}")
    return rows, details


def per_task_rows(ctx: CaseContext, envs: Sequence[int], seconds: float) -> tuple[list[Row], dict[str, Any]]:
    rows, details = [], {}
    with collector_pool(ctx, "pertask") as pool:
        pool.grow(1)
        for env_num in envs:
            pair = Pair(pool, 1, env_num, seconds, 0.0)
            trials = alternate(ctx.repeats, {"bare": pair.bare, "warren": pair.warren}, log=ctx.log)
            details[f"envs{env_num}"] = trials.to_dict()
            bare_rate = trials.series("bare", "steps_s")
            label = f"1 collector x {env_num} envs, 0 ms env"
            in_task = trials.series("warren", "in_task_steps_s")
            rows += [
                Row(TITLE, f"{label}: inside tasks", "env steps/s", "higher", in_task, bare_rate, "bare loop",
                    reference="target >= 0.9x"),
                Row(TITLE, f"{label}: overall", "env steps/s", "higher", trials.series("warren", "steps_s"),
                    bare_rate, "bare loop"),
                Row(TITLE, f"{label}: time in tasks", "share", "higher", trials.series("warren", "busy_share"),
                    reference="target >= 0.95"),
            ]  # fmt: skip
    return rows, details


def run(ctx: CaseContext) -> CaseResult:
    seconds = QUICK_SECONDS if ctx.quick else SECONDS
    chosen = os.environ.get("WARREN_BENCH_COLLECTORS")  # e.g. "16,32": only these counts
    counts = tuple(map(int, chosen.split(","))) if chosen else QUICK_COLLECTORS if ctx.quick else COLLECTORS
    envs = (8,) if ctx.quick else CPU_BOUND_ENVS
    # WARREN_BENCH_COLLECTION: "scaling" or "per-task", only that half; WARREN_BENCH_START_AHEAD:
    # the coordinator's start_ahead (-1, its default, unless set)
    only = os.environ.get("WARREN_BENCH_COLLECTION")
    rows: list[Row] = []
    details: dict[str, Any] = {}
    if only in (None, "per-task"):
        more, details["per_task"] = per_task_rows(ctx, envs, seconds)
        rows += more
    if only in (None, "scaling"):
        more, details["scaling"] = scaling_rows(ctx, counts, seconds)
        rows += more
    return CaseResult(rows, details)
