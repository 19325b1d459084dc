"""A built-in algorithm's deterministic actor as an ONNX graph, checked against warren's own actor.

What the graph computes, from a batch of observations (input ``obs``, the space's dtype,
``[batch, ...]``) to a batch of actions (output ``action``):

* DQN: the greedy action, ``argmax`` of the Q-values (plus the space's ``start``);
* PPO: the deterministic action: the most likely one of a discrete space (per component
  of a ``MultiDiscrete``; ``logit > 0`` of a ``MultiBinary``), the Gaussian's mean of a
  ``Box`` (unclipped, as the actor gives it; the env batch clips it into the box), the
  observation normalisation included;
* SAC: the mean action, squashed by ``tanh`` and scaled into the action box.

The torch network the learner trains is built from the policy's job and loaded with the
file's weights, wrapped with that last step, and exported by torch's TorchScript-based
exporter; so any model torch can trace works (the built-in ``mlp`` and ``nature_cnn``
do). Needs ``pip install 'warren[export]'`` (onnx, onnxruntime). :func:`check_export`
runs the graph in onnxruntime on random observations of the job's space and compares
its actions with :meth:`~worker.agent.policy.Policy.act`'s (the collectors' actor).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import gymnasium as gym
import numpy as np

from worker.agent.policy import Policy
from worker.errors import ConfigurationError
from worker.storage.policy_format import read_policy_file

if TYPE_CHECKING:
    import torch

#: What ``pip`` installs for exports.
EXPORT_EXTRA: Final = "pip install 'warren[export]'"
#: The ONNX operator set the graphs are written in (onnxruntime 1.17 on runs it).
OPSET: Final = 17
#: How far an exported action may be from the actor's and still agree.
TOLERANCE: Final = 1e-5


def _onnxruntime() -> Any:
    try:
        import onnx  # noqa: F401  (the exporter writes its files)
        import onnxruntime
    except ImportError:
        raise ConfigurationError(f"ONNX export needs onnx and onnxruntime: {EXPORT_EXTRA}") from None
    return onnxruntime


def action_module(policy: Policy) -> torch.nn.Module:
    """The torch module from observations to deterministic actions for ``policy``'s built-in algorithm.

    Raises:
        ConfigurationError: not DQN, PPO or SAC (no built-in deterministic actor to export),
            observations of a ``Dict`` space (one input only), or a policy with memory.
    """
    from worker.algorithms.dqn import DQN
    from worker.algorithms.ppo import PPO
    from worker.algorithms.sac import SAC

    algorithm = policy.algorithm
    if not isinstance(algorithm, DQN | PPO | SAC):
        raise ConfigurationError(
            f"ONNX export knows the built-in actors (dqn, ppo, sac); {policy.header.algorithm!r} is a plug-in's"
        )
    if isinstance(algorithm.spaces.observation, gym.spaces.Dict):
        raise ConfigurationError("ONNX export takes one observation array: a Dict observation space is not supported")
    if policy.has_memory:
        raise ConfigurationError(
            f"ONNX export takes feed-forward policies; this one keeps a recurrent state (model "
            f"{policy.header.model!r}), which an exported graph would have to take and return each step"
        )
    weights = read_policy_file(policy.path).state_dict
    if isinstance(algorithm, DQN):
        from worker.agent.onnx_modules import GreedyQ

        q_network = algorithm.q_network()
        q_network.load_state_dict(weights, strict=True)
        return GreedyQ(q_network, algorithm.spaces.action)
    if isinstance(algorithm, PPO):
        from worker.agent.onnx_modules import PPOMode

        network = algorithm.network()
        network.load_state_dict(weights, strict=True)
        return PPOMode(network, algorithm.spaces.action)
    from worker.agent.onnx_modules import SACMean

    sac_policy = algorithm.policy_network()
    sac_policy.load_state_dict(weights, strict=True)
    return SACMean(sac_policy)


def export_onnx(policy: Policy, out: Path) -> Path:
    """Write ``policy``'s deterministic actor as an ONNX file at ``out`` (with the policy's provenance as metadata).

    Raises:
        ConfigurationError: onnx or onnxruntime missing, or an algorithm it cannot export.
    """
    _onnxruntime()
    import onnx
    import torch

    module = action_module(policy).eval()
    shape, dtype = _obs_layout(policy)
    example = torch.as_tensor(_random_obs(policy, 2, seed=0))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.no_grad():
        # The TorchScript-based exporter says it is the older one; the graph is the same.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        torch.onnx.export(
            module,
            (example,),
            str(out),
            input_names=["obs"],
            output_names=["action"],
            dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}},
            opset_version=OPSET,
            dynamo=False,
        )
    model = onnx.load(str(out))
    header = policy.header
    provenance = {
        "warren.algorithm": header.algorithm,
        "warren.algorithm_version": header.algorithm_version or "",
        "warren.model": header.model or "",
        "warren.policy_version": str(header.version),
        "warren.spaces_digest": policy.spaces.digest,
        "warren.env_id": str(header.section("env").get("id", "")),
        "warren.observation": f"{list(shape)} {dtype}",
    }
    for key, value in provenance.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(model, str(out))
    return out


@dataclass(frozen=True)
class ExportCheck:
    """How an exported graph's actions compare with the actor's on ``samples`` random observations."""

    samples: int
    max_abs_diff: float
    mismatches: int
    """Actions further apart than :data:`TOLERANCE` (in any component)."""

    @property
    def agrees(self) -> bool:
        return self.mismatches == 0

    def describe(self) -> str:
        verdict = "agrees with" if self.agrees else f"DISAGREES in {self.mismatches} of them with"
        return (
            f"onnxruntime on {self.samples} random observations {verdict} warren's actor "
            f"(largest difference {self.max_abs_diff:.3g}, tolerance {TOLERANCE:g})"
        )


def check_export(policy: Policy, path: Path, samples: int = 256, seed: int = 1) -> ExportCheck:
    """Run the graph at ``path`` in onnxruntime and compare its actions with ``policy.act`` (deterministic)."""
    ort = _onnxruntime()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    obs = _random_obs(policy, samples, seed)
    exported = np.asarray(session.run(["action"], {"obs": obs})[0])
    expected = np.asarray(policy.act_batch(obs, deterministic=True))
    if exported.shape != expected.shape:
        return ExportCheck(samples, float("inf"), samples)
    diff = np.abs(exported.astype(np.float64) - expected.astype(np.float64)).reshape(samples, -1)
    per_sample = diff.max(axis=1) if diff.shape[1] else np.zeros(samples)
    return ExportCheck(samples, float(per_sample.max(initial=0.0)), int((per_sample > TOLERANCE).sum()))


def _obs_layout(policy: Policy) -> tuple[tuple[int, ...], np.dtype[Any]]:
    from worker.plugins.spaces import leaf_layout

    return leaf_layout(policy.spaces.observation)


def _random_obs(policy: Policy, count: int, seed: int) -> np.ndarray[Any, Any]:
    """``count`` observations sampled from the policy's observation space, in its layout."""
    space = policy.spaces.observation
    batch = gym.vector.utils.batch_space(space, count)
    batch.seed(seed)
    _, dtype = _obs_layout(policy)
    return np.ascontiguousarray(np.asarray(batch.sample()), dtype=dtype)
