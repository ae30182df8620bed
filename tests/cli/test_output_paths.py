"""Output paths (``sweep --json``, ``timeline --export``): only a regular file or a new path is
replaced; a symlink is written through to its target; devices, FIFOs and sockets are refused
before any work. Every node is made in a temporary directory."""
from __future__ import annotations

import io
import os
import socket
import stat

import pytest
from rich.console import Console

from megawino.cli import main
from megawino.cli.common import OutputFile

SWEEP = ["sweep", "resnet50", "--batch", "1", "--layers", "conv2_x", "--backend", "cpu"]


def _run(argv, capsys):
    console = Console(width=100, record=True, file=io.StringIO(), color_system=None)
    code = main(argv, console=console)
    return code, capsys.readouterr().err


def test_new_path_and_regular_file_replaced(tmp_path):
    target = tmp_path / "new.json"
    OutputFile(str(target), "--json").write_text("1\n")
    assert target.read_text() == "1\n"
    OutputFile(str(target), "--json").write_text("2\n")
    assert target.read_text() == "2\n" and stat.S_ISREG(target.lstat().st_mode)


def test_symlink_written_through_to_its_final_target(tmp_path):
    target = tmp_path / "results" / "out.json"
    target.parent.mkdir()
    target.write_text("old\n")
    first = tmp_path / "first.json"
    first.symlink_to(target)
    link = tmp_path / "link.json"
    link.symlink_to(first)                      # a chain: link -> first -> target
    OutputFile(str(link), "--json").write_text("new\n")
    assert link.is_symlink() and first.is_symlink()
    assert target.read_text() == "new\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.json"]   # no temporary left


def test_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "missing.json")
    OutputFile(str(link), "--json").write_text("x\n")
    assert link.is_symlink() and (tmp_path / "missing.json").read_text() == "x\n"


def _fifo(path):
    os.mkfifo(path)


def _socket(path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    return sock


def _char_device(path):
    if not hasattr(os, "mknod"):
        pytest.skip("no os.mknod here")
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))     # what /dev/null is
    except PermissionError:
        pytest.skip("making a device node needs root")


def _block_device(path):
    if not hasattr(os, "mknod"):
        pytest.skip("no os.mknod here")
    try:
        os.mknod(path, stat.S_IFBLK | 0o600, os.makedev(7, 0))
    except PermissionError:
        pytest.skip("making a device node needs root")


@pytest.mark.parametrize("make, words", [(_fifo, "a FIFO"), (_socket, "a socket"),
                                         (_char_device, "a character device"),
                                         (_block_device, "a block device")])
@pytest.mark.parametrize("through_link", [False, True])
def test_special_nodes_refused_and_left_alone(tmp_path, make, words, through_link):
    node = tmp_path / "node"
    kept = make(node)
    kind = stat.S_IFMT(node.lstat().st_mode)
    path = node
    if through_link:
        path = tmp_path / "link"
        path.symlink_to(node)
    with pytest.raises(ValueError, match=words):
        OutputFile(str(path), "--json")
    assert stat.S_IFMT(node.lstat().st_mode) == kind          # the node is still what it was
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["node"] + ["link"] * through_link)
    if kept is not None:
        kept.close()


def test_sweep_json_writes_through_a_symlink(tmp_path, capsys):
    target = tmp_path / "results.json"
    target.write_text("{}\n")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    code, err = _run(SWEEP + ["--json", str(link)], capsys)
    assert code == 0, err
    assert link.is_symlink() and '"layers"' in target.read_text()


@pytest.mark.parametrize("option", ["sweep", "timeline"])
def test_cli_refuses_a_fifo_before_the_work(tmp_path, capsys, monkeypatch, option):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    from megawino import sweep
    monkeypatch.setattr(sweep, "select_layers", lambda *a, **k: pytest.fail("the work started"))
    monkeypatch.setattr("megawino.cli.timeline._timeline", lambda *a, **k: pytest.fail("the work started"))
    argv = SWEEP + ["--json", str(fifo)] if option == "sweep" else \
        ["timeline", "resnet50.conv2_x", "--batch", "1", "--simulate", "--export", str(fifo)]
    code, err = _run(argv, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "a FIFO" in lines[0], err
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_help_says_what_paths_are_written(capsys):
    for command, option in (("sweep", "--json"), ("timeline", "--export")):
        assert main([command, "--help"], console=Console(file=io.StringIO())) == 0
        text = " ".join(capsys.readouterr().out.split())
        assert "symlink is written through" in text and "FIFO or socket is refused" in text, command
