"""The public ``warren`` package, and the old plug-in import path kept for one release with a warning.

* ``warren`` names what a user imports (``__all__``), and ``warren.plugins`` the whole
  plug-in API that ``worker.plugins`` served;
* importing those names from ``worker.plugins`` outside warren warns, pointing at the
  importing line and naming the new place; warren's own modules (and its example plug-in
  package) import without any warning;
* importing ``warren`` imports no torch.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import warren
import warren.plugins

INTERNAL_IMPORTS = """
import sys
import warren, warren.plugins
import worker.cli.main, worker.cli.run, worker.cli.eval, worker.cli.check
import worker.coordinator.loop, worker.learner.service, worker.collector.service, worker.inprocess
import warren_example.env, warren_example.model, warren_example.reinforce
print("torch" in sys.modules)
"""


def test_warren_names_the_public_api_and_warren_plugins_the_whole_plugin_contract() -> None:
    # Every name warren exports is there, the plug-in bases among them
    for name in warren.__all__:
        assert getattr(warren, name) is not None
    assert {"load_policy", "Policy", "Job", "EnvPlugin", "Algorithm", "ModelPlugin", "EnvContext"} <= set(
        warren.__all__
    )
    # and warren.plugins serves every name worker.plugins served, as the same objects
    import worker.plugins

    assert set(warren.plugins.__all__) == set(worker.plugins.__all__)
    for name in warren.plugins.__all__:
        assert getattr(worker.plugins, name) is getattr(warren.plugins, name)


def test_warrens_own_modules_import_the_plugin_api_without_a_warning_and_warren_imports_no_torch() -> None:
    # When warren's roles, its CLI and its example plug-in package are imported with warnings as errors
    done = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", INTERNAL_IMPORTS],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # Then none warns (a warning would be an error here)
    assert done.returncode == 0, done.stderr[-3000:]
    # and none of them imported torch (it is imported where a torch actor or a learner is made)
    assert done.stdout.strip() == "False"


def test_a_plugin_package_importing_from_worker_plugins_is_warned_where_it_imports(tmp_path: Path) -> None:
    # Given a third-party module that imports the plug-in API from its old place
    (tmp_path / "old_style_plugin.py").write_text(
        textwrap.dedent(
            """
            from __future__ import annotations

            from worker.plugins import EnvPlugin
            """
        )
    )
    code = textwrap.dedent(
        """
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import old_style_plugin
        import warren
        for w in caught:
            print(f"{w.category.__name__}|{w.filename.rsplit('/', 1)[-1]}:{w.lineno}|{w.message}")
        print("same", old_style_plugin.EnvPlugin is warren.EnvPlugin)
        """
    )
    # When it is imported
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    # Then it gets the same class, with one DeprecationWarning at its import line naming warren.plugins
    assert lines[-1] == "same True"
    warned = [line for line in lines[:-1] if line.startswith("DeprecationWarning")]
    assert len(warned) == 1, lines
    _, where, message = warned[0].split("|", 2)
    assert where == "old_style_plugin.py:4"
    assert "import it from warren.plugins" in message and "EnvPlugin" in message
