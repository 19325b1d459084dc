"""warren's plug-in API: what an env, a model and an algorithm plug-in subclass and receive.

The public home of the contract (``docs/plugins.md``): subclass :class:`EnvPlugin`,
:class:`ModelPlugin` or :class:`Algorithm` (with its :class:`Actor` and :class:`Learner`),
read :class:`Spaces`, :class:`EnvContext` and :class:`Chunk`, and raise
:class:`UnsupportedSpace` for what your plug-in cannot take. ``worker.plugins``, where these
names lived before, is warren's private module now; importing them from there still works
for one release, with a ``DeprecationWarning``.
"""

from __future__ import annotations

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
from worker.plugins.registry import LoadedPlugin, MissingPlugin, PluginKind, PluginRegistry, installed
from worker.plugins.spaces import Spaces, UnsupportedSpace

__all__ = [
    "Actor",
    "Algorithm",
    "Chunk",
    "Column",
    "EnvContext",
    "EnvPlugin",
    "Learner",
    "LoadedPlugin",
    "MissingPlugin",
    "Model",
    "ModelPlugin",
    "NoConfig",
    "Obs",
    "PluginKind",
    "PluginRegistry",
    "Spaces",
    "UnsupportedSpace",
    "config_from_dict",
    "config_to_dict",
    "installed",
]
