"""Splicing through the HTTP API: each echoed turn gets the raw ids of the call that generated it.

A real proxy on loopback and the scripted test engine (a named test double: it emits exactly the scripted
text as real token ids). The model makes the same tool call twice with different raw text: bare JSON the
first time, inside `<tool_call>` tags the second. Both echoes have one structure, so only the prompt they
sit after (or their position) can tell them apart; the wrong choice breaks the prefix and forks the tree.
Also over HTTP: an edited earlier user message (a counted, located prefix break) and Claude Code's `cd`
rewrite of an echoed Bash call (spliced, not drift).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from clawgym_env.records import ModelCall
from clawgym_env.trajectory import build_forest

LIST_DIR = {"name": "list_dir", "arguments": {"path": "/work"}}
BARE = json.dumps(LIST_DIR)  # how the model wrote it the first time
TAGGED = "<tool_call>\n" + json.dumps(LIST_DIR) + "\n</tool_call>"  # and the second time
SCRIPT = [BARE, TAGGED, "Done: /work holds a.txt."]
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
SYSTEM = "You are a careful agent."
TASK = "List /work twice."


# ------------------------------------------------------------------- one harness loop per API (raw JSON)
async def anthropic_loop(client: httpx.AsyncClient, url: str, key: str, turns: int, user: Any = TASK) -> list[dict]:
    tools = [{"name": "list_dir", "description": "List a folder.", "input_schema": SCHEMA}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": user(0) if callable(user) else user}]
    bodies = []
    for turn in range(turns):
        if callable(user):
            messages[0]["content"] = user(turn)
        r = await client.post(
            f"{url}/v1/messages",
            json={"model": "policy", "max_tokens": 256, "system": SYSTEM, "messages": messages, "tools": tools},
            headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
        )
        assert r.status_code == 200, r.text
        body = r.json()
        bodies.append(body)
        uses = [b for b in body["content"] if b["type"] == "tool_use"]
        if not uses:
            break
        messages.append({"role": "assistant", "content": body["content"]})
        messages.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": u["id"], "content": "a.txt"} for u in uses],
            }
        )
    return bodies


async def chat_loop(client: httpx.AsyncClient, url: str, key: str, turns: int, user: Any = TASK) -> list[dict]:
    tools = [
        {"type": "function", "function": {"name": "list_dir", "description": "List a folder.", "parameters": SCHEMA}}
    ]
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ""}]
    bodies = []
    for turn in range(turns):
        messages[1]["content"] = user(turn) if callable(user) else user
        r = await client.post(
            f"{url}/v1/chat/completions",
            json={"model": "policy", "messages": messages, "tools": tools},
            headers={"authorization": f"Bearer {key}"},
        )
        assert r.status_code == 200, r.text
        body = r.json()
        bodies.append(body)
        message = body["choices"][0]["message"]
        if not message.get("tool_calls"):
            break
        messages.append(message)
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": "a.txt"} for c in message["tool_calls"]]
    return bodies


async def responses_loop(client: httpx.AsyncClient, url: str, key: str, turns: int, user: Any = TASK) -> list[dict]:
    tools = [{"type": "function", "name": "list_dir", "description": "List a folder.", "parameters": SCHEMA}]
    items: list[dict[str, Any]] = [{"role": "user", "content": ""}]
    bodies = []
    for turn in range(turns):
        items[0]["content"] = user(turn) if callable(user) else user
        r = await client.post(
            f"{url}/v1/responses",
            json={"model": "policy", "instructions": SYSTEM, "input": items, "tools": tools},
            headers={"authorization": f"Bearer {key}"},
        )
        assert r.status_code == 200, r.text
        body = r.json()
        bodies.append(body)
        calls = [i for i in body["output"] if i["type"] == "function_call"]
        if not calls:
            break
        items += body["output"]
        items += [{"type": "function_call_output", "call_id": c["call_id"], "output": "a.txt"} for c in calls]
    return bodies


LOOPS = {"anthropic": anthropic_loop, "chat": chat_loop, "responses": responses_loop}


def assert_each_call_extends_the_previous(calls: list[ModelCall]) -> None:
    for previous, current in zip(calls, calls[1:]):
        full = previous.full_ids
        assert current.prompt_ids[: len(full)] == full, (
            f"call {current.call_index} shares only {current.prefix.shared if current.prefix else '?'} of call "
            f"{previous.call_index}'s {len(full)} ids"
        )
        assert (
            current.prefix is not None
            and current.prefix.extended
            and current.prefix.previous_call == previous.call_index
        )
        assert current.drift_events == 0


@pytest.mark.parametrize("api", ["anthropic", "chat", "responses"])
async def test_repeated_call_with_different_raw_text_is_spliced_from_its_own_generation(proxy, scripted_policy, api):
    route = proxy.open_rollout(f"repeat-{api}", scripted_policy(list(SCRIPT)))
    async with httpx.AsyncClient(base_url=proxy.origin, timeout=30) as client:
        bodies = await LOOPS[api](client, route.path_prefix, route.api_key, turns=3)
    assert len(bodies) == 3
    calls = proxy.close_rollout(route.rollout_id)
    # the engine really emitted two different id sequences for one structure
    assert calls[0].generated_ids != calls[1].generated_ids
    assert_each_call_extends_the_previous(calls)
    spliced = [s for s in calls[2].segments if s.kind == "assistant_spliced"]
    assert [s.source_call for s in spliced] == [0, 1]
    assert [calls[2].prompt_ids[s.start : s.end] for s in spliced] == [calls[0].generated_ids, calls[1].generated_ids]
    forest = build_forest(calls, rollout_id=route.rollout_id)
    assert forest.stats.leaves == 1 and forest.stats.relocated_splice_tokens == 0
    assert forest.stats.prefix_extended == 2 and forest.stats.prefix_breaks == 0
    stats = proxy.stats(route.rollout_id)
    assert (stats.prefix_extended, stats.prefix_breaks, stats.drift_events) == (2, {}, 0)
    # calls 1 and 2 were rendered from where the call before left off (the messages each API's request
    # repeats became the very same Messages again), and gave the ids checked above
    assert stats.resumed_renders == 2


@pytest.mark.parametrize("api", ["anthropic", "chat", "responses"])
async def test_an_edited_user_message_is_a_located_edited_history_break(proxy, scripted_policy, api):
    """The harness rewrites the task text between calls: re-rendered correctly, but the prefix broke there."""
    route = proxy.open_rollout(f"edit-{api}", scripted_policy(list(SCRIPT)))
    texts = [TASK, TASK, "List /work twice, please."]  # the third request edits the first user message
    async with httpx.AsyncClient(base_url=proxy.origin, timeout=30) as client:
        await LOOPS[api](client, route.path_prefix, route.api_key, turns=3, user=lambda turn: texts[turn])
    calls = proxy.close_rollout(route.rollout_id)
    assert_each_call_extends_the_previous(calls[:2])
    check = calls[2].prefix
    assert check is not None and not check.extended and check.reason == "edited_history"
    user_segment = next(s for s in calls[1].segments if s.kind == "user")
    assert user_segment.start <= check.shared < user_segment.end  # located inside the edited message
    assert calls[2].prompt_ids[: check.shared] == calls[1].prompt_ids[: check.shared]
    assert calls[2].prompt_ids[check.shared] != calls[1].prompt_ids[check.shared]
    assert calls[2].drift_events == 0  # both echoes are still spliced from their own generations
    assert [s.source_call for s in calls[2].segments if s.kind == "assistant_spliced"] == [0, 1]
    forest = build_forest(calls, rollout_id=route.rollout_id)
    assert forest.stats.leaves == 2  # the edit forks the tree ...
    assert forest.stats.prefix_breaks == 1 and forest.stats.breaks_edited_history == 1  # ... and is counted
    record = next(r for r in forest.metadata["calls"] if r["call_index"] == 2)
    assert record["prefix"]["reason"] == "edited_history" and record["prefix"]["shared"] == check.shared
    assert proxy.stats(route.rollout_id).prefix_breaks == {"edited_history": 1}


async def test_claude_code_cd_rewrite_of_a_bash_echo_is_spliced_not_drift(proxy, scripted_policy):
    """Claude Code 2.1.197 echoes `cd /work && ls` as `ls`: a known rewrite, matched structurally."""
    bash = {"name": "Bash", "arguments": {"command": "cd /work && ls -la", "description": "List files"}}
    script = ["<tool_call>\n" + json.dumps(bash) + "\n</tool_call>", "Done."]
    route = proxy.open_rollout("cd-rewrite", scripted_policy(script))
    schema = {"type": "object", "properties": {"command": {"type": "string"}, "description": {"type": "string"}}}
    tools = [{"name": "Bash", "description": "Run a command.", "input_schema": schema}]
    url, headers = f"{route.path_prefix}/v1/messages", {"x-api-key": route.api_key}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is in /work?"}]
    async with httpx.AsyncClient(base_url=proxy.origin, timeout=30) as client:
        first = (
            await client.post(
                url, json={"model": "p", "max_tokens": 99, "messages": messages, "tools": tools}, headers=headers
            )
        ).json()
        use = next(b for b in first["content"] if b["type"] == "tool_use")
        assert use["input"]["command"] == "cd /work && ls -la"
        echoed = {**use, "input": {**use["input"], "command": "ls -la"}}  # what Claude Code sends back
        messages += [
            {"role": "assistant", "content": [echoed]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "a.txt"}]},
        ]
        second = await client.post(
            url, json={"model": "p", "max_tokens": 99, "messages": messages, "tools": tools}, headers=headers
        )
        assert second.status_code == 200, second.text
    calls = proxy.close_rollout(route.rollout_id)
    assert_each_call_extends_the_previous(calls)
    assert calls[1].rewritten_turns == 1
    stats = proxy.stats(route.rollout_id)
    assert (stats.rewritten_turns, stats.drift_events, stats.spliced_turns) == (1, 0, 1)
    forest = build_forest(calls, rollout_id=route.rollout_id)
    assert forest.stats.leaves == 1 and forest.stats.rewritten_turns == 1 and forest.stats.drift_events == 0


async def test_interleaved_agents_are_each_compared_with_their_own_previous_call(proxy, scripted_policy):
    """A side agent (another system prompt) between two main calls: no break for either agent."""
    script = [TAGGED, "Sub: first.", TAGGED.replace("/work", "/tmp"), "Sub: second."]
    route = proxy.open_rollout("agents", scripted_policy(script))
    url, headers = f"{route.path_prefix}/v1/chat/completions", {"authorization": f"Bearer {route.api_key}"}
    tools = [{"type": "function", "function": {"name": "list_dir", "parameters": SCHEMA}}]
    main = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    side = [{"role": "system", "content": "You write titles."}, {"role": "user", "content": "Title?"}]
    async with httpx.AsyncClient(base_url=proxy.origin, timeout=30) as client:

        async def ask(messages: list[dict[str, Any]], with_tools: bool) -> dict[str, Any]:
            body = {"model": "policy", "messages": messages, **({"tools": tools} if with_tools else {})}
            r = await client.post(url, json=body, headers=headers)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["message"]

        first = await ask(main, True)
        main += [first, {"role": "tool", "tool_call_id": first["tool_calls"][0]["id"], "content": "a.txt"}]
        side.append(await ask(side, False))
        side.append({"role": "user", "content": "Shorter?"})
        await ask(main, True)
        await ask(side, False)
    calls = proxy.close_rollout(route.rollout_id)
    checks = [(c.prefix.previous_call, c.prefix.extended, c.prefix.reason) for c in calls]
    assert checks == [(None, None, None), (None, None, "new_root"), (0, True, None), (1, True, None)]
    rollout = proxy.stats(route.rollout_id)
    assert (rollout.prefix_extended, rollout.prefix_breaks, rollout.new_roots) == (2, {}, 1)
    stats = build_forest(calls, rollout_id=route.rollout_id).stats
    assert (stats.prefix_extended, stats.prefix_breaks, stats.new_roots) == (2, 0, 1)
