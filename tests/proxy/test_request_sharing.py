"""A rollout's recorded requests share what they repeat (clawgym_env.proxy.request_sharing).

Each call resends the whole conversation; kept as parsed, an open rollout of n calls held ~n²/2 message
objects. Through the real proxy over HTTP: the calls' requests hold each message once, and the log and
`close_rollout` still give every request exactly as it was sent.
"""

from __future__ import annotations

import copy

import httpx
import orjson
import pytest

from clawgym_env.proxy.request_sharing import RequestMemory
from clawgym_env.records import read_calls

from .conftest import WRITE_SCHEMA

TOOLS = [{"type": "function", "function": {"name": "write", "description": "write a file", "parameters": WRITE_SCHEMA}}]


def test_parts_with_the_same_json_become_the_previous_objects_and_the_json_is_unchanged() -> None:
    memory = RequestMemory()
    previous = {"model": "m", "tools": [{"a": [1, 2]}], "messages": [{"role": "system", "content": "s"}, {"x": 1}]}
    assert memory.share(previous) is previous  # the first request: nothing to share with
    body = copy.deepcopy(previous)
    body["messages"][1] = {"x": 2}  # an edited turn: it and everything after it stay the new objects
    body["messages"].append({"role": "user", "content": "more"})
    sent = orjson.dumps(body)
    shared = memory.share(body)
    assert shared is body and orjson.dumps(shared) == sent
    assert body["tools"] is previous["tools"] and body["model"] is previous["model"]
    assert body["messages"][0] is previous["messages"][0]
    assert body["messages"][1] is not previous["messages"][1] and body["messages"][1] == {"x": 2}
    again = memory.share(copy.deepcopy(body))  # now compared with `body`
    assert again["messages"] is body["messages"]


def test_values_python_calls_equal_but_json_does_not_are_kept_as_sent() -> None:
    """1 == 1.0 == True in Python; in the record (and the rendered prompt) they must stay what was sent."""
    memory = RequestMemory()
    memory.share({"temperature": 1, "messages": [{"n": 1}, {"a": 1, "b": 2}], "flag": 1})
    body = {"temperature": 1.0, "messages": [{"n": True}, {"b": 2, "a": 1}], "flag": True}
    sent = orjson.dumps(body)
    assert orjson.dumps(memory.share(body)) == sent  # 1.0, true and the key order all kept
    # the same when the list goes on after the previous one's end (the one-comparison path)
    longer = {**orjson.loads(sent), "messages": [{"n": 1}, {"b": 2, "a": 1}, {"c": 3}]}
    sent = orjson.dumps(longer)
    assert orjson.dumps(memory.share(longer)) == sent and longer["messages"][0] is not body["messages"][0]


def test_a_list_that_goes_on_after_the_previous_one_shares_all_of_it() -> None:
    memory = RequestMemory()
    first = {"messages": [{"role": "user", "content": "go"}, {"role": "assistant", "content": "ok"}]}
    memory.share(first)
    second = orjson.loads(orjson.dumps(first))
    second["messages"].append({"role": "user", "content": "more"})
    memory.share(second)
    assert all(a is b for a, b in zip(second["messages"], first["messages"]))
    assert memory.fresh == [({"role": "user", "content": "more"}, 3)]  # only the new turn is walked


def test_a_request_too_deep_for_the_writer_is_kept_as_it_is() -> None:
    memory = RequestMemory()
    deep: object = "x"
    for _ in range(300):  # deeper than orjson can write (the proxy's parse limit may allow it)
        deep = [deep]
    body = {"messages": [deep]}
    assert memory.share(body) is body and memory.body is None


