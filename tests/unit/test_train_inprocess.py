"""A whole job in one process (worker/inprocess.py) and the example script on it (scripts/train_inprocess.py)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from worker.algorithms.dqn import DQNConfig
from worker.inprocess import InProcessJob
from worker.job import JobConfig

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "train_inprocess.py"


def test_the_in_process_example_trains_at_the_replay_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("train_inprocess", SCRIPT)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    sys.modules["train_inprocess"] = example
    spec.loader.exec_module(example)
    # Given a small budget and a target no policy reaches, when the example runs one seed
    example.main(["--seeds", "3", "--max-steps", "8000", "--eval-every", "4000", "--target", "1e9"])
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    # Then it said which job it ran, collected the budget, evaluated along the way, and trained
    # at the replay ratio once the buffer held learning_starts transitions
    assert lines[0].startswith("job:") and json.loads(lines[0][4:])["algorithm"]["name"] == "dqn"
    defaults = DQNConfig()
    assert result["seed"] == 3 and not result["solved"]
    assert result["env_steps"] >= 8000
    assert len(result["evals"]) >= 2
    ratio = defaults.train_steps_per_sample
    assert (result["env_steps"] - defaults.learning_starts) * ratio <= result["updates"] + 1
    assert result["updates"] <= result["env_steps"] * ratio
    assert result["policy_version"] == result["updates"]


def test_a_job_in_one_process_collects_into_the_learner_and_acts_on_what_it_published() -> None:
    # Given the shipped job with small tasks, in one process
    job = JobConfig.load(
        None, **{"collector.n_sample": 512, "env.collector_env_num": 8, "algorithm.learning_starts": 512}
    )
    run = InProcessJob(job, seed=1)
    try:
        assert run.read() is not None and run.read().iter == 0  # type: ignore[union-attr]
        # When it collects twice (past learning_starts) and trains
        steps = run.collect() + run.collect()
        updates = run.train()
        # Then every step went into the learner's replay, the updates follow the replay ratio,
        # and the actors' weights are the learner's newest
        assert steps == run.env_steps >= 1024
        assert run.learner.replay is not None and len(run.learner.replay) == steps  # type: ignore[attr-defined]
        assert updates == run.updates == run.learner.version == int((steps - 512) / 32) > 0
        published = run.read()
        assert published is not None and published.iter == run.learner.version
        # and an eval task runs greedy episodes on fresh envs of the eval seed
        reward = run.evaluate(seed=123)
        assert reward > 0 and run.evaluate(seed=123) == reward
    finally:
        run.close()
