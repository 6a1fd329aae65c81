"""A response's head leaves with its first body bytes (clawgym_env.proxy.head_with_body), and nothing is held.

Over real TCP the client's kernel counts the data segments it received (TCP_INFO, tcpi_data_segs_in): a call
answered in one write arrives as one segment (two before: the head, then the body). The attacks: a client
waiting for `100 Continue` before it sends its body still gets it, and the writes of one cycle never swap.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct

from clawgym_env.engines.scripted import ScriptedTestEngine
from clawgym_env.interfaces import Policy, RolloutLimits
from clawgym_env.proxy.head_with_body import HeadWithBody

TCP_INFO_DATA_SEGS_IN = 152  # offset of tcpi_data_segs_in in Linux's struct tcp_info (since 4.6)


def data_segments_in(sock: socket.socket) -> int:
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return struct.unpack_from("I", info, TCP_INFO_DATA_SEGS_IN)[0]


def post(origin: str, path: str, key: str, body: dict, expect_continue: bool = False) -> tuple[bytes, int]:
    """One raw HTTP/1.1 call; the whole answer and the data segments it came in."""
    host, port = origin.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nauthorization: Bearer {key}\r\n"
        f"content-length: {len(payload)}\r\n" + ("expect: 100-continue\r\n" if expect_continue else "") + "\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        if expect_continue:
            sock.sendall(head)
            sock.settimeout(2)  # an SDK would give up waiting and send the body anyway; this one fails instead
            assert sock.recv(4096).startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), "the 100 Continue was held back"
            sock.settimeout(10)
            sock.sendall(payload)
        else:
            sock.sendall(head + payload)
        answer = b""
        while not (answer.endswith(b"0\r\n\r\n") or _whole_with_length(answer)):
            data = sock.recv(65536)
            assert data, f"the proxy closed the connection mid-answer: {answer[:200]!r}"
            answer += data
        return answer, data_segments_in(sock)


def _whole_with_length(answer: bytes) -> bool:
    head, sep, body = answer.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return bool(sep) and len(body) >= int(line.split(b":")[1])
    return False


class WholeAnswerEngine(ScriptedTestEngine):
    """A named test double: the scripted engine without `stream`, so each answer comes whole (one chunk), as a
    fast engine's does; token-by-token streams are written as they decode (tests/proxy/test_live_streaming.py)."""

    stream = None


async def test_an_answer_leaves_in_one_write(proxy, tokenizer, renderer):
    policy = Policy(engine=WholeAnswerEngine(tokenizer, ["hello there", "again"]), renderer=renderer)
    route = proxy.open_rollout("one-write", policy, RolloutLimits())
    path = f"{route.path_prefix}/v1/chat/completions"
    messages = [{"role": "user", "content": "hi"}]
    streamed, segments = await asyncio.to_thread(
        post, proxy.origin, path, route.api_key, {"model": "p", "messages": messages, "stream": True}
    )
    assert streamed.startswith(b"HTTP/1.1 200 OK") and b"hello" in streamed and b"[DONE]" in streamed
    assert segments == 1, f"the streamed answer came in {segments} segments (head and body written apart)"
    plain, segments = await asyncio.to_thread(
        post, proxy.origin, path, route.api_key, {"model": "p", "messages": messages}
    )
    assert b"again" in plain and segments == 1
    # a refusal is answered the same way
    refused, segments = await asyncio.to_thread(
        post, proxy.origin, path, "sk-wrong", {"model": "p", "messages": messages}
    )
    assert refused.startswith(b"HTTP/1.1 401") and segments == 1
    calls = proxy.calls("one-write")
    assert [c.generated_ids != [] for c in calls] == [True, True]
    for _ in range(100):  # the delivery check still sees each answer leave whole
        if all(c.delivered for c in calls):
            break
        await asyncio.sleep(0.01)
    assert [c.delivered for c in calls] == [True, True]


async def test_a_client_waiting_for_100_continue_gets_it(proxy, scripted_policy):
    route = proxy.open_rollout("continue", scripted_policy(["fine"]), RolloutLimits())
    body = {"model": "p", "messages": [{"role": "user", "content": "hi"}]}
    answer, _ = await asyncio.to_thread(
        post, proxy.origin, f"{route.path_prefix}/v1/chat/completions", route.api_key, body, True
    )
    assert b"HTTP/1.1 200 OK" in answer and b"fine" in answer


class RecordingTransport:
    """A named test double: the writes a transport was given, in order."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed, "written after close"
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


async def test_the_head_waits_for_the_next_write_or_the_end_of_the_loop_iteration():
    loop = asyncio.get_running_loop()
    real = RecordingTransport()
    joined = HeadWithBody(real, loop)  # type: ignore[arg-type]
    joined.write(b"head")
    assert real.writes == []
    joined.write(b"body1")
    joined.write(b"body2")
    assert real.writes == [b"headbody1", b"body2"]
    await asyncio.sleep(0)  # the pending flush finds nothing held
    assert real.writes == [b"headbody1", b"body2"] and joined.get_extra_info("peername") == "info:peername"

    alone = RecordingTransport()
    held = HeadWithBody(alone, loop)  # type: ignore[arg-type]
    held.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    await asyncio.sleep(0)  # nothing written after it in this iteration: it leaves by itself
    assert alone.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    held.write(b"rest")
    assert alone.writes[-1] == b"rest"

    closing = RecordingTransport()
    shut = HeadWithBody(closing, loop)  # type: ignore[arg-type]
    shut.write(b"head")
    shut.close()  # a close sends what is held first
    assert closing.writes == [b"head"] and closing.closed and shut.is_closing()
    gone = RecordingTransport()
    lost = HeadWithBody(gone, loop)  # type: ignore[arg-type]
    lost.write(b"head")
    gone.closed = True  # the connection went before the flush: nothing is written to a closed transport
    await asyncio.sleep(0)
    assert gone.writes == []
