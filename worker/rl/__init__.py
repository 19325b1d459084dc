"""Broker-free reinforcement-learning core: env batches, the collector loop, chunks, replay buffers and feed.

Nothing here talks to RabbitMQ or touches files: the roles wire these pieces to the
broker and the shared volume through :class:`worker.rl.rollout.SampleSink` and
:class:`worker.rl.rollout.PolicySource`. The algorithms (their networks, actors and
learners) live in :mod:`worker.algorithms`. Import the submodules directly; this package
imports nothing itself. Only the learner's device pieces (:mod:`.placement`,
:mod:`.device_frames`) import torch, and only learners import them: a collector whose
actor runs in numpy never imports torch.
"""
