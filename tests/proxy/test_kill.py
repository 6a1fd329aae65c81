"""Killing the proxy process (SIGKILL, no clean-up at all) loses no completed call."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from clawgym_env.records import read_calls
from tests.proxy.conftest import tagged


def test_sigkill_mid_run_loses_no_completed_call(tmp_path: Path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps([tagged("ls", {"dir": "."}), "done"]))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "clawgym_env.proxy",
            "--run-dir",
            str(run_dir),
            "--port",
            "0",
            "--rollout",
            "r1",
            "--script",
            str(script),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        info = json.loads(proc.stdout.readline())
        route = info["routes"][0]
        base = info["origin"] + route["path_prefix"]
        headers = {"authorization": f"Bearer {route['api_key']}"}
        answers = []
        with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
            for i in range(3):
                body = {"model": "policy", "messages": [{"role": "user", "content": f"call {i}"}], "stream": i % 2 == 1}
                r = client.post("/v1/chat/completions", json=body)
                assert r.status_code == 200
                answers.append(r.text)
        # a fourth call is on the wire when the process dies
        host, port = info["origin"].removeprefix("http://").split(":")
        payload = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "call 3"}]}).encode()
        with socket.create_connection((host, int(port))) as raw:
            raw.sendall(
                f"POST {route['path_prefix']}/v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                f"authorization: Bearer {route['api_key']}\r\ncontent-length: {len(payload)}\r\n\r\n".encode()
                + payload
            )
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    calls = list(read_calls(Path(info["log"])))
    assert len(calls) >= 3, "a completed call was lost"
    assert [c.call_index for c in calls[:3]] == [0, 1, 2]
    assert all(c.error is None and c.rollout_id == "r1" and c.generated_ids for c in calls[:3])
    # the client read the first answers whole; a call in flight at the kill (its reply never read) says it was not
    assert [c.delivered for c in calls[:2]] == [True, True]
    assert all(c.delivered is False for c in calls[3:])
    assert calls[0].request["messages"][0]["content"] == "call 0"
    assert calls[1].streamed and "ls" in answers[0]
