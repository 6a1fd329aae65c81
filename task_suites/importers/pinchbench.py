"""Importer for the PinchBench markdown task format.

One `.md` file per task: YAML front matter (`id`, `name`, `category`, `grading_type: automated |
llm_judge | hybrid`, `timeout_seconds`, `grading_weights`, `workspace_files`), then `## Prompt`,
`## Expected Behavior`, `## Grading Criteria` (a `- [ ]` checklist), `## Automated Checks` (a fenced
python block defining `grade(transcript, workspace_path) -> dict` of scores in [0, 1]) and
`## LLM Judge Rubric` (`### Criterion N: Name (Weight: X%)` blocks).

A `{source, dest}` entry's `source` (a relative path, no `..`) is looked up in this order, first hit
wins: `<folder>/fixtures/` (ClawGym's layout), `<folder>/../assets/` (the published PinchBench repository
keeps `tasks/*.md` beside `assets/`, and its runner reads `<repo>/assets/<source>`), then `<folder>` itself
(the broadest place, so last). `<folder>` is the folder of the task file. The file found must resolve
(symlinks followed) to a path inside the place it was found in, else the task is refused.

ClawGym extensions (optional): `workspace_files` entries may be `{path, content}` (inline) besides
`{source, dest}`; front-matter keys `level`, `split` and `reference_files` (relative path -> content) land
in the task metadata.

The grade code is third-party code: it runs in a separate Python process (`python -I`) on the host copy
of the workspace, not inside this process, started from a check process of `verifiers.isolated`: it inherits
that process's memory limit and is killed with its process group at the timeout.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from clawgym_env.interfaces import VerifierResult, VerifyContext
from clawgym_env.specs import TaskSpec, WorkspaceSpec, check_relative_path
from task_suites.importers.common import ImportedSuite, import_suite
from verifiers.base import BaseVerifier, host_workspace
from verifiers.composite import CompositeVerifier
from verifiers.isolated import DEFAULT_MEMORY_MB, CheckLimitError, run_isolated
from verifiers.rubric import Criterion, ModelJudge, RubricVerifier

GRADING_TYPES = ("automated", "llm_judge", "hybrid")
_FRONT_MATTER = re.compile(r"^---\s*\n(.*?)\n---\s*\n(.*)$", re.DOTALL)
_CODE_BLOCK = re.compile(r"```python\s*\n(.*?)```", re.DOTALL)
_CRITERION = re.compile(
    r"^###\s*(?:Criterion\s*\d+\s*:\s*)?(.+?)\s*(?:\(\s*Weight\s*:\s*([\d.]+)\s*%?\s*\))?\s*$", re.I
)

_RUNNER = r"""
import json, sys
ns = {"__name__": "pinchbench_grade"}
exec(compile(open(sys.argv[1]).read(), "grade.py", "exec"), ns)
transcript = json.load(open(sys.argv[2]))
scores = ns["grade"](transcript, sys.argv[3])
print("\n" + json.dumps(scores, default=str))
"""


def split_sections(body: str) -> dict[str, str]:
    """`## Heading` -> text (headings compared case-insensitively; the last heading wins)."""
    sections: dict[str, str] = {}
    current: str | None = None
    lines: list[str] = []
    in_fence = False
    for line in body.split("\n"):
        if line.strip().startswith("```"):
            in_fence = not in_fence
        match = None if in_fence else re.match(r"^##\s+(.+?)\s*$", line)
        if match and not line.startswith("###"):
            if current is not None:
                sections[current] = "\n".join(lines).strip()
            current, lines = match.group(1).strip().lower(), []
        elif current is not None:
            lines.append(line)
    if current is not None:
        sections[current] = "\n".join(lines).strip()
    return sections


def parse_checklist(text: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"^\s*-\s+\[[ xX]\]\s+(.+)$", text, re.MULTILINE)]


def parse_judge_rubric(text: str) -> list[tuple[str, float, str]]:
    """(name, weight, description) per `### Criterion` block of the judge rubric."""
    out: list[tuple[str, float, str]] = []
    blocks = re.split(r"(?m)^(?=###\s)", text)
    for block in blocks:
        head, _, rest = block.partition("\n")
        match = _CRITERION.match(head.strip())
        if not match or not head.startswith("###"):
            continue
        out.append((match.group(1).strip(), float(match.group(2) or 1.0), rest.strip()))
    return out


def check_grade_code(code: str) -> None:
    """The grade code must compile and define `grade(transcript, workspace_path)` (not executed here)."""
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        raise ValueError(f"automated checks do not compile: line {exc.lineno}: {exc.msg}") from None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "grade":
            if len(node.args.args) < 2:
                raise ValueError("grade() must take (transcript, workspace_path)")
            return
    raise ValueError("automated checks define no top-level function grade(transcript, workspace_path)")


class PinchBenchGradeVerifier(BaseVerifier):
    """Runs a PinchBench `grade(transcript, workspace_path)` in a child Python process.

    Reward: the mean of the returned scores (PinchBench's rule). A crash, a timeout, a non-dict or an
    empty dict, or a score outside [0, 1] is a verifier error.
    """

    def __init__(
        self, code: str, *, name: str = "automated", timeout_s: float = 60.0, memory_mb: int = DEFAULT_MEMORY_MB
    ) -> None:
        check_grade_code(code)
        self.code = code
        self.name = name
        self.grade_timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.timeout_s = timeout_s + 15.0

    async def _verify(self, ctx: VerifyContext) -> VerifierResult:
        transcript = list(ctx.harness_result.events) if ctx.harness_result else []
        async with host_workspace(ctx) as workspace:
            with tempfile.TemporaryDirectory(prefix="pinchbench-grade-") as tmp:
                (Path(tmp) / "grade.py").write_text(self.code)
                (Path(tmp) / "transcript.json").write_text(json.dumps(transcript, default=str))
                argv = [sys.executable, "-I", "-c", _RUNNER, "grade.py", "transcript.json", str(workspace)]
                try:
                    returncode, out, err = await run_isolated(
                        _run_grader, argv, tmp, timeout_s=self.grade_timeout_s, memory_mb=self.memory_mb
                    )
                except CheckLimitError as exc:
                    return VerifierResult.failure(f"grade() {exc}")
        if returncode != 0:
            tail = err.decode(errors="replace").strip().splitlines()[-3:]
            return VerifierResult.failure(f"grade() crashed: {' | '.join(tail) or f'exit {returncode}'}")
        lines = [ln for ln in out.decode(errors="replace").splitlines() if ln.strip()]
        try:
            scores = json.loads(lines[-1]) if lines else None
        except json.JSONDecodeError:
            scores = None
        if not isinstance(scores, dict) or not scores:
            return VerifierResult.failure(f"grade() must return a non-empty dict of scores, got {lines[-1:]!r}")
        clean: dict[str, float] = {}
        for key, value in scores.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
                return VerifierResult.failure(f"grade() score {key!r} = {value!r} is not a number in [0, 1]")
            clean[str(key)] = float(value)
        failed = [k for k, v in clean.items() if v < 1.0]
        return VerifierResult(
            reward=sum(clean.values()) / len(clean),
            subscores=clean,
            explanation="all criteria met" if not failed else f"below 1.0: {', '.join(failed)}",
        )


def _run_grader(argv: list[str], cwd: str) -> tuple[int, bytes, bytes]:
    """In the check process: the grader inherits its memory limit and process group (killed with it)."""
    done = subprocess.run(argv, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, check=False)
    return done.returncode, done.stdout[-(1 << 20) :], done.stderr[-8192:]


def _workspace_files(entries: Any, folder: Path) -> dict[str, str | bytes]:
    if entries in (None, []):
        return {}
    if not isinstance(entries, list):
        raise ValueError("workspace_files must be a list of {source, dest} or {path, content}")
    files: dict[str, str | bytes] = {}
    for i, item in enumerate(entries):
        if not isinstance(item, dict):
            raise ValueError(f"workspace_files[{i}] must be a mapping")
        if "content" in item:
            dest = str(item.get("path") or item.get("dest") or "")
            check_relative_path(dest)
            files[dest] = str(item["content"])
            continue
        source, dest = item.get("source"), item.get("dest") or item.get("source")
        if not source:
            raise ValueError(f"workspace_files[{i}] needs `source` (and `dest`) or `path` and `content`")
        check_relative_path(str(source))
        check_relative_path(str(dest))
        files[str(dest)] = _read_source(str(source), folder, f"workspace_files[{i}]")
    return files


def _source_bases(folder: Path) -> list[Path]:
    """Where a `source` is looked up, in order (see the module docstring).

    `assets/` sits beside the folder as given, made absolute lexically: a relative `.` still has a parent,
    and a symlinked `tasks/` keeps the repository it was reached through.
    """
    return [folder / "fixtures", Path(os.path.abspath(folder)).parent / "assets", folder]


def _read_source(source: str, folder: Path, where: str) -> bytes:
    """Bytes of the first `<base>/<source>` that is a file; refused if it resolves outside its base.

    `check_relative_path` already rules out `..` and absolute paths; this catches symlinks (of the file or
    of a folder on its way) that lead out of the base, so a task cannot read arbitrary host files.
    """
    bases = _source_bases(folder)
    for base in bases:
        candidate = base / source
        if not candidate.is_file():
            continue
        real, root = candidate.resolve(), base.resolve()
        if not real.is_relative_to(root):
            raise ValueError(f"{where}: source {source!r} in {base} resolves to {real}, outside {root}; refused")
        return real.read_bytes()
    looked = ", ".join(str(base / source) for base in bases)
    raise ValueError(f"{where}: source {source!r} not found; looked in {looked}")


def parse_pinchbench_task(path: Path, *, judge: ModelJudge | None = None, default_split: str = "train") -> TaskSpec:
    """One PinchBench markdown file as a TaskSpec; ValueError says what is wrong."""
    text = Path(path).read_text(encoding="utf-8")
    match = _FRONT_MATTER.match(text)
    if not match:
        raise ValueError("no YAML front matter (the file must start with '---', the fields, and '---')")
    try:
        meta = yaml.safe_load(match.group(1))
    except yaml.YAMLError as exc:
        raise ValueError(f"front matter is not valid YAML: {exc}") from None
    if not isinstance(meta, dict):
        raise ValueError("front matter must be a YAML mapping")
    task_id = str(meta.get("id") or "").strip()
    if not task_id:
        raise ValueError("front matter has no `id`")
    grading_type = str(meta.get("grading_type", "automated"))
    if grading_type not in GRADING_TYPES:
        raise ValueError(f"grading_type {grading_type!r} is not one of {GRADING_TYPES}")
    sections = split_sections(match.group(2))
    prompt = sections.get("prompt", "").strip()
    if not prompt:
        raise ValueError("the `## Prompt` section is missing or empty")
    timeout = float(meta.get("timeout_seconds", 120))
    if timeout <= 0:
        raise ValueError("timeout_seconds must be > 0")
    criteria_text = parse_checklist(sections.get("grading criteria", ""))

    parts: dict[str, tuple[Any, float]] = {}
    weights = meta.get("grading_weights") or {}
    if not isinstance(weights, dict):
        raise ValueError("grading_weights must be a mapping like {automated: 0.5, llm_judge: 0.5}")
    if grading_type in ("automated", "hybrid"):
        code_match = _CODE_BLOCK.search(sections.get("automated checks", ""))
        if not code_match:
            raise ValueError(f"grading_type {grading_type} needs a ```python block in `## Automated Checks`")
        parts["automated"] = (
            PinchBenchGradeVerifier(code_match.group(1), name=f"grade[{task_id}]"),
            float(weights.get("automated", 0.5)),
        )
    if grading_type in ("llm_judge", "hybrid"):
        rubric = parse_judge_rubric(sections.get("llm judge rubric", ""))
        if not rubric:
            rubric = [(c, 1.0, "") for c in criteria_text]
        if not rubric:
            raise ValueError(f"grading_type {grading_type} needs `## LLM Judge Rubric` criteria or a grading checklist")
        criteria = [
            Criterion(
                name=f"c{i + 1}_{re.sub(r'[^a-z0-9]+', '_', n.lower()).strip('_')[:40]}",
                weight=w,
                question=f"Task given to the assistant:\n{prompt}\n\nCriterion: {n}\n{d}\n\nIs this criterion fully met?",
            )
            for i, (n, w, d) in enumerate(rubric)
        ]
        parts["llm_judge"] = (
            RubricVerifier(criteria, judge=judge, name=f"judge[{task_id}]"),
            float(weights.get("llm_judge", 0.5)),
        )
    verifier = next(iter(parts.values()))[0] if len(parts) == 1 else CompositeVerifier(parts, name=f"hybrid[{task_id}]")

    known = {"id", "name", "category", "grading_type", "timeout_seconds", "grading_weights", "workspace_files"}
    metadata: dict[str, Any] = {k: v for k, v in meta.items() if k not in known and k != "reference_files"}
    metadata.update(
        name=meta.get("name", task_id),
        category=meta.get("category", "uncategorized"),
        grading_type=grading_type,
        grading_criteria=criteria_text,
        expected_behavior=sections.get("expected behavior", sections.get("expected behaviour", "")),
        format="pinchbench",
        source=str(path),
    )
    metadata.setdefault("split", default_split)
    if isinstance(meta.get("reference_files"), dict):
        metadata["reference"] = {"files": {str(k): str(v) for k, v in meta["reference_files"].items()}}
    return TaskSpec(
        id=task_id,
        instruction=prompt,
        workspace=WorkspaceSpec(files=_workspace_files(meta.get("workspace_files"), Path(path).parent)),
        verifier=verifier,
        timeout_s=timeout,
        metadata=metadata,
    )


def load_pinchbench_folder(
    path: str | Path,
    *,
    name: str | None = None,
    judge: ModelJudge | None = None,
    default_split: str = "train",
) -> ImportedSuite:
    """Every `*.md` task under `path` (TASK_TEMPLATE.md and README.md skipped) as a suite.

    Tasks graded by `llm_judge`/`hybrid` need `judge`; without one their verifier reports an error.
    """
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder of PinchBench task files")
    files = sorted(p for p in root.glob("*.md") if p.stem.upper() not in ("TASK_TEMPLATE", "README"))
    return import_suite(
        root,
        files,
        lambda file: parse_pinchbench_task(file, judge=judge, default_split=default_split),
        kind="PinchBench",
        name=name,
        empty_hint="no *.md task files",
    )
