"""The numpy twin's shared parts against torch: layers, Adam and the clip; and the one way learners delegate a step."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import nn

from worker.algorithms.numpy_twin.adam import FlatAdam, clip_global_norm
from worker.algorithms.numpy_twin.bridge import store_params, twin_of
from worker.algorithms.numpy_twin.step import NumpyStep, TrainStep, pick_step

F = np.float32


@pytest.mark.parametrize("activation, activate_last", [("tanh", True), ("relu", False)])
def test_dense_layers_compute_torchs_outputs_and_gradients_on_the_first_rows(
    activation: str, activate_last: bool
) -> None:
    # Given a torch stack of three linear layers and its numpy twin
    act = nn.Tanh if activation == "tanh" else nn.ReLU
    layers: list[nn.Module] = [nn.Linear(5, 7), act(), nn.Linear(7, 6), act(), nn.Linear(6, 3)]
    torch_net = nn.Sequential(*layers, *([act()] if activate_last else []))
    flat = twin_of(torch_net)
    dense = flat.dense(["0", "2", "4"], activation, activate_last=activate_last)  # type: ignore[arg-type]
    # When both run forward on 12 rows, and backward from the first 8 only (as DQN's [obs; next_obs])
    x = np.random.default_rng(0).normal(size=(12, 5)).astype(F)
    grad_out = np.random.default_rng(1).normal(size=(8, 3)).astype(F)
    xt = torch.tensor(x, requires_grad=True)
    out = torch_net(xt)
    (out[:8] * torch.from_numpy(grad_out)).sum().backward()
    got = dense.forward(x).copy()
    grad_in = dense.backward(grad_out)
    # Then the outputs, the input's gradient and every weight's gradient are torch's
    np.testing.assert_allclose(got, out.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert xt.grad is not None and grad_in is not None
    np.testing.assert_allclose(grad_in, xt.grad[:8].numpy(), rtol=1e-5, atol=1e-6)
    for name, param in torch_net.named_parameters():
        assert param.grad is not None
        np.testing.assert_allclose(flat.grads[name], param.grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("eps, max_norm", [(1e-8, 0.5), (1e-5, 100.0)])
def test_flat_adam_and_the_clip_take_torchs_steps(eps: float, max_norm: float) -> None:
    # Given a torch module with its Adam, and a twin of its parameters with FlatAdam
    net = nn.Linear(4, 3)
    opt = torch.optim.Adam(net.parameters(), lr=0.01, eps=eps)
    flat = twin_of(net)
    adam = FlatAdam(flat.size, eps=eps)
    rng = np.random.default_rng(2)
    for _ in range(5):
        # When both take the same clipped steps on the same gradients
        grads = {name: rng.normal(size=p.shape).astype(F) for name, p in net.named_parameters()}
        for name, p in net.named_parameters():
            p.grad = torch.from_numpy(grads[name].copy())
            flat.grads[name][...] = grads[name]
        want = float(nn.utils.clip_grad_norm_(net.parameters(), max_norm))
        assert clip_global_norm(flat.grad, max_norm) == pytest.approx(want, rel=1e-5)
        opt.step()
        adam.step(flat.params, flat.grad, 0.01)
    # Then they hold the same parameters
    for name, p in net.named_parameters():
        np.testing.assert_allclose(flat.views[name], p.detach().numpy(), rtol=1e-6, atol=1e-7, err_msg=name)


@dataclass
class Toy:
    """A torch side of one parameter, the ``policy``, and one more, the ``rest``."""

    policy: nn.Linear
    rest: nn.Linear
    backend: str = "auto"


class ToyNumpyStep(NumpyStep[float]):
    """Adds ``batch`` to every parameter of its twin; counts the copies it makes."""

    def __init__(self, config: Toy, nets: Toy) -> None:
        super().__init__()
        self.nets = nets
        self.policy, self.rest = twin_of(nets.policy), twin_of(nets.rest)
        self.copies: list[str] = []

    def numpy_step(self, batch: float) -> dict[str, float]:
        self.policy.params += F(batch)
        self.rest.params += F(batch)
        return {"batch": batch}

    def store_policy(self) -> None:
        store_params(self.policy, self.nets.policy)
        self.copies.append("policy")

    def store_rest(self) -> None:
        store_params(self.rest, self.nets.rest)
        self.copies.append("rest")

    def load(self) -> None:
        self.policy, self.rest = twin_of(self.nets.policy), twin_of(self.nets.rest)
        self.copies.append("load")


class ToyTorchStep(TrainStep[float]):
    def __init__(self, config: Toy, nets: Toy) -> None:
        self.nets = nets

    def train_step(self, batch: float) -> dict[str, float]:
        return {"batch": batch}


def test_the_numpy_step_writes_back_to_torch_only_what_moved_and_only_when_asked() -> None:
    toy = Toy(nn.Linear(2, 1), nn.Linear(2, 1))
    step = ToyNumpyStep(toy, toy)
    before = toy.policy.bias.item()
    # Steps leave the torch side alone
    step.train_step(1.0)
    step.train_step(2.0)
    assert toy.policy.bias.item() == before and step.copies == []
    # The actors' weights bring the policy up to date, and only it
    step.sync(policy_only=True)
    assert toy.policy.bias.item() == pytest.approx(before + 3.0) and step.copies == ["policy"]
    # A checkpoint brings the rest; then nothing is stale, and a sync copies nothing
    step.sync()
    step.sync()
    assert step.copies == ["policy", "rest"]
    # After the learner changed the torch side, the step takes it in and has nothing to write back
    with torch.no_grad():
        toy.policy.bias.fill_(7.0)
    step.reload()
    step.sync()
    assert step.copies == ["policy", "rest", "load"] and toy.policy.bias.item() == 7.0


@pytest.mark.parametrize(
    "backend, why_not, expected",
    [("auto", None, ToyNumpyStep), ("auto", "images", ToyTorchStep), ("torch", None, ToyTorchStep)],
)
def test_a_learner_gets_the_numpy_step_where_it_can_run_unless_the_job_asks_for_torch(
    backend: str, why_not: str | None, expected: type
) -> None:
    toy = Toy(nn.Linear(2, 1), nn.Linear(2, 1), backend)
    assert type(pick_step(toy, toy, why_not, ToyNumpyStep, ToyTorchStep)) is expected


def test_backend_numpy_where_numpy_cannot_run_is_refused_naming_why() -> None:
    toy = Toy(nn.Linear(2, 1), nn.Linear(2, 1), "numpy")
    with pytest.raises(ValueError, match="backend = 'numpy' cannot run this job: images"):
        pick_step(toy, toy, "images", ToyNumpyStep, ToyTorchStep)
