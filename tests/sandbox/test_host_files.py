"""Host-side workspace helpers on plain folders (no sandbox): what a download keeps and what it refuses."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from clawgym_env.sandbox.host_files import copy_workspace, read_beneath, write_beneath

MOUNT = "/root/.openclaw/workspace"


def make_workspace(root: Path, outside: Path) -> Path:
    ws = root / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "a.txt").write_text("a")
    (ws / "sub" / "b.txt").write_text("b")
    os.chmod(ws / "a.txt", 0o6755)
    (ws / "rel_in").symlink_to("sub/b.txt")
    (ws / "abs_in").symlink_to(f"{MOUNT}/a.txt")  # absolute as seen inside: stays inside
    (ws / "abs_out").symlink_to(outside)
    (ws / "rel_out").symlink_to("../../secret.txt")
    (ws / "up").symlink_to("..")
    (ws / "through_up").symlink_to("up/ws/a.txt")  # lexically inside, but goes through a link that leaves
    os.mkfifo(ws / "fifo")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(ws / "sock"))
    return ws


def test_copy_keeps_files_and_inside_links_and_refuses_the_rest(tmp_path: Path) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_text("host secret")
    ws = make_workspace(tmp_path, outside)
    dest = tmp_path / "copy"
    report = copy_workspace(ws, dest, MOUNT)
    assert (dest / "a.txt").read_text() == "a" and oct(os.stat(dest / "a.txt").st_mode & 0o7777) == "0o755"
    assert (dest / "rel_in").read_text() == "b" and (dest / "abs_in").read_text() == "a"
    assert report.skipped == {
        "abs_out": "link out of the workspace",
        "rel_out": "link out of the workspace",
        "up": "link out of the workspace",
        "fifo": "fifo",
        "sock": "socket",
    }
    assert not (dest / "through_up").exists()  # dangles: the link it went through was not copied
    assert report.files == 2 and report.links == 3


def test_reads_refuse_links_and_fifos_and_writes_replace_them(tmp_path: Path) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_text("host secret")
    ws = make_workspace(tmp_path, outside)
    with pytest.raises(FileNotFoundError, match="symlinks are not followed"):
        read_beneath(ws, "abs_out")
    with pytest.raises(OSError, match="not a regular file"):
        read_beneath(ws, "fifo")
    write_beneath(ws, "fifo", b"now a file")
    write_beneath(ws, "abs_out", b"not the host file")
    assert read_beneath(ws, "fifo") == b"now a file" and read_beneath(ws, "abs_out") == b"not the host file"
    assert outside.read_text() == "host secret"
