"""Finding plug-ins (worker/plugins/registry.py): built-ins, installed entry points, the allowlist, broken packages.

The entry points come from a throwaway distribution written into a temp dir on
``sys.path`` (a package and its ``*.dist-info`` with ``entry_points.txt``), which is
what ``pip install`` leaves behind.
"""

from __future__ import annotations

import importlib
import logging
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker.algorithms.dqn import DQN
from worker.algorithms.random import RandomActions
from worker.envs.gymnasium import GymnasiumEnvs
from worker.models.mlp import MLP
from worker.plugins import MissingPlugin, PluginKind, PluginRegistry
from worker.plugins.registry import import_env_packages, warren_version

PACKAGE = "toy_warren_plugins"
DIST = "toy-warren-plugins"
VERSION = "1.2.3"

MODULE = """
import gymnasium as gym
from torch import nn

from warren.plugins import Algorithm, EnvPlugin, ModelPlugin

IMPORTED = True


class ToyEnvs(EnvPlugin):
    def make_env(self, ctx):
        return gym.make("CartPole-v1")


class FussyEnvs(EnvPlugin):
    def __init__(self):
        raise RuntimeError("needs a GPU")

    def make_env(self, ctx):
        raise AssertionError


class ToyModel(ModelPlugin):
    def make_encoder(self, observation_space, config):
        module = nn.Flatten()
        module.out_dim = 4
        return module


class ToyAlgorithm(Algorithm):
    kind = "none"

    def make_actor(self, seed):
        raise NotImplementedError

    def make_learner(self, seed):
        raise NotImplementedError


class NotAPlugin:
    pass
"""

ENTRY_POINTS = """
[warren.envs]
toy = toy_warren_plugins:ToyEnvs
fussy = toy_warren_plugins:FussyEnvs

[warren.models]
toy = toy_warren_plugins:ToyModel
broken = toy_warren_plugins.broken:Model

[warren.algorithms]
toy = toy_warren_plugins:ToyAlgorithm
dqn = toy_warren_plugins:ToyAlgorithm
imposter = toy_warren_plugins:NotAPlugin
"""


