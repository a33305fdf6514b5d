"""The layering of docs/design.md, enforced: no module imports a higher layer (lazy imports
inside functions included)."""
import ast
from pathlib import Path

import planner

ROOT = Path(__file__).resolve().parents[1]
API = set(planner.__all__)

# (layer, module prefixes) low to high, as in docs/design.md "Layers and who may import whom"
LAYERS = [
    (0, ("hardware",)),
    (1, ("planner.model", "planner.hf_config", "planner.plan", "planner.ties", "planner.jsonout",
         "planner.pipeline_layout", "planner.processes", "planner.threads")),
    (2, ("planner.analytical",)),
    (3, ("planner.megatron", "planner.checkpoint", "planner.calibration", "planner.reference", "planner.reference_moe",
         "planner.reference_dense", "planner.reference_errata", "planner.reference_launch_fields",
         "planner.bridge_recipes",
         "planner.evidence",
         "planner.fit", "planner.planfile",
         "planner.report")),
    (4, ("constraints",)),
    (5, ("planner.search", "planner.bruteforce", "planner.sweep")),
    (6, ("planner",)),  # the package __init__: the public API facade
    (7, ("planner.cli",)),
]


def layer_of(module: str) -> int | None:
    best = None
    for layer, prefixes in LAYERS:
        for p in prefixes:
            if module == p or module.startswith(p + "."):
                if best is None or len(p) > best[1]:
                    best = (layer, len(p))
    return best[0] if best else None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Every project module `path` imports; `from pkg import name` counts as pkg.name when that
    is a module, else as pkg."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                if node.module == "planner" and a.name in API:  # the facade's names, even `plan`
                    found.add("planner")
                    continue
                sub = f"{node.module}.{a.name}"
                as_path = ROOT / Path(*sub.split("."))
                found.add(sub if as_path.with_suffix(".py").exists() or as_path.is_dir() else node.module)
    return {m for m in found if m.split(".")[0] in ("hardware", "planner", "constraints")}


def sources() -> list[Path]:
    return sorted(p for pkg in ("hardware", "planner", "constraints") for p in (ROOT / pkg).rglob("*.py"))


def test_every_module_has_a_layer():
    assert [module_name(p) for p in sources() if layer_of(module_name(p)) is None] == []


def test_imports_point_down():
    upward = []
    for path in sources():
        me = module_name(path)
        for dep in imported_modules(path):
            if layer_of(dep) > layer_of(me):
                upward.append(f"{me} (layer {layer_of(me)}) imports {dep} (layer {layer_of(dep)})")
    assert upward == []


def test_the_checker_catches_upward_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import numpy\nfrom planner.model import ModelSpec\n\n"
                     "def lazy():\n    from planner.search import plan\n    from planner import estimate\n")
    deps = imported_modules(probe)
    assert deps == {"planner.model", "planner.search", "planner"}
    # as a layer-2 module (planner.analytical.*) two of these point up
    assert sorted(d for d in deps if layer_of(d) > 2) == ["planner", "planner.search"]
