"""Each built-in algorithm learns in the whole distributed job: separate processes, the real broker.

Short runs that show learning (the evaluation return rises well above what the untrained
policy gets), not full solves: those are the benchmarks' (``python -m benchmarks --cases
sb3``). The shipped job files are used as they are, with a lower stop value and a budget.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from messaging import Settings
from tests.procs import role_env

pytestmark = [pytest.mark.rabbitmq, pytest.mark.slow]

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def run_job(settings: Settings, workdir: Path, config: str, *extra: str) -> tuple[dict[str, Any], list[float], str]:
    env = {**os.environ, **role_env(settings)}
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", "run", "--config", str(CONFIGS / config), "--collectors", "2",
         "--workdir", str(workdir), "--progress", "log", *extra],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    summary_path = workdir / "summary.json"
    assert summary_path.exists(), done.stdout[-2000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in (workdir / "run.jsonl").read_text().splitlines()]
    returns = [r["reward_mean"] for r in records if r["kind"] == "eval"]
    return json.loads(summary_path.read_text()), returns, done.stderr


def test_ppo_learns_cartpole_with_collectors_and_learner_in_separate_processes(
    settings: Settings, tmp_path: Path
) -> None:
    # Given the shipped PPO job, asked for 300 instead of 475, with a 60 s budget
    summary, returns, log = run_job(
        settings, tmp_path / "run", "cartpole_ppo.toml", "--stop-value", "300", "--max-time-s", "60", "--seed", "2"
    )
    # Then an evaluation reached it (an untrained policy balances for about 10 steps)
    assert summary["success"], (summary, returns, log[-3000:])
    assert max(returns) >= 300 and summary["policy_iter"] >= 1
    assert summary["learner_train_steps"] is not None and summary["learner_train_steps"] >= 1


def test_sac_learns_pendulum_with_collectors_and_learner_in_separate_processes(
    settings: Settings, tmp_path: Path
) -> None:
    # Given the shipped SAC job with a 90 s budget, asked only to beat -700 (untrained: -1100 to -1500)
    summary, returns, log = run_job(
        settings, tmp_path / "run", "pendulum_sac.toml", "--stop-value", "-700", "--max-time-s", "90"
    )
    # Then the return rose to it
    assert summary["success"], (summary, returns, log[-3000:])
    assert returns[-1] >= -700 and returns[-1] > returns[0]
