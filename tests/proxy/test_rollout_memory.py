"""An open rollout keeps one list of ids per agent, not one per call (RolloutState.fold).

Every call of an agent resends the conversation, and its prompt begins with the previous call's prompt and
generation. The proxy used to keep every call's prompt ids (for close_rollout and for splicing), so an open
rollout held the sum of its prompts: quadratic in its calls (a 96-call rollout of benchmarks.proxy_memory
held ~3.4 MB). Now a call's ids are folded into the next prompt of its agent once that call extends them:
the calls and the remembered generations read them from that one list, and get their own lists back at
close_rollout. What is checked: the proxy's own structures after each call, the calls handed out whole
(mid-rollout copies and at close, equal to the log: the `proxy` fixture), and the cases that must not fold.
"""

from __future__ import annotations

import httpx

from clawgym_env.proxy.rollout_state import RolloutState, RolloutStats
from clawgym_env.records import ModelCall, PrefixCheck
from tests.proxy.test_splicing_http import SCHEMA, SYSTEM, TAGGED, TASK, chat_loop


def prompt_lists(state: RolloutState) -> set[int]:
    """The distinct prompt lists an open rollout holds: its calls' own and its remembered generations'."""
    return {id(c.prompt_ids) for c in state.calls if c.prompt_ids} | state.memory.tapes()


async def test_a_long_rollout_keeps_one_prompt_list_and_hands_out_whole_calls(proxy, scripted_policy):
    turns = 12
    route = proxy.open_rollout("long", scripted_policy([TAGGED] * (turns - 1) + ["Done."]))
    async with httpx.AsyncClient(base_url=proxy.origin, timeout=30) as client:
        bodies = await chat_loop(client, route.path_prefix, route.api_key, turns=turns)
        assert len(bodies) == turns
        state = proxy._rollouts["long"]
        assert len(prompt_lists(state)) == 1  # the latest prompt; every earlier call's ids are a prefix of it
        assert all(not c.prompt_ids for c in state.calls[:-1]) and state.calls[-1].prompt_ids
        middle = proxy.calls("long")  # copies, whole
    calls = proxy.close_rollout("long")
    assert [c.model_dump() for c in calls] == [c.model_dump() for c in middle]
    for previous, current in zip(calls, calls[1:]):
        assert current.prompt_ids[: len(previous.full_ids)] == previous.full_ids
        assert len(previous.generated_ids) == len(previous.logprobs) > 0
    assert all(c.drift_events == 0 for c in calls)  # the echoed turns were spliced from folded generations
    assert proxy.stats("long").spliced_turns == turns * (turns - 1) // 2


async def test_two_agents_keep_one_list_each_and_an_edit_keeps_its_own(proxy, scripted_policy):
    """A side agent (another system prompt) between main calls; then the main agent's first message is
    edited: that call does not extend the previous one, which keeps its own ids."""
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
        assert len(prompt_lists(state)) == 3  # the main agent's last call before the edit keeps its own
    calls = proxy.close_rollout("two")
    assert [c.prefix.reason for c in calls if c.prefix] == [None, "new_root", None, None, "edited_history"]
    assert all(len(c.generated_ids) == len(c.logprobs) > 0 for c in calls)


def test_a_call_recorded_after_close_does_not_fold_the_calls_handed_out():
    """A call still in flight when its rollout closes is recorded later: the calls close_rollout returned
    belong to the caller by then, and must keep their ids."""
    state = RolloutState(route=None, policy=None, limits=None, stats=RolloutStats(rollout_id="r"))  # type: ignore[arg-type]

    def call(index: int, prompt: list[int], previous: ModelCall | None) -> ModelCall:
        check = PrefixCheck(previous_call=previous.call_index, extended=True) if previous else PrefixCheck()
        made = ModelCall(
            rollout_id="r", call_index=index, api_style="openai-chat", request={}, prompt_ids=prompt,
            generated_ids=[9, 9], logprobs=[-1.0, -1.0], prefix=check,
        )  # fmt: skip
        state.check_prefix(made)
        return made

    first = call(0, [1, 2, 3], None)
    state.completed(first)
    second = call(1, [1, 2, 3, 9, 9, 4], first)
    state.completed(second)
    assert first.prompt_ids == [] and state.whole(first).full_ids == [1, 2, 3, 9, 9]  # folded into call 1's
    handed = [state.whole(c, in_place=True) for c in (first, second)]  # close_rollout
    state.closed = True
    late = call(2, [1, 2, 3, 9, 9, 4, 9, 9, 5], second)
    state.completed(late)
    assert [c.full_ids for c in handed] == [[1, 2, 3, 9, 9], [1, 2, 3, 9, 9, 4, 9, 9]]
