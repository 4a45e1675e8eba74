"""python -m shapes list | from-config PATH | grid"""
from __future__ import annotations

from harness.errors import quiet_interrupts

quiet_interrupts("shapes")  # Ctrl-C during the imports below: one line, no traceback

import csv
import io
import json
import sys
from pathlib import Path
from typing import Sequence

from harness.cli import Parser, int_in
from harness.options import add, flag_renamed
from harness.errors import run_cli
from shapes.catalog import dedup, model_configs, model_layers
from shapes.derive import CATALOG_LAYOUTS, LinearLayer, derive_layers, load_config
from shapes.grid import hybrid_buckets, parse_m

FORMATS = ("table", "csv", "json")


def _layer_rows(layers: list[LinearLayer]) -> list[dict]:
    return [{"model": l.model, "layer": l.layer, "n": l.n, "k": l.k, "tp": l.tp, "style": l.style,
             "count": l.count, "in_cuda_graph": l.in_cuda_graph, "tags": ";".join(l.tags)} for l in layers]


def _shape_rows(layers: list[LinearLayer]) -> list[dict]:
    return [{"shape": s.name, "n": s.n, "k": s.k, "tp": s.tp, "count": s.count, "in_cuda_graph": s.in_cuda_graph,
             "tags": ";".join(s.tags), "layers": ";".join(f"{u.model}:{u.layer}x{u.count}" for u in s.uses)}
            for s in dedup(layers)]


def emit(rows: list[dict], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(rows, indent=2)
    if not rows:
        return ""
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return buf.getvalue().rstrip("\n")
    cols = list(rows[0])
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols)]
    lines += ["  ".join(str(r[c]).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(prog="python -m shapes", description="BF16 linear shapes of the model catalog.")
    sub = parser.add_subparsers(dest="cmd", required=True)

    p_list = sub.add_parser("list", help="the catalog: distinct (n, k) shapes of the known models, or their layers")
    add(p_list, "model", what=f"(one; known: {', '.join(model_configs())})", shown="every model")
    add(p_list, "tp", type=int_in(1, 64), default=1)
    p_list.add_argument("--per-layer", "--layers", dest="per_layer", action=flag_renamed("--per-layer", "--layers"),
                        help="one row per model layer instead of per distinct shape")
    add(p_list, "format", choices=FORMATS, default="table")

    p_cfg = sub.add_parser("from-config", help="derive the linears of any Qwen3.5/Qwen3-Next HF config.json")
    p_cfg.add_argument("path")
    add(p_cfg, "tp", type=int_in(1, 64), default=1)
    p_cfg.add_argument("--name", help="model name for the rows (default: the file's _model or stem)")
    p_cfg.add_argument("--distinct", "--shapes", dest="distinct", action=flag_renamed("--distinct", "--shapes"),
                       help="deduplicate into distinct shapes")
    add(p_cfg, "format", choices=FORMATS, default="table")
    for p in (p_list, p_cfg):
        add(p, "layout", choices=CATALOG_LAYOUTS, default="vllm",
            what=": vllm: vLLM's fused layers and TP splits; transformers: the modules as transformers builds them "
                 "(unfused, one rank); union: both (one table for both)")

    p_grid = sub.add_parser("grid", help="the M grid (default or --m), with FlashInfer tuning-bucket membership")
    add(p_grid, "m", shown="the default grid")
    add(p_grid, "format", choices=FORMATS, default="table")

    args = parser.parse_args(argv)
    if args.cmd == "list":
        layers = model_layers(args.model, args.tp, args.layout)
        rows = _layer_rows(layers) if args.per_layer else _shape_rows(layers)
    elif args.cmd == "from-config":
        cfg = load_config(args.path)
        name = args.name or cfg.get("_model") or Path(args.path).stem
        layers = derive_layers(cfg, name, args.tp, args.layout)
        rows = _shape_rows(layers) if args.distinct else _layer_rows(layers)
    else:
        buckets = set(hybrid_buckets())
        rows = [{"m": m, "tuning_bucket": m in buckets} for m in parse_m(args.m)]
    print(emit(rows, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main, "shapes"))
