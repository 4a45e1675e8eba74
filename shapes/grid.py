"""The M (token count) grid."""
from __future__ import annotations

from harness.errors import HarnessError

M_MAX = 16384
MAX_GRID_VALUES = 1024  # a sweep over more M values than this is a typo, not a plan
# Values that are not FlashInfer autotuner buckets: cuBLASLt tuned entries are keyed by exact M, so these
# run the untuned heuristic algorithm (24 and 48 round up to buckets 32 and 64; 1031 -> 1280; 6144 -> 8192).
NON_BUCKET_M = (24, 48, 1031, 6144)


def vllm_capture_sizes(max_size: int = 512) -> list[int]:
    """vLLM's default cudagraph_capture_sizes: 1, 2, 4, then steps of 8 below 256, then steps of 16."""
    sizes = [s for s in (1, 2, 4) if s <= max_size]
    sizes += list(range(8, min(max_size + 1, 256), 8))
    sizes += list(range(256, max_size + 1, 16))
    return sizes


def hybrid_buckets(max_m: int = M_MAX) -> list[int]:
    """FlashInfer's get_hybrid_num_tokens_buckets: powers of two to 256, +256 to 2048, +512 to 4096, then powers of two."""
    out, m = [], 1
    while m <= min(256, max_m):
        out.append(m)
        m *= 2
    m = 512
    while m <= min(2048, max_m):
        out.append(m)
        m += 256
    m = 2560
    while m <= min(4096, max_m):
        out.append(m)
        m += 512
    m = 8192
    while m <= max_m:
        out.append(m)
        m *= 2
    if max_m not in out:
        out.append(max_m)
    return out


def powers_of_two(max_m: int = M_MAX) -> list[int]:
    return [1 << i for i in range(max_m.bit_length()) if 1 << i <= max_m]


def default_grid(capture_max: int = 512) -> list[int]:
    """Every power of two to 16384, vLLM's capture sizes in full up to 64 (where the low-M threshold lives) and
    every 64 above that up to capture_max, and the non-bucket probes: 25 values. `--m capture` adds all 51."""
    capture = [c for c in vllm_capture_sizes(capture_max) if c <= 64 or c % 64 == 0]
    return sorted(set(powers_of_two()) | set(capture) | set(NON_BUCKET_M))


NAMED_GRIDS = {
    "default": default_grid,
    "capture": lambda: sorted(set(default_grid()) | set(vllm_capture_sizes(512))),
    "powers": powers_of_two,
}


def parse_m(spec: str | None) -> list[int]:
    """'1,8,32', '1-64' (every power of two in the range), '64:512:64' (start:stop:step) or a named grid
    (default, capture, powers); combined with commas. Every M lies in 1..M_MAX; at most MAX_GRID_VALUES values."""
    if spec is None:
        return default_grid()
    hint = "use e.g. --m 1,8,32 or 1-16384 or 64:512:64 or default,capture"
    tokens = [t.strip() for t in spec.split(",") if t.strip()]
    if not tokens:
        raise HarnessError(f"--m {spec!r} names no M value; {hint}")
    values: set[int] = set()
    for token in tokens:
        try:
            if token in NAMED_GRIDS:
                values.update(NAMED_GRIDS[token]())
            elif ":" in token:
                start, stop, step = (int(x) for x in token.split(":"))
                _check_range(token, start, stop)
                if step < 1:
                    raise ValueError
                values.update(range(start, stop + 1, step))
            elif "-" in token:
                lo, hi = (int(x) for x in token.split("-"))
                _check_range(token, lo, hi)
                values.update(1 << i for i in range(hi.bit_length()) if lo <= 1 << i <= hi)
                values.update({lo, hi})
            else:
                values.add(int(token))
                _check_range(token, int(token), int(token))
        except ValueError:
            raise HarnessError(f"bad M value {token!r}; {hint}") from None
        if len(values) > MAX_GRID_VALUES:
            raise HarnessError(f"--m {spec!r} asks for more than {MAX_GRID_VALUES} M values; take a coarser step")
    return sorted(values)


def _check_range(token: str, lo: int, hi: int) -> None:
    if not 1 <= lo <= hi <= M_MAX:
        raise HarnessError(f"M values must lie in 1..{M_MAX} (the range the harness measures), got {token!r}")
