"""The ``warren`` command: one subcommand per role, their shared flags, and ``warren run``."""

from __future__ import annotations

from worker.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
