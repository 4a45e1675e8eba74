"""python -m evidence_store add | list | current | restore | section | figure | page: the store of measured runs
(evidence_store/store.py) and the results pages (evidence_store/page.py).

    add RUN_DIR --backs "what it backs" [--note "..."] [--partial] [--replaces ID]
    list
    current PROFILE [check-sweep|check-forward|run]   the folder behind the shipped table (make report's default)
    restore ID --to DIR
    section ID --profile P --title T --order N --text "..."
    figure ID --label "..." --of READER --args JSON [--tolerance T]
    page PROFILE [--check]                             exit 1 where docs/results-PROFILE.md differs (--check)
"""
from __future__ import annotations

from harness.errors import quiet_interrupts

quiet_interrupts("evidence_store")  # Ctrl-C or SIGTERM during the imports below: one line, no traceback

import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from dispatch.profiles import PROFILES  # noqa: E402
from evidence_store.page import figure, page, page_file, section  # noqa: E402
from evidence_store import store  # noqa: E402
from harness.cli import Parser, float_in  # noqa: E402
from harness.errors import run_cli  # noqa: E402
from harness.io import atomic_write_text  # noqa: E402
from harness.options import add as add_option  # noqa: E402

PROG = "python -m evidence_store"


def json_object(text: str) -> dict:
    import argparse
    try:
        value = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r:.40} is not JSON") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r:.40} is not a JSON object")
    return value


def parser() -> Parser:
    p = Parser(prog=PROG)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("add")
    a.add_argument("run")
    a.add_argument("--backs", required=True)
    a.add_argument("--note", default=None)
    add_option(a, "partial", what="(the manifest says so)")
    a.add_argument("--replaces", metavar="ID", help="a filed table run this run is a later state of (refitted or "
                                                     "judged again): its folder and entry, figures read again")
    sub.add_parser("list")
    r = sub.add_parser("restore")
    r.add_argument("id")
    r.add_argument("--to", required=True, help="the working folder to create (e.g. results/h200/<run-id>)")
    c = sub.add_parser("current")
    c.add_argument("profile", choices=sorted(PROFILES))
    c.add_argument("part", nargs="?", default="run", choices=store.PARTS)
    s = sub.add_parser("section")
    s.add_argument("id")
    s.add_argument("--profile", required=True, choices=sorted(PROFILES))
    s.add_argument("--title", required=True)
    s.add_argument("--order", type=int, required=True)
    s.add_argument("--text", required=True)
    f = sub.add_parser("figure")
    f.add_argument("id")
    f.add_argument("--label", required=True)
    f.add_argument("--of", required=True, help="a reader of evidence_store/figures.py")
    f.add_argument("--args", type=json_object, default={}, help="the reader's arguments, a JSON object")
    f.add_argument("--tolerance", type=float_in(0.0, 1e12), default=0.0,
                   help="how far a later reading may be from the recorded value (>= 0)")
    g = sub.add_parser("page")
    g.add_argument("profile", choices=sorted(PROFILES))
    g.add_argument("--check", action="store_true", help="exit 1 where docs/results-PROFILE.md differs")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.cmd == "add":
        rid, changed = store.add(Path(args.run), args.backs, args.note or "", args.partial, args.replaces)
        print(rid + (f" (replaces {args.replaces})" if args.replaces else ""))
        for line in changed:
            print(f"  figure read again, changed: {line}")
    elif args.cmd == "restore":
        print(f"restored evidence/{args.id} into {store.restore(args.id, Path(args.to))}")
    elif args.cmd == "section":
        section(args.id, args.profile, args.title, args.order, args.text)
    elif args.cmd == "figure":
        print(json.dumps(figure(args.id, args.label, args.of, args.args, args.tolerance)))
    elif args.cmd == "page":
        out, text = page_file(args.profile), page(args.profile) + "\n"
        if args.check:
            if not out.is_file() or out.read_text() != text:
                print(f"{out.relative_to(store.ROOT)} is not what the manifest writes; run {PROG} page {args.profile}",
                      file=sys.stderr)
                return 1
            return 0
        atomic_write_text(out, text)
        print(f"wrote {out.relative_to(store.ROOT)} ({text.count(chr(10))} lines)")
    elif args.cmd == "current":
        print(store.current(args.profile, args.part).relative_to(store.ROOT))
    else:
        for rid, r in sorted(store.load_manifest()["runs"].items()):
            print(f"{rid}  {r.get('backs', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main, "evidence_store"))
