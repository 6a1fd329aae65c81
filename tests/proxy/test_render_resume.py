"""A render that resumes where the rollout's previous render left off gives what a render from scratch gives.

Every case drives calls through the real ChatML renderer (Qwen2.5 tokenizer) and one rollout's generation
memory, as the proxy does: each call's conversation is rendered twice, from scratch and from the kept
`resume`s, and the two must agree on every id, segment and counter. The cases are the ways a conversation
can stop being the previous one plus a turn: an edited message, a tool run that goes on, a drifted echo,
changed tools or system text, two agents taking turns.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from clawgym_env.chat.conversation import Conversation, Message, ToolCall, ToolSpec
from clawgym_env.chat.renderers import ChatMLRenderer
from clawgym_env.chat.renderers.chatml import RenderResume
from clawgym_env.chat.splice import GenerationMemory
from clawgym_env.proxy.rollout_state import RESUMES_KEPT, RolloutState, RolloutStats

LIST_DIR = {"name": "list_dir", "arguments": {"path": "/work"}}
# one structure, two raw texts: every echo has several candidates (the lookup's costliest case)
TEXTS = [json.dumps(LIST_DIR), "<tool_call>\n" + json.dumps(LIST_DIR) + "\n</tool_call>"]
TOOLS = [ToolSpec("list_dir", "List a folder.", {"type": "object", "properties": {"path": {"type": "string"}}})]


class Rollout:
    """One rollout's calls through the renderer: generation memory and kept resumes as the proxy keeps them."""

    def __init__(self, renderer: ChatMLRenderer, tokenizer) -> None:
        self.renderer, self.tokenizer = renderer, tokenizer
        self.memory = GenerationMemory()
        self.state = RolloutState(route=None, policy=None, limits=None, stats=RolloutStats(rollout_id="r"))  # type: ignore[arg-type]
        self.calls = 0
        self.resumed: list[int] = []  # messages each call took from a resume (0: rendered from scratch)

    def call(self, conversation: Conversation, text: str) -> Message:
        """Render (both ways, compared), generate `text`, remember it; the echo a harness would send back."""
        fresh = self.renderer.render(conversation, self.memory.find)
        rendered = self.renderer.render(conversation, self.memory.find, resume=self.state.render_resumes)
        for field in ("prompt_ids", "segments", "drift_events", "spliced_turns", "rewritten_turns", "assistant_turns"):
            assert getattr(rendered, field) == getattr(fresh, field), (field, self.calls)
        assert rendered.control_token_texts == fresh.control_token_texts
        self.state.keep_resume(rendered)
        self.resumed.append(rendered.resumed.at.messages_done if rendered.resumed is not None else 0)
        generated = self.tokenizer.encode(text, add_special_tokens=False) + [self.renderer.im_end_id]
        parsed = self.renderer.parse(generated, conversation.tool_names)
        self.memory.remember(
            self.calls, rendered.prompt_ids, generated, parsed, self.renderer.end_of_turn_id, rendered.assistant_turns
        )
        self.calls += 1
        return Message(
            "assistant", parsed.text, [ToolCall(c.name, dict(c.arguments), id="x") for c in parsed.tool_calls]
        )


def tool_loop(
    rollout: Rollout,
    turns: int,
    system: str = "You are a careful agent.",
    change: Callable[[int, list[Message]], None] | None = None,
) -> list[Message]:
    """A harness loop: system, task, then an echoed call and its tool result per turn; `change(turn, messages)`
    may alter the history before a call."""
    messages = [Message("system", system), Message("user", "List /work, again and again.")]
    for turn in range(turns):
        if change is not None:
            change(turn, messages)
        echo = rollout.call(Conversation(list(messages), TOOLS), TEXTS[turn % 2])
        messages += [echo, Message("tool", f"a.txt ({turn})")]
    return messages


def test_an_append_only_rollout_resumes_every_call_past_all_but_the_last_message(renderer, tokenizer):
    rollout = Rollout(renderer, tokenizer)
    tool_loop(rollout, turns=8)
    # call k - 1 held 2k messages; call k resumes after all of them but the last one
    assert rollout.resumed == [0] + [2 * k - 1 for k in range(1, 8)]
    assert rollout.state.render_resumes[0].at.position == 7


