"""Package prose says what and why; which run showed it lives in docs/ (docs/results-h200.md) and the evidence store."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bench", "calibrate", "dispatch", "harness", "shapes", "reports")
# a run folder's name (h200-settled-forward-7, h200-table-h200-20261201c), a path into the evidence or the test data,
# or a commit named by its hash
CITES_A_RUN = re.compile(r"\bh[0-9]{3}(?:x[0-9])?-[a-z0-9-]*[0-9]|\bevidence/|\btests/data/|\bcommits? [0-9a-f]{7,40}\b"
                         r"|\b[0-9a-f]{7}\.\.[0-9a-f]{7}\b")


def citations(text: str) -> list[str]:
    return [m.group(0) for m in CITES_A_RUN.finditer(text)]


def test_the_pattern_finds_what_it_is_for():
    assert citations("as h200-settled-forward-7 showed") == ["h200-settled-forward-7"]
    assert citations("see evidence/h200-x and tests/data/y") == ["evidence/", "tests/data/"]
    assert citations("at c6f9bbd..caaa733, commit a7a3670") == ["c6f9bbd..caaa733", "commit a7a3670"]
    assert citations("the h200 profile; results/h200/run-1; 'h200'") == []


def test_package_sources_cite_no_run_or_commit():
    found = [f"{p.relative_to(ROOT)}: {c}" for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*"))
             if p.suffix in (".py", ".cpp") for c in citations(p.read_text())]
    assert not found, "move the run or commit to docs/ and say what and why in the code: " + "; ".join(found)


def test_the_probes_run_nothing_at_import_and_use_public_names_only():
    """tools/probes/: each says in its first line what it is for, runs nothing when imported (only definitions and
    imports at the top level, a __main__ guard) and imports no private name of the project."""
    import ast
    import importlib
    import importlib.util
    from pathlib import Path

    from harness.floors import FLOORS
    folder = Path(__file__).resolve().parent.parent / "tools" / "probes"
    probes = sorted(p for p in folder.glob("*.py") if p.name != "__init__.py")
    assert probes
    for path in probes:
        tree = ast.parse(path.read_text())
        assert ast.get_docstring(tree), path.name
        for node in tree.body:
            assert isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign,
                                     ast.AnnAssign, ast.Expr)) or (
                isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)), f"{path.name}: {ast.unparse(node)[:60]}"
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in FLOORS:
                assert not any(a.name.startswith("_") for a in node.names), f"{path.name}: {ast.unparse(node)}"
        try:
            importlib.import_module(f"tools.probes.{path.stem}")
        except ModuleNotFoundError as exc:  # a probe whose kernels are defined at import needs Triton, where absent
            assert exc.name == "triton" and importlib.util.find_spec("triton") is None, f"{path.name}: {exc}"
