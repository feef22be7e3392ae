r"""Regexes for the JSON numbers between two bounds, built digit by digit.

``integer_range_regex(lo, hi)`` matches exactly the integers ``lo <= n <= hi`` written
the canonical JSON way outlines-core generates (``-?(0|[1-9][0-9]*)``: no leading zeros,
no ``-0``).  ``number_range_regex(lo, hi, lo_strict, hi_strict)`` matches exactly the
decimals in the range written as ``-?(0|[1-9][0-9]*)(\.[0-9]+)?`` (any number of fraction
digits, trailing zeros included; never a negative zero).  Exponent forms are added only
when every bound is 0, the one case where the sign alone decides.  A bound of ``None``
means unbounded on that side.  Empty ranges raise ``ValueError``.

Integers are the classic digit-range decomposition: one alternative per digit count,
and within a count a prefix-by-prefix split of ``[lo, hi]``.  Decimals are an integer
part range plus a fraction suffix: a fraction ``.f`` is compared with a bound's fraction
digit by digit (0.f padded with zeros), which is what ``_fraction_digits`` recurses on.
"""

from __future__ import annotations

from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

ANY_FRACTION = r"(\.[0-9]+)?"
EXPONENT = r"([eE][+-][0-9]+)?"  # outlines-core's exponent syntax


