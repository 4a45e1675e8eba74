"""The GEMV's kernels compiled ahead of their first calls, several at once, beside the caller's other work.

Triton compiles a kernel at the first launch of each specialization: its constexprs (the configuration), the
options (warps, PDL), which pointer arguments are None, and which integer arguments are 1 or multiples of 16. A sweep
on a machine with an empty Triton cache meets a hundred or so of the GEMV's, each compiled inside a cell's check,
one after another. `CompileAhead` compiles those that calls at given (N, K, M) cells will launch with their served
configurations (gemv.pinned), in threads that start at once and run while the caller does other work (the
ptxas step is a subprocess; the rest overlaps as far as Triton lets go of the GIL); `wait` joins them. A launch
whose specialization this misjudges compiles at its first call, as without it.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dispatch import gemv

WORKERS = 8


def specialization(ints: tuple[int, ...]) -> tuple[tuple[bool, bool], ...]:
    """What Triton's key takes of each integer argument: whether it is 1, whether a multiple of 16."""
    return tuple((v == 1, v % 16 == 0) for v in ints)


def launches(cells: Iterable[tuple[int, int, int]], pdls: tuple[bool | None, ...] = (None,)
             ) -> list[tuple[Any, ...]]:
    """The distinct launches (grid, integer arguments, options, split) that calls at these (N, K, M) cells make with
    their served configurations (contiguous x, w and y), launched as each of `pdls` says (None: as the configuration
    does; True, False: every call with PDL, plainly); a cell above gemv.MAX_M or without one is left out."""
    seen: dict[tuple, tuple[Any, ...]] = {}
    for n, k, m in cells:
        c = gemv.pinned(n, k, m) if m <= gemv.MAX_M else None
        for pdl in pdls if c is not None else ():
            grid, ints, options = gemv.arguments(m, n, k, c, pdl, (k, k, n))
            key = (tuple(sorted(options.items())), c.split_k > 1, specialization(ints))
            seen.setdefault(key, (grid, ints, options, c.split_k > 1))
    return list(seen.values())


class CompileAhead:
    """The kernels of `cells` (launched as each of `pdls` says) compiling in threads from construction on, for the
    current CUDA device; wait() joins them and says what was done."""

    def __init__(self, cells: Iterable[tuple[int, int, int]], pdls: tuple[bool | None, ...] = (None,),
                 workers: int = WORKERS):
        import torch
        self.todo = launches(cells, pdls)
        self.errors: list[str] = []
        self.device = torch.cuda.current_device()
        self.t0 = time.perf_counter()
        self.seconds = 0.0
        self.thread = threading.Thread(target=self._run, args=(workers,), name="blb-gemv-compile", daemon=True)
        self.thread.start()

    def _compile(self, launch: tuple[Any, ...]) -> None:
        import torch
        grid, ints, options, split = launch
        torch.cuda.set_device(self.device)
        pointers = (torch.bfloat16,) * 3 + ((torch.float32, torch.int32) if split else (None, None))
        try:
            gemv.kernel().warmup(*pointers, *ints, grid=grid, **options)
        except Exception as exc:  # this launch compiles at its first call instead
            self.errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")

    def _run(self, workers: int) -> None:
        if self.todo:
            self._compile(self.todo[0])  # first alone: Triton makes its per-device state once
            with ThreadPoolExecutor(max_workers=workers) as pool:
                list(pool.map(self._compile, self.todo[1:]))
        self.seconds = time.perf_counter() - self.t0

    def wait(self) -> dict[str, Any]:
        """Joins the compiles; what run.json records of them."""
        self.thread.join()
        return {"launches": len(self.todo), "seconds": round(self.seconds, 2), "failed": len(self.errors),
                **({"first_error": self.errors[0]} if self.errors else {})}
