"""The public API in planner/__init__.py: lazy, complete, and README's snippet runs."""
import re
import subprocess
import sys
from pathlib import Path

import planner

README = Path(__file__).resolve().parents[1] / "README.md"
API = {"plan", "check", "estimate", "count", "load_model", "load_system", "Plan", "JobSpec", "ModelSpec",
       "SystemSpec", "Estimate", "SearchResult"}


def python_snippets() -> list[str]:
    text = README.read_text()
    section = text[text.index("## Use from Python"):]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_readme_python_snippet_runs(capsys):
    snippets = python_snippets()
    assert snippets, "README has no Python snippet under 'Use from Python'"
    for code in snippets:
        exec(compile(code, "README.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and "s/step" in lines[0] and "MFU" in lines[0]
    assert lines[1].startswith("True ") and lines[2] == "False"  # 70B does not fit on 2 GPUs


def test_exports_are_the_documented_api():
    assert set(planner.__all__) == API
    from planner import JobSpec, Plan, plan  # noqa: F401  (the function, not the planner.plan module)
    from planner.search import plan as search_plan
    assert plan is search_plan and callable(planner.plan)
    import planner.plan as _  # noqa: F401  re-importing the submodule must not rebind the name
    assert planner.plan is search_plan


def test_import_planner_loads_nothing_heavy():
    code = ("import sys, planner; heavy = [m for m in ('numpy', 'pydantic', 'ortools', 'planner.search') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_fixed_batch_above_the_free_batch_cap_is_taken_as_asked():
    """JobSpec(global_batch=4096) is what `planner plan -b 4096` asks; the 3072 default caps only a
    free batch. A cap the caller gives below the batch is still a contradiction."""
    import pytest
    from pydantic import ValidationError

    from planner import JobSpec
    assert JobSpec(global_batch=4096).max_global_batch == 4096
    assert JobSpec(global_batch=64).max_global_batch == 3072
    assert JobSpec().max_global_batch == 3072
    with pytest.raises(ValidationError, match="exceeds max_global_batch"):
        JobSpec(global_batch=4096, max_global_batch=2048)
