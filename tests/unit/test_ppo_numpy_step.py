"""The numpy PPO minibatch step against the torch step it is written from: whole updates, the same weights after."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from tests.rl_builders import bound, chunk_fields, flat_spaces
from worker.algorithms.ppo.learner import PPOLearner
from worker.algorithms.ppo.numpy_step import NumpyPPOStep
from worker.algorithms.ppo.torch_step import TorchPPOStep
from worker.plugins import Spaces
from worker.plugins.contract import Column
from worker.rl.chunks import ChunkLayout, read_chunk

BOX_ACTIONS = Spaces(gym.spaces.Box(-np.inf, np.inf, (3,), np.float32), gym.spaces.Box(-1.0, 1.0, (2,), np.float32))
SHIFTED_DISCRETE = Spaces(gym.spaces.Box(-np.inf, np.inf, (5,), np.float32), gym.spaces.Discrete(3, start=-1))


def learner(spaces: Spaces, backend: str, model: dict[str, Any], **config: Any) -> PPOLearner:
    settings = {"batch_steps": 64, "epochs": 3, "minibatch_size": 24, "lr": 3e-3, "ent_coef": 0.05, **config}
    algo = bound("ppo", spaces, model=model, backend=backend, **settings)
    out = algo.make_learner(seed=7)
    assert isinstance(out, PPOLearner)
    return out


def feed(target: PPOLearner, spaces: Spaces, seed: int) -> None:
    """Two chunks of 16 steps x 2 envs with episode ends inside, and actor columns a little off the policy."""
    layout = ChunkLayout.of(spaces, {"logp": Column(()), "value": Column(())})
    for part in range(2):
        fields = chunk_fields(layout, spaces, 16, 2, seed=seed + part)
        rng = np.random.default_rng(seed + part)
        fields["done"][5, 0] = True  # terminated; the next row is the reset, not a transition
        fields["valid"][6, 0] = False
        fields["truncated"][11, 1] = True
        fields["valid"][12, 1] = False
        fields["logp"] = rng.normal(-1.0, 0.3, size=fields["logp"].shape).astype(np.float32)
        fields["value"] = rng.normal(size=fields["value"].shape).astype(np.float32)
        target.add(read_chunk(fields, layout, spaces, policy_version=0))


CASES = [
    pytest.param(flat_spaces(), {"hidden_sizes": [16, 16], "activation": "tanh"}, {}, id="discrete-tanh-two-bodies"),
    pytest.param(
        SHIFTED_DISCRETE,
        {"hidden_sizes": [8], "activation": "relu"},
        {"shared_body": True, "clip_range_vf": 0.2, "normalize_obs": True},
        id="discrete-from-minus-one-relu-shared-clipped-value",
    ),
    pytest.param(BOX_ACTIONS, {"hidden_sizes": [16, 8], "activation": "tanh"}, {"log_std_init": -0.5}, id="gaussian"),
]


@pytest.mark.parametrize("spaces, model, config", CASES)
def test_the_numpy_step_leaves_the_same_weights_and_metrics_as_the_torch_step_after_two_updates(
    spaces: Spaces, model: dict[str, Any], config: dict[str, Any]
) -> None:
    # Given two learners from the same seed, one per backend, fed the same chunks
    fast, reference = learner(spaces, "numpy", model, **config), learner(spaces, "torch", model, **config)
    assert isinstance(fast.step, NumpyPPOStep) and isinstance(reference.step, TorchPPOStep)
    before = {k: v.clone() for k, v in reference.nets.actor_critic.state_dict().items()}
    runs = []
    for learner_ in (fast, reference):
        metrics = []
        for update in range(2):
            feed(learner_, spaces, seed=10 * update)
            metrics.append(learner_.update())
        runs.append(metrics)
    # Then every weight moved, and moved the same way on both
    after_fast, after_ref = fast.actor_weights(), reference.actor_weights()
    for name, tensor in after_ref.items():
        if name.startswith("obs_norm"):
            continue
        assert not torch.equal(tensor, before[name]), f"{name} did not change"
        torch.testing.assert_close(after_fast[name], tensor, rtol=2e-4, atol=2e-5, msg=name)
    for got, want in zip(runs[0], runs[1], strict=True):
        assert got.keys() == want.keys()
        for key in want:
            assert got[key] == pytest.approx(want[key], rel=1e-3, abs=1e-5), key


def test_a_checkpoint_of_the_numpy_step_resumes_on_the_torch_step_and_back() -> None:
    spaces, model = flat_spaces(), {"hidden_sizes": [16, 16], "activation": "tanh"}
    fast = learner(spaces, "numpy", model)
    feed(fast, spaces, seed=3)
    fast.update()
    # When its checkpoint is loaded by a torch learner and by a fresh numpy learner
    state = fast.state_dict()
    resumed = {backend: learner(spaces, backend, model) for backend in ("torch", "numpy")}
    for other in resumed.values():
        other.load_state_dict(state, version=fast.version)
        other.generator.manual_seed(99)
        feed(other, spaces, seed=4)
        other.update()
    # Then both take the same next update (Adam's moments travelled too)
    torch_net, numpy_net = resumed["torch"].actor_weights(), resumed["numpy"].actor_weights()
    for name, tensor in torch_net.items():
        torch.testing.assert_close(numpy_net[name], tensor, rtol=2e-4, atol=2e-5, msg=name)
    assert resumed["numpy"].state_dict()["adam.0.step"].item() == pytest.approx(2 * 3 * 3)


def test_backend_numpy_on_a_model_it_cannot_run_is_refused_naming_why() -> None:
    spaces = Spaces(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6))
    algo = bound("ppo", spaces, model_name="nature_cnn", model={"features": 32}, backend="numpy")
    with pytest.raises(ValueError, match="backend = 'numpy' cannot run this job: the model is not the built-in mlp"):
        algo.make_learner(seed=0)


def test_auto_picks_numpy_for_an_mlp_and_torch_for_a_cnn() -> None:
    mlp = learner(flat_spaces(), "auto", {"hidden_sizes": [8], "activation": "tanh"})
    cnn = bound(
        "ppo", Spaces(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6)),
        model_name="nature_cnn", model={"features": 32},
    ).make_learner(seed=0)  # fmt: skip
    assert isinstance(cnn, PPOLearner)
    assert isinstance(mlp.step, NumpyPPOStep) and isinstance(cnn.step, TorchPPOStep)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_a_checkpoint_with_a_tensor_of_the_wrong_shape_is_refused_and_the_learner_keeps_its_weights(
    backend: str,
) -> None:
    spaces, model = flat_spaces(), {"hidden_sizes": [16, 16], "activation": "tanh"}
    target = learner(spaces, backend, model)
    before = target.actor_weights()
    state = {k: v + 1.0 for k, v in learner(spaces, backend, model).state_dict().items()}
    state["net.vf_head.bias"] = torch.zeros(2)
    with pytest.raises(ValueError, match=r"'vf_head.bias' is \(2,\), needs \(1,\)"):
        target.load_state_dict(state, version=3)
    for name, tensor in target.actor_weights().items():
        torch.testing.assert_close(tensor, before[name], msg=name)


def test_an_update_on_read_only_chunk_arrays_raises_no_warning() -> None:
    import warnings

    spaces, model = flat_spaces(), {"hidden_sizes": [8], "activation": "tanh"}
    target = learner(spaces, "numpy", model, batch_steps=16)
    layout = ChunkLayout.of(spaces, {"logp": Column(()), "value": Column(())})
    fields = chunk_fields(layout, spaces, 16, 1)
    for array in fields.values():
        array.flags.writeable = False  # as a chunk read from a step file is
    target.add(read_chunk(fields, layout, spaces, policy_version=0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns about tensors over read-only memory
        target.update()
