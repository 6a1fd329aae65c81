"""An open rollout keeps one list of ids per agent, not one per call, and its recorded calls never change.

Every call of an agent resends the conversation, and its prompt begins with the previous call's prompt and
generation. The proxy used to keep every call's prompt ids (for close_rollout and for splicing), so an open
rollout held the sum of its prompts: quadratic in its calls (a 96-call rollout of benchmarks.proxy_memory
held ~3.4 MB). Now the calls are kept only in the log (their lines' places noted), read back whole when
asked for (`Recorder.calls`), and the remembered generations read their prompts from the latest prompt of
their agent (`GenerationMemory.rebase`). What is checked: the proxy's own structures after each call, the
calls handed out (mid-rollout and at close, equal to the log: the `proxy` fixture), that a handed-out call
is never changed by what the proxy does later, and the cases that must keep their own list.
"""

from __future__ import annotations

import httpx

from clawgym_env.proxy.rollout_state import RolloutState
from tests.proxy.test_splicing_http import SCHEMA, SYSTEM, TAGGED, TASK, chat_loop


def prompt_lists(state: RolloutState) -> set[int]:
    """The distinct prompt lists an open rollout holds for splicing: its remembered generations'."""
    return state.memory.tapes()


async def test_a_long_rollout_keeps_one_prompt_list_and_hands_out_whole_calls(proxy, scripted_policy):
    turns = 12
    route = proxy.open_rollout("long", scripted_policy([TAGGED] * (turns - 1) + ["Done."]))
    async with httpx.AsyncClient(base_url=proxy.origin, timeout=30) as client:
        bodies = await chat_loop(client, route.path_prefix, route.api_key, turns=turns)
        assert len(bodies) == turns
        state = proxy._rollouts["long"]
        assert len(prompt_lists(state)) == 1  # the latest prompt; every earlier call's ids are a prefix of it
        assert len(state.lines) == turns and not hasattr(state, "calls")  # the calls are in the log only
        middle = proxy.calls("long")
    calls = proxy.close_rollout("long")
    assert [c.model_dump(exclude={"delivered"}) for c in calls] == [c.model_dump(exclude={"delivered"}) for c in middle]
    assert all(c.delivered is not False for c in calls)  # delivered, or its receipt not yet in: never "lost"
    for previous, current in zip(calls, calls[1:]):
        assert current.prompt_ids[: len(previous.full_ids)] == previous.full_ids
        assert len(previous.generated_ids) == len(previous.logprobs) > 0
    assert all(c.drift_events == 0 for c in calls)  # the echoed turns were spliced from rebased generations
    assert proxy.stats("long").spliced_turns == turns * (turns - 1) // 2


async def test_two_agents_keep_one_list_each_and_an_edit_keeps_its_own(proxy, scripted_policy):
    """A side agent (another system prompt) between main calls; then the main agent's first message is
    edited: that call does not extend the previous one, whose generations keep their own list."""
    route = proxy.open_rollout("two", scripted_policy([TAGGED, "Sub: a.", TAGGED, "Sub: b.", TAGGED, "Done."]))
    url, headers = f"{route.path_prefix}/v1/chat/completions", {"authorization": f"Bearer {route.api_key}"}
    tools = [{"type": "function", "function": {"name": "list_dir", "parameters": SCHEMA}}]
    main = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    side = [{"role": "system", "content": "You write titles."}, {"role": "user", "content": "Title?"}]
    async with httpx.AsyncClient(base_url=proxy.origin, timeout=30) as client:

        async def ask(messages: list, with_tools: bool) -> dict:
            body = {"model": "policy", "messages": messages, **({"tools": tools} if with_tools else {})}
            r = await client.post(url, json=body, headers=headers)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["message"]

        for _ in range(2):
            answer = await ask(main, True)
            main += [answer, {"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"], "content": "a.txt"}]
            side += [await ask(side, False), {"role": "user", "content": "Shorter?"}]
        state = proxy._rollouts["two"]
        assert len(prompt_lists(state)) == 2  # one per agent
        main[1] = {"role": "user", "content": TASK + " Please."}  # the harness edits its history
        await ask(main, True)
        assert len(prompt_lists(state)) == 3  # the main agent's generations before the edit keep their own
    calls = proxy.close_rollout("two")
    assert [c.prefix.reason for c in calls if c.prefix] == [None, "new_root", None, None, "edited_history"]
    assert all(len(c.generated_ids) == len(c.logprobs) > 0 for c in calls)


async def test_calls_handed_out_are_the_callers_own_and_never_change(proxy, scripted_policy):
    """What close_rollout and calls() return is read back from the log: new objects each time, which nothing
    the proxy does later (more calls, receipts, a call finishing after the close) changes."""
    route = proxy.open_rollout("own", scripted_policy([TAGGED] * 5 + ["Done."]))
    async with httpx.AsyncClient(base_url=proxy.origin, timeout=30) as client:
        await chat_loop(client, route.path_prefix, route.api_key, turns=2)
        early = proxy.calls("own")
        frozen = [c.model_dump() for c in early]
        again = proxy.calls("own")
        assert [c.model_dump() for c in again] == frozen and all(a is not b for a, b in zip(again, early))
        early[0].prompt_ids.clear()  # the caller's to change: the record is not
        assert proxy.calls("own")[0].prompt_ids == again[0].prompt_ids != []
        await chat_loop(client, route.path_prefix, route.api_key, turns=4)  # the harness starts over: 4 more
        calls = proxy.close_rollout("own")
        handed = [c.model_dump() for c in calls]
        assert proxy.stats("own").closed and len(calls) == 6
    assert [c.model_dump() for c in again] == frozen  # later calls of the agent did not fold them away
    assert [c.model_dump() for c in calls] == handed
