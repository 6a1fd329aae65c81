# Verifiers: reward in [0, 1] with named sub-scores from the final workspace state. Every verifier
# implements `clawgym_env.interfaces.Verifier` (`async verify(ctx) -> VerifierResult`) and reports its
# own crashes and timeouts as errors, never as a silent 0.

from verifiers.answer import match_answer, normalize_text, parse_number
from verifiers.base import BaseVerifier, VerifierConfigError, host_workspace
from verifiers.composite import CompositeVerifier
from verifiers.files import (
    AnswerMatches,
    CheckOutcome,
    CsvMatches,
    DocxText,
    FileCheck,
    FileChecksVerifier,
    FileExists,
    JsonMatches,
    SqliteQuery,
    TextMatches,
    XlsxCells,
    docx_text,
    values_match,
)
from verifiers.python_check import CheckFunctionVerifier, python_check
from verifiers.rubric import Criterion, JudgeAnswerError, ModelJudge, RubricVerifier, parse_yes_no
from verifiers.script import ScriptVerifier, parse_reward_output

__all__ = [
    "AnswerMatches",
    "BaseVerifier",
    "CheckFunctionVerifier",
    "CheckOutcome",
    "CompositeVerifier",
    "Criterion",
    "CsvMatches",
    "DocxText",
    "FileCheck",
    "FileChecksVerifier",
    "FileExists",
    "JsonMatches",
    "JudgeAnswerError",
    "ModelJudge",
    "RubricVerifier",
    "ScriptVerifier",
    "SqliteQuery",
    "TextMatches",
    "VerifierConfigError",
    "XlsxCells",
    "docx_text",
    "host_workspace",
    "match_answer",
    "normalize_text",
    "parse_number",
    "parse_reward_output",
    "parse_yes_no",
    "python_check",
    "values_match",
]
