"""`BootIdMiddleware`: every answer of a server life names it, streamed or not; no variable, no header."""

from __future__ import annotations

import httpx
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from clawgym_env.engines.server_boot import BOOT_ENV, BOOT_HEADER, BootIdMiddleware


def app() -> FastAPI:
    api = FastAPI()

    @api.get("/plain")
    async def plain() -> dict[str, str]:
        return {"ok": "yes"}

    @api.get("/stream")
    async def stream() -> StreamingResponse:
        async def events():
            yield "data: 1\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return api


async def answers(served) -> list[httpx.Response]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(served), base_url="http://server") as client:
        return [await client.get("/plain"), await client.get("/stream"), await client.get("/missing")]


async def test_every_answer_names_the_life_from_the_variable(monkeypatch):
    monkeypatch.setenv(BOOT_ENV, "life-7")
    got = await answers(BootIdMiddleware(app()))
    assert [r.status_code for r in got] == [200, 200, 404]
    assert [r.headers.get(BOOT_HEADER) for r in got] == ["life-7"] * 3
    assert got[1].text == "data: 1\n\ndata: [DONE]\n\n" and got[0].json() == {"ok": "yes"}


async def test_without_the_variable_no_answer_names_a_life(monkeypatch):
    """An id made up per process would differ between one server's API processes: every call would look like a
    restart to the pool. So nothing is added, and the pool reads the version around each call instead."""
    monkeypatch.delenv(BOOT_ENV, raising=False)
    got = await answers(BootIdMiddleware(app()))
    assert [r.status_code for r in got] == [200, 200, 404]
    assert all(BOOT_HEADER not in r.headers for r in got)
