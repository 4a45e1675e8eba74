"""Shape catalog of BF16 linears, derived from HF model configs, and the M grid."""
from shapes.catalog import Shape, catalog, model_layers, select
from shapes.derive import LinearLayer, derive_layers
from shapes.grid import default_grid, parse_m

__all__ = ["Shape", "LinearLayer", "catalog", "model_layers", "select", "derive_layers",
           "default_grid", "parse_m"]
