"""One name, one meaning: every option name that several commands take is the shared declaration of
harness/options.py, and an old spelling still works for one release and says so."""
from __future__ import annotations

import argparse

import pytest

from harness import cli
from harness.options import OPTIONS, add


class _Got(Exception):
    def __init__(self, parser):
        self.parser = parser


def _command_parsers(main) -> list[argparse.ArgumentParser]:
    """The parser a command-line main builds and each subcommand's, without running any command."""
    def grab(self, *args, **kwargs):
        raise _Got(self)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli.Parser, "parse_args", grab)
        with pytest.raises(_Got) as got:
            main([])
    found, todo = [], [got.value.parser]
    while todo:
        p = todo.pop()
        found.append(p)
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())
    return found


def _mains():
    from bench.__main__ import main as bench
    from calibrate.__main__ import main as calibrate
    from dispatch.__main__ import main as dispatch
    from reports.__main__ import main as reports
    from shapes.__main__ import main as shapes
    return [bench, calibrate, dispatch, reports, shapes]


def _declarations() -> dict[str, list[tuple[str, argparse.Action]]]:
    """option string -> (command, action) wherever a command declares it under its current name."""
    out: dict[str, list[tuple[str, argparse.Action]]] = {}
    for main in _mains():
        for p in _command_parsers(main):
            for action in p._actions:
                for flag in action.option_strings:
                    if flag in ("-h", "--help") or flag == getattr(action, "old_spelling", None):
                        continue
                    out.setdefault(flag, []).append((p.prog, action))
    return out


def test_an_option_several_commands_take_is_the_shared_one():
    shared_twice = {}
    for flag, uses in _declarations().items():
        if len(uses) < 2:
            continue
        names = {getattr(action, "shared", None) for _, action in uses}
        assert len(names) == 1 and None not in names, (
            f"{flag} is declared apart in {sorted(prog for prog, a in uses if not getattr(a, 'shared', None))}: "
            f"declare it once in harness/options.py and add() it")
        shared_twice[flag] = names.pop()
    assert {"--gpu", "--out", "--partial", "--table", "--allow-mismatch"} <= set(shared_twice)


def test_out_is_a_folder_and_out_file_a_file_everywhere():
    decl = _declarations()
    assert all(a.metavar == "DIR" for _, a in decl["--out"]), [p for p, a in decl["--out"] if a.metavar != "DIR"]
    assert all(a.metavar == "FILE" for _, a in decl["--out-file"])
    assert len(decl["--out-file"]) >= 5  # fit, noise, forward-noise, baseline, host-cost, compare, reports


def test_an_old_spelling_works_and_says_so(capsys):
    p = cli.Parser(prog="prog")
    add(p, "out-file", dest="out")
    add(p, "table")
    assert p.parse_args(["--out-file", "a.json"]).out == "a.json"
    assert capsys.readouterr().err == ""
    args = p.parse_args(["--out", "b.json", "--thresholds", "t.json"])
    assert (args.out, args.table) == ("b.json", "t.json")
    err = capsys.readouterr().err
    assert "--out is now --out-file" in err and "--thresholds is now --table" in err


def test_a_shown_default_is_not_a_value():
    p = cli.Parser(prog="prog")
    add(p, "paths", shown="every path")
    action = add(p, "tp", type=int, default=1)
    assert p.parse_args([]).paths is None and p.parse_args([]).tp == 1
    assert "(default: every path)" in p._actions[-2].help and "(default: 1)" in action.help


def test_every_shared_option_has_one_current_name():
    flags = [f for o in OPTIONS.values() for f in o.flags]
    assert len(flags) == len(set(flags))
