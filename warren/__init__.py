"""warren's public API: use a trained policy, drive a job from Python, write plug-ins.

::

    import warren

    policy = warren.load_policy("runs/<id>")          # the run's best policy (no broker, no torch for MLPs)
    action = policy.act(obs)                           # raw env observations, one or a batch
    summary = warren.Job.from_toml("configs/cartpole_dqn.toml").run(collectors=2)

Everything a user imports is named here (and the plug-in contract in :mod:`warren.plugins`);
the packages ``worker`` and ``messaging`` are warren's internals and change without notice.
"""

from __future__ import annotations

from warren.job import Job
from worker.agent.policy import Policy, load_policy
from worker.errors import (
    ConfigurationError,
    CorruptFile,
    MissingFile,
    PluginFailed,
    PolicyMismatch,
    StorageError,
    TaskError,
    WarrenError,
)
from worker.plugins.contract import (
    Actor,
    Algorithm,
    Chunk,
    Column,
    EnvContext,
    EnvPlugin,
    Learner,
    Model,
    ModelPlugin,
    NoConfig,
    Obs,
    config_from_dict,
    config_to_dict,
)
from worker.plugins.registry import MissingPlugin
from worker.plugins.spaces import Spaces, UnsupportedSpace

__all__ = [
    "Actor",
    "Algorithm",
    "Chunk",
    "Column",
    "ConfigurationError",
    "CorruptFile",
    "EnvContext",
    "EnvPlugin",
    "Job",
    "Learner",
    "MissingFile",
    "MissingPlugin",
    "Model",
    "ModelPlugin",
    "NoConfig",
    "Obs",
    "PluginFailed",
    "Policy",
    "PolicyMismatch",
    "Spaces",
    "StorageError",
    "TaskError",
    "UnsupportedSpace",
    "WarrenError",
    "config_from_dict",
    "config_to_dict",
    "load_policy",
]
