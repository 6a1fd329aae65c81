"""Named test doubles of the reliability suite: a harness whose real process misbehaves on purpose, and
engines that fail, stall or answer by rule.

`FaultyHarnessTestDouble` is a registered harness like any other: its adapter runs a real process (a
small stdlib-only Python agent, `AGENT_SCRIPT`) inside the real sandbox, and that process talks to the
real serving proxy over HTTP through the sandbox's relay (OpenAI Chat Completions). What it does is
chosen per task (`task.metadata["fault"]`), so one batch can mix faulty and healthy rollouts:

| fault | the process ... |
|---|---|
| `ok` | runs a tool loop: calls the model, executes `write` tool calls in the workspace, stops at a text answer |
| `crash` | makes one model call, then kills itself with SIGSEGV |
| `hang` | makes one model call, then sleeps past any limit |
| `idle` | exits 0 at once, having done nothing |
| `flood` | calls the model in a loop, whatever it answers, until the proxy refuses (call cap) |
| `stream_hang` | starts a streamed call and waits on it until it is killed (the proxy sees a disconnect) |
| `probe` | tries to reach what it must not (paths, other rollouts' routes) and prints what happened |
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from clawgym_env.chat import ChatMLRenderer
from clawgym_env.engines import ScriptedTestEngine, load_qwen_tokenizer
from clawgym_env.interfaces import Generation, HarnessContext, HarnessResult, Policy, SamplingParams
from clawgym_env.specs import ApiStyle, HarnessSpec, TaskSpec

HARNESS_NAME = "FaultyHarnessTestDouble"
SUITE_NAME = "ReliabilitySuite"
ANSWER_FILE = "answer.txt"
ANSWER = "42"
WRITE_TOOL = {
    "type": "function",
    "function": {
        "name": "write",
        "description": "Write a file in the workspace.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    },
}

# Runs inside the sandbox as `/usr/bin/python3 -I -S -c AGENT_SCRIPT <fault> [json args]`; stdlib only.
AGENT_SCRIPT = r"""
import json, os, signal, sys, time, urllib.error, urllib.request
fault = sys.argv[1]
args = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
base, key, ws = os.environ["BASE_URL"], os.environ["API_KEY"], os.environ["WORKSPACE"]
tools = json.loads(os.environ["TOOLS"])

def emit(**event):
    print(json.dumps(event), flush=True)

def post(path, body, api_key=key, url=None, timeout=120):
    req = urllib.request.Request((url or base) + path, data=json.dumps(body).encode(),
                                 headers={"authorization": "Bearer " + api_key, "content-type": "application/json"})
    return urllib.request.urlopen(req, timeout=timeout)

def chat(messages, **kw):
    with post("/v1/chat/completions", {"model": "policy", "messages": messages, "tools": tools}, **kw) as r:
        return json.loads(r.read())

messages = [{"role": "user", "content": os.environ["INSTRUCTION"]}]
if fault == "idle":
    sys.exit(0)
if fault == "crash":
    chat(messages)
    emit(type="crashing")
    os.kill(os.getpid(), signal.SIGSEGV)
if fault == "hang":
    chat(messages)
    emit(type="hanging")
    time.sleep(100000)
if fault == "stream_hang":
    emit(type="streaming")
    post("/v1/chat/completions", {"model": "policy", "messages": messages, "stream": True}, timeout=100000).read()
    sys.exit(0)
if fault == "flood":
    n = 0
    while True:
        try:
            chat(messages)
            n += 1
        except urllib.error.HTTPError as e:
            body = json.loads(e.read())
            emit(type="refused", status=e.code, calls=n, error=body["error"])
            sys.exit(2)
if fault == "probe":
    out = {}
    for path in args.get("read", []):
        try:
            with open(path, "rb") as f:
                out[path] = "read %d bytes" % len(f.read())
        except OSError as e:
            out[path] = "refused: " + type(e).__name__
    for path in args.get("write", []):
        try:
            with open(path, "w") as f:
                f.write("intruder")
            out[path] = "written"
        except OSError as e:
            out[path] = "refused: " + type(e).__name__
    for path in args.get("list", []):
        try:
            out[path] = "listed: " + ",".join(sorted(os.listdir(path)))
        except OSError as e:
            out[path] = "refused: " + type(e).__name__
    for name, (url, api_key) in args.get("routes", {}).items():
        try:
            chat(messages, url=url, api_key=api_key)
            out[name] = "answered"
        except urllib.error.HTTPError as e:
            out[name] = "refused: %d %s" % (e.code, json.loads(e.read())["error"].get("code"))
        except OSError as e:
            out[name] = "unreachable: " + type(e).__name__
    emit(type="probe", results=out)
    # then behave: fall through to the healthy loop
