import pytest
from hypothesis import given
from hypothesis import strategies as st

from verifiers import match_answer, normalize_text, parse_number


@pytest.mark.parametrize(
    ("predicted", "expected"),
    [
        ("1,234", 1234),
        ("$1,234.50", "1234.5"),
        ("USD 3,000", 3000),
        ("€4.20", 4.2),
        ("(1,234)", -1234),
        ("-1,234", "(1,234)"),
        ("12.5%", 0.125),
        ("12.5 %", "12.5"),
        ("0.125", "12.5%"),
        ("3.2 million", 3_200_000),
        ("3.2 million", 3.2),
        ("Answer: 42", 42),
        ("42 kg", 42),
        ("42.", 42),
        ("1 234 567", 1234567),
        ("\u22127", -7),
        ("100.9", 100),  # within the default 1 % relative tolerance
        ("The Treasury", "treasury"),
        ("  Hello,   World! ", "hello world"),
        ("YES", True),
        ("North-East", "north east"),
    ],
)
def test_matches(predicted, expected):
    assert match_answer(predicted, expected)


@pytest.mark.parametrize(
    ("predicted", "expected"),
    [
        ("102", 100),  # outside 1 %
        ("In 2021 it was 42", 42),  # several numbers: not one answer
        ("42 or 43", 42),
        ("1,2,3", 123),  # a list, not a grouped number
        ("abc", 1),
        ("", 0),
        ("", "north"),
        ("south", "north"),
        (None, 1),
        ("12.5%", 0.2),
    ],
)
def test_mismatches(predicted, expected):
    assert not match_answer(predicted, expected)


def test_tolerance_is_configurable():
    assert not match_answer("100.5", 100, rel_tol=1e-3)
    assert match_answer("100.05", 100, rel_tol=1e-3)


def test_parse_number_readings():
    assert parse_number("12%") == [12.0, 0.12]
    assert parse_number("no digits") is None
    assert normalize_text("The  Quick, brown fox!") == "quick brown fox"


@given(st.floats(min_value=-1e12, max_value=1e12, allow_nan=False).filter(lambda x: abs(x) > 1e-6))
def test_formatted_numbers_round_trip(x):
    assert match_answer(f"{x:,.6f}", x, rel_tol=1e-6, abs_tol=1e-6)
    assert match_answer(f"${abs(x):,.2f}" if x > 0 else f"({abs(x):,.2f})", round(x, 2), rel_tol=1e-9, abs_tol=1e-6)
