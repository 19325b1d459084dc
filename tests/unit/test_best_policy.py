"""The best policy a run's evals saw: ``<policy name>.best``, with the eval in its header, kept across ``--resume``.

* an eval at least as good as the best so far has its copy of the policy published as the
  best (ties go to the newer version; the untrained version 0 never is the best), its
  header saying the eval's return, episodes, seeds and the run's env steps;
* an eval copy that no longer holds the evaluated version is not kept;
* a resumed run starts from the best file's own header, so only a better eval replaces it;
* a policy copy can add metadata to the header without touching the tensors.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tests.trained_policies import job_of, write_policy
from worker.coordinator.best_policy import BestPolicy
from worker.coordinator.policy_files import RunPolicy
from worker.job import JobConfig
from worker.protocol import FinishInfo
from worker.storage import PolicyStore
from worker.storage.policies import read_policy_header


def eval_of(job: JobConfig, copy: str, version: int, returns: list[float]) -> tuple[Any, FinishInfo]:
    """An eval task of the job that read ``copy``, and its finish info: policy ``version``, these returns."""
    task = SimpleNamespace(start=SimpleNamespace(cfg=job.eval_spec(copy)))
    finish = FinishInfo.measured(
        eval_flag=True,
        env_num=len(returns),
        duration=1.0,
        train_iter=version,
        collector_done=True,
        predefined_episode_count=len(returns),
        steps=100,
        samples=0,
        returns=returns,
    )
    return task, finish


@pytest.fixture
def job() -> JobConfig:
    return job_of()


def evaluate(best: BestPolicy, job: JobConfig, run: Path, version: int, mean: float, *, env_steps: int) -> bool:
    """The coordinator's copy for an eval holds ``version`` (weights seeded by it); the eval returns ``mean``."""
    write_policy(run, job, seed=version, version=version, name="policy_main.eval")
    task, finish = eval_of(job, "policy_main.eval", version, [mean - 1.0, mean + 1.0])
    return best.evaluated(task, finish, env_steps)


def test_the_best_eval_so_far_keeps_its_policy_with_the_eval_in_its_header(tmp_path: Path, job: JobConfig) -> None:
    best = BestPolicy(RunPolicy(tmp_path / "policy", "policy_main"))
    # Given evals of the untrained policy (at 100), then of versions 3 (50), 5 (40) and 7 (50 again)
    kept = [
        evaluate(best, job, tmp_path, 0, 100.0, env_steps=1000),
        evaluate(best, job, tmp_path, 3, 50.0, env_steps=3000),
        evaluate(best, job, tmp_path, 5, 40.0, env_steps=5000),
        evaluate(best, job, tmp_path, 7, 50.0, env_steps=7000),
    ]
    # Then version 3 was the best, then version 7 (as good, and newer); never the untrained one
    assert kept == [False, True, False, True]
    assert best.version == 7 and best.eval_return == 50.0
    # and the best file holds version 7's weights, its header the eval that chose it
    store = PolicyStore(tmp_path / "policy")
    version, meta = read_policy_header(tmp_path / "policy" / "policy_main.best")
    assert version == 7
    spec = job.eval_spec()
    assert {k: meta[k] for k in ("eval_return", "eval_episodes", "env_steps", "eval_seed", "eval_envs")} == {
        "eval_return": "50.0",
        "eval_episodes": "2",
        "env_steps": "7000",
        "eval_seed": str(spec.env.seed),
        "eval_envs": str(spec.env.env_num),
    }
    assert meta["job"] == read_policy_header(tmp_path / "policy" / "policy_main.eval")[1]["job"]
    best_weights = store.read("policy_main.best", numpy=True).state_dict  # type: ignore[union-attr]
    evaluated = store.read("policy_main.eval", numpy=True).state_dict  # type: ignore[union-attr]
    assert all(np.array_equal(best_weights[k], evaluated[k]) for k in evaluated)


def test_an_eval_copy_that_no_longer_holds_the_evaluated_version_is_not_kept(tmp_path: Path, job: JobConfig) -> None:
    best = BestPolicy(RunPolicy(tmp_path / "policy", "policy_main"))
    # Given the eval copy holds version 8, and an eval of version 7 ends
    write_policy(tmp_path, job, version=8, name="policy_main.eval")
    task, finish = eval_of(job, "policy_main.eval", 7, [100.0])
    # Then nothing is kept as the best
    assert not best.evaluated(task, finish, 100)
    assert not (tmp_path / "policy" / "policy_main.best").exists()


def test_evals_of_the_learners_own_file_keep_no_best(tmp_path: Path, job: JobConfig) -> None:
    # Given evals that read the learner's file itself (a coordinator without the policy directory's copies)
    write_policy(tmp_path, job, version=4)
    task, finish = eval_of(job, "policy_main", 4, [100.0])
    # Then no best is kept (the file may hold a newer version than the one evaluated)
    assert not BestPolicy(RunPolicy(tmp_path / "policy", "policy_main")).evaluated(task, finish, 100)


def test_a_resumed_run_replaces_its_best_only_with_a_better_eval(tmp_path: Path, job: JobConfig) -> None:
    # Given a run that kept version 3 at 50 as its best
    first = BestPolicy(RunPolicy(tmp_path / "policy", "policy_main"))
    assert evaluate(first, job, tmp_path, 3, 50.0, env_steps=3000)
    # When it is resumed (a new coordinator) and evals of versions 9 (at 45) and 11 (at 60) end
    resumed = BestPolicy(RunPolicy(tmp_path / "policy", "policy_main"))
    resumed.resumed()
    assert (resumed.version, resumed.eval_return) == (3, 50.0)
    # Then the worse eval does not replace the best, the better one does
    assert not evaluate(resumed, job, tmp_path, 9, 45.0, env_steps=9000)
    assert read_policy_header(tmp_path / "policy" / "policy_main.best")[0] == 3
    assert evaluate(resumed, job, tmp_path, 11, 60.0, env_steps=11000)
    assert read_policy_header(tmp_path / "policy" / "policy_main.best")[0] == 11


def test_a_copy_adds_metadata_to_the_header_and_leaves_the_tensors(tmp_path: Path, job: JobConfig) -> None:
    # Given a policy file
    write_policy(tmp_path, job, version=2)
    store = PolicyStore(tmp_path / "policy")
    # When it is copied with more metadata
    assert store.copy("policy_main", "copy", meta={"eval_return": "1.5"}) == 2
    # Then the copy's header has it besides the original's, and the tensors are the same
    original, copied = store.read("policy_main", numpy=True), store.read("copy", numpy=True)
    assert original is not None and copied is not None
    assert copied.meta == {**original.meta, "eval_return": "1.5"} and copied.iter == 2
    assert all(np.array_equal(original.state_dict[k], copied.state_dict[k]) for k in original.state_dict)
    # and the format and version cannot be changed by a copy
    with pytest.raises(ValueError, match="policy_version"):
        store.copy("policy_main", "copy", meta={"policy_version": "9"})
