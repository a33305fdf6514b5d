"""User-facing input errors: one line that names the field and what is allowed."""
from __future__ import annotations

import functools
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # yaml and pydantic load on first use: this module is on every CLI path
    from pydantic import ValidationError


class SpecError(ValueError):
    """A mistake in what the user gave us; the CLI prints it as one line and exits 2."""


# pydantic error type of a cross-field check whose message names its fields itself, relative to
# where the error sits (hardware/spec.py raises it as a PydanticCustomError)
INCONSISTENT = "inconsistent"


# A name the output shows (a system's, a model's): one line with some visible text, no control
# characters (C0, DEL, C1), Unicode line separators or bidirectional controls (overrides and
# isolates U+202A-E, U+2066-9: a right-to-left override printed the name reversed; the marks
# U+200E-F and U+061C), which would garble the header it is printed in. Zero-width characters
# (U+200B-D, U+2060, U+FEFF) may join visible ones but are not text of their own: a name of only
# them printed as nothing.
_HIDDEN = "\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029\\u202a-\\u202e\\u2066-\\u2069\\u200e\\u200f\\u061c"
_ZERO_WIDTH = "\\u200b-\\u200d\\u2060\\ufeff"
VISIBLE_LINE_PATTERN = rf"^[^{_HIDDEN}]*[^\s{_HIDDEN}{_ZERO_WIDTH}][^{_HIDDEN}]*$"