def _alt(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else "(" + "|".join(parts) + ")"


def _digit_class(a: str, b: str) -> str:
    return a if a == b else f"[{a}-{b}]"


def _any_digits(n: int) -> str:
    return "" if n == 0 else "[0-9]" if n == 1 else f"[0-9]{{{n}}}"


def _same_length_range(lo: str, hi: str) -> str:
    """Digit strings of length len(lo) == len(hi) between lo and hi (inclusive)."""
    if lo == hi:
        return lo
    i = next(i for i in range(len(lo)) if lo[i] != hi[i])
    if i:
        return lo[:i] + _same_length_range(lo[i:], hi[i:])
    rest = len(lo) - 1
    lo_full, hi_full = lo[1:] == "0" * rest, hi[1:] == "9" * rest
    parts = [] if lo_full else [lo[0] + _same_length_range(lo[1:], "9" * rest)]
    first = lo[0] if lo_full else chr(ord(lo[0]) + 1)
    last = hi[0] if hi_full else chr(ord(hi[0]) - 1)
    if first <= last:
        parts.append(_digit_class(first, last) + _any_digits(rest))
    if not hi_full:
        parts.append(hi[0] + _same_length_range("0" * rest, hi[1:]))
    return _alt(parts)


def _natural_range(lo: int, hi: int | None) -> list[str]:
    """Alternatives for the canonical naturals lo <= n <= hi (hi None: unbounded)."""
    if hi is not None and hi < lo:
        return []
    a, b = str(lo), None if hi is None else str(hi)
    if b is not None and len(a) == len(b):
        return [_same_length_range(a, b)]
    parts = [_same_length_range(a, "9" * len(a))]
    if b is None:
        return parts + [f"[1-9][0-9]{{{len(a)},}}"]
    if len(b) - 2 >= len(a):  # every number with a digit count strictly between
        parts.append(f"[1-9][0-9]{{{len(a)},{len(b) - 2}}}")
    return parts + [_same_length_range("1" + "0" * (len(b) - 1), b)]


def integer_range_regex(lo: int | None, hi: int | None) -> str:
    """Canonical JSON integers n with lo <= n <= hi (None: unbounded that side)."""
    parts = []
    if hi is None or hi >= 0:
        parts += _natural_range(max(lo or 0, 0), hi)
    if lo is None or lo < 0:
        negative = _natural_range(1 if hi is None else max(-hi, 1), None if lo is None else -lo)
        parts += ["-" + _alt(negative)] if negative else []
    if not parts:
        raise ValueError(f"no integer lies between {lo} and {hi}")
    return _alt(parts)


def integer_bounds(lo: Decimal | None, hi: Decimal | None, lo_strict: bool,
                   hi_strict: bool) -> tuple[int | None, int | None]:
    """The inclusive integer bounds of a (possibly fractional, possibly strict) range."""
    def rounded(d: Decimal, rounding: str) -> int:
        return int(d.to_integral_value(rounding))

    low = high = None
    if lo is not None:  # > 2.5 and >= 2.5 -> 3; > 3 -> 4
        low = rounded(lo, ROUND_FLOOR) + 1 if lo_strict else rounded(lo, ROUND_CEILING)
    if hi is not None:
        high = rounded(hi, ROUND_CEILING) - 1 if hi_strict else rounded(hi, ROUND_FLOOR)
    return low, high


def _zero_ok(lo: str | None, lo_strict: bool, hi: str | None, hi_strict: bool) -> bool:
    """Whether fraction value 0 satisfies the (fraction-digit) bounds."""
    return (lo is None or (lo == "" and not lo_strict)) and (hi is None or hi != "" or not hi_strict)


def _fraction_digits(lo: str | None, lo_strict: bool, hi: str | None, hi_strict: bool) -> str | None:
    """Non-empty digit strings f with lo <= 0.f <= hi (bounds as trimmed fraction digits,
    None: no bound, strictness per flag), or None if there are none."""
    if lo == "" and not lo_strict:
        lo = None
    if hi == "" and hi_strict:
        return None
    if lo is None and hi is None:
        return "[0-9]+"
    if lo == "" and hi is None:
        return "0*[1-9][0-9]*"
    if lo is None and hi == "":
        return "0+"
    if lo == "" and hi == "":
        return None
    low = None if lo is None else lo[:1] or "0"  # next digit of each bound (0 past its end)
    high = None if hi is None else hi[:1] or "0"
    parts, free = [], []
    for c in "0123456789":
        if (low is not None and c < low) or (high is not None and c > high):
            continue
        nlo = lo[1:] if low == c else None
        nhi = hi[1:] if high == c else None
        if nlo is None and nhi is None:
            free.append(c)
            continue
        rest = _fraction_digits(nlo, lo_strict, nhi, hi_strict)
        empty_ok = _zero_ok(nlo, lo_strict, nhi, hi_strict)
        if rest is not None:
            parts.append(c + (f"({rest})?" if empty_ok else rest))
        elif empty_ok:
            parts.append(c)
    if free:
        parts.append(_digit_class(free[0], free[-1]) + "[0-9]*")
    return _alt(parts) if parts else None


def _fraction(lo: str | None, lo_strict: bool, hi: str | None, hi_strict: bool) -> str | None:
    r"""The optional ``\.digits`` suffix within the bounds, or None if none fits."""
    digits = _fraction_digits(lo, lo_strict, hi, hi_strict)
    if digits is None:
        return None
    return rf"(\.{digits})?" if _zero_ok(lo, lo_strict, hi, hi_strict) else rf"\.{digits}"


def _split(d: Decimal) -> tuple[int, str]:
    """Integer part and trimmed fraction digits of a non-negative decimal."""
    whole = int(d)
    text = format(d - whole, "f")
    return whole, text.split(".")[1].rstrip("0") if "." in text else ""


def _magnitude(a: Decimal, a_strict: bool, b: Decimal | None, b_strict: bool) -> list[str]:
    """Alternatives for unsigned decimals m with a <(=) m <(=) b (b None: unbounded)."""
    if b is not None and (a > b or (a == b and (a_strict or b_strict))):
        return []
    whole_a, frac_a = _split(a)
    if b is None:
        parts = [(str(whole_a), _fraction(frac_a, a_strict, None, False))]
        parts += [(_alt(_natural_range(whole_a + 1, None)), ANY_FRACTION)]
    else:
        whole_b, frac_b = _split(b)
        if whole_a == whole_b:
            parts = [(str(whole_a), _fraction(frac_a, a_strict, frac_b, b_strict))]
        else:
            parts = [(str(whole_a), _fraction(frac_a, a_strict, None, False))]
            middle = _natural_range(whole_a + 1, whole_b - 1)
            parts += [(_alt(middle), ANY_FRACTION)] if middle else []
            parts += [(str(whole_b), _fraction(None, False, frac_b, b_strict))]
    return [whole + fraction for whole, fraction in parts if fraction is not None]


def number_range_regex(lo: Decimal | None, hi: Decimal | None, lo_strict: bool = False,
                       hi_strict: bool = False) -> str:
    """JSON decimals x with lo <(=) x <(=) hi, '<' where the bound is strict."""
    zero = Decimal(0)
    parts = []
    if hi is None or hi > 0 or (hi == 0 and not hi_strict):
        low, low_strict = (zero, False) if lo is None or lo < 0 else (lo, lo_strict)
        parts += _magnitude(low, low_strict, hi, hi_strict)
    if lo is None or lo < 0:
        low, low_strict = (zero, True) if hi is None or hi >= 0 else (-hi, hi_strict)
        negative = _magnitude(low, low_strict, None if lo is None else -lo, lo_strict)
        parts += ["-" + _alt(negative)] if negative else []
    if not parts:
        raise ValueError(f"no number lies between {lo} and {hi}")
    if all(bound is None or bound == 0 for bound in (lo, hi)):
        return _alt(parts) + EXPONENT
    return _alt(parts)