def test_an_edited_earlier_message_renders_from_scratch_once_then_resumes_again(renderer, tokenizer):
    def edit(turn: int, messages: list[Message]) -> None:
        if turn == 4:
            messages[1] = Message("user", "List /work, again and again, please.")

    rollout = Rollout(renderer, tokenizer)
    tool_loop(rollout, turns=7, change=edit)
    assert rollout.resumed[4] == 0 and all(n > 0 for n in rollout.resumed[5:])


def test_a_tool_run_that_goes_on_in_the_next_call_is_rendered_as_one_block(renderer, tokenizer):
    rollout = Rollout(renderer, tokenizer)
    messages = [Message("system", "s"), Message("user", "go")]
    echo = rollout.call(Conversation(list(messages), TOOLS), TEXTS[0])
    messages += [echo, Message("tool", "first result")]
    rollout.call(Conversation(list(messages), TOOLS), TEXTS[1])
    # the harness sends one more result of the same run instead of echoing the last generation: the render
    # resumes before the run (message 3), which is one block
    messages.append(Message("tool", "second result"))
    rollout.call(Conversation(list(messages), TOOLS), TEXTS[0])
    assert rollout.resumed[2] == 3
    # a call that ended after the run (a user note), then one where the run goes on in the note's place: what
    # was kept ends after the run, which is longer here, so it may not be resumed (from scratch instead)
    rollout.call(Conversation([*messages, Message("user", "note")], TOOLS), TEXTS[1])
    assert [r.at.messages_done for r in rollout.state.render_resumes] == [5]
    rollout.call(Conversation([*messages, Message("tool", "third result")], TOOLS), TEXTS[0])
    assert rollout.resumed[-1] == 0


def test_a_drifted_echo_is_looked_up_again_in_every_later_call(renderer, tokenizer):
    def drift(turn: int, messages: list[Message]) -> None:
        if turn == 3:  # the harness rewrote call 1's echo: no generation has its structure
            messages[4] = Message("assistant", "I will list it.", [ToolCall("list_dir", {"path": "/"}, id="y")])

    rollout = Rollout(renderer, tokenizer)
    tool_loop(rollout, turns=6, change=drift)
    # the resumable prefix stops before the drifted turn (message 4): later calls walk on from there
    assert rollout.resumed[3] == 0 and all(0 < n <= 4 for n in rollout.resumed[4:])


@pytest.mark.parametrize("what", ["tools", "system"])
def test_other_tools_or_system_text_render_from_scratch(renderer, tokenizer, what):
    rollout = Rollout(renderer, tokenizer)
    messages = tool_loop(rollout, turns=3)
    tools, system = TOOLS, messages[0]
    if what == "tools":
        tools = [*TOOLS, ToolSpec("read", "Read a file.", {"type": "object", "properties": {}})]
    else:
        system = Message("system", "You are a hasty agent.")
    rollout.call(Conversation([system, *messages[1:]], tools), TEXTS[0])
    assert rollout.resumed[-1] == 0


def test_agents_taking_turns_each_resume_from_their_own_last_render(renderer, tokenizer):
    rollout = Rollout(renderer, tokenizer)
    agents = [[Message("system", f"You are agent {a}."), Message("user", f"Task {a}.")] for a in range(RESUMES_KEPT)]
    for turn in range(3):
        for messages in agents:  # a main agent and its subagents, one call each in turn
            echo = rollout.call(Conversation(list(messages), TOOLS), TEXTS[turn % 2])
            messages += [echo, Message("tool", "ok")]
    later = rollout.resumed[RESUMES_KEPT:]
    assert all(n > 0 for n in later), later
    assert len(rollout.state.render_resumes) == RESUMES_KEPT  # one each, the superseded ones dropped
    assert isinstance(rollout.state.render_resumes[0], RenderResume)


def test_a_turn_matched_other_than_by_its_exact_prompt_is_looked_up_again(renderer, tokenizer):
    """Only a match on the very prompt a turn sits after cannot change as generations are added; one made by
    position or shared prefix (an edited history) could, so the kept render ends before such a turn."""
    rollout = Rollout(renderer, tokenizer)
    messages = tool_loop(rollout, turns=3)
    exact = rollout.memory.find

    def inexact(message, context):  # the same generations, as if matched by position
        turn = exact(message, context)
        if turn is not None and context.position == 1:
            turn.exact = False
        return turn

    rendered = renderer.render(Conversation(messages, TOOLS), inexact)
    assert rendered.resume.at.messages_done == 4  # system, task, turn 0, its result: turn 1 (message 4) not kept
