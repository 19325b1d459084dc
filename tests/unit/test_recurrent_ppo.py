"""Recurrent PPO: the sequence loss by hand, sequences' start states, the actors' memory across chunks and episodes.

A counting model makes the arithmetic visible: its state ``n`` adds each observation's
value, and is zeroed where an episode begins; its feature is ``n``. With a policy head of
logits ``[0, n]`` and a value head ``n``, every number below is worked out by hand.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from tests.rl_builders import bound, chunk_fields
from worker.algorithms.ppo import PPO, PPOConfig
from worker.algorithms.ppo.learner import PPOLearner
from worker.algorithms.ppo.sequences import SequenceBatch
from worker.algorithms.ppo.torch_step import TorchPPOStep
from worker.errors import CorruptChunk, PluginFailed, TaskError
from worker.plugins import EnvContext, EnvPlugin, Spaces
from worker.plugins.contract import Chunk, Model, ModelPlugin, NoConfig
from worker.protocol import CollectorSpec, EnvSpec, PolicySpec
from worker.rl.chunks import ChunkLayout, read_chunk
from worker.rl.envs import VecEnvBatch
from worker.rl.rollout import Rollout
from worker.storage import PolicySnapshot

SPACES = Spaces(gym.spaces.Box(-10.0, 10.0, (1,), np.float32), gym.spaces.Discrete(2))


class CountingEncoder(nn.Module):
    """``n_t = n_{t-1} + obs_t`` (``n`` zeroed where ``first``); the feature is ``n``."""

    out_dim = 1

    def __init__(self) -> None:
        super().__init__()
        self.unused = nn.Parameter(torch.zeros(1))  # the optimizer needs a parameter per body

    def forward(
        self, obs: torch.Tensor, state: dict[str, torch.Tensor], first: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        n = state["n"]
        outs = []
        for t in range(first.shape[0]):
            n = n * (~first[t]).float().unsqueeze(-1) + obs[t].float().sum(-1, keepdim=True) + 0 * self.unused
            outs.append(n)
        return torch.stack(outs), {"n": n}


class Counting(ModelPlugin):
    def make_encoder(self, observation_space: gym.Space[Any], config: Any) -> nn.Module:
        return CountingEncoder()

    def state_shapes(self, observation_space: gym.Space[Any], config: Any) -> Mapping[str, tuple[int, ...]]:
        return {"n": (1,)}


def counting_ppo(spaces: Spaces = SPACES, **config: Any) -> PPO:
    settings = {"normalize_advantage": False, "ortho_init": False, "lr": 1e-9, "epochs": 1, **config}
    return PPO(PPOConfig(**settings), spaces, Model(Counting(), NoConfig(), "counting"))


def hand_heads(learner: PPOLearner) -> None:
    """Policy logits ``[0, n]``, value ``n``."""
    net = learner.nets.actor_critic
    with torch.no_grad():
        net.pi_head.weight.copy_(torch.tensor([[0.0], [1.0]]))
        net.pi_head.bias.zero_()
        net.vf_head.weight.fill_(1.0)
        net.vf_head.bias.zero_()


def log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x))


def bernoulli_entropy(n: float) -> float:
    p = 1.0 / (1.0 + math.exp(-n))
    return -(p * math.log(p) + (1 - p) * math.log(1 - p))


def column(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32).reshape(-1, 1)


def test_the_sequence_loss_is_the_hand_computed_one_masked_inside_the_sequence() -> None:
    # Given one sequence of 4 steps from state n = 3, all observations 1: an episode begins at
    # step 2 (first), and step 1 is a reset step (masked out), so the features are 4, 5, 1, 2
    learner = PPOLearner(counting_ppo(), seed=0)
    hand_heads(learner)
    features = [4.0, 5.0, 1.0, 2.0]
    actions = [1, 0, 0, 1]
    logp = [log_sigmoid(n) if a == 1 else log_sigmoid(-n) for n, a in zip(features, actions, strict=True)]
    batch = SequenceBatch(
        obs=torch.ones(4, 1, 1),
        first=torch.tensor([[False], [False], [True], [False]]),
        mask=torch.tensor([[True], [False], [True], [True]]),
        state={"pi.n": torch.tensor([[3.0]]), "vf.n": torch.tensor([[3.0]])},
        actions=torch.tensor(actions).reshape(4, 1),
        old_logp=column(logp),  # the policy that acted is this one: every ratio is 1
        old_values=column([0.0, 0.0, 0.0, 0.0]),
        advantages=column([1.0, 100.0, -2.0, 4.0]),  # the masked step's 100 must not count
        returns=column([5.0, 0.0, 3.0, 2.0]),
    )
    # When the torch step takes it
    metrics = TorchPPOStep(learner.config, learner.nets).train_step(batch)
    # Then the losses are the means over the three real steps, worked by hand
    assert metrics["pg_loss"] == pytest.approx(-(1.0 - 2.0 + 4.0) / 3, abs=1e-6)
    assert metrics["value_loss"] == pytest.approx(0.5 * ((4 - 5) ** 2 + (1 - 3) ** 2 + (2 - 2) ** 2) / 3, abs=1e-5)
    entropy = (bernoulli_entropy(4.0) + bernoulli_entropy(1.0) + bernoulli_entropy(2.0)) / 3
    assert metrics["entropy"] == pytest.approx(entropy, abs=1e-6)
    assert metrics["clip_fraction"] == 0.0 and metrics["approx_kl"] == pytest.approx(0.0, abs=1e-6)


def chunk_of(layout: ChunkLayout, valid: list[bool], start: float) -> Chunk:
    steps = len(valid)
    fields = chunk_fields(layout, SPACES, steps, 1)
    fields["obs"][:] = 1.0
    fields["valid"][:, 0] = valid
    fields["action"][:] = 1
    fields["state.pi.n"][:] = start
    fields["state.vf.n"][:] = start
    return read_chunk(fields, layout, SPACES, policy_version=0)


def test_sequences_start_from_the_chunks_state_and_the_state_unrolled_to_inside_a_chunk() -> None:
    # Given a chunk of 5 steps from state n = 3 whose step 2 is a reset step, cut into sequences of 2
    algorithm = counting_ppo(seq_len=2)
    learner = PPOLearner(algorithm, seed=0)
    hand_heads(learner)
    chunk = chunk_of(ChunkLayout.of_algorithm(algorithm), [True, True, False, True, True], start=3.0)
    # When the learner builds its sequences
    batch = learner._sequences([chunk])
    # Then they are 3 (2 + 2 + 1 padded), starting from 3, then 5 (unrolled), then 1 (the reset at row 3)
    assert batch.sequences == 3
    assert batch.state["pi.n"].flatten().tolist() == [3.0, 5.0, 1.0]
    assert batch.first[:, 2].tolist() == [False, False] and batch.first[:, 1].tolist() == [False, True]
    # and the padding and the reset step are masked out, the values are the features (4, 5, 6 | 1, 2)
    assert batch.mask.T.tolist() == [[True, True], [False, True], [True, False]]
    assert batch.old_values.T.tolist() == [[4.0, 5.0], [6.0, 1.0], [2.0, 0.0]]
    assert len(batch) == 4


def test_a_chunk_without_the_state_a_recurrent_learner_needs_is_refused_naming_it() -> None:
    algorithm = counting_ppo()
    layout = ChunkLayout.of_algorithm(algorithm)
    fields = chunk_fields(layout, SPACES, 4, 2)
    # A chunk missing the state, and one whose state has another shape, are corrupt, named as such
    missing = {k: v for k, v in fields.items() if not k.startswith("state.")}
    with pytest.raises(Exception, match=r"lacks fields \['state.pi.n', 'state.vf.n'\]"):
        read_chunk(missing, layout, SPACES, 0)
    wrong = {**fields, "state.pi.n": np.zeros((2, 3), np.float32)}
    with pytest.raises(CorruptChunk, match=r"'state.pi.n' is \(2, 3\) float32; the job's model makes it \(2, 1\)"):
        read_chunk(wrong, layout, SPACES, 0)


def test_a_recurrent_model_given_to_dqn_or_sac_is_refused_naming_both() -> None:
    cartpole = Spaces(gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2))
    with pytest.raises(TaskError, match=r"algorithm 'dqn' cannot use model 'lstm': the model keeps a recurrent state"):
        bound("dqn", cartpole, model_name="lstm")
    pendulum = Spaces(gym.spaces.Box(-np.inf, np.inf, (3,), np.float32), gym.spaces.Box(-2, 2, (1,), np.float32))
    with pytest.raises(TaskError, match=r"algorithm 'sac' cannot use model 'lstm'"):
        bound("sac", pendulum, model_name="lstm")
    # and PPO takes it, its chunks carrying both bodies' state
    ppo = bound("ppo", cartpole, {"lstm_size": 16}, model_name="lstm")
    assert {k: c.shape for k, c in ppo.memory_columns().items()} == {
        "pi.h": (16,),
        "pi.c": (16,),
        "vf.h": (16,),
        "vf.c": (16,),
    }


@dataclass
class Sink:
    chunks: list[dict[str, np.ndarray]]

    def add_chunk(self, samples: Mapping[str, np.ndarray], meta: dict[str, Any]) -> None:
        self.chunks.append(dict(samples))

    def add_info(self, info: dict[str, Any]) -> None:
        pass


class OnesEnv(gym.Env[np.ndarray, np.int64]):
    """Observes 1 every step; episodes of 3 to 7 steps (drawn at reset)."""

    observation_space = gym.spaces.Box(-10.0, 10.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.left = int(self.np_random.integers(3, 8))
        return np.ones(1, np.float32), {}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.left -= 1
        return np.ones(1, np.float32), 1.0, self.left == 0, False, {}


class OnesEnvs(EnvPlugin):
    def make_env(self, ctx: EnvContext) -> gym.Env[Any, Any]:
        return OnesEnv()


class Source:
    def __init__(self, weights: Mapping[str, torch.Tensor]) -> None:
        self.weights = dict(weights)

    def read(self) -> PolicySnapshot:
        return PolicySnapshot(dict(self.weights), iter=1, meta={})


def test_the_actors_state_is_carried_across_chunks_and_tasks_and_zeroed_where_an_episode_begins() -> None:
    # Given the counting model acting in envs whose observations are all 1, so its state is the
    # count of steps since the episode began; chunks of 4 steps, three tasks on the same envs
    algorithm = counting_ppo()
    learner = PPOLearner(algorithm, seed=0)
    envs = VecEnvBatch(OnesEnvs(), EnvContext("Ones-v0", 3, seed=1))
    sink = Sink([])
    spec = CollectorSpec(
        env=EnvSpec("Ones-v0", 3, seed=1), policy=PolicySpec("ppo"), n_sample=30, traj_len=4, policy_update_path="p"
    )
    try:
        for _ in range(3):
            Rollout(spec, algorithm, envs, sink, Source(learner.actor_weights()), stop=threading.Event()).run()
    finally:
        envs.close()
    # Then every chunk's state is, per env, the steps since its episode began (carried over the
    # chunk and task boundaries, zeroed after each reset step), counted from the chunks themselves
    since = np.zeros(3)
    for fields in sink.chunks:
        assert fields["state.pi.n"][:, 0].tolist() == since.tolist()
        assert fields["state.vf.n"][:, 0].tolist() == since.tolist()
        for valid in fields["valid"]:
            since = np.where(valid, since + 1, 0.0)
    assert len(sink.chunks) >= 9 and since.max() > 0
    # (which a run that drops either would not give: the episodes span chunks, and end inside them)
    resets = np.concatenate([~fields["valid"] for fields in sink.chunks])
    assert resets.any()


def test_a_model_whose_state_is_not_its_declared_shapes_fails_where_it_is_built_naming_it() -> None:
    class Forgetful(CountingEncoder):
        def forward(
            self, obs: torch.Tensor, state: dict[str, torch.Tensor], first: torch.Tensor
        ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            out, _ = super().forward(obs, state, first)
            return out, {"n": torch.zeros(first.shape[1], 3)}

    class Liar(Counting):
        def make_encoder(self, observation_space: gym.Space[Any], config: Any) -> nn.Module:
            return Forgetful()

    with pytest.raises(PluginFailed, match=r"returned the state \{'n': \(2, 3\)\}; its state_shapes make it"):
        Model(Liar(), NoConfig(), "liar").encoder(SPACES.observation)


def test_warren_checks_steps_and_update_pass_for_the_shipped_recurrent_job_whose_rate_limit_is_below_them() -> None:
    from pathlib import Path

    from worker.cli.check import CHECK_STEPS, steps_and_update
    from worker.job import JobConfig

    job = JobConfig.load(Path(__file__).resolve().parents[2] / "configs" / "cartpole_novel_ppo_lstm.toml")
    assert job.coordinator.max_run_ahead_samples < CHECK_STEPS
    # The check's collect task of CHECK_STEPS starts, the LSTM acts, and the learner's sequences update once
    assert "update 1:" in steps_and_update(job)


def test_rewards_are_scaled_by_the_running_std_of_their_discounted_sums_reset_at_episode_ends() -> None:
    from worker.algorithms.ppo.reward_scale import RewardScale

    # Given one env's chunk of rewards 1, 1, 1 whose episode ends at step 1, discount 0.5
    algorithm = counting_ppo()
    layout = ChunkLayout.of_algorithm(algorithm)
    fields = chunk_fields(layout, SPACES, 3, 1)
    fields["reward"][:] = 1.0
    fields["done"][1, 0] = True
    scale = RewardScale(0.5)
    # When its sums are taken in: 1, then 1 x 0.5 + 1 = 1.5 (the episode ends), then 1 again
    scale.update(read_chunk(fields, layout, SPACES, 0))
    # Then the variance is theirs, (1 + 2.25 + 1) / 3 - (7 / 6)^2 (the prior weighs 1e-4 samples)
    assert scale.var == pytest.approx((1 + 2.25 + 1) / 3 - (7 / 6) ** 2, rel=5e-3)
    assert scale.scale == pytest.approx(math.sqrt(scale.var), rel=1e-6)
