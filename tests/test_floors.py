"""The house: no import runs back up a floor, and the README's import graph is the one the source has."""
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


def test_the_readme_shows_the_generated_import_graph():
    assert mermaid(imports()) in (ROOT / "README.md").read_text()