async def test_a_rollouts_calls_hold_each_message_once(proxy, scripted_policy) -> None:
    calls_n = 6
    route = proxy.open_rollout("r", scripted_policy(["Noted."] * calls_n))
    url, key = f"{proxy.origin}{route.path_prefix}/v1/chat/completions", {"authorization": f"Bearer {route.api_key}"}
    messages = [{"role": "system", "content": "You write files. " * 50}]
    sent = []
    async with httpx.AsyncClient() as client:
        for i in range(calls_n):
            messages.append({"role": "user", "content": f"step {i}"})
            body = {"model": "policy", "messages": messages, "tools": TOOLS}
            sent.append(orjson.loads(orjson.dumps(body)))
            reply = await client.post(url, json=body, headers=key)
            assert reply.status_code == 200, reply.text
            messages.append(reply.json()["choices"][0]["message"])
    calls = proxy.close_rollout("r")
    assert [c.request for c in calls] == sent  # what close_rollout gives is what was sent
    assert [c.request for c in read_calls(proxy.log_path)] == sent  # and so is the log
    held = {id(m) for c in calls for m in c.request["messages"]}
    assert len(held) == len(sent[-1]["messages"])  # 2 * calls_n messages, not 1 + 3 + 5 + ... of them
    assert len({id(t) for c in calls for t in c.request["tools"]}) == len(TOOLS)  # the tools held once too


def test_items_validated_last_call_are_reused_and_new_ones_still_validated() -> None:
    """A call validates only what it adds: an item that is the very object sent (and validated) last call is
    passed on as its model; a new item that is invalid is still refused with its index named."""
    from clawgym_env.proxy.apis import AnthropicAdapter, ChatAdapter
    from clawgym_env.proxy.apis.base import ValidatedItems
    from clawgym_env.proxy.errors import ProxyError

    adapter, memory, validated = ChatAdapter(), RequestMemory(), ValidatedItems()
    first = {"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}
    one = adapter.parse_request(memory.share(first), validated)
    second = copy.deepcopy(first)
    second["messages"].append({"role": "assistant", "content": "a"})
    two = adapter.parse_request(memory.share(second), validated)
    assert two.messages[0] is one.messages[0] and two.messages[1] is one.messages[1]
    assert (
        two.messages[2].content == "a" and two.model_dump() == adapter.request_model.model_validate(second).model_dump()
    )

    bad = copy.deepcopy(second)
    bad["messages"].append({"role": "wizard", "content": "x"})
    with pytest.raises(ProxyError) as refused:
        adapter.parse_request(memory.share(bad), validated)
    assert refused.value.param is not None and refused.value.param.startswith("messages.3")

    edited = copy.deepcopy(second)
    edited["messages"][0]["content"] = "changed"  # not the object validated before: validated anew
    three = adapter.parse_request(memory.share(edited), validated)
    assert three.messages[0] is not one.messages[0] and three.messages[0].content == "changed"

    # another API's models are never reused (a rollout may speak two): the same item, shared, is validated
    # as an Anthropic message, not passed on as the Chat model it was validated into last call
    chat = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "u"}]}
    assert adapter.parse_request(memory.share(chat), validated).messages[0].content == "u"
    anthropic = copy.deepcopy(chat)
    parsed = AnthropicAdapter().parse_request(memory.share(anthropic), validated)
    assert anthropic["messages"][0] is chat["messages"][0]  # shared by the request memory
    assert type(parsed.messages[0]).__name__ == "AnthropicMessage" and parsed.messages[0].content == "u"


