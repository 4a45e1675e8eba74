"""The house: no import runs back up a floor, and docs/design.md's import graph is the one the source has."""
from pathlib import Path

from harness.floors import FLOORS, imports, mermaid, upward

ROOT = Path(__file__).resolve().parent.parent


def test_no_import_runs_back_up_a_floor():
    assert upward(imports()) == []


def test_the_check_names_an_upward_import():
    planted = {**imports(), ("dispatch", "bench"): ["dispatch/__init__.py"]}
    assert upward(planted) == ["dispatch imports bench (dispatch/__init__.py)"]


def test_the_runtime_dispatcher_needs_only_the_ground_floor():
    below = set(FLOORS[:FLOORS.index("dispatch")])
    assert {b for (a, b) in imports() if a == "dispatch"} <= below


def test_the_design_doc_shows_the_generated_import_graph():
    assert mermaid(imports()) in (ROOT / "docs" / "design.md").read_text()


def _path_literals() -> list[str]:
    """String constants naming a path or forward rule, outside the modules that define the names."""
    import ast

    from bench.forward_paths import RULES
    from bench.paths import PATHS
    names = set(PATHS) | set(RULES)
    owners = {"bench/paths.py", "bench/forward_paths.py", "dispatch/backends.py",
              "harness/floors.py"}  # the last names the package dispatch/, not the path
    found = []
    for pkg in FLOORS:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel in owners:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                        node.value in names or node.value.startswith("flashinfer:")):
                    found.append(f"{rel}:{node.lineno} {node.value!r}")
    return found


def test_no_path_name_is_written_outside_the_registry():
    assert _path_literals() == []


def test_no_function_of_bench_takes_more_than_six_parameters():
    """A cell travels as one object (bench.sweep.Group, bench.forward.ForwardAt) with the run's state beside it
    (Sweeping, Forwarding), not as loose values: no function of bench declares more than six parameters."""
    import ast
    wide = []
    for path in sorted((ROOT / "bench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                count = (len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
                         - bool(a.args and a.args[0].arg in ("self", "cls")))
                if count > 6:
                    wide.append(f"{path.relative_to(ROOT)}:{node.name} ({count})")
    assert wide == []
