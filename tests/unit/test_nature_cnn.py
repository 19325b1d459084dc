"""The built-in ``nature_cnn`` model: uint8 frame stacks in, features out; flat vectors refused before anything runs."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from tests.rl_builders import bound, chunk_fields, flat_spaces
from worker.models.nature_cnn import NatureCNN, NatureCNNConfig
from worker.models.nature_cnn_encoder import NatureCNNEncoder
from worker.plugins import Spaces, UnsupportedSpace
from worker.rl.chunks import ChunkLayout, read_chunk

PONG = Spaces(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6))


def test_a_batch_of_uint8_stacks_becomes_a_batch_of_features() -> None:
    torch.manual_seed(0)
    encoder = NatureCNN().make_encoder(PONG.observation, NatureCNNConfig(features=32))
    frames = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    out = encoder(frames)
    assert out.shape == (5, 32) and out.dtype == torch.float32 and encoder.out_dim == 32
    # the uint8 frames are scaled to [0, 1] inside the module: the same as floats divided by 255
    torch.testing.assert_close(out, encoder(frames.float() / 255.0 * 255.0))
    assert isinstance(encoder, NatureCNNEncoder) and encoder.scale == pytest.approx(1 / 255)


def test_a_single_grey_image_is_one_channel() -> None:
    encoder = NatureCNN().make_encoder(gym.spaces.Box(0, 255, (84, 84), np.uint8), NatureCNNConfig(features=8))
    assert encoder(torch.zeros(2, 84, 84, dtype=torch.uint8)).shape == (2, 8)


@pytest.mark.parametrize(
    ("space", "why"),
    [
        (gym.spaces.Box(-1, 1, (4,), np.float32), r"needs an image observation.*Box\(4,\) float32"),
        (gym.spaces.Box(0, 255, (4, 20, 20), np.uint8), r"at least 36x36"),
        (gym.spaces.Discrete(3), r"needs an image observation.*Discrete\(3\)"),
    ],
)
def test_a_space_the_convolutions_cannot_take_is_refused_naming_the_model_and_the_space(
    space: gym.Space[object], why: str
) -> None:
    with pytest.raises(UnsupportedSpace, match=rf"model 'nature_cnn' cannot take observations .*{why}"):
        bound("ppo", Spaces(space, gym.spaces.Discrete(2)), model_name="nature_cnn")


def test_a_flat_cartpole_job_on_the_cnn_is_refused_by_dqn_too() -> None:
    with pytest.raises(UnsupportedSpace, match=r"model 'nature_cnn' cannot take observations Box\(4,\) float32"):
        bound("dqn", flat_spaces(), model_name="nature_cnn")


def test_ppo_on_images_keeps_frames_uint8_and_normalises_nothing() -> None:
    algo = bound(
        "ppo", PONG, model={"features": 16}, model_name="nature_cnn", normalize_obs=True, batch_steps=16, epochs=1
    )
    net = algo.network(seed=0)  # type: ignore[attr-defined]
    assert net.obs_norm is None  # running statistics are for float vectors, not pixels
    x = net.inputs(np.zeros((3, 4, 84, 84), np.uint8))
    assert x.dtype == torch.uint8
    # and its learner trains on a chunk of stored frames
    layout = ChunkLayout.of(algo.spaces, algo.columns())
    fields = chunk_fields(layout, algo.spaces, 8, 2)
    fields["logp"][:] = -np.log(6)
    learner = algo.make_learner(seed=0)
    learner.add(read_chunk(fields, layout, algo.spaces, 0))
    assert learner.can_update()
    metrics = learner.update()
    assert learner.version == 1 and np.isfinite(metrics["pg_loss"])


def test_dqn_on_images_acts_and_learns_through_the_cnn() -> None:
    algo = bound(
        "dqn", PONG, model={"features": 16}, model_name="nature_cnn", batch_size=4, learning_starts=8,
        train_steps_per_sample=1.0, replay_capacity=64,
    )  # fmt: skip
    actor = algo.make_actor(seed=0)
    actions, _ = actor.act(np.zeros((2, 4, 84, 84), np.uint8), explore=False, settings={"epsilon": 0.0})
    assert actions.shape == (2,)
    layout = ChunkLayout.of(algo.spaces, algo.columns())
    learner = algo.make_learner(seed=0)
    learner.add(read_chunk(chunk_fields(layout, algo.spaces, 8, 2), layout, algo.spaces, 0))
    assert learner.can_update()
    learner.update()
    assert learner.version == 1


def test_a_shared_body_runs_the_cnn_once_for_both_heads_and_has_one_set_of_weights() -> None:
    algo = bound("ppo", PONG, model={"features": 16}, model_name="nature_cnn", shared_body=True)
    net = algo.network(seed=0)  # type: ignore[attr-defined]
    assert net.vf_body is None and not any(k.startswith("vf_body") for k in net.state_dict())
    x = net.inputs(np.random.default_rng(0).integers(0, 256, (3, 4, 84, 84), dtype=np.uint8))
    with torch.no_grad():
        policy, value = net.policy_and_value(x)
        torch.testing.assert_close(value, net.value(x))
        torch.testing.assert_close(
            policy.log_prob(torch.tensor([0, 1, 2])), net.policy(x).log_prob(torch.tensor([0, 1, 2]))
        )


def test_an_image_dqn_whose_replay_would_not_fit_its_memory_bound_is_refused_saying_the_bytes() -> None:
    from worker.errors import TaskError

    algo = bound("dqn", PONG, model_name="nature_cnn", replay_capacity=1_000_000, replay_max_gib=8.0)
    # frames kept once: 84 x 84 x 1.125 frame slots + 9 int64 frame numbers + action, reward, done
    assert algo.replay_bytes_per_transition == 7938 + 72 + 13  # type: ignore[attr-defined]
    with pytest.raises(TaskError, match=r"replay buffer would take 7.5 GiB \(1000000 transitions x 8023 bytes\)"):
        bound("dqn", PONG, model_name="nature_cnn", replay_capacity=1_000_000, replay_max_gib=4.0)
