"""Scaling: env steps/s reaching the learner with 1, 2 and 4 ``warren collector`` processes.

Four collector processes start once. Each repeat sends k collect tasks (k = 1, 2, 4,
rotated) to the shared task queue, so k idle workers take one each; every task runs
CartPole-v1 with 64 envs (the shipped job's vector env and 64x64 chunks) and the DQN
policy (eps 1.0) for a fixed number of samples.
This process plays coordinator and learner: it reads every task's metadata stream
straight from the broker and, for each data item, reads the step file with
``StepStore.read`` and deletes it. The rate is all env steps / (first start request ->
last ``collector_done`` read). Baseline: the 1-collector rate of the same run.
"""

from __future__ import annotations

import os
import time
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks import procs
from benchmarks.case_collector import bench_job, random_weights
from benchmarks.common import CaseContext, CaseResult, Trials, alternate
from benchmarks.stats import Row
from messaging import BrokerLink, MetadataConsumer, Names, RpcClient, Settings
from worker.storage import PolicyStore, StepStore

NAME = "scaling"
TITLE = "scaling"
COLLECTORS = (1, 2, 4)
POLICY = "bench_policy"
#: Reference for the whole pipeline (coordinator + learner included): DI-engine parallel.
REFERENCE = "DI-engine parallel ~50 env steps/s (2 collectors, whole job)"


def collect_cfg(n_sample: int) -> dict[str, Any]:
    """The shipped job's collect task (64 envs, 64-step chunks, its DQN at eps 1.0) for ``n_sample`` samples."""
    cfg = bench_job().collect_spec(0).to_wire()
    cfg.update(n_sample=n_sample, collect_setting={"eps": 1.0}, policy_update_path=POLICY, update_policy_second=1.0)
    return cfg


class _Driver:
    """Starts k tasks, reads their streams and files like coordinator + learner, closes them."""

    def __init__(self, settings: Settings, workdir: Path, n_sample: int) -> None:
        self.settings = settings
        self.names = Names(settings.prefix)
        self.link = BrokerLink(settings, "bench-scaling").open()
        self.client = RpcClient(settings, "bench-scaling", link=self.link)
        self.steps = StepStore(workdir / "data")
        self.n_sample = n_sample
        self.seq = 0

    def close(self) -> None:
        self.client.close()
        self.link.close()

    def run(self, k: int) -> dict[str, float]:
        started = time.monotonic()
        tasks = self._start(k)
        consumers = [MetadataConsumer(self.link, t["metadata_queue"], prefetch=64) for t in tasks]
        steps = self._read(consumers)
        seconds = time.monotonic() - started
        for consumer in consumers:
            consumer.close()
        self._close(tasks)
        return {"steps_s": steps / seconds, "steps": float(steps), "seconds": seconds}

    def _start(self, k: int) -> list[dict[str, Any]]:
        calls = []
        for _ in range(k):
            self.seq += 1
            info = {"task_id": f"scaling-{self.seq}", "buffer_id": "bench", "collector_cfg": collect_cfg(self.n_sample)}
            body = {"name": "collector_start_task", "task_info": info}
            calls.append(self.client.send(self.names.collector_tasks, body, timeout_s=60))
        return [self.client.wait(corr, timeout_s=60) for corr in calls]

    def _read(self, consumers: list[MetadataConsumer]) -> int:
        final_steps: dict[int, int] = {}
        deadline = time.monotonic() + 300
        while len(final_steps) < len(consumers):
            if time.monotonic() > deadline:
                raise RuntimeError("collect tasks did not finish within 300 s")
            self.link.process_events(0.005)
            for i, consumer in enumerate(consumers):
                while (item := consumer.get(0.0)) is not None:
                    message = item.message
                    if "data_id" in message:
                        self.steps.read(str(message["data_id"]))
                        self.steps.delete(str(message["data_id"]))
                    elif message.get("collector_done"):
                        final_steps[i] = int(message["cur_step"])
                    item.ack()
        return sum(final_steps.values())

    def _close(self, tasks: list[dict[str, Any]]) -> None:
        calls = [self.client.send(t["control_queue"], {"name": "collector_close_task"}, timeout_s=60) for t in tasks]
        for corr in calls:
            self.client.wait(corr, timeout_s=60)
        for task in tasks:
            self.link.delete_queue(task["metadata_queue"])


def run(ctx: CaseContext) -> CaseResult:
    n_sample = 100_000 if ctx.quick else 300_000
    settings = ctx.broker.settings(ctx.broker.sub_prefix("scaling"))
    children: list[procs.Child] = []
    with ctx.scratch("scaling") as workdir:
        PolicyStore(workdir / "policy").write(POLICY, random_weights(), 0)
        driver: _Driver | None = None
        try:
            ctx.log(f"starting {max(COLLECTORS)} warren collectors")
            for i in range(max(COLLECTORS)):
                children.append(procs.start_collector(settings, workdir, f"bench-scaling-{i}"))
            driver = _Driver(settings, workdir, n_sample)
            driver.run(max(COLLECTORS))  # untimed: every worker builds its envs and loads torch code
            variants = {f"{k}": partial(driver.run, k) for k in COLLECTORS}
            trials = alternate(ctx.repeats, variants, log=ctx.log)
        finally:
            if driver is not None:
                driver.close()
            procs.stop_all(children)
    return CaseResult.of(_rows(trials), trials, samples_per_task=n_sample)


def _rows(trials: Trials) -> list[Row]:
    one = trials.series("1", "steps_s")
    rows = [Row(TITLE, "1 collector", "env steps/s", "higher", one, reference=REFERENCE)]
    for k in COLLECTORS[1:]:
        rows.append(
            Row(
                TITLE,
                f"{k} collectors vs 1",
                "env steps/s",
                "higher",
                trials.series(f"{k}", "steps_s"),
                one,
                "1 collector",
                f"ideal {k}x; {len(os.sched_getaffinity(0))} cores; target >= 50,000 with 2",
            )
        )
    return rows
