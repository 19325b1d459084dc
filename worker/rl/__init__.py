"""Broker-free reinforcement-learning core: envs, policies, the collector loop and the DQN learner.

Nothing here talks to RabbitMQ or touches files: the roles wire these pieces to the
broker and the shared volume through :class:`worker.rl.rollout.SampleSink` and
:class:`worker.rl.rollout.PolicySource`. Import the submodules directly; this package
imports nothing itself, so a process that needs only :mod:`worker.rl.config` (the
coordinator) never loads torch.
"""
