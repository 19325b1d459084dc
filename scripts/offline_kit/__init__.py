"""Everything a warren run needs on a machine cut off from package indexes, in one directory.

    scripts/offline-kit build DIR [--python 3.12] [--extras atari] [--without torch,numpy,...]
    scripts/offline-kit install DIR [--prefix PREFIX] [--target SITE]
    scripts/offline-kit start-broker DIR|PREFIX [--amqp-port N]
    scripts/offline-kit stop-broker DIR|PREFIX
    scripts/offline-kit selftest [--keep DIR]

``build`` runs where pip and apt reach their indexes. The kit holds warren's wheel (built
from this tree) and the wheels of its runtime dependencies for the target's CPython on
manylinux x86_64, leaving out what the target already has (torch, numpy... and whatever
only they need), and the Debian packages of RabbitMQ and the Erlang it depends on. It
also carries its own tools, so ``DIR/offline-kit install DIR`` works without the repository.

``install`` runs on the offline machine: ``pip install --no-index`` from the kit, the
Debian packages unpacked (``dpkg -x``) under a prefix, never installed as system packages
or services. ``start-broker`` then runs one RabbitMQ node from those files as a plain
process (scripts/rabbit_node.py): its own data directory, ports, cookie and port-mapper,
the management plugin on, and prints the ``WARREN_AMQP_URL`` to use.

``selftest`` is the whole round on this machine (needs the indexes): build a kit into a
temporary directory, install it into a scratch virtualenv with ``--no-index``, start its
broker, run warren against it, stop it.

Only the standard library and pip (its own copy of ``packaging`` where no other is
installed): it runs before warren, on machines that have nothing else. It runs as a folder
(``python3 scripts/offline_kit``, what ``scripts/offline-kit`` does) and is imported by the
tests as ``scripts.offline_kit``: :mod:`.kit` (the kit's layout, defaults, targets, running
tools), :mod:`.contents` (what goes into a kit: wheels, Debian packages, the manifest),
:mod:`.build`, :mod:`.install` (and the broker), :mod:`.cli` (the command line, ``selftest``).
"""
