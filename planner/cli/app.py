"""`planner`: the typer app. Each sub-command lives in its own module of this package.

Commands are loaded when they are invoked, not at start: `planner --help` must not pay for
OR-tools, numpy or rich (issue 10, item 6). COMMANDS holds each command's module and the one
line `planner --help` shows for it (tests check that every listed command loads from its module).
"""
from __future__ import annotations

from typing import Annotated

import errno
import importlib
import json
import os
import re
import sys

import typer
from typer import _click as click  # typer vendors its own click
from typer.core import TyperGroup
from typer.exceptions import Abort

COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("search", "Search for the fastest plans (CP-SAT over the exact model)."),
    "check": ("search", "Can this model train on this box? yes + best plan (exit 0) or no + why (exit 1)."),
    "count": ("search", "Number of valid mappings (memory ignored)."),
    "presets": ("search", "List model and system presets with their key numbers."),
    "estimate": ("estimate", "Time and memory of ONE plan under the exact analytical model."),
    "megatron": ("megatron", "Megatron-LM command-line arguments for a plan."),
    "checkpoint": ("checkpoint", "Checkpoint size, who writes it, storage bandwidth and the optimal interval."),
    "sweep": ("sweep", "Best plan at every point of a one- or two-parameter grid; writes CSV + plots."),
    "validate": ("validate", "Predicted vs measured step time for the published reference runs."),
}

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
EXIT_INTERNAL = 70      # EX_SOFTWARE: a bug in planner, not in the input
EXIT_IO = 74            # EX_IOERR: the output could not be written (disk full, quota)
EXIT_PIPE_CLOSED = 141  # 128 + SIGPIPE, what a shell reports when the reader of a pipe left (| head)
# errnos of a write that failed for want of room, not for a mistake in the input
NO_ROOM = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def _error(message: str, as_json: bool) -> None:
    """One line: JSON on stdout under --json (so a pipe still parses), else `error: ...` on stderr.
    Where stdout cannot take it (a full disk, a reader gone) the line goes to stderr; where neither
    can, it is dropped: the exit code still says what happened."""
    message = " ".join(str(message).split())
    try:
        if as_json:
            print(json.dumps({"error": message}), flush=True)
            return
    except (OSError, ValueError):
        _close_stdout()
    try:
        print(f"error: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


class _LazyOneLineGroup(TyperGroup):
    """Loads a command's module on first use, and turns every failure into one line + exit code:
    2 for input mistakes (SpecError, bad flag values), 130 for Ctrl-C, 70 for a bug."""

    def list_commands(self, ctx) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx, name: str):
        if name not in COMMANDS:
            return None
        if name not in self.commands:
            self.commands[name] = _built_command(name)
        return self.commands[name]

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError as err:
            if not stdout_reader_gone():  # another pipe (a worker's): a bug, reported as one (click
                # would make any EPIPE exit 1)
                raise RuntimeError(f"BrokenPipeError on a pipe other than stdout: {err}") from err
            raise  # stdout's: click exits 1, which main() turns into EXIT_PIPE_CLOSED

    def _value_options(self, name: str) -> set[str]:
        """The option names of command `name` that take a value (none for an unknown command)."""
        from typer.core import TyperOption
        try:
            cmd = self.get_command(click.core.Context(self), name)
        except Exception:  # noqa: BLE001 - a command that fails to load is reported by main() itself
            return set()
        return {opt for p in getattr(cmd, "params", ()) if isinstance(p, TyperOption) and not p.is_flag
                and not p.count for opt in (*p.opts, *p.secondary_opts)}

    def format_commands(self, ctx, formatter) -> None:
        # the one-line summaries without importing every command
        with formatter.section("Commands"):
            formatter.write_dl([(name, summary) for name, (_, summary) in COMMANDS.items()])

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        from hardware.errors import SpecError

        if sys.stdout is None:  # started with fd 1 closed (`>&-`): Python drops every print in silence
            _error("cannot write the output (standard output is closed)", False)
            if standalone_mode:
                sys.exit(EXIT_IO)
            return EXIT_IO

        # a message or a table may hold what the terminal's encoding cannot show (a file name that
        # is not UTF-8, an ASCII locale): escape it rather than fail on the way out
        for stream in (sys.stdout, sys.stderr):
            if hasattr(stream, "reconfigure"):
                stream.reconfigure(errors="backslashreplace")
        argv = list(sys.argv[1:] if args is None else args)
        # errors as JSON where the output is: --json, or megatron's --format json; a `--json` that
        # is the value of the option before it (`count -m --json`) asks for nothing
        takes_value = self._value_options(argv[0]) if argv else set()
        as_json = any(a == "--json" and (i == 0 or argv[i - 1] not in takes_value) for i, a in enumerate(argv)) \
            or any(a == "--format" and [w.lower() for w in argv[i + 1:i + 2]] == ["json"]
                   or a.lower() == "--format=json" for i, a in enumerate(argv))
        try:
            try:
                code = super().main(args=argv, prog_name=prog_name, complete_var=complete_var,
                                    standalone_mode=False, **extra)
            except SystemExit as done:
                # click answers EPIPE with exit 1 ("no plan fits" here), for a command's output and
                # for the --help and --version it prints itself: a closed stdout is 141
                if done.code == 1 and stdout_reader_gone():
                    raise _PipeClosed from None
                raise
        except SpecError as err:
            _error(err, as_json)
            code = 2
        except click.exceptions.ClickException as err:  # bad flag value, unknown option, ...
            hint = f" (see `{err.ctx.command_path} --help`)" if getattr(err, "ctx", None) else ""
            # click echoes an unknown option or command whole: a pasted 5 kB word is cut short
            from hardware.errors import shortened
            message = re.sub(r"\S{80,}", lambda word: shortened(word.group(0)), err.format_message())
            _error(f"{message}{hint}", as_json)
            code = err.exit_code
        except (KeyboardInterrupt, Abort):
            _error("interrupted", as_json)
            code = EXIT_INTERRUPTED
        except _PipeClosed:  # the reader of our output left (| head): nothing more to say
            _close_stdout()
            code = EXIT_PIPE_CLOSED
        except Exception as err:  # noqa: BLE001 - a user never sees a traceback, but a bug must stay visible
            if isinstance(err, PermissionError) and err.filename and not os.environ.get("PLANNER_DEBUG"):
                # a path the user gave that the OS refuses (other OS errors on user paths are
                # caught, with the field named, where each path is read)
                _error(f"path: {err.filename}: permission denied", as_json)
                code = 2
            elif isinstance(err, OSError) and err.errno in NO_ROOM and not os.environ.get("PLANNER_DEBUG"):
                _close_stdout()
                _error(f"cannot write the output ({err.strerror})", False)  # stdout is what failed
                code = EXIT_IO
            elif isinstance(err, OSError) and err.errno == errno.ENAMETOOLONG:
                # a path the user typed (-m, -s, --save, -o, --name) that the file system cannot hold
                # (other OS errors on user paths are caught where each path is read)
                _error(_name_too_long(str(err.filename or "")), as_json)
                code = 2
            elif os.environ.get("PLANNER_DEBUG"):
                raise
            else:
                _error(f"internal error ({type(err).__name__}: {err}); please report it "
                       "(PLANNER_DEBUG=1 shows the traceback)", as_json)
                code = EXIT_INTERNAL
        code = 0 if code is None else code
        if standalone_mode and code == EXIT_INTERRUPTED and args is None:  # the real process, not a test runner
            # Interrupted: every `with` block has closed its file on the way up; skip the
            # interpreter's teardown, in which OR-tools aborted now and then after a stopped solve
            # ("terminate called without an active exception", exit -6 instead of 130).
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        if standalone_mode:
            sys.exit(code)
        return code


