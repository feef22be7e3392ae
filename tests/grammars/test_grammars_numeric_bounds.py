"""Numeric bounds: exact range regexes (brute force), schema rewriting, end to end."""

from __future__ import annotations

import itertools
import random
import re
from decimal import Decimal

import pytest

from grammar_fixtures import shared_compiler, smollm2_tokenizer
from grammars import GrammarError, UnsupportedSchemaError, check_schema, schema_to_regex
from grammars.schema.numeric_range import integer_range_regex, number_range_regex

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


def _matches(schema, text):
    return re.fullmatch(schema_to_regex(schema), text) is not None


@pytest.mark.parametrize("bounds,inside,outside", [
    ({"minimum": 0.5}, [1, 2, 100], [0, -1]),
    ({"maximum": 2.5}, [2, -7], [3]),
    ({"exclusiveMinimum": 3}, [4], [3]),
    ({"exclusiveMaximum": 3.5}, [3], [4]),
    ({"exclusiveMaximum": -3}, [-4], [-3]),
    ({"minimum": 3, "exclusiveMinimum": True}, [4], [3]),  # draft 4
    ({"maximum": 3, "exclusiveMaximum": False}, [3], [4]),
    ({"minimum": 1, "exclusiveMinimum": 4}, [5], [4]),  # the tighter bound wins
    ({"minimum": 4, "exclusiveMinimum": 1}, [4], [3]),
    ({"minimum": -2, "maximum": -2}, [-2], [-1, -3]),
    ({"minimum": 1.0, "maximum": 12}, [1, 12], [0, 13]),
])
def test_integer_bound_forms(bounds, inside, outside):
    schema = {"type": "integer", **bounds}
    for n in inside:
        assert _matches(schema, str(n)), (bounds, n)
    for n in outside:
        assert not _matches(schema, str(n)), (bounds, n)


@pytest.mark.parametrize("schema,valid,invalid", [
    ({"type": "number", "minimum": 0}, ["0", "0.5", "12", "1e+9"], ["-0.5", "-1"]),
    ({"type": "number", "exclusiveMinimum": 0}, ["0.001", "3"], ["0", "0.0", "-2"]),
    ({"type": "number", "minimum": 1, "maximum": 5}, ["1", "3.75", "5", "5.000"], ["0.99", "5.01", "6"]),
    ({"type": "number", "minimum": -1.5, "exclusiveMaximum": 0.25}, ["-1.5", "0.2499", "0"],
     ["-1.51", "0.25"]),
    ({"type": ["integer", "null"], "minimum": 1}, ["1", "null"], ["0", '"x"']),
    ({"type": ["number", "integer"], "maximum": 1}, ["0.5", "1"], ["1.5"]),
    ({"type": "object", "properties": {"a": {"type": "object", "properties": {
        "b": {"type": "integer", "minimum": 1}}, "required": ["b"]}}, "required": ["a"]},
     ['{"a":{"b":1}}'], ['{"a":{"b":0}}']),
    ({"type": "array", "items": {"type": "integer", "maximum": 9}}, ["[1,9]", "[]"], ["[1,10]"]),
    ({"anyOf": [{"type": "integer", "minimum": 10}, {"type": "string"}]}, ["10", '"a"'], ["9"]),
    ({"type": "array", "items": {"$ref": "#/$defs/pct"},
      "$defs": {"pct": {"type": "number", "minimum": 0, "maximum": 100}}}, ["[0,100,55.5]"], ["[101]"]),
    ({"type": "integer", "format": "int32", "minimum": 0, "title": "t"}, ["7"], ["-7"]),
    ({"type": "integer", "minimum": 0, "faker": "x", "minLength": 2}, ["7"], ["-7"]),
    ({"type": ["number", "string"], "minimum": 1, "maxLength": 2}, ["1.5", '"ab"'], ["0.5", '"abc"']),
    ({"type": "string", "minimum": 1}, ['"a"'], ["1"]),  # bounds do not constrain strings
    ({"type": "integer", "enum": [1, 5, 9], "maximum": 6}, ["1", "5"], ["9"]),
    ({"enum": ["a", 2, 3.5], "exclusiveMaximum": 3}, ['"a"', "2"], ["3.5"]),
])
def test_bounds_in_schemas(schema, valid, invalid):
    regex = re.compile(schema_to_regex(schema))
    for text in valid:
        assert regex.fullmatch(text), (schema, text)
    for text in invalid:
        assert not regex.fullmatch(text), (schema, text)


def test_check_schema_accepts_enforced_bounds():
    check_schema({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}})
    with pytest.raises(UnsupportedSchemaError):
        check_schema({"type": "object", "properties": {"n": {"minimum": 0}}})


def test_placeholder_never_collides_with_schema_strings():
    schema = {"type": "object", "properties": {"s": {"const": "maskdbound0"},
                                               "n": {"type": "integer", "minimum": 1}},
              "required": ["s", "n"]}
    regex = re.compile(schema_to_regex(schema))
    assert regex.fullmatch('{"s":"maskdbound0","n":3}')
    assert not regex.fullmatch('{"s":"maskdbound0","n":0}')


@pytest.mark.parametrize("keyword,schema", [
    ("minimum", {"minimum": 0}),  # no numeric type
    ("minimum", {"type": "integer", "minimum": 0, "multipleOf": 2}),
    ("anyOf", {"type": "number", "anyOf": [{"const": 1}], "maximum": 3}),  # siblings of anyOf: refused first
    ("minimum", {"type": "integer", "minimum": 10 ** 400}),  # too long to write out
])
def test_bounds_not_enforceable_are_refused(keyword, schema):
    with pytest.raises(UnsupportedSchemaError) as info:
        schema_to_regex(schema)
    assert info.value.keyword == keyword


@pytest.mark.parametrize("schema,message", [
    ({"type": "integer", "minimum": 5, "maximum": 3}, "no integer is >= 5 and <= 3"),
    ({"type": "integer", "minimum": 0.2, "maximum": 0.8}, "no integer"),
    ({"type": "number", "exclusiveMinimum": 1, "maximum": 1}, "no number is > 1 and <= 1"),
    ({"type": "integer", "const": 7, "maximum": 6}, "no value of enum/const"),
    ({"type": "integer", "minimum": "3"}, "must be a number"),
])
def test_bad_bounds_are_clear_errors(schema, message):
    with pytest.raises(GrammarError, match=message):
        schema_to_regex(schema)


def _accepts(grammar, text):
    matcher = grammar.matcher()
    for token in smollm2_tokenizer().encode(text, add_special_tokens=False):
        if not matcher.accepts(token):
            return False
        matcher.advance(token)
    return matcher.finished()


def test_bounds_enforced_end_to_end():
    schema = {"type": "object", "properties": {
        "month": {"type": "integer", "minimum": 1, "maximum": 12},
        "score": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}},
        "required": ["month", "score"]}
    grammar = shared_compiler().compile_json_schema(schema)
    assert _accepts(grammar, '{"month":12,"score":0.75}')
    assert _accepts(grammar, '{"month":1,"score":1}')
    for bad in ['{"month":13,"score":0.5}', '{"month":0,"score":0.5}',
                '{"month":5,"score":0}', '{"month":5,"score":1.5}', '{"month":-1,"score":0.5}']:
        assert not _accepts(grammar, bad), bad