def test_items_converted_last_call_give_the_same_messages_and_merging_never_changes_them() -> None:
    """A repeated item's Messages are the ones made from it last call; so no step may change a Message once
    made. Responses splits one assistant turn into a reasoning item and a function_call item, which are
    merged into one turn: done in place, the second call would merge into last call's merged turn again
    (two tool calls, doubled reasoning)."""
    from clawgym_env.proxy.apis import ResponsesAdapter
    from clawgym_env.proxy.apis.base import ValidatedItems

    adapter, memory, validated = ResponsesAdapter(), RequestMemory(), ValidatedItems()
    body = {
        "model": "m",
        "input": [
            {"type": "message", "role": "user", "content": "list files"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "use ls"}]},
            {"type": "function_call", "name": "ls", "arguments": '{"path": "."}', "call_id": "c1"},
            {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
        ],
    }
    conversations = []
    for turn in range(3):
        sent = copy.deepcopy(body)
        sent["input"] += [{"type": "message", "role": "user", "content": f"go on {i}"} for i in range(turn)]
        request = adapter.parse_request(memory.share(sent), validated)
        conversations.append(adapter.to_conversation(request, validated))
    fresh = adapter.to_conversation(adapter.parse_request(copy.deepcopy(sent)))  # no memory: converted anew
    first, last = conversations[0], conversations[-1]
    [assistant] = [m for m in last.messages if m.role == "assistant"]
    assert [c.name for c in assistant.tool_calls] == ["ls"] and assistant.reasoning == "use ls"
    assert last.messages == fresh.messages  # equal to a conversion from scratch
    assert last.messages[0] is first.messages[0]  # the repeated user item's Message is last call's
    assert last.messages[2] is first.messages[2]  # ...and the tool output's
    # an edited first item (converted anew, with what follows it), then a call that goes on after that one
    edited = copy.deepcopy(sent)
    edited["input"][0]["content"] = "list all files"
    for extra in ([], [{"type": "message", "role": "user", "content": "more"}]):
        sent = copy.deepcopy(edited)
        sent["input"] += extra
        got = adapter.to_conversation(adapter.parse_request(memory.share(sent), validated), validated)
        assert got.messages == adapter.to_conversation(adapter.parse_request(copy.deepcopy(sent))).messages
    assert got.messages[0].content == "list all files" and got.messages[-1].content == "more"


def test_the_same_tools_are_validated_and_converted_once_and_a_changed_tool_is_seen() -> None:
    """Harnesses send the same (sometimes dozens of) tools every call: repeated tools are last call's models
    and ToolSpecs; a tool that changes gives new ones; an unsupported tool type is refused every time."""
    from clawgym_env.proxy.apis import ChatAdapter
    from clawgym_env.proxy.apis.base import ValidatedItems
    from clawgym_env.proxy.errors import ProxyError

    adapter, memory, validated = ChatAdapter(), RequestMemory(), ValidatedItems()
    body = {"model": "m", "tools": copy.deepcopy(TOOLS), "messages": [{"role": "user", "content": "u"}]}

    def conversation(sent: dict):
        return adapter.to_conversation(adapter.parse_request(memory.share(sent), validated), validated)

    first = conversation(copy.deepcopy(body))
    second = conversation(copy.deepcopy(body))
    assert second.tools is first.tools and [t.name for t in second.tools] == ["write"]

    renamed = copy.deepcopy(body)
    renamed["tools"][0]["function"]["name"] = "save"
    third = conversation(renamed)
    assert third.tools is not first.tools and [t.name for t in third.tools] == ["save"]

    odd = copy.deepcopy(body)
    odd["tools"].append({"type": "retrieval", "function": {"name": "x"}})
    for _ in range(2):
        with pytest.raises(ProxyError, match="not supported"):
            conversation(copy.deepcopy(odd))


def test_a_rollouts_repeated_tools_keep_their_rendered_section(renderer) -> None:
    """The tools section (its memo key costs ~20 µs for 20 tools) is made once per rollout: it is kept on the
    rollout's ToolSpecs, and it is the text the template's own rendering gives."""
    from clawgym_env.proxy.apis import ChatAdapter
    from clawgym_env.proxy.apis.base import ValidatedItems

    adapter, memory, validated = ChatAdapter(), RequestMemory(), ValidatedItems()
    body = {"model": "m", "tools": TOOLS, "messages": [{"role": "user", "content": "u"}]}
    calls = []
    for _ in range(2):
        sent = copy.deepcopy(body)
        conversation = adapter.to_conversation(adapter.parse_request(memory.share(sent), validated), validated)
        calls.append((conversation, renderer.render(conversation).prompt_ids))
    (first, first_ids), (second, second_ids) = calls
    assert second.tools is first.tools and set(first.tools.rendered) == {"chatml"}
    assert first.tools.rendered["chatml"] == renderer._tools_text_of(list(first.tools))
    assert first_ids == second_ids == renderer.render(adapter.to_conversation(adapter.parse_request(sent))).prompt_ids
    renderer.check_conversation(second)  # block-wise ids equal the tokenizer's own chat template
