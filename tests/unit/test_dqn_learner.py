"""DQN's learner: the torch train step (the reference), the numpy one held to it, checkpoints, the replay ratio."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from tests.rl_builders import bound, chunk_fields, flat_spaces
from worker.algorithms.dqn import DQN, DQNConfig
from worker.algorithms.dqn.learner import DQNLearner
from worker.algorithms.dqn.network import QNetwork
from worker.algorithms.dqn.numpy_step import NumpyDQNStep
from worker.algorithms.dqn.torch_step import TorchDQNStep
from worker.plugins import Spaces
from worker.rl.chunks import ChunkLayout, read_chunk

OBS_DIM, N_ACTIONS = 5, 3
#: Small enough to run 4 x 240 torch steps in about a second; two hidden layers of different
#: widths, so a mixed-up weight layout cannot go unnoticed.
HIDDEN = (32, 16)
CONFIG = DQNConfig(batch_size=32, target_update_interval=40, max_grad_norm=0.25)
#: Float32 weights of the two implementations after 200+ steps: they agree to ~1e-7 in practice.
WEIGHT_ATOL = 1e-5
SPACES = flat_spaces(OBS_DIM, N_ACTIONS)

Batch = dict[str, np.ndarray]


def algorithm(config: DQNConfig = CONFIG, hidden: tuple[int, ...] = HIDDEN, **model: Any) -> DQN:
    algo = bound("dqn", SPACES, {"hidden_sizes": list(hidden), **model}, **_plain(config))
    assert isinstance(algo, DQN)
    return algo


def _plain(config: DQNConfig) -> dict[str, Any]:
    from worker.plugins import config_to_dict

    return config_to_dict(config)


def pair(config: DQNConfig = CONFIG, seed: int = 3, hidden: tuple[int, ...] = HIDDEN) -> tuple[DQNLearner, DQNLearner]:
    """Two learners of the same seed (so the same initial weights): the torch step's, then the numpy step's."""
    out = []
    for backend in ("torch", "numpy"):
        learner = algorithm(replace(config, backend=backend), hidden).make_learner(seed)
        assert isinstance(learner, DQNLearner)
        out.append(learner)
    assert isinstance(out[0].step, TorchDQNStep) and isinstance(out[1].step, NumpyDQNStep)
    return out[0], out[1]


def target_weights(learner: DQNLearner) -> dict[str, torch.Tensor]:
    """The target network's weights, as the learner's checkpoint holds them."""
    return {k.removeprefix("target."): v for k, v in learner.state_dict().items() if k.startswith("target.")}


def batches(count: int, seed: int, n: int = CONFIG.batch_size) -> list[Batch]:
    """Random transitions, a fifth of them terminal; rewards large enough for both Huber regions."""
    rng = np.random.default_rng(seed)
    return [
        {
            "obs": rng.normal(size=(n, OBS_DIM)).astype(np.float32),
            "next_obs": rng.normal(size=(n, OBS_DIM)).astype(np.float32),
            "action": rng.integers(0, N_ACTIONS, n),
            "reward": (3.0 * rng.normal(size=n)).astype(np.float32),
            "done": rng.random(n) < 0.2,
        }
        for _ in range(count)
    ]


def near_a_kink(ref: DQNLearner, batch: Batch, margin: float = 1e-5) -> bool:
    """Whether float32 rounding could flip one of the train step's two discontinuities on this batch.

    The step is continuous in the weights except where a ReLU pre-activation of the online
    net on ``obs`` crosses 0 (its mask gates the gradient) and, for Double DQN, where the
    online net's best two next-state actions tie (the argmax flips). The implementations
    round differently (~1e-7), so a batch within ``margin`` of a kink could send them apart
    for a reason that is no bug; such batches are left out of the comparison.
    """
    encoder: Any = ref.nets.online.encoder
    with torch.no_grad():
        x = encoder.flatten(torch.from_numpy(batch["obs"]))
        for layer in encoder.net:
            if isinstance(layer, nn.ReLU) and bool((x.abs() < margin).any()):
                return True
            x = layer(x)
        if ref.config.double_dqn:
            top2 = ref.nets.online(torch.from_numpy(batch["next_obs"])).topk(2, dim=1).values
            return bool((top2[:, 0] - top2[:, 1] < margin).any())
    return False


def assert_same_weights(
    expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor], what: str, *, ordered: bool = True
) -> None:
    assert (list(actual) == list(expected)) if ordered else (set(actual) == set(expected))
    for name, tensor in expected.items():
        torch.testing.assert_close(actual[name], tensor, atol=WEIGHT_ATOL, rtol=0.0, msg=f"{what} {name}")


def train_side_by_side(ref: DQNLearner, fast: DQNLearner, data: list[Batch]) -> list[dict[str, Any]]:
    """Feed both train steps the same batches (skipping any near a kink); check metrics every step."""
    log = []
    for batch in data:
        if near_a_kink(ref, batch):
            continue
        expected, actual = ref.learn(batch), fast.learn(batch)
        assert actual.keys() == expected.keys() == {"loss", "q_mean", "grad_norm"}
        for key, value in expected.items():
            assert actual[key] == pytest.approx(value, rel=1e-5, abs=1e-6), f"{key} at version {ref.version}"
        log.append(expected)
    assert fast.version == ref.version
    return log


# -- the numpy step against the torch reference ------------------------------------------


def test_both_steps_start_from_the_networks_seeded_weights_without_touching_the_global_rng() -> None:
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)

    ref, fast = pair(seed=5)

    assert torch.equal(torch.rand(1), expected_next)
    for name, tensor in ref.actor_weights().items():
        assert torch.equal(fast.actor_weights()[name], tensor)
        assert torch.equal(target_weights(fast)[name], tensor)
    assert list(ref.actor_weights()) == [
        "encoder.net.0.weight", "encoder.net.0.bias", "encoder.net.2.weight", "encoder.net.2.bias",
        "head.weight", "head.bias",
    ]  # fmt: skip
    other = pair(seed=6)[1].actor_weights()
    assert not torch.equal(other["encoder.net.0.weight"], ref.actor_weights()["encoder.net.0.weight"])


# (tau 0.5 alone could not tell a Polyak update by tau from one by 1 - tau, hence also 0.3)
@pytest.mark.parametrize(("double_dqn", "tau"), [(True, 1.0), (False, 1.0), (True, 0.5), (False, 0.3)])
def test_the_numpy_step_follows_the_torch_step_step_for_step(double_dqn: bool, tau: float) -> None:
    # Given both train steps with the same config and seed
    config = replace(CONFIG, double_dqn=double_dqn, tau=tau)
    ref, fast = pair(config)

    # When they train on the same 240 batches (target syncs at 40, 80, ...)
    log = train_side_by_side(ref, fast, batches(240, seed=7))

    # Then every step reported the same loss, q_mean and grad_norm, and they end with the
    # same online and target weights
    assert len(log) >= 200
    assert_same_weights(ref.actor_weights(), fast.actor_weights(), "online")
    assert_same_weights(target_weights(ref), target_weights(fast), "target")
    # (the run covered both sides of the gradient clip)
    norms = [m["grad_norm"] for m in log]
    assert min(norms) < config.max_grad_norm < max(norms)


@pytest.mark.parametrize("producer_kind", ["numpy", "torch"])
def test_a_checkpoint_of_either_step_resumes_both_alike(producer_kind: str) -> None:
    # Given a checkpoint (online, target, Adam moments) of 37 steps of training
    producer = pair(seed=1)[0 if producer_kind == "torch" else 1]
    for batch in batches(37, seed=2):
        producer.learn(batch)
    state, version = producer.state_dict(), producer.version
    assert {name.split(".")[0] for name in state} == {"online", "target", "adam"}

    # When a numpy and a torch step, built with another seed and trained a little (so
    # Adam has state to forget), resume from it
    ref, fast = pair(seed=9)
    train_side_by_side(ref, fast, batches(5, seed=3))
    for step in (fast, ref):
        step.load_state_dict(state, version)

    # Then both hold the checkpoint's weights and moments and its iteration
    assert fast.version == ref.version == 37
    for step in (fast, ref):
        assert_same_weights(producer.actor_weights(), step.actor_weights(), "online")
        assert_same_weights(target_weights(producer), target_weights(step), "target")
        assert_same_weights(state, step.state_dict(), "checkpoint", ordered=False)
    # and they train alike from there (Adam carries on, not restarting), syncing the target at iter 40 and 80
    train_side_by_side(ref, fast, batches(60, seed=4))
    assert fast.version >= 80
    assert_same_weights(ref.actor_weights(), fast.actor_weights(), "online")
    assert_same_weights(target_weights(ref), target_weights(fast), "target")


def test_resuming_keeps_adams_moments_a_fresh_optimizer_would_not() -> None:
    # Given a checkpoint after 30 steps, and a copy of it with the moments and step count zeroed
    ref, _ = pair(seed=1)
    for batch in batches(30, seed=2):
        ref.learn(batch)
    state = ref.state_dict()
    amnesic = {k: torch.zeros_like(v) if k.startswith("adam.") else v for k, v in state.items()}
    # When one step resumes each and takes the same step
    with_moments, _ = pair(seed=4)
    without, _ = pair(seed=4)
    with_moments.load_state_dict(state, 30)
    without.load_state_dict(amnesic, 30)
    batch = batches(1, seed=5)[0]
    with_moments.learn(batch)
    ref.learn(batch)
    without.learn(batch)
    # Then the one with the moments moved exactly as the uninterrupted run, and the other did not
    assert_same_weights(ref.actor_weights(), with_moments.actor_weights(), "resumed")
    differs = any(
        not torch.allclose(a, b, atol=1e-7)
        for a, b in zip(ref.actor_weights().values(), without.actor_weights().values(), strict=True)
    )
    assert differs


@pytest.mark.parametrize("kind", ["torch", "numpy"])
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: {k.replace("encoder.net.2", "encoder.net.3"): v for k, v in s.items()}, "missing"),
        (lambda s: {k: v for k, v in s.items() if k != "adam.step"}, "missing"),
        (lambda s: {**s, "online.encoder.net.2.weight": torch.zeros(16, 31)}, "encoder.net.2.weight"),
        (lambda s: {**s, "target.head.bias": torch.zeros(4)}, "head.bias"),
        (lambda s: {**s, "adam.exp_avg_sq.head.weight": torch.zeros(3, 15)}, "head.weight"),
    ],
)
def test_a_checkpoint_of_another_network_is_refused_and_nothing_changes(kind: str, change: Any, message: str) -> None:
    # Given a train step, and a checkpoint that does not fit it in one tensor
    ref, fast = pair(seed=0)
    step: Any = ref if kind == "torch" else fast
    before, target_before = step.actor_weights(), target_weights(step)
    foreign = change(pair(seed=1)[1].state_dict())
    # When it is asked to resume from it, it refuses naming the tensor
    with pytest.raises(ValueError, match=message):
        step.load_state_dict(foreign, 99)
    # and keeps every weight and its iteration (no half-loaded network)
    assert step.version == 0
    assert_same_weights(before, step.actor_weights(), "online")
    assert_same_weights(target_before, target_weights(step), "target")


def test_a_checkpoint_of_another_hidden_size_is_refused_by_the_learner(tmp_path: Any) -> None:
    # (same keys, other shapes: what a job whose [model] hidden_sizes changed between runs leaves)
    wide, narrow = algorithm(hidden=(32, 16)), algorithm(hidden=(32, 8))
    learner = narrow.make_learner(seed=0)
    before = learner.actor_weights()
    with pytest.raises(ValueError, match=r"'encoder\.net\.2\.weight' is \(16, 32\), needs \(8, 32\)"):
        learner.load_state_dict(wide.make_learner(seed=1).state_dict(), 50)
    assert learner.version == 0
    assert_same_weights(before, learner.actor_weights(), "online")


@pytest.mark.parametrize("kind", ["torch", "numpy"])
@pytest.mark.parametrize("double_dqn", [True, False])
def test_a_train_step_reduces_the_loss_on_a_fixed_batch(kind: str, double_dqn: bool) -> None:
    config = DQNConfig(lr=1e-2, target_update_interval=10**6, double_dqn=double_dqn)
    ref, fast = pair(config, seed=0, hidden=(64,))
    step: Any = ref if kind == "torch" else fast
    batch = batches(1, seed=0, n=64)[0]

    first = step.learn(batch)
    for _ in range(200):
        last = step.learn(batch)

    assert step.version == 201
    assert last["loss"] < 0.5 * first["loss"]
    assert all(isinstance(v, float) for v in last.values())


def test_the_target_net_is_synced_every_target_update_interval() -> None:
    ref, _ = pair(DQNConfig(target_update_interval=3), hidden=(8,))

    def synced() -> bool:
        online, target = ref.actor_weights(), target_weights(ref)
        return all(torch.equal(online[k], target[k]) for k in online)

    assert synced()
    for expected in (False, False, True, False):
        ref.learn(batches(1, seed=ref.version)[0])
        assert synced() is expected


def test_a_soft_target_update_moves_the_target_part_way() -> None:
    ref, _ = pair(DQNConfig(target_update_interval=1, tau=0.5), hidden=(8,))
    before = target_weights(ref)

    ref.learn(batches(1, seed=0)[0])

    online = ref.actor_weights()
    for key, old in before.items():
        torch.testing.assert_close(target_weights(ref)[key], 0.5 * old + 0.5 * online[key])


def test_actor_weights_are_a_copy_that_loads_into_a_fresh_q_network() -> None:
    ref, fast = pair(seed=1)
    train_side_by_side(ref, fast, batches(20, seed=5))

    state = fast.actor_weights()
    net = algorithm().q_network()
    net.load_state_dict(state, strict=True)
    obs = torch.from_numpy(np.random.default_rng(0).normal(size=(50, OBS_DIM)).astype(np.float32))
    with torch.no_grad():
        torch.testing.assert_close(net(obs), ref.nets.online(obs), atol=1e-5, rtol=0.0)
    # a copy: training on does not change what was handed out
    fast.learn(batches(1, seed=6)[0])
    assert not torch.equal(state["encoder.net.0.weight"], fast.actor_weights()["encoder.net.0.weight"])


# -- DQNLearner: the algorithm's learner half ------------------------------------------


def cartpole_chunk(algo: DQN, steps: int, envs: int = 1, seed: int = 0) -> Any:
    layout = ChunkLayout.of(algo.spaces, algo.columns())
    return read_chunk(chunk_fields(layout, algo.spaces, steps, envs, seed), layout, algo.spaces, 0)


@pytest.mark.parametrize(
    ("backend", "model", "obs", "expected"),
    [
        ("auto", {}, None, NumpyDQNStep),
        ("numpy", {}, None, NumpyDQNStep),
        ("torch", {}, None, TorchDQNStep),
        ("auto", {"activation": "tanh"}, None, TorchDQNStep),
        ("auto", {}, gym.spaces.Box(0, 255, (6,), np.uint8), TorchDQNStep),
        ("auto", {}, gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (2,)), "b": gym.spaces.Discrete(3)}), TorchDQNStep),
    ],
)
def test_the_learner_runs_numpy_where_it_can_and_torch_everywhere_else(
    backend: str, model: dict[str, Any], obs: gym.Space[Any] | None, expected: type
) -> None:
    spaces = SPACES if obs is None else Spaces(obs, gym.spaces.Discrete(N_ACTIONS))
    algo = bound("dqn", spaces, {"hidden_sizes": [8], **model}, backend=backend)
    assert isinstance(algo.make_learner(seed=0).step, expected)  # type: ignore[attr-defined]


def test_the_numpy_backend_refuses_a_network_it_cannot_run() -> None:
    algo = bound("dqn", SPACES, {"activation": "tanh"}, backend="numpy")
    with pytest.raises(ValueError, match="backend = 'numpy' cannot run this job: activation 'tanh'"):
        algo.make_learner(seed=0)


def test_the_learner_takes_data_until_learning_starts_then_trains_at_the_replay_ratio() -> None:
    # Given a learner that starts at 100 transitions and trains once per 10
    algo = algorithm(replace(CONFIG, learning_starts=100, train_steps_per_sample=0.1, batch_size=16))
    learner = algo.make_learner(seed=0)
    assert isinstance(learner, DQNLearner)
    assert learner.wants_data() and not learner.can_update()
    # When 60 transitions came in: still warming up
    assert learner.add(cartpole_chunk(algo, 30, envs=2)) == 60
    assert learner.wants_data() and not learner.can_update()
    # When 60 more came in: warm, and 2 updates are owed (one per 10 transitions after the first 100)
    learner.add(cartpole_chunk(algo, 30, envs=2, seed=1))
    assert learner.can_update() and not learner.wants_data()
    updates = 0
    while learner.can_update():
        metrics = learner.update()
        updates += 1
        assert set(metrics) == {"loss", "q_mean", "grad_norm"}
    # Then it ran exactly those, its version counting them, and it wants data again
    assert updates == 2 and learner.version == 2
    assert learner.wants_data()


def test_only_valid_transitions_reach_the_replay_buffer() -> None:
    # Given a chunk of 3 steps x 2 envs whose env 1 takes a reset step at t = 1
    algo = algorithm()
    layout = ChunkLayout.of(algo.spaces, algo.columns())
    fields = chunk_fields(layout, algo.spaces, 3, 2)
    fields["done"][0, 1] = True
    fields["valid"][1, 1] = False
    learner = algo.make_learner(seed=0)
    # When it is added, the reset step is left out and the terminal one kept as such
    assert learner.add(read_chunk(fields, layout, algo.spaces, 0)) == 5
    assert learner.replay is not None  # type: ignore[attr-defined]
    np.testing.assert_array_equal(learner.replay.columns["done"][:5], [False, True, False, False, False])  # type: ignore[attr-defined]


def test_actor_weights_are_what_the_actor_loads_and_give_the_learners_q_values() -> None:
    algo = algorithm()
    learner = algo.make_learner(seed=2)
    actor = algo.make_actor(seed=0)
    actor.load_weights(learner.actor_weights())
    obs = np.random.default_rng(0).normal(size=(10, OBS_DIM)).astype(np.float32)
    net = algo.q_network()
    net.load_state_dict(learner.actor_weights())
    with torch.no_grad():
        expected = net(torch.from_numpy(obs)).argmax(dim=1).numpy()
    actions, extras = actor.act(obs, explore=False, settings={"eps": 1.0})
    np.testing.assert_array_equal(actions, expected)
    assert extras == {}


def test_learners_of_the_same_seed_start_alike_and_other_seeds_do_not() -> None:
    algo = algorithm()
    a, b, c = (algo.make_learner(seed=s).actor_weights() for s in (5, 5, 6))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["head.weight"], c["head.weight"])


def test_a_learner_resumes_its_version_from_its_checkpoint() -> None:
    algo = algorithm(replace(CONFIG, learning_starts=10, train_steps_per_sample=1.0, batch_size=8))
    first = algo.make_learner(seed=0)
    first.add(cartpole_chunk(algo, 20))
    while first.can_update():
        first.update()
    again = algo.make_learner(seed=1)
    again.load_state_dict(first.state_dict(), first.version)
    assert again.version == first.version == 10  # the 10 transitions after learning_starts
    assert_same_weights(first.actor_weights(), again.actor_weights(), "resumed")


def test_q_network_weights_depend_only_on_the_seed() -> None:
    algo = algorithm()
    one, two = QNetwork.build(algo.model, algo.spaces, 7), QNetwork.build(algo.model, algo.spaces, 7)
    assert all(torch.equal(x, y) for x, y in zip(one.state_dict().values(), two.state_dict().values(), strict=True))
