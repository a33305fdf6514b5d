"""The rich Console the commands print with, leaving a closed pipe to `planner`'s own exit code."""
from __future__ import annotations

import errno
import os

from rich.console import Console as _RichConsole


MIN_WIDTH = 40  # columns: below this the tables and plan lines are not readable


def _columns() -> int | None:
    """The terminal width the environment asks for (COLUMNS, as rich reads it), None if unset or not a number."""
    try:
        return int(os.environ.get("COLUMNS", ""))
    except ValueError:
        return None


class Console(_RichConsole):
    """rich with markup off: a plan's text such as `rc-selective[mlp]` is printed as written (rich
    markup took `[mlp]` for a style tag and dropped it, so `planner check` named a plan that does
    not fit as written); styled words are rich Text objects. And rich exits with status 1 when the
    reader of a pipe leaves (`planner presets | head`), the status that means "no plan fits"; raise
    BrokenPipeError instead, which the app answers with 141 (128 + SIGPIPE), as a shell does."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("markup", False)
        columns = _columns()
        if "width" not in kwargs and columns is not None and columns < MIN_WIDTH:
            # COLUMNS=0 made rich print nothing at all (a plan's exit code and no plan); a
            # narrower request wraps every word on its own line
            kwargs["width"] = MIN_WIDTH
        super().__init__(*args, **kwargs)

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))  # with its errno, as click reads it
