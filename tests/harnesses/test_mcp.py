"""MCP tools served from inside the sandbox: the harness launches our stdio server there and calls it."""

from __future__ import annotations

from harness_adapters.claude_code import ClaudeCodeAdapter
from harness_adapters.codex import CodexAdapter
from harness_adapters.mcp_servers import workspace_search_server
from harness_adapters.whitebox import WhiteBoxAdapter
from tests.harnesses.helpers import one_rollout, scripted_policy, tool_call, write_call

SEARCH_HIT = "notes.md:1: The answer is 42."


async def test_claude_code_calls_a_tool_served_over_mcp_inside_the_sandbox() -> None:
    completions = [
        tool_call("mcp__workspace_search__search_workspace", {"query": "answer"}),
        write_call("ClaudeCode", "42"),
        "Done.",
    ]
    policy = scripted_policy(completions)
    result = await one_rollout(ClaudeCodeAdapter(mcp_servers=[workspace_search_server()]), policy)
    assert result.status == "ok", result.failure
    init = next(e for e in result.harness_result.events if e.get("subtype") == "init")
    assert init["mcp_servers"] == [{"name": "workspace_search", "status": "connected"}]
    assert "mcp__workspace_search__search_workspace" in init["tools"]
    # the MCP server's answer, computed inside the sandbox from the task's workspace, reached the model
    assert SEARCH_HIT in policy.engine.prompt_texts[1]
    assert result.reward == 1.0 and len(result.calls) == 3 and result.forest.stats.leaves == 1


async def test_whitebox_calls_a_tool_served_over_mcp_inside_the_sandbox() -> None:
    completions = [tool_call("search_workspace", {"query": "answer"}), write_call("WhiteBox", "42"), "Done."]
    policy = scripted_policy(completions)
    result = await one_rollout(WhiteBoxAdapter(mcp_servers=[workspace_search_server()]), policy)
    assert result.status == "ok", result.failure
    assert '"name": "search_workspace"' in policy.engine.prompt_texts[0]  # offered with the built-in tools
    assert SEARCH_HIT in policy.engine.prompt_texts[1]
    assert result.reward == 1.0 and result.forest.stats.calls == 3


async def test_codex_calls_a_tool_served_over_mcp_inside_the_sandbox() -> None:
    """Codex offers MCP tools as a Responses `namespace` tool; the proxy flattens it to `mcp__<server>__<tool>`."""
    completions = [
        tool_call("mcp__workspace_search__search_workspace", {"query": "answer"}),
        write_call("Codex", "42"),
        "Done.",
    ]
    policy = scripted_policy(completions)
    result = await one_rollout(CodexAdapter(mcp_servers=[workspace_search_server()]), policy)
    assert result.status == "ok", result.failure
    # the MCP tool was offered from the very first call (the server is `required`: Codex waits for it)
    assert '"name": "mcp__workspace_search__search_workspace"' in policy.engine.prompt_texts[0]
    namespaces = [t for t in result.calls[0].request["tools"] if t["type"] == "namespace"]
    assert "mcp__workspace_search" in [t["name"] for t in namespaces]
    # Codex dispatched the call to the MCP server (not as an unknown function) ...
    mcp_items = [
        e["item"]
        for e in result.harness_result.events
        if e.get("type") == "item.completed" and e.get("item", {}).get("type") == "mcp_tool_call"
    ]
    assert [(i["server"], i["tool"], i["status"]) for i in mcp_items] == [
        ("workspace_search", "search_workspace", "completed")
    ]
    # ... echoed it back with its namespace, and the server's answer reached the model's next prompt
    echoed = next(i for i in result.calls[1].request["input"] if i.get("type") == "function_call")
    assert (echoed["namespace"], echoed["name"]) == ("mcp__workspace_search", "search_workspace")
    assert SEARCH_HIT in policy.engine.prompt_texts[1]
    assert result.reward == 1.0 and len(result.calls) == 3
    assert result.forest.stats.leaves == 1 and sum(c.drift_events for c in result.calls) == 0
