"""Tolerant matching of short answers: numbers within a relative tolerance, and normalized short strings.

Accepts what people write: thousands separators (`1,234,567`), currency (`$1.2`, `USD 3`, `€4`),
percentages (`12.5%` matches 12.5 and 0.125), negatives in parentheses (`(1,234)` is -1234), scale words
(`3.2 million` matches 3.2 and 3200000), trailing units (`42 kg`), and a leading `Answer:` label.
Strings compare case-, whitespace-, punctuation- and article-insensitively. Several different numbers in
one answer never match a single expected number (listing candidates must not earn a reward).
"""

from __future__ import annotations

import math
import re
import string
import unicodedata
from typing import Any

_SCALES = {
    "thousand": 1e3,
    "thousands": 1e3,
    "k": 1e3,
    "million": 1e6,
    "millions": 1e6,
    "mn": 1e6,
    "mm": 1e6,
    "billion": 1e9,
    "billions": 1e9,
    "bn": 1e9,
    "trillion": 1e12,
    "trillions": 1e12,
    "tn": 1e12,
}
_CURRENCY = re.compile(r"(?i)(us\$|usd|eur|gbp|jpy|cad|aud|dollars?|euros?|pounds?|[$€£¥₹])")
_LABEL = re.compile(r"(?i)^\s*(final\s+answer|answer|result|total)\s*(is|=|:)?\s*")
_NUMBER = re.compile(r"[-+]?\(?\d[\d,_\s]*(?:\.\d+)?\)?|[-+]?\(?\.\d+\)?")
_GROUPED = re.compile(r"^\d{1,3}([,_ ]\d{3})+(\.\d+)?$")


def _clean(text: str) -> str:
    text = unicodedata.normalize("NFKC", str(text)).strip()
    return text.replace("\u2212", "-").replace("\u2013", "-").replace("\u00a0", " ")


def _to_float(token: str) -> float | None:
    token = token.strip()
    negative = False
    if token.startswith("(") and token.endswith(")"):
        negative, token = True, token[1:-1].strip()
    elif token.startswith("(") or token.endswith(")"):
        return None
    sign = -1.0 if token.startswith("-") else 1.0
    token = token.lstrip("+-").strip()
    body = token.split(".")[0]
    if any(sep in body for sep in ",_ "):
        if not _GROUPED.match(token):
            return None  # "1,2,3" or "12 34" are lists, not one number
        token = re.sub(r"[,_ ]", "", token)
    try:
        value = float(token)
    except ValueError:
        return None
    return -value if (negative or sign < 0) and not (negative and sign < 0) else value


def parse_number(text: Any) -> list[float] | None:
    """The numeric readings of a short answer (several when % or a scale word makes it ambiguous).

    Returns None when the answer is not one number (no digits, or several different numbers).
    """
    if isinstance(text, bool):
        return None
    if isinstance(text, (int, float)):
        return None if math.isnan(float(text)) else [float(text)]
    s = _LABEL.sub("", _clean(text)).rstrip(".").strip()
    percent = "%" in s or re.search(r"(?i)\b(percent|pct)\b", s) is not None
    s = _CURRENCY.sub(" ", s.replace("%", " "))
    scale = 1.0
    words = re.findall(r"[A-Za-z]+", s)
    for word in words:
        if word.lower() in _SCALES:
            scale = _SCALES[word.lower()]
    # keep digits, separators, signs, parentheses; everything else (units, words) is a separator
    numeric = re.sub(r"[^\d.,_()+\- ]", " ", s)
    tokens = [t.strip() for t in _NUMBER.findall(numeric) if t.strip() and re.search(r"\d", t)]
    values = {v for v in (_to_float(t) for t in tokens) if v is not None}
    if len(tokens) != 1 or len(values) != 1:
        # "1 234" may have been split by the tokenizer; try the whole numeric string once
        whole = _to_float(re.sub(r"\s+", " ", numeric).strip())
        if whole is None:
            return None
        values = {whole}
    value = values.pop()
    readings = [value]
    if percent:
        readings.append(value / 100.0)
    if scale != 1.0:
        readings.append(value * scale)
    return readings


def normalize_text(text: Any) -> str:
    """Lower case, no punctuation, no articles, single spaces (SQuAD-style)."""
    s = _clean(text).lower()
    s = "".join(" " if ch in string.punctuation or unicodedata.category(ch).startswith("P") else ch for ch in s)
    without_articles = " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())
    return without_articles or " ".join(s.split())  # "A" alone is an answer, not an article


def match_answer(predicted: Any, expected: Any, rel_tol: float = 1e-2, abs_tol: float = 1e-9) -> bool:
    """True if `predicted` states `expected`: numbers within `rel_tol`, strings after normalization."""
    if predicted is None:
        return False
    expected_numbers = parse_number(expected)
    if expected_numbers is not None:
        got = parse_number(predicted)
        if got is None:
            return False
        return any(math.isclose(g, e, rel_tol=rel_tol, abs_tol=abs_tol) for g in got for e in expected_numbers)
    if isinstance(expected, bool):
        expected = "yes" if expected else "no"
    want = normalize_text(expected)
    return bool(want) and normalize_text(predicted) == want
