"""Tests of what surrounds the code: the compose files, the Dockerfile, scripts/test and the benchmarks."""
