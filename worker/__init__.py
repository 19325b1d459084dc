"""Everything of warren above the transport: the roles (collector, coordinator, learner) and what they share.

The wire contract (:mod:`worker.protocol`), the plug-in contract and the built-in plug-ins
(:mod:`worker.plugins`, :mod:`worker.algorithms`, :mod:`worker.models`, :mod:`worker.envs`),
the broker-free RL core (:mod:`worker.rl`), the shared-volume storage (:mod:`worker.storage`),
telemetry, and on top the entry points, which nothing below imports: the ``warren`` command
(:mod:`worker.cli`) and what the public Python API (:mod:`warren`) runs (:mod:`worker.agent`).

Private: users and plug-in authors import :mod:`warren` (and :mod:`warren.plugins`); the
modules here change without notice from one release to the next.
"""
