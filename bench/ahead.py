"""What a run compiles at its start, in threads, while it measures its ceilings: the dispatcher's C++ layer (where
it runs the dispatcher and no build exists; its first bind waits for the build) and the GEMV kernels its calls will
launch with served configurations (dispatch/gemv_ahead.py). --no-compile-ahead compiles each at its first call."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from harness.console import terminal


@dataclass
class Ahead:
    on: bool = True  # False: --no-compile-ahead
    native: bool = False  # the C++ layer's build started
    gemv: Any = None  # gemv_ahead.CompileAhead

    @classmethod
    def start(cls, on: bool, native_layer: bool, cells: Iterable[tuple[int, int, int]],
              pdls: tuple[bool | None, ...] = (None,)) -> Ahead:
        """Starts what `on` allows: the C++ layer's build where native_layer, the GEMV's kernels of `cells` (N, K, M)
        launched as each of `pdls` says (None: as the configuration does)."""
        from dispatch import gemv_ahead, native
        cells = list(cells) if on else []
        ahead = cls(on=on, native=on and native_layer and native.build_ahead())
        if cells:
            ahead.gemv = gemv_ahead.CompileAhead(cells, pdls=pdls)
        return ahead

    def wait(self) -> dict[str, Any]:
        """Joins the GEMV's compiles; run.json's `compiled_ahead`. A kernel that failed to compile ahead compiles at
        its first call, said in one line."""
        done = self.gemv.wait() if self.gemv is not None else None
        if done and done["failed"]:
            print(f"bench: {done['failed']} of the GEMV's {done['launches']} kernels did not compile ahead "
                  f"({done['first_error']}); each compiles at its first call", file=terminal())
        return {"native_layer": self.native, "gemv": done, **({} if self.on else {"off": "--no-compile-ahead"})}
