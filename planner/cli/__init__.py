"""The command-line layer: one module per sub-command, `app` ties them together."""
from planner.cli.app import app, main

__all__ = ["app", "main"]
