"""A one-shot MCP client, run inside the sandbox by the white-box loop: list a stdio server's tools, or call one.

    python mcp_client.py list '<server json>'
    python mcp_client.py call '<server json>' <tool> '<arguments json>'

prints one JSON object. The white-box loop's own process stays on the host, so each MCP request launches
the server inside the sandbox afresh (simple and stateless; ~0.5 s per call).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def _session_do(
    server: dict[str, Any], action: str, tool: str | None, arguments: dict[str, Any]
) -> dict[str, Any]:
    params = StdioServerParameters(
        command=server["command"], args=list(server.get("args", [])), env=dict(server.get("env", {})) or None
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        if action == "list":
            tools = (await session.list_tools()).tools
            return {
                "tools": [
                    {"name": t.name, "description": t.description or "", "parameters": t.input_schema} for t in tools
                ]
            }
        result = await session.call_tool(tool or "", arguments)
        texts = [getattr(block, "text", "") for block in result.content]
        return {"text": "\n".join(t for t in texts if t), "is_error": bool(result.is_error)}


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("list", "call") or (argv[0] == "call" and len(argv) < 3):
        print(__doc__, file=sys.stderr)
        return 2
    server = json.loads(argv[1])
    arguments = json.loads(argv[3]) if len(argv) > 3 else {}
    out = asyncio.run(_session_do(server, argv[0], argv[2] if argv[0] == "call" else None, arguments))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
