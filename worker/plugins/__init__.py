"""The plug-in contract (:mod:`.contract`), spaces as data (:mod:`.spaces`), and finding plug-ins (:mod:`.registry`)."""

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