def shortened(text, limit: int = 60) -> str:
    """`text` cut to `limit` characters, "..." marking the cut: a value or path echoed in an error
    keeps the line readable (a 5,000-character flag value would otherwise fill the screen)."""
    text = str(text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def refuse_dash(ref, what: str, instead: str, stream: str = "standard input") -> None:
    """`-`, which many tools read as standard input or output: the planner reads and writes named
    files only, so say so rather than look for a preset '-' or create a file named '-'."""
    if ref is not None and str(ref) == "-":
        raise SpecError(f"{what}: '-' ({stream}) is not supported; {instead}")


# pydantic error types in the project's words ("tp: must be > 0, got the number -1" for pydantic's
# "Input should be greater than 0"); `got` is what the file held, said by kind_text
PYDANTIC_WORDS = {
    "greater_than": "must be > {gt}, got {got}",
    "greater_than_equal": "must be >= {ge}, got {got}",
    "less_than": "must be < {lt}, got {got}",
    "less_than_equal": "must be <= {le}, got {got}",
    "int_type": "expected an integer, got {got}",
    "int_from_float": "expected an integer (a whole number), got {got}",
    "float_type": "expected a number, got {got}",
    "string_type": "expected text, got {got}",
    "bool_type": "expected true or false, got {got}",  # `flash_attention:` left empty (null)
    "tuple_type": "expected a list such as [16, 16], got {got}",
    "list_type": "expected a list, got {got}",
    "too_short": "expected at least {min_length} item(s), got {actual_length}",
    "too_long": "expected at most {max_length} item(s), got {actual_length}",
    "string_too_long": "must be at most {max_length} characters long",
    "string_too_short": "must be at least {min_length} character(s) long, got {got}",
    "invalid_key": "a field name must be text, got {got}",  # load_model("x", {1: 2}); YAML refuses it on reading
}


# How alike a misspelt field or key must be to a real one to be named ("did you mean ...?"):
# difflib's ratio, loose enough for one or two slips in a short name (micro_bach, bfl6)
FIELD_NAME_SIMILARITY = 0.6


def closest_name(written: str, names) -> str | None:
    """The one of `names` that `written` (a misspelt field or key) most resembles, or None."""
    import difflib
    near = difflib.get_close_matches(written, list(names), n=1, cutoff=FIELD_NAME_SIMILARITY)
    return near[0] if near else None


def _fields_at(spec, loc) -> list[str]:
    """The field names of the pydantic model at `loc` (a path of field names and list indices)
    inside the model class `spec`, through nested, optional and listed models; [] if none."""
    import typing

    def model_in(annotation):
        if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
            return annotation
        return next((m for m in map(model_in, typing.get_args(annotation)) if m is not None), None)

    cls = spec
    for part in loc:
        if isinstance(part, int):
            continue  # an item of a list of models (network.0)
        field = getattr(cls, "model_fields", {}).get(part)
        cls = None if field is None else model_in(field.annotation)
        if cls is None:
            return []
    return list(getattr(cls, "model_fields", {}))


def one_line(err: ValidationError, where: str, spec=None) -> SpecError:
    """First pydantic error as `where: field.path: message`; an unknown key before the rest (a typo
    of a required key also reads as that key missing: the typo is what the user wrote), with the
    missing key it is close to, else, given the model class `spec` that was validated, the field
    of that mapping it is close to (`biasses` -> biases, which has a default and is never missing)."""
    errors = err.errors()
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    first = unknown[0] if unknown else errors[0]
    loc = ".".join(str(p) for p in first["loc"]) or "(top level)"
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        missing = [str(e["loc"][-1]) for e in errors
                   if e["type"] == "missing" and e["loc"] and tuple(e["loc"][:-1]) == tuple(first["loc"][:-1])]
        written = str(first["loc"][-1]) if first["loc"] else ""
        near = closest_name(written, missing) or closest_name(written, _fields_at(spec, first["loc"][:-1]))
        msg = f"unknown field (did you mean {near}?)" if near else "unknown field"
    elif first["type"] == "missing":
        msg = "required field is missing"
    elif first["type"] in ("model_type", "dict_type"):  # pydantic names its class: say what to write
        msg = f"expected a mapping of its fields (name: value), got {str(first.get('input'))[:40]!r}"
    elif first["type"] in ("literal_error", "enum") and first["loc"][-1:] == ("[key]",):
        # a mapping's key outside its choices (peak_flops: {bfl6: ...}): pydantic's loc ends in
        # the key and "[key]"; said at the mapping, with the choice it is close to
        written = str(first.get("input"))
        choices = re.findall(r"'([^']*)'", first.get("ctx", {}).get("expected", ""))
        near = closest_name(written, choices)
        loc = ".".join(str(p) for p in first["loc"][:-2]) or "(top level)"
        msg = (f"unknown key {shortened(repr(written), 40)}{f' (did you mean {near}?)' if near else ''}; "
               f"allowed: {', '.join(choices)}")
    elif first["type"] in ("literal_error", "enum"):  # a choice: the choices, whatever was written
        msg = f"{msg.replace('Input should be', 'must be', 1)}, got {shortened(repr(first.get('input')), 40)}"
    elif isinstance(first.get("input"), float) and not math.isfinite(first["input"]) \
            and msg.startswith("Input should"):  # YAML .nan against pydantic's own bound: "less than 1"
        msg = f"must be a finite number, got {first['input']}"
    elif first["type"] == "int_parsing_size":  # an integral float too large to be an int (1e300)
        value = first.get("input")
        msg = f"must be an integer in its range; {format(value, 'g') if finite_number(value) else value} is far beyond it"
    elif first["type"] == "string_pattern_mismatch":  # VISIBLE_LINE_PATTERN, the only pattern of a spec
        msg = f"must be one line of visible text, got {str(first.get('input'))[:40]!r}"
    elif first["type"] in PYDANTIC_WORDS:  # pydantic's wording, said in ours with what was written
        msg = PYDANTIC_WORDS[first["type"]].format(**first.get("ctx", {}), got=kind_text(first.get("input")))
    elif first["type"] in (INCONSISTENT, "value_error") and not first["loc"]:
        loc = None  # a model's own check: its message names the fields itself
    if first["type"] == "value_error":
        msg = msg.removeprefix("Value error, ")  # pydantic's prefix to a ValueError raised by our checks
    more = len(err.errors()) - 1
    tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return SpecError(f"{where}: {msg}{tail}" if loc is None else f"{where}: {loc}: {msg}{tail}")


# Keys that mark a file of one kind, and the flag that reads it (a file given to the wrong flag
# failed on its first unknown key: "plan: unknown field (and 11 more problems)")
FILE_KINDS = (("plan", ("plan",), "a plan file", "--plan"), ("plan", ("tp", "pp", "dp"), "a plan file", "--plan"),
              ("system", ("accelerator",), "a system file", "-s"), ("model", ("layers", "hidden"), "a model file", "-m"),
              ("hf", ("model_type",), "a Hugging Face config", "-m, named config.json (or its folder)"),
              ("hf", ("num_hidden_layers", "hidden_size"), "a Hugging Face config", "-m, named config.json (or its folder)"),
              ("accelerator", ("peak_flops", "hbm_capacity_gib"), "an accelerator file",
               "`accelerator:` in a system file (its path or preset name; see hardware/presets/*.yaml)"))


def other_kind_of_file(data: dict, expected: str) -> str:
    """'' if `data` may be a file of the `expected` kind (model, system, plan); else what it is and
    the flag that reads it, for the error that replaces the first unknown key."""
    for kind, keys, name, flag in FILE_KINDS:
        if kind != expected and all(k in data for k in keys):
            return f"this is {name} ({', '.join(k + ':' for k in keys)}); pass it with {flag}"
    return ""


def finite_number(value) -> bool:
    """A real, finite number as YAML/JSON give it (a bool is not one, NaN and inf are not finite)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def in_range(low: float, high: float, integer: bool = False):
    """A pydantic validator refusing a value outside [low, high] in the CLI's wording
    (`check_int`/`check_float` in planner/cli/common.py): `must be an integer from 1 to 10,000, got
    1000000000`, `must be a number from 1e+09 to 1e+18, got 1e+308`."""
    from pydantic import AfterValidator
    from pydantic_core import PydanticCustomError
    kind, fmt = ("an integer", ",") if integer else ("a number", "g")

    def check(value):
        if not low <= value <= high:
            raise PydanticCustomError("value_range", "must be {kind} from {low} to {high}, got {value}",
                                      {"kind": kind, "low": format(low, fmt), "high": format(high, fmt),
                                       "value": _shown_int(value) if integer else format(value, "g")})
        return value
    return AfterValidator(check)


def _shown_int(value: int) -> str:
    """An integer as an error shows it: in full up to 20 digits, else in short (a 300-digit value
    would fill the line, and str() refuses one of over 4,300 digits)."""
    if abs(value) < 10 ** 20:
        return str(value)
    try:
        return format(float(value), "g")
    except OverflowError:
        return "an integer of -1e+308 or less" if value < 0 else "an integer of 1e+308 or more"


# A spec file is a few hundred bytes; anything this large is not one (and would be slow to parse).
MAX_YAML_BYTES = 1 << 20


class DuplicateKeyError(Exception):
    """A mapping that gives the same key twice (YAML requires unique keys; PyYAML keeps the last)."""

    def __init__(self, key: str, line: int):
        super().__init__(f"duplicate key {key!r} (line {line})")


class BadNumberError(Exception):
    """A number no field can take, said for the key it sits under (PyYAML would raise a bare
    ValueError, or give a silent inf)."""

    def __init__(self, where: str, node, problem: str):
        shown = shortened(node.value, 24) or repr("")
        super().__init__(f"{where}: {shown} (line {node.start_mark.line + 1}) {problem}")


# Magnitude from which a number in a spec file is out of range: a float's range (~1.8e308). Every
# number is used in float arithmetic, so a larger one is no field's value; Python also refuses to
# convert a decimal integer of over 4,300 digits (a ValueError "Exceeds the limit").
MAX_DIGITS = 308
_INT_TAG, _FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"


def digit_limit_error(exc: ValueError, where: str) -> SpecError | None:
    """The one-line error for a ValueError that is Python's refusal to convert an integer of too
    many digits (json and PyYAML's plain loaders raise it bare), None for any other ValueError."""
    if "integer string conversion" not in str(exc):
        return None
    import sys
    return SpecError(f"{where}: a number of over {sys.get_int_max_str_digits():,} digits is out of range: "
                     f"no field takes a number of 1e+{MAX_DIGITS} or more")


def _number_problem(node) -> str | None:
    """What is wrong with an int- or float-tagged scalar, mirroring PyYAML's constructors (an
    explicit `!!int abc` reaches int() unchecked); None if it converts to a number in range. Base
    60 and leading-0 octal are left to the strict constructors, which refuse them."""
    text = str(node.value).replace("_", "")
    body = text[1:] if text[:1] in ("+", "-") else text
    if ":" in body:
        return None
    if node.tag == _INT_TAG:
        base = 2 if body.startswith("0b") else 16 if body.startswith("0x") else 10
        digits = body[2:] if base != 10 else body
        allowed = {2: "01", 10: "0123456789", 16: "0123456789abcdefABCDEF"}[base]
        if not digits or any(c not in allowed for c in digits):
            return "is tagged !!int but is not an integer"
        if base == 10:
            if len(digits) > 1 and digits[0] == "0":
                return None  # octal: construct_yaml_int refuses it
            if len(digits) > MAX_DIGITS:
                return f"is out of range ({len(digits):,} digits): no field takes a number of 1e+{MAX_DIGITS} or more"
            too_large = False
        else:  # int() of a power-of-two base has no digit limit
            too_large = int(digits, base) >= 10 ** MAX_DIGITS
    else:
        if body.lower() in (".inf", ".nan"):
            return None
        try:
            value = float(text)
        except ValueError:
            return "is tagged !!float but is not a number"
        too_large = math.isinf(value) and any(c.isdigit() for c in body)  # 1.0e+999; not inf spelled out
    if too_large:
        return f"is out of range: no field takes a number of 1e+{MAX_DIGITS} or more"
    return None


def _check_numbers(root) -> None:
    """Refuse a number no field can take, naming the keys that lead to it (`moe.num_experts`,
    `network.1.domain_gpus`). Walked with a stack (a deeply nested file must not overflow
    Python's), each node once (an alias shares its anchor's); a path is kept as (parent, name)
    links and spelled out only for the error."""
    import yaml
    stack, seen = [(root, None)], set()
    while stack:
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            problem = node.tag in (_INT_TAG, _FLOAT_TAG) and _number_problem(node)
            if problem:
                raise BadNumberError(_spelled(path), node, problem)
        elif isinstance(node, yaml.SequenceNode):  # pushed last first: the file's first error is said
            stack.extend((item, (path, str(i))) for i, item in reversed(list(enumerate(node.value))))
        elif isinstance(node, yaml.MappingNode):
            for key, value in reversed(node.value):
                stack.append((value, (path, shortened(key.value, 40) if isinstance(key, yaml.ScalarNode) else "?")))
                stack.append((key, (path, None)))  # None: the key itself


def _spelled(path) -> str:
    """A (parent, name) chain as the keys a user reads: `records.0.parallel.tp`, `a key in moe`."""
    names = []
    while path is not None:
        path, name = path
        names.append(name)
    names.reverse()
    if names and names[-1] is None:
        return f"a key in {'.'.join(names[:-1])}" if names[:-1] else "a key"
    return ".".join(names) or "(top level)"


@functools.cache
def _strict_loader(base, aliases: bool = False):
    """`base` (PyYAML's SafeLoader or libyaml's CSafeLoader) refusing a mapping key given twice:
    keys compared as the values they load as (`1` and `0x1` are one key). On the pure-Python
    loader also aliases: `*ref` can expand exponentially ("billion laughs"), and no spec file
    needs them (the C loader's are refused from its parse events, `_load_strict`)."""
    import yaml

    class StrictLoader(base):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:  # unhashable: construct_mapping refuses it itself
                    continue
                if duplicate:
                    raise DuplicateKeyError(str(key_node.value), key_node.start_mark.line + 1)  # as written
            return super().construct_mapping(node, deep)

        def construct_document(self, node):
            _check_numbers(node)
            return super().construct_document(node)

        def compose_node(self, parent, index):  # the pure-Python composer only
            if not aliases and self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark
                raise yaml.YAMLError(f"YAML aliases (*name) are not allowed (line {mark.line + 1})")
            return super().compose_node(parent, index)

        # YAML 1.1 (PyYAML) reads `1:30` as base 60 (90; 1:30.5 is 90.5) and `010` as octal (8);
        # nobody means either
        def construct_yaml_int(self, node):
            text = str(node.value).replace("_", "").lstrip("+-")
            _refuse_base_60(node)
            if len(text) > 1 and text[0] == "0" and text[1:].isdigit():
                raise yaml.YAMLError(f"{node.value!r} (line {node.start_mark.line + 1}) reads as an octal number "
                                     "in YAML 1.1; write it without the leading 0")
            return super().construct_yaml_int(node)

        def construct_yaml_float(self, node):
            _refuse_base_60(node)
            return super().construct_yaml_float(node)

    def _refuse_base_60(node) -> None:
        if ":" in str(node.value):
            raise yaml.YAMLError(f"{node.value!r} (line {node.start_mark.line + 1}) reads as a base-60 number in "
                                 "YAML 1.1; write the number in decimal, or quote it")
    StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_yaml_int)
    StrictLoader.add_constructor("tag:yaml.org,2002:float", StrictLoader.construct_yaml_float)
    return StrictLoader


# Nodes a file with aliases may expand to (each alias counted as the nodes it stands for): the
# packaged fsdp_moe_runs.yaml, whose records share their sources by `&id`/`*id`, expands to ~10^5;
# a "billion laughs" file, nine levels of ten aliases, to 10^9
MAX_EXPANDED_NODES = 2_000_000


def _expanded_nodes(yaml, events) -> int:
    """How many nodes the document's events expand to, aliases expanded (without building it)."""
    size: dict[str, int] = {}
    open_nodes: list[list] = [[None, 0]]  # per open collection: its anchor, the nodes in it so far
    for event in events:
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            open_nodes.append([event.anchor, 0])
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            anchor, n = open_nodes.pop()
            if anchor is not None:
                size[anchor] = n + 1
            open_nodes[-1][1] += n + 1
        elif isinstance(event, yaml.ScalarEvent):
            if event.anchor is not None:
                size[event.anchor] = 1
            open_nodes[-1][1] += 1
        elif isinstance(event, yaml.AliasEvent):
            open_nodes[-1][1] += size.get(event.anchor, 1)
        if open_nodes[0][1] > MAX_EXPANDED_NODES:
            mark = event.start_mark
            raise yaml.YAMLError(f"its aliases expand to over {MAX_EXPANDED_NODES:,} nodes (line {mark.line + 1})")
    return open_nodes[0][1]


def safe_load_packaged(text: str):
    """Safe-load a YAML document the project ships (reference runs, recipe tables): libyaml's C
    loader where PyYAML has it, ~10x faster than the pure-Python one on these megabyte files. A
    user's file goes through `read_yaml_mapping` instead, which also refuses duplicate keys."""
    import yaml  # noqa: PLC0415 (start-up: only the commands that read these files pay for it)
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 (safe loader)


def _load_strict(yaml, text: str, aliases: bool = False):
    """Safe-load `text`, refusing duplicate keys, and aliases unless `aliases` (then refusing a
    document they expand past MAX_EXPANDED_NODES). With libyaml (PyYAML's C extension) the events
    are checked first, then the text is loaded, both parsed in C: ~10x faster than the pure-Python
    loader, which matters for start-up (`planner presets` reads every preset)."""
    fast = getattr(yaml, "CSafeLoader", None)
    events = yaml.parse(text, Loader=fast or yaml.SafeLoader)
    if aliases:
        _expanded_nodes(yaml, events)
    elif fast is not None:
        for event in events:
            if isinstance(event, yaml.AliasEvent):
                mark = event.start_mark
                raise yaml.YAMLError(f"YAML aliases (*name) are not allowed (line {mark.line + 1})")
    return yaml.load(text, Loader=_strict_loader(fast or yaml.SafeLoader, aliases))  # noqa: S506 (safe loader)


def kind_text(value) -> str:
    """What a YAML or JSON value is, in the file's own words (null, not NoneType)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the text {shortened(value)!r}"
    return {list: "a list", tuple: "a list", dict: "a mapping"}.get(type(value), type(value).__name__)


def read_yaml_mapping(path: Path, what: str, aliases: bool = False) -> dict:
    """A YAML file's top-level mapping, or a one-line SpecError; `aliases`: allow `&a`/`*a`
    (reference files share a source between records), within MAX_EXPANDED_NODES."""
    import yaml
    try:
        if path.is_dir():
            raise SpecError(f"{what} {path}: is a folder, expected a YAML file")
        if path.exists() and not path.is_file():
            # /dev/null, a FIFO (reading one would block), a socket: none holds a spec
            raise SpecError(f"{what} {path}: is not a regular file (a device, pipe or socket), expected a YAML file")
        if path.stat().st_size > MAX_YAML_BYTES:
            raise SpecError(f"{what} {path}: larger than {MAX_YAML_BYTES >> 20} MiB, not a spec file")
        data = _load_strict(yaml, path.read_text(encoding="utf-8"), aliases)
    except (DuplicateKeyError, BadNumberError) as exc:
        raise SpecError(f"{what} {path}: {exc}") from None
    except UnicodeDecodeError:
        raise SpecError(f"{what} {path}: not a text (UTF-8) YAML file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None)  # what the parser found there, e.g. an unhashable key
        detail = f": {' '.join(str(problem).split())}" if mark is not None and problem else \
            "" if mark is not None else f" ({exc})"
        if "tag:yaml.org,2002:merge" in detail:  # the loader takes no `<<` merge keys: say so in words
            detail = ": a YAML merge key (<<) is not supported; write the keys out"
        raise SpecError(f"{what} {path}: malformed YAML{at}{detail}") from None
    except OSError as exc:
        raise SpecError(f"{what} {path}: cannot read ({exc.strerror})") from None
    if data is None:
        raise SpecError(f"{what} {path}: the file is empty; expected a YAML mapping of fields")
    if not isinstance(data, dict):
        raise SpecError(f"{what} {path}: expected a YAML mapping of fields, got {kind_text(data)}")
    cycle = _self_containing_node(data)
    if cycle is not None:
        raise SpecError(f"{what} {path}: {cycle}: a YAML alias (*name) inside the mapping or list it names; "
                        "write the value out instead")
    bad = _first_non_string_key(data)
    if bad is not None:
        where, key = bad
        written = "null" if key is None else str(key).lower() if isinstance(key, bool) else key  # (1 == True)
        kind = {type(None): "null", bool: "a boolean", int: "a number", float: "a number"}.get(type(key),
                                                                                             type(key).__name__)
        raise SpecError(f"{what} {path}: key {where}{written}: YAML reads it as {kind}, not as a field name; "
                        "quote it or use the field's name")
    return data


def _self_containing_node(node, where: str = "", ancestors: frozenset = frozenset()) -> str | None:
    """Path of the first mapping or list that an alias nests inside itself (`a: &a [*a]`: YAML
    builds a cycle, which every walk over the data would follow forever), None where there is none.
    Shared, non-nested aliases (a source two records name) are fine."""
    if not isinstance(node, (dict, list)):
        return None
    if id(node) in ancestors:
        return where.rstrip(".")
    inside = ancestors | {id(node)}
    items = node.items() if isinstance(node, dict) else ((f"[{i}]", v) for i, v in enumerate(node))
    for key, value in items:
        found = _self_containing_node(value, f"{where}{key}.", inside)
        if found is not None:
            return found
    return None


def _first_non_string_key(node, where: str = ""):
    """(path of its mapping, key) of the first key YAML did not read as a string (null:, 3:,
    true:), depth first; None where every key is a name."""
    if isinstance(node, dict):
        for key, value in node.items():
            if not isinstance(key, str):
                return where, key
            found = _first_non_string_key(value, f"{where}{key}.")
            if found is not None:
                return found
    elif isinstance(node, list):
        for i, item in enumerate(node):
            found = _first_non_string_key(item, f"{where}[{i}].")
            if found is not None:
                return found
    return None


MAX_NAME_BYTES = 255  # a file name's limit on Linux and macOS file systems (NAME_MAX)
# difflib similarity from which a name counts as a typo of a preset: a letter dropped or doubled
# (lama3-8b, 0.93) is; another variant's word (deepseek-v2-mini for deepseek-v2-lite, 0.79) is not
TYPO_SIMILARITY = 0.85


def check_name_length(ref: str, what: str) -> None:
    """A name with a part longer than a file name may be is neither a preset nor a file: say so
    for the field, before the file system raises ENAMETOOLONG on it."""
    parts = re.split(r"[/\\]", ref)
    # a bare name is also looked up as the preset file NAME.yaml
    limit = MAX_NAME_BYTES - (len(".yaml") if len(parts) == 1 else 0)
    # surrogateescape: a path's bytes that are not UTF-8 (a file named b"\xff.yaml") count as they are
    if any(len(part.encode("utf-8", "surrogateescape")) > limit for part in parts):
        raise SpecError(f"{what}: a name in {ref[:40]!r}... is too long for the file system (a file name may have "
                        f"at most {MAX_NAME_BYTES} bytes); give a preset name or a path to a file")


def reference_text(ref, what: str) -> str:
    """A preset name or path as text: a pathlib.Path is taken as its path (the Python API); any
    other type is a one-line error, not a TypeError deep inside the resolver."""
    import os
    if isinstance(ref, os.PathLike):
        ref = os.fspath(ref)
    if not isinstance(ref, str):
        raise SpecError(f"{what}: expected a preset name or a path, got {type(ref).__name__} {ref!r}")
    return ref


def resolve_preset_or_file(ref: str, preset_dir: Path, what: str) -> tuple[Path, str]:
    """A preset name or a path to a YAML file -> (path, label).

    A bare preset name always means the preset, even when a file of that name sits in the current
    folder (write ./NAME to mean the file); anything else is a path."""
    if not ref.strip():  # Path("") is ".", the current folder: say what is really wrong
        raise SpecError(f"{what}: empty name: give a preset name or a path to a .yaml file")
    refuse_dash(ref, what, "give a preset name or the path of a file (./- for a file named '-')")
    check_name_length(ref, what)
    try:
        return _resolve(ref, preset_dir, what)
    except PermissionError as exc:  # a folder on the way that this user may not enter
        raise SpecError(f"{what}: {ref}: cannot read ({exc.strerror})") from None


def _resolve(ref: str, preset_dir: Path, what: str) -> tuple[Path, str]:
    if "/" not in ref and "\\" not in ref and (preset_dir / f"{ref}.yaml").is_file():
        return preset_dir / f"{ref}.yaml", f"preset {ref}"
    candidate = Path(ref)
    if candidate.is_symlink() and not candidate.exists():  # dangling, or a loop of links
        raise SpecError(f"{what}: {ref} is a symbolic link that leads to no file")
    if candidate.suffix in (".yaml", ".yml") or candidate.exists():
        if candidate.is_dir():
            if what == "model":  # a Hugging Face model folder is read before this (hf_config.find_config_json)
                raise SpecError(f"model: {ref} is a folder with no config.json; expected a Hugging Face model "
                                "folder (holding config.json), a config.json, a model YAML file or a preset")
            raise SpecError(f"{what}: {ref} is a folder, expected a YAML file (or a preset name)")
        if candidate.exists() and not candidate.is_file():
            raise SpecError(f"{what}: {ref} is not a regular file (a device, pipe or socket), expected a YAML file")
        if not candidate.is_file():
            raise SpecError(f"{what}: file {ref} does not exist{preset_hint(ref, _preset_names(preset_dir))}")
        return candidate, str(candidate)
    if "/" in ref or "\\" in ref:  # a path, never a preset (./NAME means the file NAME)
        raise SpecError(f"{what}: file {ref} does not exist{preset_hint(ref, _preset_names(preset_dir))}")
    preset = preset_dir / f"{ref}.yaml"
    if not preset.is_file():
        names = _preset_names(preset_dir)
        raise SpecError(f"{what}: unknown preset {ref!r}{preset_hint(ref, names)}; allowed: {', '.join(names)} "
                        "(or a path to a .yaml file)")
    return preset, f"preset {ref}"


def _preset_names(preset_dir: Path) -> list[str]:
    return sorted(p.stem for p in preset_dir.glob("*.yaml"))


def _preset_key(name: str) -> str:
    """A name as people write it, reduced to what tells presets apart: no organisation prefix (a
    Hugging Face repo id), no case, no separators ("meta-llama/Llama-3-8B" -> "llama38b")."""
    return re.sub(r"[-_\s]", "", name.rsplit("/", 1)[-1].lower())


# What follows a model's name in a Hugging Face repo id or a file name without naming another model
VARIANT_SUFFIX = r"(\.(ya?ml|json)|[-_](instruct|base|chat|hf|it|pretrain(ed)?|v\d+(\.\d+)*))+$"


# NVIDIA's server product prefix in front of a GPU name (DGX-B200, HGX-H100, DGX GB200)
SERVER_PREFIX = r"^(dgx|hgx)[-_\s]*"


def _numbers(name: str) -> list[str]:
    """The whole numbers of a name as written (separators kept: qwen3-14b is 3 and 14, not 314)."""
    return re.findall(r"\d+", name.rsplit("/", 1)[-1])


def preset_hint(ref: str, names: list[str]) -> str:
    """What a name that is no preset most likely means, as a parenthesis for the error (or ""):
    - "did you mean X?" for the same name up to case, separators and an organisation prefix
      (Llama-3-8B, meta-llama/Llama-3.1-405B) or NVIDIA's DGX/HGX server prefix (DGX-B200 -> b200),
      or a close spelling (difflib, TYPO_SIMILARITY) with
      the same first letter and the same numbers (lama3-8b);
    - "presets that begin so: ..." for the presets it is the start of, number for whole number
      (GB200 -> gb200-nvl72; h100 -> the three H100 systems; deepseek-v2 -> deepseek-v2-lite, which
      the list shows for what it is, not as a guess).
    Nothing for a name whose numbers differ: llama3-7b is not llama3-70b, h20 not h200, a10 not
    a100, nor h100-80g a100-80g: another size, version or GPU is not a typo."""
    import difflib
    keys = {_preset_key(n): n for n in names}
    key = _preset_key(ref)
    if not key:
        return ""
    last = ref.rsplit("/", 1)[-1]
    # NVIDIA's server names for a GPU (DGX-B200, HGX H100, as Megatron-Bridge's tables write them)
    # name the GPU's system preset
    server = re.sub(SERVER_PREFIX, "", last, flags=re.IGNORECASE)
    if server != last and _preset_key(server) not in ("", key):
        hint = preset_hint(server, names)
        if hint:
            return hint
    if key in keys:
        return f" (did you mean {keys[key]}?)"
    # a Hugging Face repo's variant suffix or a file extension on the same model: Qwen2.5-72B-Instruct,
    # Mistral-7B-v0.1, nemotron-h-8b.yaml
    bare = _preset_key(re.sub(VARIANT_SUFFIX, "", last, flags=re.IGNORECASE))
    if bare in keys:
        return f" (did you mean {keys[bare]}?)"
    numbers = _numbers(ref)
    longer = [n for k, n in keys.items() if k.startswith(key) and _numbers(n)[:len(numbers)] == numbers]
    if longer:
        return f" (presets that begin so: {', '.join(longer)})"
    alike = [k for k, n in keys.items() if _numbers(n) == numbers and k[:1] == key[:1]]
    close = difflib.get_close_matches(key, alike, n=1, cutoff=TYPO_SIMILARITY)
    return f" (did you mean {keys[close[0]]}?)" if close else ""


def _yaml_number_hint(text: str) -> str:
    """Why YAML read a number as text, and how to write it so that it reads as the same number:
    PyYAML (YAML 1.1) takes 1e3 or 1.2345e6 as a string, a float needing a dot and a signed
    exponent (1.0e+3, 1.2345e+6); quoted, any number is text; nan and inf are no field's value."""
    try:
        value = float(text)
    except ValueError:
        return ""
    if math.isinf(value) and any(c.isdigit() for c in text):
        return f" (out of range: no field takes a number of 1e+{MAX_DIGITS} or more)"
    if not math.isfinite(value):
        return " (non-finite numbers are not allowed; give a finite number)"
    import yaml
    # as written (it was quoted), else the shortest spelling that YAML reads back as this very
    # number: %g (1000, 1.2345e+06), the user's digits mended, Python's exact repr
    short = f"{value:g}"
    for written in (text.strip(), short, _yaml_float(short), _yaml_float(text.strip()), _yaml_float(repr(value))):
        try:
            read = yaml.safe_load(written)
        except yaml.YAMLError:
            continue
        if isinstance(read, (int, float)) and not isinstance(read, bool) and read == value:
            if written == text.strip():
                return " (write it without quotes)"
            return f" (YAML 1.1 reads it as text; write {written})"
    return ""


def _yaml_float(text: str) -> str:
    """`text` (a Python float's spelling) as YAML 1.1 reads a float: a dot in the mantissa, a sign
    on the exponent (1e3 -> 1.0e+3, 1.2345e6 -> 1.2345e+6)."""
    mantissa, _, exponent = text.replace("E", "e").partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    if exponent and exponent[0] not in "+-":
        exponent = "+" + exponent
    return f"{mantissa}e{exponent}" if exponent else mantissa


def refuse_loose_types(data: dict, schema, where: str) -> None:
    """YAML `layers: true` or `hidden: "4096"` would pass pydantic's lax mode as 1 or 4096: refuse
    a bool or a string where the field takes neither (recursing into nested specs, and into the
    items of lists and the values of mappings: a network tier's `domain_gpus: true`, a plan's
    `stage_layers: [true, 31]` or `["4", "28"]`). One exception: a float inside a mapping or list
    written as YAML 1.1 reads "989.0e12" (text) is the number it spells, as the packaged
    accelerator presets write their peaks."""
    for name, field in schema.model_fields.items():
        if name in data:
            _refuse_loose_value(data[name], field.annotation, f"{where}: {name}", top=True)


def _spells_float(text: str) -> bool:
    import math
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _leaves(annotation) -> list:
    """The member annotations of a union / Annotated / Optional, flattened."""
    import types
    import typing
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return [leaf for a in typing.get_args(annotation) for leaf in _leaves(a)]
    if origin is typing.Annotated:
        return _leaves(typing.get_args(annotation)[0])
    return [annotation]


_ANNOTATION_SHAPES: dict[int, tuple] = {}


def _annotation_shape(annotation) -> tuple:
    """(kinds, Literal names, nested spec or None, containers) of a field's annotation,
    worked out once per annotation: specs are validated ~10^5 times in a search's tests (Plan),
    and the typing introspection was most of it. Keyed by id, the annotation kept beside it."""
    import typing

    from pydantic import BaseModel

    kept = _ANNOTATION_SHAPES.get(id(annotation))
    if kept is not None and kept[0] is annotation:
        return kept[1]
    leaves = _leaves(annotation)
    kinds: set = set()
    for leaf in leaves:
        origin = typing.get_origin(leaf)
        kinds |= {type(a) for a in typing.get_args(leaf)} if origin is typing.Literal else {origin or leaf}
    names = [a for leaf in leaves if typing.get_origin(leaf) is typing.Literal for a in typing.get_args(leaf)]
    nested = next((k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)), None)
    containers = [(typing.get_origin(leaf), typing.get_args(leaf)) for leaf in leaves]
    shape = (frozenset(kinds), names, nested, containers)
    _ANNOTATION_SHAPES[id(annotation)] = (annotation, shape)
    return shape


