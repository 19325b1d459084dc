"""Benchmarks: warren against raw pika, a bare rollout loop, Stable-Baselines3 and published figures."""
