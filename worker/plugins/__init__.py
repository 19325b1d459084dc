"""The plug-in contract (:mod:`.contract`), spaces as data (:mod:`.spaces`), and finding plug-ins (:mod:`.registry`).

Private to warren: plug-in packages import these names from :mod:`warren.plugins` (or
:mod:`warren`). Importing them from here still works for one release, but code outside
warren gets a ``DeprecationWarning`` naming the new place; warren's own modules
(``worker``, ``messaging``, ``warren``, its tests and benchmarks) import them from here
without one. The names are served by a module ``__getattr__`` (PEP 562), which is how
the warning can tell who is importing: the frame that asked.
"""

from __future__ import annotations

import sys
import warnings
from types import FrameType, ModuleType
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
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

#: Each name this package has served, and the submodule that defines it.
_HOMES: Final = {
    **dict.fromkeys(
        (
            "Actor",
            "Algorithm",
            "Chunk",
            "Column",
            "EnvContext",
            "EnvPlugin",
            "Learner",
            "Model",
            "ModelPlugin",
            "NoConfig",
            "Obs",
            "config_from_dict",
            "config_to_dict",
        ),
        "contract",
    ),
    **dict.fromkeys(("LoadedPlugin", "MissingPlugin", "PluginKind", "PluginRegistry", "installed"), "registry"),
    **dict.fromkeys(("Spaces", "UnsupportedSpace"), "spaces"),
}
#: Top-level packages whose imports from here are warren's own (no warning).
_WARREN_PACKAGES: Final = frozenset({"worker", "messaging", "warren", "tests", "benchmarks"})

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


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _outside_warren(sys._getframe(1)):
        warnings.warn(
            f"importing {name} from worker.plugins is deprecated: import it from warren.plugins (or warren); "
            "worker is warren's private package, and worker.plugins stops serving these names in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
    return getattr(_SUBMODULES[home], name)


def _submodules() -> dict[str, ModuleType]:
    # Imported here, not at the top: the submodules import from this package as it loads.
    from worker.plugins import contract, registry, spaces

    return {"contract": contract, "registry": registry, "spaces": spaces}


_SUBMODULES: Final = _submodules()


def _outside_warren(frame: FrameType) -> bool:
    """Whether the code that asked for a name (``frame``) is not warren's own.

    ``from worker.plugins import X`` asks twice: importlib's ``_handle_fromlist`` first (this
    is a package), whose frozen frame says nothing, then the importing module's own line,
    which is the one judged (and warned at: ``warnings`` skips importlib's frames).
    """
    if frame.f_code.co_filename.startswith("<frozen importlib"):
        return False
    return str(frame.f_globals.get("__name__", "")).partition(".")[0] not in _WARREN_PACKAGES
