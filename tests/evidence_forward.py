"""Helpers of the evidence tests: a measured forward's dispatcher time over all-aten's, a machine's GPU UUID."""
from pathlib import Path

import pandas as pd


def dispatch_over_aten(folder: Path) -> pd.Series:
    """Per (regime, M), the dispatcher's per-forward time over all-aten's, from the ok rows of folder/forward.csv."""
    df = pd.read_csv(folder / "forward.csv")
    df = df[df["status"] == "ok"].set_index(["regime", "m", "path"])["us"]
    return df.xs("dispatch", level="path") / df.xs("aten", level="path")


def gpu_uuid(path: Path) -> str:
    """The GPU UUID in a gpu-machine-*.txt file (nvidia-smi's CSV: a header, then name, uuid, ...)."""
    return path.read_text().splitlines()[1].split(", ")[1]
