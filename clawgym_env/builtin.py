"""The bundled suites and harnesses, registered at import by import string (nothing loads until used).

The ground names them as strings only: `task_suites` and `harness_adapters` sit above this package
(clawgym_env/layers.py), and an import string is resolved only when an environment is made.
"""

from __future__ import annotations

from clawgym_env.registry import Registry
from clawgym_env.specs import ApiStyle, HarnessSpec, TaskSuite

BUILTIN_SUITES = {
    "OfficeQA": ("task_suites.officeqa:load", "questions over long statistical bulletins; numeric answers"),
    "JobBench": ("task_suites.jobbench:load", "professional workflows over spreadsheets, databases, documents"),
    "OfficeQAEasy": ("task_suites.officeqa:load_easy", "OfficeQA level 0 with the bulletin in the instruction"),
    "JobBenchEasy": ("task_suites.jobbench:load_easy", "JobBench level 0 with the input file in the instruction"),
    "ClawGymBench": ("task_suites.clawgymbench:load", "general workspace tasks in the ClawGym folder format"),
    "PinchBench": ("task_suites.pinchbench:load", "tasks in the PinchBench markdown format"),
}

BUILTIN_HARNESSES = {
    "ClaudeCode": ("harness_adapters.claude_code:ClaudeCodeAdapter", ApiStyle.ANTHROPIC_MESSAGES, "2.1.197"),
    "OpenClaw": ("harness_adapters.openclaw:OpenClawAdapter", ApiStyle.OPENAI_RESPONSES, "2026.9.6"),
    "Codex": ("harness_adapters.codex:CodexAdapter", ApiStyle.OPENAI_RESPONSES, "0.171.0"),
    "Pi": ("harness_adapters.pi:PiAdapter", ApiStyle.OPENAI_CHAT, "0.73.1"),
    "WhiteBox": ("harness_adapters.whitebox:WhiteBoxAdapter", ApiStyle.IN_PROCESS, None),
}


def register_builtins(registry: Registry) -> None:
    for name, (loader, description) in BUILTIN_SUITES.items():
        registry.register_suite(TaskSuite(name=name, loader=loader, description=description))
    for name, (adapter, api_style, version) in BUILTIN_HARNESSES.items():
        registry.register_harness(HarnessSpec(name=name, adapter=adapter, api_style=api_style, version=version))
