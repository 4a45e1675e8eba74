"""The options several commands share, each declared once here: one name, one meaning.

A command takes one with `add(parser, "name", ...)`; only its default and whether it is required change per command
(and `what`, a few words on what it is for there). `--out` is a folder wherever a command writes a folder; a command
that writes one file takes `--out-file` (its old spelling `--out` is kept one release and says so).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field


def renamed(new: str, old: str, base: type[argparse.Action] = argparse._StoreAction) -> type[argparse.Action]:
    """An option's action under its new name that also takes its old spelling for one release, saying so on stderr:
    add_argument(new, old, action=renamed(new, old), ...). `base`: argparse's action it behaves as (store,
    store_true)."""
    class Renamed(base):
        old_spelling = old

        def __call__(self, parser, namespace, values, option_string=None):
            if option_string == old:
                print(f"{parser.prog}: note: {old} is now {new}; the old spelling goes after this release",
                      file=sys.stderr)
            super().__call__(parser, namespace, values, option_string)
    return Renamed


def flag_renamed(new: str, old: str) -> type[argparse.Action]:
    return renamed(new, old, argparse._StoreTrueAction)


@dataclass(frozen=True)
class Option:
    flags: tuple[str, ...]
    help: str  # may hold {default} and {what}
    kwargs: dict = field(default_factory=dict)
    old: str | None = None  # a spelling kept for one release


OPTIONS: dict[str, Option] = {
    "gpu": Option(("--gpu",), "GPU profile, e.g. h200 (`python -m bench profiles` lists them){what}"),
    "out": Option(("--out",), "output folder{what} (default: {default})", dict(metavar="DIR")),
    "out-file": Option(("--out-file",), "the file written{what} (default: {default})", dict(metavar="FILE"),
                       old="--out"),
    "table": Option(("--table",), "the threshold table{what} (default: the GPU profile's shipped table)",
                    dict(metavar="FILE"), old="--thresholds"),
    "partial": Option(("--partial",), "take runs with missing cells or that did not finish (what is missing is "
                                      "named){what}", dict(action="store_true")),
    "allow-mismatch": Option(("--allow-mismatch",), "take a GPU or runs of another GPU than the profile's (the "
                                                    "mismatch is named){what}", dict(action="store_true")),
    "install": Option(("--install",), "also write the shipped file{what}", dict(action="store_true")),
    "dry-run": Option(("--dry-run",), "print the plan and write nothing{what}", dict(action="store_true")),
    "resume": Option(("--resume",), "continue an interrupted run{what}", dict(action="store_true")),
    "layout": Option(("--layout",), "the model's linears{what} (default: {default})"),
    "model": Option(("--model",), "catalog model{what} (default: {default})"),
    "tp": Option(("--tp",), "tensor-parallel degree (default: {default})"),
    "m": Option(("--m",), "M values: 1,8,32 or 1-16384 (powers of two) or 64:512:64 (default: {default})"),
    "shapes": Option(("--shapes",), "comma list of shape names (n2048_k4096) or NxK (default: {default})"),
    "samples": Option(("--samples",), "timed samples{what} (default: {default})"),
    "layers": Option(("--layers",), "only the first N decoder layers (memory){what}"),
    "forward": Option(("--forward",), "measured-forward folder(s) (python -m bench forward){what}",
                      dict(metavar="DIR")),
    "csv": Option(("--csv",), "also write the per-cell figures to this CSV file{what}", dict(metavar="FILE")),
    "paths": Option(("--paths",), "comma list of paths{what} (default: {default})"),
    "no-tune": Option(("--no-tune",), "skip FlashInfer's autotuner (time its default tactics)",
                      dict(action="store_true")),
    "no-compile-ahead": Option(("--no-compile-ahead",), "compile each kernel at its first call, not the "
                               "dispatcher's C++ layer and the GEMV's kernels in threads while the run starts "
                               "(default: ahead)", dict(action="store_true")),
    "tolerance": Option(("--tolerance",), "tolerance{what} (default: {default})"),
    "format": Option(("--format",), "output format (default: {default})"),
    "config": Option(("--config",), "a HF config.json instead of the catalog's models{what}"),
    "rounds": Option(("--rounds",), "interleaved rounds{what} (default: {default})"),
    "calls": Option(("--calls",), "timed calls{what} (default: {default})"),
    "margin": Option(("--margin",), "equivalence margin: within it two times are the same (default: {default})"),
    "no-floor": Option(("--no-floor",), "judge without the stored noise floor{what}", dict(action="store_true")),
    # how FlashInfer's tactics are chosen (bench run, bench forward)
    "autotune-cache": Option(("--autotune-cache",), (
        "serve FlashInfer's tactics from FILE (e.g. an earlier run's autotune-cache.json) instead of tuning; shapes or "
        "M that FILE lacks run FlashInfer's fallback tactic (-1), as in vLLM"), dict(metavar="FILE")),
    "save-autotune-cache": Option(("--save-autotune-cache",), (
        "after tuning, also write the tactics to FILE (they are always kept in OUT/autotune-cache.json)"),
        dict(metavar="FILE")),
    "tune": Option(("--tune",), (
        "tune FlashInfer's tactics in this run. Default: serve the tactics of the table the dispatch path runs, as "
        "the dispatcher loads them, where that file holds every shape of the run at each of its M that is a tuning "
        "bucket; else tune"), dict(action="store_true")),
    "tuning": Option(("--tuning",), (
        "grid: FlashInfer's autotuner over the run's M values that are tuning buckets (default); vllm: as vLLM tunes "
        "at start-up, one call at --max-num-batched-tokens inside autotune(hybrid buckets up to it, round_up=True)"),
        dict(choices=("grid", "vllm"), default="grid")),
    "max-num-batched-tokens": Option(("--max-num-batched-tokens",), (
        "with --tuning vllm: vLLM's max_num_batched_tokens (default: vLLM's server default on the profile's GPU)"),
        dict(metavar="N")),
    "from": Option(("--from",), "existing results folder(s){what} (default: measure afresh, GPU)",
                   dict(metavar="DIR")),
    "work": Option(("--work",), "where a fresh measurement writes (default: {default})", dict(metavar="DIR")),
    "noise": Option(("--noise",), "the run-to-run noise floor (python -m calibrate noise){what} (default: the "
                                  "profile's shipped calibrate/noise/<profile>.json)", dict(metavar="FILE")),
    "forward-floor": Option(("--forward-floor",), "the forward noise floor (python -m calibrate forward-noise){what} "
                                                  "(default: the profile's shipped calibrate/noise/<profile>-forward."
                                                  "json)", dict(metavar="FILE")),
    "baseline": Option(("--baseline",), "a stored baseline file{what} (default: {default})", dict(metavar="FILE")),
}


def add(parser: argparse.ArgumentParser, name: str, *, what: str = "", default=None, dest: str | None = None,
        shown: str | None = None, short: str | None = None, old: str | None = None, **kwargs) -> argparse.Action:
    """Declare the shared option `name` on `parser`. `what`: a few words on what it is for in this command; `short`:
    a one-letter spelling besides; `old`: this command's old spelling, kept one release; `shown`: the default as the
    help says it where it is not a value (the profile's file, every path); `default` and the other keywords
    (required, type, nargs, choices, metavar) are argparse's."""
    opt = OPTIONS[name]
    args = {**opt.kwargs, **kwargs}
    shown = shown if shown is not None else ("none" if default is None else default)
    args["help"] = opt.help.format(what=f" {what}" if what and not what.startswith((":", ";", ",")) else what,
                                   default=shown).replace("%", "%%")
    if default is not None:
        args["default"] = default
    if shown == "none":
        args["help"] = args["help"].replace(" (default: none)", "")
    flags = (short, *opt.flags) if short else opt.flags
    old = old or opt.old
    if old:
        flags = (*flags, old)
        store_true = args.pop("action", None) == "store_true"
        args["action"] = flag_renamed(opt.flags[0], old) if store_true else renamed(opt.flags[0], old)
        args.setdefault("dest", dest or opt.flags[0].lstrip("-").replace("-", "_"))
    elif dest:
        args["dest"] = dest
    action = parser.add_argument(*flags, **args)
    action.shared = name  # tests check that an option name several commands take comes from here
    return action


def parent(*names: str | tuple[str, dict]) -> argparse.ArgumentParser:
    """A parent parser of shared options for parents=[...]: each a name, or (name, keywords for add)."""
    p = argparse.ArgumentParser(add_help=False)
    for item in names:
        name, kw = (item, {}) if isinstance(item, str) else item
        add(p, name, **kw)
    return p
