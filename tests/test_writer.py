"""The one writer: targets checked before any work, shipped files only with --install, links followed, special files
never replaced."""
import os

import pytest

from harness.errors import HarnessError
from harness.io import ROOT, atomic_write_text, check_target, output_file, shipped_or_results


def test_a_shipped_file_needs_install(tmp_path):
    shipped = ROOT / "dispatch" / "thresholds" / "h200.json"
    with pytest.raises(HarnessError, match="--install"):
        output_file(shipped, "--out")
    assert output_file(shipped, "--out", install=True) == shipped
    assert shipped_or_results(None, shipped, tmp_path / "results" / "table.json", False) == \
        tmp_path / "results" / "table.json"
    assert shipped_or_results(None, shipped, tmp_path / "t.json", True) == shipped


def test_a_link_into_a_shipped_folder_is_refused_too(tmp_path):
    link = tmp_path / "mine.json"
    link.symlink_to(ROOT / "calibrate" / "noise" / "h200.json")
    with pytest.raises(HarnessError, match="ships"):
        output_file(link, "--out")


def test_special_files_are_never_replaced(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(HarnessError, match="not a regular file"):
        output_file(fifo, "--csv")
    with pytest.raises(HarnessError, match="not a regular file"):
        atomic_write_text(fifo, "x")
    assert fifo.is_fifo()
    with pytest.raises(HarnessError, match="not a regular file"):
        check_target(os.devnull, "--csv")


def test_a_symlink_is_written_through_and_kept(tmp_path):
    target, link = tmp_path / "target.txt", tmp_path / "link.txt"
    target.write_text("old")
    link.symlink_to(target)
    atomic_write_text(output_file(link, "--out"), "new")
    assert link.is_symlink() and target.read_text() == "new"


def test_an_empty_output_name_is_refused():
    with pytest.raises(HarnessError, match="empty"):
        output_file("", "--out")


def test_a_symlink_loop_is_one_error(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(HarnessError, match="symlink loop"):
        output_file(loop, "--out")
    with pytest.raises(HarnessError, match="symlink loop"):
        output_file(loop / "x.json", "--out")


def test_an_interrupt_during_the_final_write_leaves_the_old_file_and_no_temp_file(tmp_path):
    """Every writer goes through harness.io.atomic_write: Ctrl-C or SIGTERM (Terminated) while the temp file is being
    filled leaves the target as it was and nothing beside it, and the interrupt goes on to end the command."""
    from harness.errors import Terminated
    from harness.io import atomic_write
    target = tmp_path / "table.json"
    target.write_text("old\n")
    for interrupt in (KeyboardInterrupt, Terminated):
        def fill(tmp, interrupt=interrupt):
            tmp.write_text("half")
            raise interrupt()
        with pytest.raises(interrupt):
            atomic_write(target, fill)
        assert target.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["table.json"]