for turn in range(int(args.get("max_turns", 8))):
    try:
        reply = chat(messages)["choices"][0]["message"]
    except urllib.error.HTTPError as e:  # surface the API's error and stop, as the CLIs do on a 4xx
        emit(type="refused", status=e.code, calls=turn, error=json.loads(e.read())["error"])
        sys.exit(2)
    calls = reply.get("tool_calls") or []
    if not calls:
        emit(type="final", text=reply.get("content") or "", turns=turn + 1)
        sys.exit(0)
    messages.append({"role": "assistant", "content": reply.get("content"), "tool_calls": calls})
    for call in calls:
        a = json.loads(call["function"]["arguments"])
        with open(os.path.join(ws, a["path"]), "w") as f:
            f.write(a["content"])
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": "wrote " + a["path"]})
emit(type="error", message="turn cap")
sys.exit(1)
"""


class FaultyHarnessTestDouble:
    """Test double of a CLI harness: a real process inside the sandbox that misbehaves as its task says.

    Judges success like a lenient CLI (pi exits 0 after API errors): exit code 0 is success. So an
    `idle` run is a "successful" harness run that made no call, and the environment itself must catch it.
    """

    name = HARNESS_NAME
    api_style = ApiStyle.OPENAI_CHAT

    def __init__(self, fault: str | None = None, probe: dict[str, Any] | None = None) -> None:
        self.fault = fault
        self.probe = probe or {}

    def check_installed(self) -> None:
        """Nothing to install: the agent is a stdlib Python script run by the sandbox's /usr/bin/python3."""

    async def run(self, ctx: HarnessContext) -> HarnessResult:
        fault = self.fault or ctx.task.metadata.get("fault", "ok")
        probe = ctx.task.metadata.get("probe", self.probe)
        env = {
            "BASE_URL": ctx.base_url,
            "API_KEY": ctx.api_key,
            "WORKSPACE": ctx.task.mount_path,
            "INSTRUCTION": ctx.task.instruction,
            "TOOLS": json.dumps([WRITE_TOOL]),
        }
        argv = ["/usr/bin/python3", "-I", "-S", "-c", AGENT_SCRIPT, fault, json.dumps(probe)]
        result = await ctx.sandbox.exec(argv, cwd=ctx.task.mount_path, env=env, timeout_s=ctx.timeout_s)
        events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
        final = next((e["text"] for e in events if e.get("type") == "final"), "")
        success = result.exit_code == 0 and not result.timed_out
        error = None
        if result.timed_out:
            error = f"{self.name} ran past its {ctx.timeout_s:.0f} s wall-time limit"
        elif not success:
            refused = next((e for e in events if e.get("type") == "refused"), None)
            detail = refused["error"]["message"] if refused else result.stderr.strip()[-300:]
            error = f"{self.name} exited with code {result.exit_code}: {detail}"
        return HarnessResult(
            harness=self.name,
            exit_code=result.exit_code,
            success=success,
            final_message=final,
            events=events,
            error=error,
            timed_out=result.timed_out,
            wall_s=result.duration_s,
            stdout_tail=result.stdout[-4000:],
            stderr_tail=result.stderr[-4000:],
        )


def harness_spec() -> HarnessSpec:
    return HarnessSpec(
        name=HARNESS_NAME,
        adapter=FaultyHarnessTestDouble,
        api_style=ApiStyle.OPENAI_CHAT,
        description="test double: a real process in the sandbox that misbehaves on purpose",
    )


def answer_check(workspace: Any) -> float:
    path = workspace / ANSWER_FILE
    return 1.0 if path.is_file() and path.read_text().strip() == ANSWER else 0.0


def fault_task(
    fault: str,
    index: int = 0,
    timeout_s: float = 60.0,
    marker: str = "",
    workspace: dict[str, str] | None = None,
    **metadata: Any,
) -> TaskSpec:
    """A task for the faulty harness; `marker` goes into the instruction (engine doubles match on it)."""
    return TaskSpec(
        id=f"{fault}-{index}",
        instruction=f"Read notes.md and write the answer into {ANSWER_FILE}.{marker}",
        workspace=workspace or {"notes.md": f"The answer is {ANSWER}.\n"},
        verifier=answer_check,
        timeout_s=timeout_s,
        metadata={"fault": fault, **metadata},
    )


# ------------------------------------------------------------------------------------------- engines
_TOKENIZER: Any = None


def tokenizer() -> Any:
    global _TOKENIZER
    if _TOKENIZER is None:
        _TOKENIZER = load_qwen_tokenizer()
    return _TOKENIZER


def write_then_answer(prompt_text: str) -> str:
    """The rule of a healthy policy: write the answer file, and once the tool said so, answer in text."""
    last_turn = prompt_text.rsplit("<|im_start|>", 2)[-2] if prompt_text.count("<|im_start|>") >= 2 else prompt_text
    if "<tool_response>" in last_turn:
        return "Done: the answer is written."
    return '<tool_call>\n{"name": "write", "arguments": {"path": "answer.txt", "content": "42"}}\n</tool_call>'


def scripted_policy(rule: Any = write_then_answer, **kw: Any) -> Policy:
    return Policy(
        engine=ScriptedTestEngine(tokenizer(), rule), renderer=ChatMLRenderer(tokenizer()), name="policy", **kw
    )


class FaultyEngineTestDouble:
    """Test double of an inference engine: answers like `write_then_answer`, except on prompts that
    match `fail_on` (raise, mid-generation after `delay_s`) or `stall_on` (sleep past any timeout)."""

    def __init__(self, *, fail_on: str | None = None, stall_on: str | None = None, delay_s: float = 0.05) -> None:
        self.inner = ScriptedTestEngine(tokenizer(), write_then_answer)
        self.fail_on = re.compile(fail_on) if fail_on else None
        self.stall_on = re.compile(stall_on) if stall_on else None
        self.delay_s = delay_s
        self.policy_version = 0
        self.failed = self.stalled = self.cancelled = 0

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        text = tokenizer().decode(prompt_ids, skip_special_tokens=False)
        try:
            await asyncio.sleep(self.delay_s)  # "mid-generation": the engine has started working
            if self.fail_on and self.fail_on.search(text):
                self.failed += 1
                raise RuntimeError("engine worker died mid-generation (FaultyEngineTestDouble)")
            if self.stall_on and self.stall_on.search(text):
                self.stalled += 1
                await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return await self.inner.generate(prompt_ids, sampling)

    def update_weights(self, state_dict: Any, version: int) -> None:
        self.policy_version = version
