"""``warren.Job``: a job loaded and changed from Python, with the checks a job file gets.

* ``from_toml`` reads a shipped job and ``replace`` changes keys by section, returning a new job;
* a new env id takes the new env's spaces (and its stop value), a new algorithm name starts
  that section afresh; an unknown key is refused naming it;
* a run's ``job.json`` reads back to the same job.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import warren
from tests.trained_policies import CONFIGS


def test_a_job_is_read_and_changed_by_section_into_a_new_job() -> None:
    job = warren.Job.from_toml(CONFIGS / "cartpole_ppo.toml")
    changed = job.replace(env={"stop_value": 300.0}, algorithm={"lr": 0.001})
    assert (changed.config.env.stop_value, changed.config.bound.config.lr) == (300.0, 0.001)
    assert job.config.env.stop_value != 300.0  # the first is unchanged
    assert changed.config.model == job.config.model


def test_a_new_env_takes_its_spaces_and_a_new_algorithm_starts_its_section_afresh() -> None:
    job = warren.Job.from_toml(CONFIGS / "cartpole_dqn.toml")
    pendulum = job.replace(env={"id": "Pendulum-v1", "stop_value": -200.0}, algorithm={"name": "sac"})
    assert pendulum.env_id == "Pendulum-v1" and pendulum.algorithm == "sac"
    assert pendulum.config.spaces is not None and pendulum.config.spaces.action.shape == (1,)
    # the env's own stop value when none is given
    acrobot = job.replace(env={"id": "Acrobot-v1"})
    assert acrobot.config.env.stop_value == -100.0


def test_an_unknown_key_is_refused_naming_it() -> None:
    with pytest.raises(warren.ConfigurationError, match="lrr"):
        warren.Job.from_toml(None, algorithm={"lrr": 0.1})


def test_a_runs_job_json_reads_back_to_the_same_job(tmp_path: Path) -> None:
    job = warren.Job.from_toml(CONFIGS / "pendulum_sac.toml")
    (tmp_path / "job.json").write_text(job.config.to_json())
    assert warren.Job.from_run(tmp_path).config == job.config
