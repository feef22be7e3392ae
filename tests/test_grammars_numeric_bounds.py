"""Numeric ranges: exact integer and decimal range regexes, checked by brute force."""

from __future__ import annotations

import itertools
import random
import re
from decimal import Decimal

import pytest

from grammars.numeric_range import integer_range_regex, number_range_regex

INTEGER_RANGES = [(0, 0), (0, None), (None, 0), (-5, 5), (-100, -7), (7, 1234), (None, -3),
                  (-3, None), (1, 1), (-1, -1), (0, 9), (10, 99), (1, 999), (19, 201),
                  (-1000, 1000), (99, 100), (-10, -10), (1, None), (None, -1), (None, 999)]
_rng = random.Random(0)
INTEGER_RANGES += sorted((min(a, b), max(a, b)) for a, b in
                         ((_rng.randint(-3000, 3000), _rng.randint(-3000, 3000)) for _ in range(60)))


@pytest.mark.parametrize("lo,hi", INTEGER_RANGES)
def test_integer_range_is_exact(lo, hi):
    regex = re.compile(integer_range_regex(lo, hi))
    for n in range(-4000, 4000):
        inside = (lo is None or n >= lo) and (hi is None or n <= hi)
        assert bool(regex.fullmatch(str(n))) == inside, (lo, hi, n)
    for junk in ["-0", "00", "01", "-01", "", "1.0", "+1"]:
        assert not regex.fullmatch(junk), (lo, hi, junk)


def test_integer_one_sided_ranges_are_unbounded():
    assert re.fullmatch(integer_range_regex(5, None), "123456789012345678901234567890")
    assert re.fullmatch(integer_range_regex(None, -5), "-123456789012345678901234567890")
    assert not re.fullmatch(integer_range_regex(None, 5), "123456789012345678901234567890")


def test_empty_integer_range_raises():
    with pytest.raises(ValueError):
        integer_range_regex(3, 2)


def _decimal_texts():
    """Decimal strings around the bounds below: integers with many fraction shapes."""
    fractions = ["0", "00", "1", "5", "25", "250", "5001", "49", "51", "99", "999", "001",
                 "0001", "75", "7", "05", "2499", "2501"]
    texts = {"-0.5", "-0.25", "-0.05", "-0.001", "-0.75"}
    for n in range(-20, 21):
        texts.add(str(n))
        texts.update(f"{n}.{f}" for f in fractions)
    return sorted(texts)


NUMBER_BOUNDS = [None, "0", "1", "-1", "0.5", "-0.5", "2.25", "-2.25", "0.05", "0.001", "5",
                 "-17", "12.5", "0.75", "-0.25", "1.999"]


@pytest.mark.parametrize("lo,hi", [(lo, hi) for lo, hi in itertools.product(NUMBER_BOUNDS, NUMBER_BOUNDS)
                                   if lo is not None or hi is not None])
def test_number_range_is_exact(lo, hi):
    lo = None if lo is None else Decimal(lo)
    hi = None if hi is None else Decimal(hi)
    for lo_strict, hi_strict in itertools.product([False, True], repeat=2):
        empty = lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_strict or hi_strict)))
        if empty:
            with pytest.raises(ValueError):
                number_range_regex(lo, hi, lo_strict, hi_strict)
            continue
        regex = re.compile(number_range_regex(lo, hi, lo_strict, hi_strict))
        for text in _decimal_texts():
            value = Decimal(text)
            inside = ((lo is None or value > lo or (value == lo and not lo_strict))
                      and (hi is None or value < hi or (value == hi and not hi_strict)))
            if text.startswith("-") and value == 0:
                inside = False  # negative zero is never generated (0 is)
            assert bool(regex.fullmatch(text)) == inside, (lo, hi, lo_strict, hi_strict, text)


def test_number_sign_bounds_keep_exponents():
    positive = re.compile(number_range_regex(Decimal(0), None, lo_strict=True))
    assert positive.fullmatch("1.5e+10") and positive.fullmatch("2E-3")
    assert not positive.fullmatch("0e+5") and not positive.fullmatch("-1e+2")
    assert not re.fullmatch(number_range_regex(Decimal(1), Decimal(5)), "1e+0")