_BUILT_COMMANDS: dict[str, click.Command] = {}


def _built_command(name: str) -> click.Command:
    """Command `name`, built from its module's typer registration once per process: typer reads
    every parameter's annotations to build it (~10 ms), which a process that invokes the app many
    times (a test runner) would otherwise pay on every call. The built command keeps no state
    between invocations."""
    if name not in _BUILT_COMMANDS:
        sub = typer.Typer(add_completion=False, rich_markup_mode=None)
        importlib.import_module(f"planner.cli.{COMMANDS[name][0]}").register(sub)
        built = typer.main.get_command(sub)
        found = built.commands if isinstance(built, TyperGroup) else {built.name: built}
        for cmd_name, cmd in found.items():
            _plain_numbers(cmd)
            _once_each(cmd)
            if cmd_name in COMMANDS:
                _BUILT_COMMANDS.setdefault(cmd_name, cmd)
        # a module that registers one command under a typer-made name serves `name` with it
        _BUILT_COMMANDS.setdefault(name, next(iter(found.values())))
    return _BUILT_COMMANDS[name]


def _plain_numbers(command) -> None:
    """Number options read as -g has always read them: ASCII digits, no '_' separators, and -0.0
    as 0.0. Typer's conversion (pydantic's or Python's int()/float(), by version) takes '1_024' as
    1024 and, in some versions, Arabic-Indic or fullwidth digits; a negative zero would be saved
    and printed as -0.0."""
    for param in getattr(command, "params", ()):
        desc = getattr(param, "type_descriptor", None)  # typer's own parameters; click's name their type
        kind = getattr(desc, "annotation", None) if desc is not None else \
            {"integer": int, "float": float}.get(getattr(getattr(param, "type", None), "name", None))
        if kind in (int, float):
            param.process_value = _plain_number_value(param.process_value, kind)


