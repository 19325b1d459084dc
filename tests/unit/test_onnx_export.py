"""``warren export --onnx``: the built-in actors as ONNX graphs whose actions equal warren's actor's (1e-5).

For CartPole DQN (greedy) and PPO (the most likely action), Pendulum SAC (the mean action
scaled into the box) and DQN and PPO on a Nature CNN over small fake frames, onnxruntime's
actions on random observations of the job's space are the actor's; the command checks
it too, and says when an algorithm has no built-in actor to export.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import warren
from tests.trained_policies import image_job, job_of, observations, write_policy
from worker.cli import main
from worker.job import JobConfig
from worker.storage import PolicyStore
from worker.storage.policies import read_policy_header

ort: Any = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

EXAMPLE_JOB = Path(__file__).resolve().parents[2] / "examples" / "warren-example" / "job.toml"
JOBS: dict[str, Callable[[], JobConfig]] = {
    "cartpole dqn": job_of,
    "cartpole ppo": lambda: job_of(**{"algorithm.name": "ppo"}),
    "pendulum sac": lambda: job_of("pendulum_sac.toml"),
    "nature cnn dqn": lambda: image_job("dqn"),
    "nature cnn ppo": lambda: image_job("ppo"),
}


def centre_q_values(path: Path, job: JobConfig, obs: np.ndarray[Any, Any]) -> None:
    """Make an untrained Q-network's greedy action depend on the observation: its head's bias cancels the
    mean feature of ``obs`` (a fresh CNN's features of random frames are so alike that one action wins them all)."""
    import torch

    version, meta = read_policy_header(path)
    store = PolicyStore(path.parent)
    weights = dict(store.read(path.name).state_dict)  # type: ignore[union-attr]
    bound: Any = job.bound
    network = bound.q_network()
    network.load_state_dict(weights)
    with torch.no_grad():
        features = network.encoder(torch.as_tensor(obs))
    weights["head.bias"] = -(weights["head.weight"] @ features.mean(0))
    store.write(path.name, weights, version, meta)


@pytest.mark.parametrize("name", list(JOBS))
def test_onnxruntime_chooses_the_actors_actions_on_random_observations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    # Given a policy file of the job
    job: JobConfig = JOBS[name]()
    obs = np.ascontiguousarray(observations(job, 100, seed=7))
    path = write_policy(tmp_path / "run", job, seed=5)
    if name == "nature cnn dqn":
        centre_q_values(path, job, obs)
    # When it is exported
    out = tmp_path / "actor.onnx"
    code = main(["export", str(tmp_path / "run"), "--onnx", str(out), "--log-level", "ERROR"])
    # Then the command checked it and says it agrees
    assert code == 0, capsys.readouterr().err
    assert "agrees with warren's actor" in capsys.readouterr().out
    # and onnxruntime's actions for a batch of random observations are the actor's, to 1e-5
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    exported = session.run(["action"], {"obs": obs})[0]
    expected: Any = warren.load_policy(tmp_path / "run").act(obs)
    assert exported.shape == expected.shape
    np.testing.assert_allclose(exported, expected, rtol=0, atol=1e-5)
    if expected.dtype.kind == "i":
        assert len(np.unique(expected)) > 1  # the observations tell the actions apart


def test_a_plugins_algorithm_is_refused_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("warren_example")
    # Given a policy of the example package's job (its reinforce algorithm)
    write_policy(tmp_path / "run", JobConfig.load(EXAMPLE_JOB))
    # When it is exported, Then the command says there is no built-in actor to export, exit code 2
    code = main(["export", str(tmp_path / "run"), "--onnx", str(tmp_path / "x.onnx"), "--log-level", "ERROR"])
    err = capsys.readouterr().err
    assert code == 2 and "knows the built-in actors (dqn, ppo, sac); 'reinforce'" in err
    assert not (tmp_path / "x.onnx").exists()
