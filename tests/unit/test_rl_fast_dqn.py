"""NumpyDQNLearner (the learner process's train step) against the torch reference DQNLearner."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from worker.rl.config import LearnerSpec
from worker.rl.dqn import DQNLearner
from worker.rl.fast_dqn import NumpyDQNLearner
from worker.rl.policy import DQNPolicy, QNetwork

OBS_DIM, N_ACTIONS = 5, 3
#: Small enough to run 4 x 240 torch steps in about a second; two hidden layers of different
#: widths, so a mixed-up weight layout cannot go unnoticed.
SPEC = LearnerSpec(hidden_sizes=(32, 16), batch_size=32, target_update_interval=40, max_grad_norm=0.25)
#: Float32 weights of the two implementations after 200+ steps: they agree to ~1e-7 in practice.
WEIGHT_ATOL = 1e-5

Batch = dict[str, np.ndarray]


def batches(count: int, seed: int, n: int = SPEC.batch_size) -> list[Batch]:
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


def tensors(batch: Batch) -> dict[str, torch.Tensor]:
    return {name: torch.from_numpy(array) for name, array in batch.items()}


def near_a_kink(ref: DQNLearner, batch: Batch, margin: float = 1e-5) -> bool:
    """Whether float32 rounding could flip one of the train step's two discontinuities on this batch.

    The step is continuous in the weights except where a ReLU pre-activation of the online
    net on ``obs`` crosses 0 (its mask gates the gradient) and, for Double DQN, where the
    online net's best two next-state actions tie (the argmax flips). The implementations
    round differently (~1e-7), so a batch within ``margin`` of a kink could send them apart
    for a reason that is no bug; such batches are left out of the comparison.
    """
    with torch.no_grad():
        x = torch.from_numpy(batch["obs"])
        for layer in ref.q_net.net:
            if isinstance(layer, nn.ReLU) and bool((x.abs() < margin).any()):
                return True
            x = layer(x)
        if ref.spec.double_dqn:
            top2 = ref.q_net(torch.from_numpy(batch["next_obs"])).topk(2, dim=1).values
            return bool((top2[:, 0] - top2[:, 1] < margin).any())
    return False


def assert_same_weights(expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor], what: str) -> None:
    assert list(actual) == list(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(actual[name], tensor, atol=WEIGHT_ATOL, rtol=0.0, msg=f"{what} {name}")


def train_side_by_side(ref: DQNLearner, fast: NumpyDQNLearner, data: list[Batch]) -> list[dict[str, Any]]:
    """Feed both learners the same batches (skipping any near a kink); check metrics every step."""
    log = []
    for batch in data:
        if near_a_kink(ref, batch):
            continue
        expected, actual = ref.train_step(tensors(batch)), fast.train_step(batch)
        assert actual.keys() == expected.keys()
        for key, value in expected.items():
            assert actual[key] == pytest.approx(value, rel=1e-5, abs=1e-6), f"{key} at iter {ref.iter}"
        log.append(expected)
    assert fast.iter == ref.iter
    return log


# -- equivalence with the torch reference ----------------------------------------------


def test_initial_weights_match_the_torch_learner_for_the_same_seed_without_touching_global_rng() -> None:
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)

    fast = NumpyDQNLearner(SPEC, OBS_DIM, N_ACTIONS, seed=5)
    ref = DQNLearner(SPEC, OBS_DIM, N_ACTIONS, seed=5)

    assert torch.equal(torch.rand(1), expected_next)
    for name, tensor in ref.policy_state().items():
        assert torch.equal(fast.policy_state()[name], tensor)
        assert torch.equal(fast.target_state()[name], tensor)
    other = NumpyDQNLearner(SPEC, OBS_DIM, N_ACTIONS, seed=6).policy_state()
    assert not torch.equal(other["net.0.weight"], ref.policy_state()["net.0.weight"])


# (tau 0.5 alone could not tell a Polyak update by tau from one by 1 - tau, hence also 0.3)
@pytest.mark.parametrize(("double_dqn", "tau"), [(True, 1.0), (False, 1.0), (True, 0.5), (False, 0.3)])
def test_numpy_learner_follows_the_torch_learner_step_for_step(double_dqn: bool, tau: float) -> None:
    # Given both learners with the same spec and seed
    spec = replace(SPEC, double_dqn=double_dqn, tau=tau)
    ref = DQNLearner(spec, OBS_DIM, N_ACTIONS, seed=3)
    fast = NumpyDQNLearner(spec, OBS_DIM, N_ACTIONS, seed=3)

    # When they train on the same 240 batches (target syncs at 40, 80, ...)
    log = train_side_by_side(ref, fast, batches(240, seed=7))

    # Then every step reported the same loss, q_mean and grad_norm, and they end with the
    # same online and target weights
    assert len(log) >= 200
    assert_same_weights(ref.policy_state(), fast.policy_state(), "online")
    assert_same_weights(ref.target_net.state_dict(), fast.target_state(), "target")
    # (the run covered both sides of the gradient clip)
    norms = [m["grad_norm"] for m in log]
    assert min(norms) < spec.max_grad_norm < max(norms)


def test_resumed_numpy_learner_follows_a_torch_learner_resumed_from_the_same_policy() -> None:
    # Given a policy file's content: weights trained for 37 steps elsewhere
    producer = NumpyDQNLearner(SPEC, OBS_DIM, N_ACTIONS, seed=1)
    for batch in batches(37, seed=2):
        producer.train_step(batch)
    state, iter_ = producer.policy_state(), producer.iter

    # When a numpy and a torch learner, built with another seed and trained a little (so
    # Adam has state to forget), resume from it
    fast = NumpyDQNLearner(SPEC, OBS_DIM, N_ACTIONS, seed=9)
    ref = DQNLearner(SPEC, OBS_DIM, N_ACTIONS, seed=9)
    train_side_by_side(ref, fast, batches(5, seed=3))
    for learner in (fast, ref):
        learner.load_policy(state, iter_)

    # Then both nets hold the file's weights and the iteration carries over
    assert fast.iter == 37
    assert_same_weights(state, fast.policy_state(), "online")
    assert_same_weights(state, fast.target_state(), "target")
    # and they train alike from there, syncing the target at iter 40 and 80
    train_side_by_side(ref, fast, batches(60, seed=4))
    assert fast.iter >= 80
    assert_same_weights(ref.policy_state(), fast.policy_state(), "online")
    assert_same_weights(ref.target_net.state_dict(), fast.target_state(), "target")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: {k.replace("net.2", "net.3"): v for k, v in s.items()}, "keys"),
        (lambda s: {**s, "net.2.weight": torch.zeros(16, 31)}, "'net.2.weight' has shape"),
    ],
)
def test_a_policy_of_another_network_is_refused_and_nothing_changes(change: Any, message: str) -> None:
    fast = NumpyDQNLearner(SPEC, OBS_DIM, N_ACTIONS, seed=0)
    before = fast.policy_state()
    foreign = change(NumpyDQNLearner(SPEC, OBS_DIM, N_ACTIONS, seed=1).policy_state())

    with pytest.raises(ValueError, match=message):
        fast.load_policy(foreign, 99)

    assert fast.iter == 0
    assert_same_weights(before, fast.policy_state(), "online")


# -- what the learner hands to collectors ------------------------------------------------


def test_policy_state_loads_into_the_collector_policy_and_gives_the_learners_q_values() -> None:
    ref = DQNLearner(SPEC, OBS_DIM, N_ACTIONS, seed=1)
    fast = NumpyDQNLearner(SPEC, OBS_DIM, N_ACTIONS, seed=1)
    train_side_by_side(ref, fast, batches(20, seed=5))

    state = fast.policy_state()
    net = QNetwork(OBS_DIM, N_ACTIONS, SPEC.hidden_sizes)
    assert {k: (v.shape, v.dtype) for k, v in state.items()} == {
        k: (v.shape, v.dtype) for k, v in net.state_dict().items()
    }
    net.load_state_dict(state, strict=True)
    policy = DQNPolicy(OBS_DIM, N_ACTIONS, SPEC.hidden_sizes)
    policy.load_state_dict(state)

    obs = np.random.default_rng(0).normal(size=(50, OBS_DIM)).astype(np.float32)
    with torch.no_grad():
        expected = ref.q_net(torch.from_numpy(obs)).numpy()
        from_net = net(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(from_net, expected, atol=1e-5)
    np.testing.assert_allclose(policy.q_values(obs), expected, atol=1e-5)
    # a copy: training on does not change what was handed out
    fast.train_step(batches(1, seed=6)[0])
    assert not torch.equal(state["net.0.weight"], fast.policy_state()["net.0.weight"])


# -- sanity ----------------------------------------------------------------------------


@pytest.mark.parametrize("double_dqn", [True, False])
def test_train_step_reduces_loss_on_a_fixed_batch(double_dqn: bool) -> None:
    spec = LearnerSpec(hidden_sizes=(64,), lr=1e-2, target_update_interval=10**6, double_dqn=double_dqn)
    fast = NumpyDQNLearner(spec, OBS_DIM, N_ACTIONS, seed=0)
    batch = batches(1, seed=0, n=64)[0]

    first = fast.train_step(batch)
    for _ in range(200):
        last = fast.train_step(batch)

    assert fast.iter == 201
    assert last["loss"] < 0.5 * first["loss"]
    assert set(first) == {"loss", "q_mean", "grad_norm"}
    assert all(isinstance(v, float) for v in last.values())
