"""Memory end to end: a task no feed-forward policy can solve, solved by the LSTM in a real distributed run.

CueMemory-v0 shows a cue (-1 or +1) at an episode's first step and asks for it 16 steps
later, when the observation is the same whatever the cue was: a policy that sees only the
current observation answers right half the time (mean return 0). The shipped job
(``configs/cue_memory_ppo_lstm.toml``: PPO, the ``lstm`` model, sequences of 32 steps)
runs with two collectors, a learner and a coordinator as separate processes on the
session's broker; episodes cross chunk boundaries (17 steps in chunks of 32 rows), so the
state the chunks carry is the one the learner starts its sequences from.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import warren
from worker.cli import main
from worker.envs.partial import CUE_MEMORY, register_partial_envs

pytestmark = pytest.mark.rabbitmq

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_the_question_looks_the_same_whatever_the_cue_so_without_memory_it_is_chance() -> None:
    register_partial_envs()
    seen: dict[int, set[tuple[float, ...]]] = {-1: set(), 1: set()}
    for seed in range(40):
        env = gym.make(CUE_MEMORY, delay=16)
        obs, _ = env.reset(seed=seed)
        cue = int(obs[0])
        for _ in range(16):
            obs, reward, terminated, _, _ = env.step(env.action_space.sample())
            assert reward == 0.0 and not terminated
        seen[cue].add(tuple(obs.tolist()))
        # and the answer scores +1 when it names the cue, -1 otherwise, ending the episode
        _, reward, terminated, _, _ = env.step(1 if cue == 1 else 0)
        assert reward == 1.0 and terminated
    assert seen[-1] == seen[1] == {(0.0, 1.0)}


def test_the_lstm_solves_the_cue_task_in_a_distributed_run_and_warren_eval_replays_it(
    amqp_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = warren.Job.from_toml(CONFIGS / "cue_memory_ppo_lstm.toml", coordinator={"max_time_s": 240})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WARREN_AMQP_URL", amqp_url)
        patch.setenv("WARREN_PREFIX", f"t{uuid.uuid4().hex[:8]}")
        summary: dict[str, Any] = job.run(workdir=tmp_path / "cue", collectors=2, log_level="ERROR")
    # The run reached the stop value (0.9: nearly every cue named), confirmed over more episodes
    assert summary["success"] is True and summary["exit_code"] == 0, summary
    # and its best policy, played by warren eval over 64 fresh episodes, remembers the cue too
    out = tmp_path / "eval.json"
    code = main(["eval", str(tmp_path / "cue"), "--episodes", "64", "--json", str(out), "--log-level", "ERROR"])
    assert code == 0, capsys.readouterr().err
    report = json.loads(out.read_text())
    assert report["episodes"] == 64 and report["return_mean"] >= 0.8, report
    # and loaded in Python it has memory, reset by the caller as episodes begin
    policy = warren.load_policy(tmp_path / "cue")
    assert policy.has_memory
    env = gym.make(CUE_MEMORY, delay=16)
    right = 0
    for seed in range(20):
        obs, _ = env.reset(seed=1000 + seed)
        policy.reset()
        terminated, reward = False, 0.0
        while not terminated:
            obs, step_reward, terminated, _, _ = env.step(int(np.asarray(policy.act(obs))))
            reward = float(step_reward)
        right += reward > 0
    assert right >= 16