def _once_each(command) -> None:
    """An option that takes one value, given twice, is refused: click keeps the last one in
    silence (`-m llama3-70b -m llama3-8b` planned the 8B; `--save a --save b` wrote only b); so is
    a flag given both ways (--x --no-x). The same flag twice says one thing and passes. Options
    that take several (--vary, --reference, --module-dtype) are `multiple` and left alone. The
    tokens are read as click reads them: the one after a value-taking option is its value, even if
    it starts with a dash (--save -best.yaml)."""
    options = [p for p in getattr(command, "params", ()) if getattr(p, "param_type_name", "") == "option"]
    by_opt = {opt: p for p in options for opt in (*p.opts, *p.secondary_opts)}
    parse_args = command.parse_args

    def named(param) -> str:  # the flag as the user writes it, without dashes
        return max(param.opts, key=len).lstrip("-")

    def checked(ctx, args):
        given: dict = {}  # parameter -> the tokens that gave it
        i = 0
        while i < len(args):
            token = args[i]
            i += 1
            if token == "--":
                break
            opt = token.split("=", 1)[0] if token.startswith("--") else token[:2] if token.startswith("-") else None
            param = by_opt.get(opt)
            if param is None:
                continue
            inline = token.startswith("--") and "=" in token or (not token.startswith("--") and len(token) > 2)
            if not getattr(param, "is_flag", False) and not inline:
                i += 1  # its value, whatever it looks like
            if getattr(param, "multiple", False) or getattr(param, "count", False):
                continue
            given.setdefault(param, []).append(token if getattr(param, "is_flag", False) else opt)
        for param, used in given.items():
            repeated = len(set(used)) > 1 if getattr(param, "is_flag", False) else len(used) > 1
            if repeated:
                raise click.exceptions.UsageError(f"{named(param)}: given {len(used)} times ({', '.join(used)}); "
                                                  "give it once", ctx=ctx)
        return parse_args(ctx, args)
    command.parse_args = checked


def _plain_number_value(process_value, kind):
    from hardware.errors import shortened
    what, example = ("an integer", "1024") if kind is int else ("a number", "1.5")

    def process(ctx, value):
        texts = [t for t in (value if isinstance(value, (list, tuple)) else (value,)) if isinstance(t, str)]
        for text in texts:
            if not text.isascii() or "_" in text:
                raise click.exceptions.BadParameter(f"{shortened(text)!r} is not {what} in ASCII digits without "
                                                    f"'_' (e.g. {example})", ctx=ctx)
        try:
            value = process_value(ctx, value)
        except click.exceptions.BadParameter:
            # typer's conversion says pydantic's words ("Input should be a valid integer, unable to
            # parse string as an integer" for -g 8.5): say what was written and what is wanted
            bad = next((t for t in texts if not _plain_number(t, kind)), None)
            if bad is None:
                raise
            raise click.exceptions.BadParameter(f"{shortened(bad)!r} is not {what} (e.g. {example})", ctx=ctx) from None
        return 0.0 if isinstance(value, float) and value == 0 else value
    return process


def _plain_number(text: str, kind) -> bool:
    """Whether `text` reads as a number of `kind` (an int: optional sign and digits)."""
    if kind is int:
        return re.fullmatch(r"\s*[+-]?\d+\s*", text) is not None
    try:
        float(text)
    except ValueError:
        return False
    return True


class _PipeClosed(Exception):
    """The reader of stdout left (`| head`)."""


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reading end is closed (poll reports an error on it)."""
    import select
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(event & (select.POLLERR | select.POLLHUP) for _, event in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows), no real file descriptor
        return False


def _close_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _name_too_long(path: str) -> str:
    from hardware.errors import shortened
    return (f"path: a name in it is too long for the file system ({len(os.fsencode(path))} bytes in all; "
            f"a file name may have at most 255): {shortened(path)}")


app = typer.Typer(
    cls=_LazyOneLineGroup, add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Plan tensor/pipeline/data parallelism, batch, recompute and offload for LLM training.\n\n"
         "Start with `planner plan` (GPT-3 175B on 1024 A100, batch 1536) or `planner presets`. "
         "-m/-s take a preset name or a path to a YAML file: a bare preset name always means the "
         "preset (write ./NAME for a file of that name). Exit codes: 0 done, 1 no plan fits, "
         "2 input error, 70 internal error (a bug in planner), 74 output not written (disk full, "
         "standard output closed), 130 interrupted, 141 output pipe closed. "
         "PARPLAN_THREADS=N sets the threads a search uses "
         "(default: the usable CPUs, at most 8; same plans on any count).")


def _print_version(show: bool) -> None:
    if show:
        from importlib.metadata import PackageNotFoundError, version
        try:
            typer.echo(f"parplan {version('parplan')}")
        except PackageNotFoundError:  # run from a checkout that was never installed
            typer.echo("parplan (not installed: version unknown)")
        raise typer.Exit()


@app.callback()
def _root(show_version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_print_version,
                                                     help="Print the version and exit.")] = False) -> None:
    """Plan tensor/pipeline/data parallelism, batch, recompute and offload for LLM training."""


def main() -> None:
    """Console entry point."""
    # pydantic scans every installed distribution's entry points for plugins when it builds the
    # first model class (~20 ms of start-up); the planner uses none. Set the variable yourself
    # (e.g. to "") to let pydantic load plugins.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    app()
