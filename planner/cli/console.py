"""The rich Console the commands print with, leaving a closed pipe to `planner`'s own exit code."""
from __future__ import annotations

import errno
import os

from rich.console import Console as _RichConsole


class Console(_RichConsole):
    """rich with markup off: a plan's text such as `rc-selective[mlp]` is printed as written (rich
    markup took `[mlp]` for a style tag and dropped it, so `planner check` named a plan that does
    not fit as written); styled words are rich Text objects. And rich exits with status 1 when the
    reader of a pipe leaves (`planner presets | head`), the status that means "no plan fits"; raise
    BrokenPipeError instead, which the app answers with 141 (128 + SIGPIPE), as a shell does."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("markup", False)
        super().__init__(*args, **kwargs)

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))  # with its errno, as click reads it
