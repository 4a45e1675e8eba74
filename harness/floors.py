"""The project's floors and its import graph, read from the source (python -m harness.floors prints the README's
diagram). A package imports only packages on its own floor or below: data flows up through files."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLOORS = ("harness", "shapes", "dispatch", "bench", "calibrate", "reports", "tables", "evidence_store")  # lowest first


def imports() -> dict[tuple[str, str], list[str]]:
    """(importing package, imported package) -> files, for every import of one project package by another, those
    inside functions included."""
    edges: dict[tuple[str, str], list[str]] = {}
    for pkg in FLOORS:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
                for name in names:
                    top = name.split(".")[0]
                    if top in FLOORS and top != pkg:
                        edges.setdefault((pkg, top), []).append(str(path.relative_to(ROOT)))
    return edges


def upward(edges: dict[tuple[str, str], list[str]]) -> list[str]:
    return [f"{a} imports {b} ({', '.join(sorted(set(files)))})" for (a, b), files in sorted(edges.items())
            if FLOORS.index(b) > FLOORS.index(a)]


def mermaid(edges: dict[tuple[str, str], list[str]]) -> str:
    lines = ["```mermaid", "flowchart BT"]
    lines += [f"    {a} --> {b}" for (a, b) in sorted(edges, key=lambda e: (FLOORS.index(e[0]), FLOORS.index(e[1])))]
    return "\n".join(lines + ["```"])


if __name__ == "__main__":
    print(mermaid(imports()))
    sys.exit(1 if upward(imports()) else 0)
