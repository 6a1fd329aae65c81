"""OpenClaw (`agent exec`) calls a tool of our stdio MCP server, launched by OpenClaw inside the sandbox.

OpenClaw's default Tool Search keeps MCP tools out of the request's `tools`: the model finds them with
`tool_search` and calls them through `tool_call`. With `tool_search=False` they are offered directly.
"""

from __future__ import annotations

import json

import pytest

from harness_adapters.mcp_servers import workspace_search_server
from harness_adapters.openclaw import OpenClawAdapter
from tests.harnesses.helpers import one_rollout, scripted_policy, tool_call, write_call
from tests.harnesses.test_openclaw_startup import ctx

SEARCH_HIT = "notes.md:1: The answer is 42."
MCP_TOOL = "workspace_search__search_workspace"  # OpenClaw's `<server>__<tool>` name


def test_tool_search_setting_goes_into_the_config() -> None:
    def tools(**kw) -> dict | None:
        return json.loads(OpenClawAdapter(**kw).plan(ctx(), "/root/h").files["/root/h/openclaw.json"]).get("tools")

    assert tools() is None  # OpenClaw's own default
    assert tools(tool_search=False) == {"toolSearch": False}
    assert tools(tool_search="directory") == {"toolSearch": {"mode": "directory"}}


async def test_openclaw_finds_and_calls_an_mcp_tool_through_tool_search() -> None:
    completions = [
        tool_call("tool_search", {"query": "search workspace files"}),
        tool_call("tool_call", {"id": MCP_TOOL, "args": {"query": "answer"}}),
        write_call("OpenClaw", "42"),
        "Done.",
    ]
    policy = scripted_policy(completions)
    result = await one_rollout(OpenClawAdapter(mcp_servers=[workspace_search_server()]), policy)
    assert result.status == "ok", result.failure
    offered = [t["name"] for t in result.calls[0].request["tools"]]
    assert MCP_TOOL not in offered and {"tool_search", "tool_call"} <= set(offered)
    # the MCP server's tools are in Tool Search's catalog (listed from the live server) ...
    assert f'"name": "{MCP_TOOL}"' in policy.engine.prompt_texts[1]
    # ... and its answer, computed inside the sandbox from the task's workspace, reached the model
    assert SEARCH_HIT in policy.engine.prompt_texts[2]
    summary = result.harness_result.events[0]["toolSummary"]
    assert MCP_TOOL in summary["tools"] and summary.get("failures", 0) == 0
    assert result.reward == 1.0 and len(result.calls) == 4 and result.forest.stats.leaves == 1


@pytest.mark.slow
async def test_openclaw_offers_mcp_tools_directly_without_tool_search() -> None:
    completions = [tool_call(MCP_TOOL, {"query": "answer"}), write_call("OpenClaw", "42"), "Done."]
    policy = scripted_policy(completions)
    result = await one_rollout(OpenClawAdapter(mcp_servers=[workspace_search_server()], tool_search=False), policy)
    assert result.status == "ok", result.failure
    assert MCP_TOOL in [t["name"] for t in result.calls[0].request["tools"]]
    assert SEARCH_HIT in policy.engine.prompt_texts[1]
    assert result.reward == 1.0 and len(result.calls) == 3
