"""The offline kit's broker: one RabbitMQ node started from package files unpacked under a prefix.

Fetching the kit's own Debian packages needs the network (``scripts/offline-kit selftest``
does the whole round, docs/deploy.md); here the same files come from this machine's
installed packages, copied under a prefix: what ``offline-kit install`` leaves after
``dpkg -x``, with the system's copies still there to be (wrongly) used instead.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from messaging import BrokerLink, Settings
from scripts.offline_kit.install import relocate_erlang
from scripts.rabbit_node import (
    STANDALONE_MARKER,
    marked_pids,
    port_is_free,
    proc_alive,
    start_standalone,
    stop_standalone,
    vm_pid,
)
from tests.conftest import _need_rabbitmq_package

pytestmark = pytest.mark.rabbitmq


def test_a_broker_started_from_unpacked_files_serves_warren_and_its_stop_leaves_nothing_running(tmp_path: Path) -> None:
    _need_rabbitmq_package()
    # Given Erlang and RabbitMQ unpacked under a prefix, their start scripts pointed at it
    prefix = tmp_path / "root"
    for part in ("erlang", "rabbitmq"):
        shutil.copytree(Path("/usr/lib") / part, prefix / "usr/lib" / part, symlinks=True)
    relocate_erlang(prefix)
    data = tmp_path / "broker"
    vm = 0
    try:
        # When the kit's broker starts from it
        layout = start_standalone(prefix, data)
        vm = vm_pid(layout)
        # Then its VM is the prefix's Erlang, with a port-mapper of its own
        assert os.readlink(f"/proc/{vm}/exe").startswith(f"{prefix}/usr/lib/erlang/")
        assert len(marked_pids(STANDALONE_MARKER, layout.dir, "epmd")) == 1
        # and warren connects to the URL it wrote for a shell to source
        env = dict(line.split("=", 1) for line in (data / "broker.env").read_text().splitlines())
        settings = Settings.from_env({}, amqp_url=env["WARREN_AMQP_URL"], connect_timeout_s=10, rpc_timeout_s=10)
        with BrokerLink(settings, "offline-kit-test") as link:
            assert link.node == f"127.0.0.1:{layout.ports.amqp}"
        # and a second start finds the running node instead of starting another
        assert start_standalone(prefix, data) == layout
    finally:
        stopped = stop_standalone(data)
    # Then the stop ends the VM and its port-mapper and frees the ports
    assert stopped and not proc_alive(vm)
    assert marked_pids(STANDALONE_MARKER, layout.dir, "epmd") == []
    assert port_is_free(layout.ports.amqp)
    assert not (data / "broker.env").exists()
