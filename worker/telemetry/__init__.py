"""What a run shows outside its logs: Prometheus metrics of every role, TensorBoard scalars.

* :mod:`worker.telemetry.metrics`: a role's registry and ``/metrics`` server (prometheus_client),
  with the transport's own counters (:mod:`messaging.stats`).
* :mod:`worker.telemetry.collector`, :mod:`~worker.telemetry.learner`: what those roles
  count, and (learner) writes to TensorBoard; the coordinator's, which counts its own
  tasks, lives with them (:mod:`worker.coordinator.telemetry`).
* :mod:`worker.telemetry.tensorboard`: the event files.

Everything is off unless a role is given a metrics port (``WARREN_METRICS_PORT``) or a
TensorBoard directory (``WARREN_TENSORBOARD_DIR``); off, the roles call no-op objects and
neither prometheus_client nor tensorboard is imported. The submodules are imported on
their own (nothing is re-exported here) for the same reason.
"""
