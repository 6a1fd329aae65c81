"""Seeding a workspace on the host: files, bytes, folders, functions, and paths that try to escape."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from clawgym_env.sandbox.workspace import WorkspacePathError, materialize_workspace
from clawgym_env.specs import TaskSpec, WorkspaceSpec


def test_files_bytes_folder_and_function_in_order(tmp_path: Path) -> None:
    source = tmp_path / "source"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "data.csv").write_text("a,b\n1,2\n")
    (source / "sub" / "rel_link").symlink_to("data.csv")

    def add_marker(ws: Path) -> None:
        assert (ws / "sub" / "data.csv").exists()  # the function runs after files and folder
        (ws / "from_function.txt").write_text("made by function")

    spec = WorkspaceSpec(
        files={"notes/a.txt": "hi", "blob.bin": b"\x00\xff\x01"}, directory=source, function=add_marker
    )
    dest = materialize_workspace(spec, tmp_path / "ws")
    assert (dest / "notes" / "a.txt").read_text() == "hi"
    assert (dest / "blob.bin").read_bytes() == b"\x00\xff\x01"
    assert (dest / "sub" / "data.csv").read_text() == "a,b\n1,2\n"
    assert os.readlink(dest / "sub" / "rel_link") == "data.csv"
    assert (dest / "from_function.txt").read_text() == "made by function"


@pytest.mark.parametrize("bad", ["../escape.txt", "/etc/passwd", "a/../../b", "", "ok/\x00bad"])
def test_escaping_file_names_are_refused_by_the_spec(bad: str) -> None:
    with pytest.raises(ValidationError) as info:
        WorkspaceSpec(files={bad: "x"})
    assert "workspace path" in str(info.value)


def test_bad_mount_paths_are_refused() -> None:
    for bad in ["relative/ws", "/root/../etc", "/"]:
        with pytest.raises(ValidationError, match="mount_path"):
            TaskSpec(id="t", instruction="i", verifier=lambda d: 1.0, mount_path=bad)


def test_folder_with_outward_symlink_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "fine.txt").write_text("fine")
    (source / "passwd").symlink_to("/etc/passwd")
    dest = tmp_path / "ws"
    with pytest.raises(WorkspacePathError, match="points outside"):
        materialize_workspace(WorkspaceSpec(files={"a.txt": "a"}, directory=source), dest)
    assert list(dest.iterdir()) == []


def test_relative_symlink_climbing_out_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "source"
    (source / "deep").mkdir(parents=True)
    (source / "deep" / "up").symlink_to("../../outside")
    with pytest.raises(WorkspacePathError, match="outside"):
        materialize_workspace(WorkspaceSpec(directory=source), tmp_path / "ws")


def test_writing_through_an_existing_symlink_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "ws"
    dest.mkdir()
    (dest / "link").symlink_to(outside)
    with pytest.raises(WorkspacePathError, match="symlink"):
        materialize_workspace(WorkspaceSpec(files={"first.txt": "1", "link/evil.txt": "x"}), dest)
    assert list(outside.iterdir()) == []
    assert not (dest / "first.txt").exists()  # validated before anything was written
