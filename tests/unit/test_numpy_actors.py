"""The numpy actors' layouts are their torch networks' ``state_dict``s; a collector running one never imports torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from tests.rl_builders import bound, flat_spaces
from worker.algorithms.ppo.numpy_actor import PPOLayout
from worker.algorithms.ppo.numpy_step import layout_of
from worker.plugins import Spaces

BOX = Spaces(gym.spaces.Box(-np.inf, np.inf, (2, 3), np.float32), gym.spaces.Box(-1.0, 1.0, (2,), np.float32))
SHIFTED = Spaces(gym.spaces.Box(-np.inf, np.inf, (5,), np.float32), gym.spaces.Discrete(3, start=-1))


def shapes(state: Any) -> list[tuple[str, tuple[int, ...]]]:
    return [(name, tuple(tensor.shape)) for name, tensor in state.items()]


@pytest.mark.parametrize(
    "spaces, model, config",
    [
        (flat_spaces(), {"hidden_sizes": [16, 8], "activation": "tanh"}, {}),
        (SHIFTED, {"hidden_sizes": [8], "activation": "relu"}, {"shared_body": True, "normalize_obs": True}),
        (BOX, {"hidden_sizes": [4, 4, 4], "activation": "tanh"}, {"normalize_obs": True}),
    ],
)
def test_the_ppo_layout_derived_without_torch_is_the_networks_own(
    spaces: Spaces, model: dict[str, Any], config: dict[str, Any]
) -> None:
    algo = bound("ppo", spaces, model=model, **config)
    net = algo.network(seed=0)  # type: ignore[attr-defined]
    layout = PPOLayout.of_algorithm(algo)  # type: ignore[arg-type]
    assert layout is not None
    assert layout == layout_of(net)
    assert list(layout.state_shapes.items()) == shapes(net.state_dict())


@pytest.mark.parametrize("hidden", [[16, 8], [32], [4, 4, 4, 4]])
def test_the_dqn_and_sac_layouts_are_their_networks_state_dicts_in_order(hidden: list[int]) -> None:
    dqn = bound("dqn", flat_spaces(5, 3), model={"hidden_sizes": hidden})
    assert list(dqn.numpy_layout().items()) == shapes(dqn.q_network(0).state_dict())  # type: ignore[attr-defined]
    sac = bound("sac", BOX, model={"hidden_sizes": hidden})
    assert list(sac.numpy_layout().items()) == shapes(sac.policy_network(0).state_dict())  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "algorithm, spaces, model",
    [
        ("ppo", flat_spaces(), {"hidden_sizes": [8], "activation": "tanh"}),
        ("dqn", flat_spaces(), {"hidden_sizes": [8]}),
        ("sac", BOX, {"hidden_sizes": [8]}),
    ],
)
def test_other_models_and_backend_torch_get_the_torch_actor(
    algorithm: str, spaces: Spaces, model: dict[str, Any]
) -> None:
    numpy_algo = bound(algorithm, spaces, model=model)
    assert numpy_algo.weights_format == "numpy"
    assert type(numpy_algo.make_actor(0)).__module__.endswith(".numpy_actor")
    image = Spaces(gym.spaces.Box(0, 255, (3, 8, 8), np.uint8), spaces.action)
    for other in (bound(algorithm, spaces, model=model, backend="torch"), bound(algorithm, image, model=model)):
        assert other.weights_format == "torch"
        assert type(other.make_actor(0)).__module__.endswith((".actor", ".networks"))


@pytest.mark.parametrize(
    "algorithm, obs_dim, model, network",
    [
        ("ppo", 4, {"hidden_sizes": [8], "activation": "tanh"}, "network"),
        ("dqn", 4, {"hidden_sizes": [8]}, "q_network"),
        ("sac", 6, {"hidden_sizes": [8]}, "policy_network"),
    ],
)
def test_a_collector_acting_with_a_numpy_actor_reads_its_policy_file_without_importing_torch(
    tmp_path: Path, algorithm: str, obs_dim: int, model: dict[str, Any], network: str
) -> None:
    # Given a policy file written by a learner (here, by this process, which has torch)
    from worker.storage import PolicyStore

    # the script's spaces: BOX's, written out (importing this module would import torch)
    spaces = (
        "Spaces(gym.spaces.Box(-np.inf, np.inf, (2, 3), np.float32), gym.spaces.Box(-1.0, 1.0, (2,), np.float32))"
        if algorithm == "sac"
        else "flat_spaces()"
    )
    algo = bound(algorithm, BOX if algorithm == "sac" else flat_spaces(), model=model)
    PolicyStore(tmp_path).write("policy_main", getattr(algo, network)(seed=0).state_dict(), iter=3)
    # When a fresh process with the collector's modules builds the actor, reads the file and acts
    script = textwrap.dedent(
        f"""
        import sys
        import numpy as np
        import worker.collector.service  # everything a collector imports
        from worker.collector.run import FilePolicySource
        from worker.storage import PolicyStore
        from tests.rl_builders import bound, flat_spaces
        import gymnasium as gym
        from worker.plugins import Spaces
        algo = bound({algorithm!r}, {spaces}, model={model!r})
        actor = algo.make_actor(seed=0)
        snapshot = FilePolicySource(PolicyStore({str(tmp_path)!r}), "policy_main", numpy=True).read()
        actor.load_weights(snapshot.state_dict)
        actions, extras = actor.act(np.zeros((4, {obs_dim}), np.float32), explore=True, settings={{"eps": 0.5}})
        kinds = sorted({{type(v).__name__ for v in snapshot.state_dict.values()}})
        print(snapshot.iter, ",".join(kinds), len(actions), "torch" in sys.modules)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).parents[2],
    )
    assert out.returncode == 0, out.stderr
    # Then it got the learner's arrays as numpy, acted, and torch was never imported
    assert out.stdout.split() == ["3", "ndarray", "4", "False"]


