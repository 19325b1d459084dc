"""``python -m tests.session_broker ENV_FILE``: a private RabbitMQ for one run of the test suite.

The suite needs the management API (vhosts per session, connection and consumer checks). A
broker that already answers on ``WARREN_AMQP_URL`` may be shared and must not be
reconfigured, so when it has no management API ``scripts/test`` starts this instead: one
private node (:mod:`tests.rabbit_nodes`: own ports, data, cookie; management on) that
lives as long as this process. Once the node answers, ``ENV_FILE`` gets the lines
the suite reads::

    WARREN_AMQP_URL=amqp://guest:guest@127.0.0.1:<port>/%2F
    WARREN_MANAGEMENT_URL=http://127.0.0.1:<port>
    WARREN_PROMETHEUS_URL=http://127.0.0.1:<port>

The node is removed when this process gets SIGTERM or SIGHUP, or when its parent (the
test command) dies.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

from tests.rabbit_nodes import NodeError, PrivateCluster

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGTERM when the parent exits (Linux), so a killed test command leaves no node behind."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    env_file = Path(argv[0])
    parent = os.getppid()
    die_with_parent()
    if os.getppid() != parent:  # the parent died before the death signal was armed
        return 1
    try:
        cluster = PrivateCluster.start(1)
    except NodeError as exc:
        print(f"session broker: {exc}", file=sys.stderr)
        return 1
    node = cluster.nodes[0]
    partial = env_file.with_name(env_file.name + ".partial")
    partial.write_text(
        f"WARREN_AMQP_URL={node.amqp_url}\nWARREN_MANAGEMENT_URL={node.management_url}\n"
        f"WARREN_PROMETHEUS_URL={node.prometheus_url}\n"
    )
    os.replace(partial, env_file)
    print(f"session broker: {node.name} at {node.amqp_url}, management {node.management_url}", flush=True)
    # Until a signal: tests.rabbit_nodes' handlers stop the node and end this process.
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
