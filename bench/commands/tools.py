"""python -m bench merge | paths | profiles: the commands that need no GPU profile."""
from __future__ import annotations

from pathlib import Path

from bench.merge import merge_shards
from bench.paths import PATHS
from dispatch import vllm
from dispatch.profiles import PROFILES, get_profile
from harness.errors import HarnessError
from harness.io import output_dir
from harness.options import add


def add_parser(sub) -> None:
    p_merge = sub.add_parser("merge", help="merge shards of one grid (bench run --shard, or several machines) into one run")
    p_merge.add_argument("shards", nargs="+", help="the shards' results folders")
    add(p_merge, "out", old="-o", required=True, what=": the merged run (must not hold results)")
    add(p_merge, "partial", what="(missing or unfinished shards)")
    sub.add_parser("paths", help="list the path registry")
    p_prof = sub.add_parser("profiles", help="list the GPU profiles (or check that NAME is one)")
    p_prof.add_argument("name", nargs="?", help="a profile name: exit 2 with one line when it is unknown")


def run(args) -> int:
    """merge, paths, profiles: the commands that need no GPU profile."""
    if args.cmd == "merge":
        target = output_dir(args.out, "--out")
        if target.is_dir() and any(target.iterdir()):  # a user's folder: nothing in it is ours to replace
            raise HarnessError(f"{target} is not empty; merge into a new or empty folder (nothing was changed)")
        out = merge_shards([Path(d) for d in args.shards], target, args.partial)
        print(f"merged {len(args.shards)} shard(s) into {out}/results.csv and run.json\n"
              f"  next: python -m calibrate validate {out}")
        return 0
    if args.cmd == "paths":
        for p in PATHS.values():
            sms = "any" if p.sms is None else "/".join(map(str, p.sms))
            print(f"{p.name:22s} {p.role:10s} SM {sms:24s} {p.note}")
        return 0
    if args.cmd == "profiles":
        for p in ([get_profile(args.name)] if args.name else PROFILES.values()):
            print(f"{p.name:6s} SM{p.sm} {p.name_pattern:6s} backends={','.join(p.flashinfer_backends)} "
                  f"low-M={p.low_m_backend} capture={p.capture_size} "
                  f"vllm-flag={'cute-dsl' if vllm.flag_supported(p.sm) else 'F.linear'}")
        return 0

    raise AssertionError(args.cmd)
