"""DaytonaApiStandIn: a recorded-response HTTP stand-in for the Daytona REST API and toolbox, on 127.0.0.1.

It answers the calls the real `daytona` SDK makes (create, get, delete a sandbox; toolbox process/execute,
files/bulk-upload, files/bulk-download) with bodies shaped like the real API's (field names and JSON copied
from the SDK's generated models), so the SDK's real request layer (aiohttp, serialisation, multipart) runs.
"Remote" commands run as host subprocesses without isolation: this is the server side of a test, not a
sandbox. Every request is recorded in `requests` for the tests to inspect.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from aiohttp import web


class DaytonaApiStandIn:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.sandboxes: dict[str, dict[str, Any]] = {}
        self.base_url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_post("/sandbox", self.create_sandbox)
        app.router.add_get("/sandbox/{id}", self.get_sandbox)
        app.router.add_delete("/sandbox/{id}", self.delete_sandbox)
        app.router.add_post("/toolbox/{id}/process/execute", self.execute)
        app.router.add_post("/toolbox/{id}/files/bulk-upload", self.upload)
        app.router.add_post("/toolbox/{id}/files/bulk-download", self.download)
        app.router.add_route("*", "/{tail:.*}", self.unknown)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.base_url = f"http://127.0.0.1:{port}"
        return self.base_url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _record(self, request: web.Request, body: Any = None) -> None:
        self.requests.append(
            {"method": request.method, "path": request.path, "body": body, "auth": request.headers.get("Authorization")}
        )

    def _dto(self, sandbox_id: str, body: dict[str, Any], state: str) -> dict[str, Any]:
        now = datetime.now(UTC).isoformat()
        return {
            "id": sandbox_id,
            "organizationId": "org-standin",
            "name": sandbox_id,
            "snapshot": body.get("snapshot"),
            "user": "daytona",
            "env": body.get("env") or {},
            "labels": body.get("labels") or {},
            "public": False,
            "networkBlockAll": bool(body.get("networkBlockAll")),
            "kvm": False,
            "networkAllowList": body.get("networkAllowList"),
            "domainAllowList": body.get("domainAllowList"),
            "target": "us",
            "cpu": 1,
            "gpu": 0,
            "memory": body.get("memory") or 1,
            "disk": body.get("disk") or 3,
            "state": state,
            "desiredState": state,
            "autoStopInterval": body.get("autoStopInterval") or 15,
            "autoDeleteInterval": body.get("autoDeleteInterval", -1),
            "createdAt": now,
            "updatedAt": now,
            "toolboxProxyUrl": f"{self.base_url}/toolbox",
            "daemonVersion": "0.0.0-standin",
        }

    async def create_sandbox(self, request: web.Request) -> web.Response:
        body = await request.json()
        self._record(request, body)
        sandbox_id = f"standin-{uuid.uuid4().hex[:8]}"
        self.sandboxes[sandbox_id] = body
        return web.json_response(self._dto(sandbox_id, body, "started"))

    async def get_sandbox(self, request: web.Request) -> web.Response:
        self._record(request)
        sandbox_id = request.match_info["id"]
        if sandbox_id not in self.sandboxes:
            return web.json_response({"statusCode": 404, "message": "Sandbox not found"}, status=404)
        return web.json_response(self._dto(sandbox_id, self.sandboxes[sandbox_id], "started"))

    async def delete_sandbox(self, request: web.Request) -> web.Response:
        self._record(request)
        sandbox_id = request.match_info["id"]
        body = self.sandboxes.pop(sandbox_id, {})
        return web.json_response(self._dto(sandbox_id, body, "destroying"))

    async def execute(self, request: web.Request) -> web.Response:
        body = await request.json()
        self._record(request, body)
        env = {**os.environ, **(body.get("envs") or {})}
        process = await asyncio.create_subprocess_exec(
            "sh",
            "-c",
            body["command"],
            cwd=body.get("cwd") or "/",
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,  # one stream, like the real toolbox
        )
        output, _ = await process.communicate()
        return web.json_response({"exitCode": process.returncode, "result": output.decode(errors="replace")})

    async def upload(self, request: web.Request) -> web.Response:
        reader = await request.multipart()
        paths: list[str] = []
        async for part in reader:
            if part.name and part.name.endswith(".file"):
                target = Path(unquote(part.filename or ""))  # aiohttp percent-encodes the filename
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(await part.read())
                paths.append(str(target))
            else:
                await part.read()
        self._record(request, {"uploaded": paths})
        return web.Response(status=200)

    async def download(self, request: web.Request) -> web.Response:
        body = await request.json()
        self._record(request, body)
        boundary = uuid.uuid4().hex
        body_parts: list[bytes] = []
        for path in body["paths"]:  # written by hand: the real daemon (Go) puts the raw path in `filename`
            target = Path(path)
            if target.is_file():
                name, content_type, payload = "file", "application/octet-stream", target.read_bytes()
            else:
                name, content_type = "error", "application/json"
                payload = json.dumps(
                    {"message": f"file not found: {path}", "statusCode": 404, "code": "FILE_NOT_FOUND"}
                ).encode()
            head = (
                f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{path}"\r\n'
                f"Content-Type: {content_type}\r\nContent-Length: {len(payload)}\r\n\r\n"
            )
            body_parts.append(head.encode() + payload + b"\r\n")
        data = b"".join(body_parts) + f"--{boundary}--\r\n".encode()
        return web.Response(body=data, headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})

    async def unknown(self, request: web.Request) -> web.Response:
        self._record(request, await request.text())
        return web.json_response(
            {"statusCode": 404, "message": f"stand-in has no recording for {request.path}"}, status=404
        )