@pytest.fixture(scope="module")
def toy_distribution(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A distribution ``toy-warren-plugins`` 1.2.3 with good, broken and clashing entry points, on ``sys.path``."""
    root = tmp_path_factory.mktemp("site")
    package = root / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text(MODULE)
    (package / "broken.py").write_text("raise ImportError('libtoy.so: cannot open shared object file')\n")
    info = root / f"{PACKAGE}-{VERSION}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST}\nVersion: {VERSION}\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(ENTRY_POINTS))
    (root / "warren_test_env_package.py").write_text("REGISTERED = True\n")
    (root / "warren_test_broken_env_package.py").write_text("raise RuntimeError('no ROMs installed')\n")
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    try:
        yield root
    finally:
        sys.path.remove(str(root))
        for name in list(sys.modules):
            if name.startswith((PACKAGE, "warren_test_")):
                del sys.modules[name]
        importlib.invalidate_caches()


def fresh_import_of_the_toy_package() -> None:
    for name in list(sys.modules):
        if name.startswith(PACKAGE):
            del sys.modules[name]


def test_the_builtins_are_there_without_any_entry_point() -> None:
    # Given an allowlist that admits no installed distribution at all
    registry = PluginRegistry.discover(allow="", env_packages="")
    # Then warren's own plug-ins are loaded anyway, at warren's version
    assert isinstance(registry.get(PluginKind.ENV, "gymnasium").obj, GymnasiumEnvs)
    assert isinstance(registry.get(PluginKind.MODEL, "mlp").obj, MLP)
    assert registry.get(PluginKind.ALGORITHM, "dqn").obj is DQN  # algorithms stay classes: bound per job
    assert registry.get(PluginKind.ALGORITHM, "random").obj is RandomActions
    version = warren_version()
    inventory = registry.inventory()
    assert set(inventory) == {"envs", "models", "algorithms"}
    assert inventory["algorithms"]["dqn"] == inventory["models"]["mlp"] == version
    assert registry.get(PluginKind.ALGORITHM, "dqn", version).distribution == "warren"


def test_entry_points_of_an_installed_distribution_are_loaded_with_its_version(toy_distribution: Path) -> None:
    fresh_import_of_the_toy_package()
    registry = PluginRegistry.discover(allow="*", env_packages="")

    toy_env = registry.get(PluginKind.ENV, "toy", VERSION)
    assert type(toy_env.obj).__name__ == "ToyEnvs" and toy_env.distribution == DIST
    assert registry.get(PluginKind.MODEL, "toy").version == VERSION
    assert registry.get(PluginKind.ALGORITHM, "toy").obj.__name__ == "ToyAlgorithm"
    assert registry.inventory()["envs"]["toy"] == VERSION
    envs_line = _describe(registry)[0]
    assert envs_line.startswith("envs: ") and f"toy {VERSION}" in envs_line and "gymnasium " in envs_line


def _describe(registry: PluginRegistry) -> list[str]:
    from worker.plugins.registry import describe_inventory

    return list(describe_inventory(registry.inventory()))


@pytest.mark.parametrize("allow", ["", "some-other-dist", "warren"])
def test_a_distribution_outside_the_allowlist_is_not_even_imported(
    toy_distribution: Path, allow: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Given an allowlist that does not name the toy distribution
    fresh_import_of_the_toy_package()
    with caplog.at_level(logging.INFO, logger="worker.plugins.registry"):
        registry = PluginRegistry.discover(allow=allow, env_packages="")
    # Then none of its plug-ins is there, its code never ran, and the log says why
    for kind in PluginKind:
        assert "toy" not in registry.plugins[kind]
    assert PACKAGE not in sys.modules
    assert "not in WARREN_PLUGINS" in caplog.text
    # and asking for one is a refusal naming what this process has
    with pytest.raises(MissingPlugin, match=r"env plug-in 'toy' is not installed here \(have: gymnasium"):
        registry.get(PluginKind.ENV, "toy")


@pytest.mark.parametrize("allow", [DIST, "toy_warren_plugins", " Toy-Warren-Plugins , other"])
def test_the_allowlist_names_distributions_however_they_are_spelt(toy_distribution: Path, allow: str) -> None:
    registry = PluginRegistry.discover(allow=allow, env_packages="")
    assert registry.get(PluginKind.MODEL, "toy").distribution == DIST


def test_broken_plugins_are_reported_and_the_rest_still_load(
    toy_distribution: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a distribution with one good plug-in of each kind and four bad entry points
    fresh_import_of_the_toy_package()
    with caplog.at_level(logging.ERROR, logger="worker.plugins.registry"):
        registry = PluginRegistry.discover(allow=DIST, env_packages="")
    # Then each bad one is one sentence in failures (and an error in the log), naming what went wrong
    failures = "\n".join(registry.failures)
    assert len(registry.failures) == 4, failures
    assert "model plug-in 'broken' from toy-warren-plugins: import failed: ImportError: libtoy.so" in failures
    assert "env plug-in 'fussy' from toy-warren-plugins: cannot be instantiated: RuntimeError: needs a GPU" in failures
    assert "algorithm plug-in 'imposter' from toy-warren-plugins:" in failures
    assert "is not a subclass of worker.plugins.contract.Algorithm" in failures
    assert "algorithm plug-in 'dqn' from toy-warren-plugins: the name is taken by a built-in" in failures
    assert caplog.text.count("plug-in not loaded") == 4
    # and none of them is there, while the good ones and the built-ins are (dqn is still warren's)
    assert {"broken"} & set(registry.plugins[PluginKind.MODEL]) == set()
    assert "fussy" not in registry.plugins[PluginKind.ENV] and "imposter" not in registry.plugins[PluginKind.ALGORITHM]
    assert registry.get(PluginKind.ALGORITHM, "dqn").obj is DQN
    assert registry.get(PluginKind.ENV, "toy").version == VERSION


def test_a_plugin_at_another_version_is_refused_naming_both() -> None:
    registry = PluginRegistry.discover(allow="", env_packages="")
    have = warren_version()

    with pytest.raises(MissingPlugin) as info:
        registry.get(PluginKind.ALGORITHM, "dqn", "99.0")

    assert info.value.message == f"algorithm plug-in 'dqn' is {have} here, the task wants 99.0"
    assert info.value.result == {"plugin": {"kind": "algorithm", "name": "dqn", "version": "99.0"}, "have": have}


def test_a_name_is_only_ever_looked_up_never_imported() -> None:
    # Given names a hostile task might send in place of a plug-in name
    registry = PluginRegistry.discover(allow="", env_packages="")
    before = set(sys.modules)
    for name in ("os:system", "subprocess", "worker.algorithms.dqn:DQN", "__import__('os')"):
        # Then each is a missing plug-in, and not one module was imported looking for it
        with pytest.raises(MissingPlugin) as info:
            registry.get(PluginKind.ALGORITHM, name)
        assert info.value.result["have"] is None
    assert set(sys.modules) == before


def test_env_packages_are_imported_at_start_and_missing_or_broken_ones_skipped(
    toy_distribution: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="worker.plugins.registry"):
        imported = import_env_packages(
            "warren_test_env_package, warren_no_such_package_xyz, warren_test_broken_env_package,"
        )
    assert imported == ("warren_test_env_package",)
    assert sys.modules["warren_test_env_package"].REGISTERED is True
    assert "env package warren_test_broken_env_package failed to import: RuntimeError: no ROMs installed" in caplog.text
    registry = PluginRegistry.discover(allow="", env_packages="warren_test_env_package")
    assert registry.env_packages == ("warren_test_env_package",)
