"""``warren.load_policy``: a trained policy from its file alone, acting as the collectors' actor, no broker.

* in a fresh process, a loaded CartPole DQN or PPO policy chooses the collectors' actions
  on the same observations, one at a time or as a batch, without importing torch;
* a run directory gives its best policy, else its latest; a file from before policy files
  carried their job is read with its run's ``job.json``;
* bad input is a clear error: not a warren policy, a plug-in that is not installed (named
  with its version), an env or observations of other spaces.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import warren
from tests.trained_policies import collectors_actor, job_of, observations, write_policy
from worker.agent.header import JOB_KEY
from worker.storage import PolicyStore
from worker.storage.policies import read_policy_header

ACT_IN_A_FRESH_PROCESS = """
import json, sys
import numpy as np
import warren

policy = warren.load_policy(sys.argv[1])
obs = np.load(sys.argv[2])
print(json.dumps({
    "batch": policy.act(obs).tolist(),
    "single": [policy.act(o).tolist() for o in obs],
    "torch": "torch" in sys.modules,
}))
"""


@pytest.mark.parametrize("algorithm", ["dqn", "ppo"])
def test_a_policy_loaded_in_a_fresh_process_acts_as_the_collectors_actor_without_torch(
    tmp_path: Path, algorithm: str
) -> None:
    # Given a CartPole run directory whose learner wrote its policy file
    job = job_of(**{"algorithm.name": algorithm})
    run = tmp_path / "run"
    write_policy(run, job, seed=3)
    obs = observations(job, 64, seed=1)
    np.save(tmp_path / "obs.npy", obs)
    # When a fresh process (no broker anywhere) loads it and acts on observations
    done = subprocess.run(
        [sys.executable, "-c", ACT_IN_A_FRESH_PROCESS, str(run), str(tmp_path / "obs.npy")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    acted = json.loads(done.stdout.strip().splitlines()[-1])
    # Then it chose the actions the collectors' actor chooses, one at a time and as a batch
    actor = collectors_actor(job, run / "policy", job.coordinator.policy_name)
    expected = actor.act(obs, explore=False, settings={})[0].tolist()
    assert acted["batch"] == expected == acted["single"]
    assert len(set(expected)) > 1  # the observations tell the actions apart
    # and never imported torch (the built-in MLP actors run in numpy)
    assert acted["torch"] is False


def test_one_observation_gives_one_action_and_a_batch_a_batch_in_the_spaces_dtype(tmp_path: Path) -> None:
    # Given a loaded CartPole policy and a CartPole env, whose observations are float32
    job = job_of()
    write_policy(tmp_path, job)
    env = gym.make("CartPole-v1")
    policy = warren.load_policy(tmp_path, env=env)
    obs, _ = env.reset(seed=0)
    # When it acts on one observation, on the same as float64, and on a batch of three
    one = policy.act(obs)
    as_double = policy.act(obs.astype(np.float64))
    batch = policy.act(np.stack([obs, obs, obs]))
    # Then one action of the env's space comes back for one observation, three for three
    assert np.shape(one) == () and env.action_space.contains(int(one))
    assert as_double == one
    assert batch.shape == (3,) and (batch == one).all()
    # and an observation of another shape is refused naming both shapes
    with pytest.raises(warren.PolicyMismatch, match=r"shape \[5\].*Box\(4,\)"):
        policy.act(np.zeros(5, dtype=np.float32))


def test_an_env_with_other_spaces_is_refused_naming_both(tmp_path: Path) -> None:
    # Given a CartPole policy
    write_policy(tmp_path, job_of())
    # When it is loaded for Pendulum
    with pytest.raises(warren.PolicyMismatch) as refused:
        warren.load_policy(tmp_path, env=gym.make("Pendulum-v1"))
    # Then the error says what the policy was trained on and what the env has
    assert "Discrete(2)" in refused.value.message and "Box(1,)" in refused.value.message


def test_a_file_that_is_not_a_warren_policy_is_refused_saying_so(tmp_path: Path) -> None:
    # Given a JSON file, and a safetensors file that no warren learner wrote
    (tmp_path / "notes.json").write_text('{"hello": 1}')
    header = json.dumps({"__metadata__": {"format": "pt"}}).encode()
    (tmp_path / "other.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    # When either is loaded, Then it is refused as not a warren policy
    with pytest.raises(warren.CorruptFile, match="not a safetensors file"):
        warren.load_policy(tmp_path / "notes.json")
    with pytest.raises(warren.CorruptFile, match="not a warren policy"):
        warren.load_policy(tmp_path / "other.safetensors")
    # and a path with nothing there is a missing file
    with pytest.raises(warren.MissingFile):
        warren.load_policy(tmp_path / "nowhere")


def test_a_plugin_the_file_names_that_is_not_installed_is_named_with_its_version(tmp_path: Path) -> None:
    # Given a policy file whose header names an algorithm plug-in this machine lacks
    path = write_policy(tmp_path, job_of())
    version, meta = read_policy_header(path)
    meta.update({"algorithm": "sarsa9", "algorithm_version": "4.2.0"})
    store = PolicyStore(path.parent)
    store.write("policy_main", dict(store.read("policy_main").state_dict), version, meta)  # type: ignore[union-attr]
    # When it is loaded, Then the error names the plug-in and the version the file wants
    with pytest.raises(warren.MissingPlugin, match=r"algorithm plug-in 'sarsa9' 4\.2\.0, which is not installed"):
        warren.load_policy(path)


def test_a_run_directory_gives_its_best_policy_and_its_latest_when_it_has_none(tmp_path: Path) -> None:
    # Given a run whose learner wrote version 7 and no best policy yet
    job = job_of()
    write_policy(tmp_path, job, version=7)
    # Then the run's policy is its latest
    assert warren.load_policy(tmp_path).version == 7
    # When its coordinator kept version 5 as the best
    write_policy(tmp_path, job, version=5, name="policy_main.best", seed=1)
    # Then the run's policy is the best one, unless the latest is asked for
    assert warren.load_policy(tmp_path).version == 5
    assert warren.load_policy(tmp_path, which="latest").version == 7
    assert warren.load_policy(tmp_path / "policy" / "policy_main").version == 7


def test_a_policy_file_from_before_the_job_header_is_read_with_its_runs_job_json(tmp_path: Path) -> None:
    # Given a policy file without the job in its header (as learners wrote them before), in its run directory
    job = job_of(**{"algorithm.name": "ppo"})
    path = write_policy(tmp_path, job)
    version, meta = read_policy_header(path)
    del meta[JOB_KEY]
    store = PolicyStore(path.parent)
    store.write("policy_main", dict(store.read("policy_main").state_dict), version, meta)  # type: ignore[union-attr]
    # When it is loaded from its run, Then it acts as before
    obs = observations(job, 8)
    assert warren.load_policy(tmp_path).act(obs).tolist() == warren.load_policy(path).act(obs).tolist()
    # and without the run's job.json it is refused saying what to do
    (tmp_path / "job.json").unlink()
    with pytest.raises(warren.ConfigurationError, match="does not say which job trained it"):
        warren.load_policy(path)
