"""The numpy SAC train step against the torch step it is written from: the same weights, temperature and metrics."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from tests.rl_builders import bound, chunk_fields
from worker.algorithms.sac.learner import SACLearner
from worker.algorithms.sac.numpy_step import NumpySACStep
from worker.algorithms.sac.torch_step import TorchSACStep
from worker.plugins import Spaces
from worker.rl.chunks import ChunkLayout, read_chunk

# An action box that is neither [-1, 1] nor symmetric, so the scaling into the critics counts.
SPACES = Spaces(
    gym.spaces.Box(-2.0, 2.0, (3,), np.float32),
    gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 3.0], np.float32)),
)
MODEL = {"hidden_sizes": [16, 8], "activation": "relu"}


def learner(backend: str, **config: Any) -> SACLearner:
    # A large learning rate and a tight clip, so that a wrong gradient moves the weights visibly.
    settings = {"batch_size": 32, "learning_starts": 32, "lr": 1e-2, "max_grad_norm": 5.0, **config}
    out = bound("sac", SPACES, model=MODEL, backend=backend, **settings).make_learner(seed=3)
    assert isinstance(out, SACLearner)
    return out


def feed(target: SACLearner, seed: int) -> None:
    """40 steps x 2 envs of transitions with an episode end inside."""
    layout = ChunkLayout.of(SPACES, {})
    fields = chunk_fields(layout, SPACES, 40, 2, seed=seed)
    fields["reward"] = np.random.default_rng(seed).normal(size=fields["reward"].shape).astype(np.float32)
    fields["done"][7, 1] = True
    fields["valid"][8, 1] = False
    target.add(read_chunk(fields, layout, SPACES, policy_version=0))


Edit = Callable[[dict[str, torch.Tensor]], None]


def trained(
    backend: str, updates: int, edit: Edit | None = None, **config: Any
) -> tuple[SACLearner, list[dict[str, float]]]:
    """A learner whose starting weights ``edit`` changed (through a checkpoint), after ``updates`` steps."""
    target = learner(backend, **config)
    if edit is not None:
        state = target.state_dict()
        edit(state)
        target.load_state_dict(state, version=0)
    feed(target, seed=1)
    return target, [target.update() for _ in range(updates)]


def log_std_at_the_clamp(state: dict[str, torch.Tensor]) -> None:
    # log std starts near the clamp's top (2): rows on either side of it, so the clamp's gradient counts
    state["policy.log_std.bias"] = state["policy.log_std.bias"] * 0.0 + 2.0


CASES = [
    pytest.param({}, None, id="auto-alpha-clip"),
    pytest.param({"auto_alpha": False, "max_grad_norm": 0.0}, None, id="fixed-alpha-no-clip"),
    pytest.param({"max_grad_norm": 0.0}, log_std_at_the_clamp, id="log-std-at-the-clamp"),
    pytest.param({"critic_input": "features"}, None, id="action-beside-the-features"),
]


@pytest.mark.parametrize("config, edit", CASES)
def test_the_numpy_step_leaves_the_same_weights_temperature_and_metrics_as_the_torch_step(
    config: dict[str, Any], edit: Edit | None
) -> None:
    # Given two learners from the same seed, one per backend, fed the same transitions
    before = trained("torch", 0, edit, **config)[0].state_dict()
    fast, fast_metrics = trained("numpy", 4, edit, **config)
    reference, ref_metrics = trained("torch", 4, edit, **config)
    assert isinstance(fast.step, NumpySACStep) and isinstance(reference.step, TorchSACStep)
    # Then after four steps every tensor moved (the targets and the temperature too) and moved the same way
    got, want = fast.state_dict(), reference.state_dict()
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        if name.endswith(("low", "high")) or (name == "log_alpha" and not config.get("auto_alpha", True)):
            torch.testing.assert_close(got[name], tensor, msg=name)
            continue
        assert not torch.equal(tensor, before[name]), f"{name} did not change"
        torch.testing.assert_close(got[name], tensor, rtol=1e-4, atol=2e-5, msg=name)
    for mine, theirs in zip(fast_metrics, ref_metrics, strict=True):
        assert mine.keys() == theirs.keys()
        for key in theirs:
            assert mine[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-5), key


def test_the_published_policy_is_the_numpy_steps_newest() -> None:
    fast, _ = trained("numpy", 2)
    first = fast.actor_weights()
    fast.update()
    second = fast.actor_weights()
    assert not torch.equal(first["mean.weight"], second["mean.weight"])
    assert isinstance(fast.step, NumpySACStep)
    np.testing.assert_array_equal(second["mean.weight"].numpy(), fast.step.policy.flat.views["mean.weight"])


def test_a_checkpoint_of_the_numpy_step_resumes_on_the_torch_step_and_back() -> None:
    fast, _ = trained("numpy", 2)
    state = fast.state_dict()
    # When its checkpoint is loaded by a torch learner and by a fresh numpy learner, which then take one step
    resumed = {backend: learner(backend) for backend in ("torch", "numpy")}
    for other in resumed.values():
        other.load_state_dict(state, version=fast.version)
        feed(other, seed=5)
        other.update()
    # Then both start from it (not from their own initial weights) and take the same step
    got, want = resumed["numpy"].state_dict(), resumed["torch"].state_dict()
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, rtol=1e-4, atol=2e-5, msg=name)
    fresh = learner("numpy")
    feed(fresh, seed=5)
    fresh.update()
    assert not torch.allclose(fresh.state_dict()["policy.mean.weight"], got["policy.mean.weight"])


def test_backend_numpy_on_a_model_it_cannot_run_is_refused_naming_why() -> None:
    algo = bound("sac", SPACES, model={"hidden_sizes": [8], "activation": "tanh"}, backend="numpy")
    with pytest.raises(ValueError, match="backend = 'numpy' cannot run this job: activation 'tanh'"):
        algo.make_learner(seed=0)


def test_auto_picks_numpy_for_a_relu_mlp_and_torch_otherwise() -> None:
    relu = bound("sac", SPACES, model=MODEL).make_learner(seed=0)
    tanh = bound("sac", SPACES, model={"hidden_sizes": [8], "activation": "tanh"}).make_learner(seed=0)
    assert isinstance(relu, SACLearner) and isinstance(tanh, SACLearner)
    assert isinstance(relu.step, NumpySACStep) and isinstance(tanh.step, TorchSACStep)


def test_the_numpy_actor_acts_as_the_torch_actor_on_the_same_weights() -> None:
    obs = np.random.default_rng(4).uniform(-2, 2, size=(4_000, 3)).astype(np.float32)
    weights = bound("sac", SPACES, model=MODEL).policy_network(seed=8).state_dict()  # type: ignore[attr-defined]
    weights["log_std.bias"] = weights["log_std.bias"] * 0.0 - 1.0  # a spread of ~0.37, not ~1
    fast = bound("sac", SPACES, model=MODEL).make_actor(seed=0)
    reference = bound("sac", SPACES, model=MODEL, backend="torch").make_actor(seed=0)
    assert type(fast).__name__ == "NumpySACActor" and type(reference).__name__ == "SACActor"
    fast.load_weights({k: v.numpy() for k, v in weights.items()})  # as a torch-free collector reads them
    reference.load_weights(weights)
    # Greedy: the same actions
    got, want = fast.act(obs, explore=False, settings={})[0], reference.act(obs, explore=False, settings={})[0]
    assert got.dtype == want.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # Exploring, 20,000 draws in one state: inside the box, spread as the torch actor's draws are
    one = np.repeat(obs[:1], 20_000, axis=0)
    mine, theirs = fast.act(one, explore=True, settings={})[0], reference.act(one, explore=True, settings={})[0]
    low, high = SPACES.action.low, SPACES.action.high  # type: ignore[attr-defined]
    assert ((mine >= low) & (mine <= high)).all()
    spread = theirs.std(axis=0)
    assert (spread > 0.05).all()
    np.testing.assert_allclose(mine.mean(axis=0), theirs.mean(axis=0), atol=float(6 * spread.max() / np.sqrt(20_000)))
    np.testing.assert_allclose(mine.std(axis=0), spread, rtol=0.04)
