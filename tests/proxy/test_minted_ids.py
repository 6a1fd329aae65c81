"""Response and tool-call ids: unique within a process and across a fork, as long as a random token's."""

from __future__ import annotations

import os

from clawgym_env.proxy.apis.base import mint_id


def test_ids_are_unique_and_keep_their_length() -> None:
    ids = [mint_id("call_") for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert {len(i) for i in ids} == {len("call_") + 24}
    assert all(i.startswith("call_") and int(i[5:], 16) >= 0 for i in ids)


def test_a_forked_child_mints_other_ids() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: what it would mint next
        os.write(write, ",".join(mint_id("r_") for _ in range(100)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as pipe:
        child = set(pipe.read().decode().split(","))
    parent = {mint_id("r_") for _ in range(100)}
    assert len(child) == 100 and not child & parent
    assert {i[:14] for i in child} != {i[:14] for i in parent}  # another random half, not only another count
