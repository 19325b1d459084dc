"""Benchmarks: warren against raw pika, a bare rollout loop and published figures."""
