"""The shape catalog: every model config under shapes/configs/, derived and deduplicated by (n, k, tp)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError
from harness.io import read_input_text
from shapes.derive import LinearLayer, derive_layers, load_config
from shapes.grid import parse_m

CONFIG_DIR = Path(__file__).parent / "configs"


@dataclass(frozen=True)
class LayerUse:
    model: str
    layer: str
    count: int
    in_cuda_graph: bool
    style: str
    tags: tuple[str, ...]


@dataclass(frozen=True)
class Shape:
    """One distinct GEMM weight shape [n, k] at one TP degree, with every model layer that runs it."""
    n: int
    k: int
    tp: int
    uses: tuple[LayerUse, ...]

    @property
    def name(self) -> str:
        return f"n{self.n}_k{self.k}" + (f"_tp{self.tp}" if self.tp != 1 else "")

    @property
    def count(self) -> int:
        return sum(u.count for u in self.uses)

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(u.model for u in self.uses))

    @property
    def layers(self) -> tuple[str, ...]:
        return tuple(f"{u.model}:{u.layer}" for u in self.uses)

    @property
    def in_cuda_graph(self) -> bool:
        return any(u.in_cuda_graph for u in self.uses)

    @property
    def tags(self) -> tuple[str, ...]:
        return tuple(sorted({t for u in self.uses for t in u.tags}))


def model_configs() -> dict[str, Path]:
    """Model name -> config path; a new model is one more JSON file (with a "_model" name) in shapes/configs/."""
    found = {}
    for path in sorted(CONFIG_DIR.glob("*.json")):
        name = load_config(path).get("_model", path.stem)
        found[name] = path
    return found


def model_layers(model: str | None = None, tp: int = 1, layout: str = "vllm") -> list[LinearLayer]:
    configs = model_configs()
    if model is not None and model not in configs:
        raise HarnessError(f"unknown model {model!r}; known: {', '.join(configs)} (add a config under {CONFIG_DIR})")
    names = [model] if model else list(configs)
    return [layer for name in names for layer in derive_layers(load_config(configs[name]), name, tp, layout)]


def dedup(layers: list[LinearLayer]) -> list[Shape]:
    groups: dict[tuple[int, int, int], list[LayerUse]] = {}
    for layer in layers:
        use = LayerUse(layer.model, layer.layer, layer.count, layer.in_cuda_graph, layer.style, layer.tags)
        groups.setdefault((layer.n, layer.k, layer.tp), []).append(use)
    return [Shape(n, k, tp, tuple(uses)) for (n, k, tp), uses in groups.items()]


def catalog(model: str | None = None, tp: int = 1, layout: str = "vllm") -> list[Shape]:
    """The default catalog: both Qwen3.5 models at TP1 gives 16 shapes (vLLM's layout; `layout` 'transformers':
    the modules as transformers builds them)."""
    return dedup(model_layers(model, tp, layout))


def select(shapes: list[Shape], spec: str | None) -> list[Shape]:
    """Filter by a comma list of shape names (n2048_k4096) or NxK pairs (2048x4096)."""
    if not spec:
        return shapes
    tokens = [t.strip() for t in spec.split(",") if t.strip()]
    if not tokens:
        raise HarnessError(f"--shapes {spec!r} names no shape; give names like n2048_k4096 or 2048x4096, or leave it out")
    wanted = []
    for token in tokens:
        match = [s for s in shapes if token in (s.name, f"{s.n}x{s.k}")]
        if not match:
            raise HarnessError(f"shape {token!r} is not in the catalog; `python -m shapes list` shows the names")
        wanted.extend(match)
    return list(dict.fromkeys(wanted))


def select_cells(shapes: list[Shape], spec: str) -> tuple[list[Shape], dict[str, list[int]]]:
    """'n256_k2048:80,96;n1024_k2048:20': per shape (a name or NxK), its own M values (as --m takes them); '@FILE':
    the same read from FILE."""
    hint = "give e.g. n256_k2048:80,96;n1024_k2048:20 or @FILE"
    if spec.startswith("@"):
        spec = read_input_text(spec[1:], "--cells file", hint, limit=1 << 20)
    parts = [p.strip() for p in spec.split(";") if p.strip()]
    if not parts:
        raise HarnessError(f"--cells {spec!r} names no cell; {hint}")
    cells: dict[str, list[int]] = {}
    chosen: list[Shape] = []
    for part in parts:
        name, sep, ms = part.partition(":")
        if not sep or not ms.strip():
            raise HarnessError(f"--cells entry {part!r} has no M values; {hint}")
        name = name.strip()
        if not name or "," in name:
            raise HarnessError(f"--cells entry {part!r} names {'no shape' if not name else 'several shapes'} before "
                               f"its ':'; one shape per entry, entries separated by ';': {hint}")
        [shape] = select(shapes, name)
        if shape.name in cells:
            raise HarnessError(f"--cells names {shape.name} twice; give each shape once with all its M")
        cells[shape.name] = parse_m(ms)
        chosen.append(shape)
    return chosen, cells