def _refuse_loose_value(value, annotation, where: str, top: bool = False) -> None:
    """`top`: a spec's own field, where a number written as text is refused with a hint; inside a
    list or mapping a float-valued item (a peak_flops table) written "989.4e12" is read as the
    number it spells, as the packaged accelerator presets write their peaks; an integer item
    written as text is refused like a field."""
    if getattr(getattr(value, "dtype", None), "kind", None) == "b":  # numpy's bool is a bool here
        value = bool(value)
    kinds, names, nested, containers = _annotation_shape(annotation)
    if isinstance(value, bool) and bool not in kinds:
        wanted = ("a number" if kinds & {int, float} else f"one of {', '.join(map(str, names))}" if names
                  else "text (a name)" if str in kinds else "a value of the field")
        # YAML 1.1 reads no/off as false: the name "none" written bare is one of those
        hint = " (YAML 1.1 reads no, off, yes and on as true/false: quote the name)" if names else ""
        raise SpecError(f"{where}: expected {wanted}, got {str(value).lower()}{hint}")
    if isinstance(value, (bytes, bytearray)) and bytes not in kinds:  # YAML !!binary: pydantic reads it as text
        wanted = "text (a name)" if str in kinds else "a number" if kinds & {int, float} else "a value of the field"
        raise SpecError(f"{where}: expected {wanted}, got binary data (a YAML !!binary value)")
    float_item = not top and float in kinds and int not in kinds and _spells_float(value) \
        if isinstance(value, str) else False
    if isinstance(value, str) and str not in kinds and kinds & {int, float} and not float_item:
        raise SpecError(f"{where}: expected a number, got the string {value!r}{_yaml_number_hint(value)}")
    # pydantic's lax mode reads "yes", "on", 1 as true
    if bool in kinds and not kinds & {int, float, str} and not isinstance(value, bool) and value is not None:
        raise SpecError(f"{where}: expected true or false, got {value!r}")
    if nested is not None and isinstance(value, dict):
        refuse_loose_types(value, nested, where)
        return
    for origin, args in containers:
        if origin in (list, tuple, set, frozenset) and isinstance(value, (list, tuple)) and args:
            items = args[:1] if origin is not tuple or args[-1] is Ellipsis or len(args) == 1 else args
            for i, item in enumerate(value):
                _refuse_loose_value(item, items[min(i, len(items) - 1)], f"{where}.{i}")
            return
        if origin is dict and isinstance(value, dict) and len(args) == 2:
            for key, item in value.items():
                _refuse_loose_value(item, args[1], f"{where}.{key}")
            return
