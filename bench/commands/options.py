"""What several bench commands share: the layout and tuning options, the --table a run serves, the tactics it
serves or saves, and the checks a dry run makes as the real run would."""
from __future__ import annotations

from pathlib import Path

from bench import autotune_cache
from bench.multi import parse_devices
from bench.results import done_keys
from bench.sweep import SweepConfig, table_gemv_file
from dispatch.backends import ATEN
from dispatch.table import ThresholdTable, check_files, load_table, shipped_table
from harness.cli import int_in
from harness.console import terminal
from harness.errors import HarnessError
from harness.io import output_file
from harness.options import add
from shapes.derive import CATALOG_LAYOUTS
from shapes.grid import hybrid_buckets


def layout_and_tuning(p) -> None:
    """The options run and forward share: the layout of the model's linears and how FlashInfer is tuned."""
    add(p, "layout", choices=CATALOG_LAYOUTS, default="vllm",
        what="as vLLM fuses them, as transformers builds them, or (bench run only) the union of both: one table for "
             "a vLLM and a transformers model")
    add(p, "tuning")
    add(p, "max-num-batched-tokens", type=int_in(1, 1 << 20))


def vllm_tokens(args, profile) -> int | None:
    """--tuning vllm: the max_num_batched_tokens to tune at; None for the grid's own tuning."""
    if getattr(args, "tuning", "grid") != "vllm":
        if getattr(args, "max_num_batched_tokens", None):
            raise HarnessError("--max-num-batched-tokens is for --tuning vllm; pass both or neither")
        return None
    if args.no_tune or args.autotune_cache:
        raise HarnessError("--tuning vllm tunes; it contradicts --no-tune and --autotune-cache; pass one of them")
    return args.max_num_batched_tokens or profile.server.max_num_batched_tokens


def no_ranges(profile):
    """The A/A control's table: no range in either regime, so every bound layer runs F.linear."""
    return ThresholdTable.from_thresholds(profile.name, profile.low_m_backend, 0,
                                          source={"note": "no ranges: an A/A control (bench e2e --control)"})


def table_of(path: str, profile: str):
    """A --table file for the dispatch and table-direct rules; one line and exit 2 when it is not this GPU's."""
    table = load_table(path=path)
    if table.profile != profile:
        raise HarnessError(f"--table {path} is a table for {table.profile}, not {profile}; pass one fitted for {profile}")
    check_files(table)
    return table


def served(args, profile, table, cells: list[tuple[int, int, int]], paths: list[str]) -> Path | None:
    """The tactics file the run serves (None: it tunes): --autotune-cache FILE; else, unless the run tunes or times
    FlashInfer's default tactics, the tactics of the table its dispatch path runs (the file the dispatcher loads),
    where that file holds every (N, K) of the run at each of its M that is a tuning bucket. The autotuner's pick
    among near-tied cuBLASLt tactics differs from process to process, so a run that tunes measures a draw of them."""
    if args.tune and (args.autotune_cache or args.no_tune or getattr(args, "tuning", "grid") == "vllm"):
        raise HarnessError("--tune contradicts --autotune-cache, --no-tune and --tuning vllm; pass one of them")
    if not args.autotune_cache:
        return table_tactics(args, profile, table, cells, paths)
    path = Path(args.autotune_cache)
    if path.is_dir():
        raise HarnessError(f"--autotune-cache {path} is a folder; name its autotune-cache.json")
    if not path.is_file():
        raise HarnessError(f"--autotune-cache {path}: no such file; serve an existing autotune-cache.json, or tune "
                           f"(leave it out) and keep the tactics with --save-autotune-cache FILE")
    return path


def table_tactics(args, profile, table, cells: list[tuple[int, int, int]], paths: list[str]) -> Path | None:
    """The default of _served: the tactics file of `table` (the run's --table; None: the profile's table), or None
    (tune) where the run tunes by its options, runs no FlashInfer path, or the file never tuned a shape or a bucket M
    the run would tune (a cell its tuning left without an entry runs FlashInfer's default tactic, as the dispatcher
    does)."""
    if (args.tune or args.no_tune or args.save_autotune_cache or getattr(args, "tuning", "grid") == "vllm"
            or all(name == ATEN for name in paths)):
        return None
    if table is None:
        table = shipped_table(profile.name)  # a damaged one stops here; a profile without one: nothing to serve
        if table is None:
            return None
    tactics = table.tactics
    if tactics is None or not tactics.is_file():
        return None
    buckets = set(hybrid_buckets())
    tuned = sorted({cell for cell in cells if cell[2] in buckets})
    held = autotune_cache.held_cells(tactics)
    missing = [cell for cell in tuned if cell not in held]
    if not missing:
        return tactics
    # a cell of a shape and an M the file holds elsewhere: the table's tuning ran there and left no entry
    shapes, ms = {(n, k) for n, k, _ in held}, {m for _, _, m in held}
    unheld = [cell for cell in missing if cell[:2] not in shapes or cell[2] not in ms]
    shown = _cells_shown(unheld or missing)
    if not unheld:
        # FlashInfer's tuning for the table left these cells without an entry (a tuning that failed at a large M):
        # the dispatcher runs FlashInfer's default tactic there, and so does this run; tuning afresh would measure
        # other tactics than the table's everywhere else
        print(f"bench: the table's tactics ({tactics}) lack {len(missing)} cell(s) their tuning left without an "
              f"entry ({shown}): FlashInfer's default tactic runs there, as in the dispatcher (--tune tunes "
              f"afresh)", file=terminal(), flush=True)
        return tactics
    gemv_note = ("; the GEMV serves the table's configurations (--tune tunes both)"
                 if table_gemv_file(table) is not None else "")
    print(f"bench: the table's tactics ({tactics}) lack {len(unheld)} cell(s) this run tunes, of shapes "
          f"or M they never tuned ({shown}): tuning FlashInfer afresh (--autotune-cache {tactics} serves them, "
          f"FlashInfer's default tactic where one is missing){gemv_note}", file=terminal(), flush=True)
    return None


def _cells_shown(cells: list[tuple[int, int, int]]) -> str:
    return ", ".join(f"{n}x{k} M={m}" for n, k, m in cells[:3]) + (", ..." if len(cells) > 3 else "")


def saved(args) -> Path | None:
    if not args.save_autotune_cache:
        return None
    if args.autotune_cache:
        raise HarnessError("--autotune-cache serves tactics (no tuning), so there are none to save with "
                           "--save-autotune-cache; pass one of them")
    return output_file(args.save_autotune_cache, "--save-autotune-cache")


def check_before_gpu(cfg: SweepConfig, args) -> None:
    """What a real run would refuse, checked before any GPU is touched, so that --dry-run fails the same way."""
    if args.devices and args.devices.strip() != "all":
        parse_devices(args.devices, 1 << 16)  # the syntax; the real run checks the indices against its GPUs
    if cfg.autotune_cache is not None:
        autotune_cache.read_entries(cfg.autotune_cache)
        autotune_cache.read_gemv(cfg.autotune_cache)
    if cfg.resume:
        done_keys(cfg.out)