def test_a_torch_network_refuses_numpy_arrays_while_a_numpy_actor_takes_both() -> None:
    import torch

    from worker.algorithms.weights import check_fits

    expected = {"w": torch.zeros(2, 3)}
    with pytest.raises(ValueError, match=r"'w' is ndarray, needs \(2, 3\)"):
        check_fits(expected, {"w": np.zeros((2, 3), np.float32)}, "the weights", "the net")
    check_fits({"w": (2, 3)}, {"w": np.zeros((2, 3), np.float32)}, "the weights", "the net")
    check_fits({"w": (2, 3)}, {"w": torch.zeros(2, 3)}, "the weights", "the net")


def test_a_ppo_numpy_actor_given_an_array_it_cannot_read_keeps_all_of_its_weights() -> None:
    import torch

    algo = bound("ppo", flat_spaces(), model={"hidden_sizes": [8], "activation": "tanh"}, normalize_obs=True)
    actor = algo.make_actor(seed=0)
    good = algo.network(seed=1).state_dict()  # type: ignore[attr-defined]
    actor.load_weights(good)
    obs = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
    before = actor.act(obs, explore=False, settings={})[1]["value"]
    # A tensor that still requires grad cannot become a numpy array; it comes last, after others that could
    bad = {k: v + 1.0 for k, v in good.items()}
    bad["vf_head.bias"] = torch.zeros(1, requires_grad=True)
    with pytest.raises(ValueError, match="do not fit the PPO actor-critic"):
        actor.load_weights(bad)
    np.testing.assert_array_equal(actor.act(obs, explore=False, settings={})[1]["value"], before)


@pytest.mark.parametrize(
    "devices, visible, expected",
    [
        (["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"], None, 2),
        (["nvidia0", "nvidia1"], "1", 1),
        (["nvidia0", "nvidia1"], "0,-1,1", 1),
        (["nvidia0", "nvidia1"], "", 0),
        ([], "0,1", 0),
    ],
)
def test_the_collector_counts_gpus_from_the_devices_and_cuda_visible_devices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, devices: list[str], visible: str | None, expected: int
) -> None:
    from worker.devices import visible_gpus

    for name in devices:
        (tmp_path / name).touch()
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert visible_gpus(tmp_path) == expected
