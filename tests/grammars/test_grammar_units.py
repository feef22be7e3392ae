"""Grammar units: one compiled unit per tool, chosen among at run time, equal to the one-union grammar."""

import json
import random

import jsonschema
import pytest

from grammar_fixtures import allowed, shared_compiler, smollm2_tokenizer, smollm2_vocabulary
from grammars import schema_to_regex
from grammars.tools.formats import get_tool_format
from grammars.tools.formats.call_regex import call_alternatives
from grammars.tools.tool_constraint import compile_tool_constraint
from grammars.tools.tool_grammar import tool_grammar
from grammars.match import unit_union
from grammars.match.unit_union import UnitUnion

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                            "unit": {"type": "string", "enum": ["c", "f"]}},
           "required": ["city"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
       "required": ["a", "b"], "additionalProperties": False}
NOTE = {"type": "object", "properties": {"text": {"type": "string", "maxLength": 8}}, "required": ["text"]}
# `get_weather` and `get_weekday` share their first tokens: the union must keep both alive until they part
TOOLS = [{"type": "function", "function": {"name": name, "parameters": schema}}
         for name, schema in (("get_weather", WEATHER), ("get_weekday", NOTE), ("add", ADD))]
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}



@pytest.fixture(scope="module")
def union_and_reference():
    """The hermes units of TOOLS as a UnitUnion, and the old one-index grammar of their alternation."""
    grammar = tool_grammar("hermes", TOOLS, schema_to_regex, parallel=False)
    compiler = shared_compiler()
    union = UnitUnion([compiler.compile_regex(regex) for regex in grammar.units])
    alternation = call_alternatives(TOOLS, schema_to_regex, None, get_tool_format("hermes").call_object_regex)
    reference = compiler.compile_regex(r"\n" + alternation + r"\n")
    return union, reference


@pytest.mark.parametrize("seed", range(6))
def test_union_masks_equal_the_one_index_grammar_on_random_walks(union_and_reference, seed):
    union, reference = union_and_reference
    mine, theirs, rng = union.matcher(), reference.matcher(), random.Random(seed)
    for _ in range(80):
        choices = allowed(mine)
        assert choices == allowed(theirs)
        assert mine.min_tokens() == theirs.min_tokens() and mine.finished() == theirs.finished()
        if mine.is_terminated():
            break
        token = rng.choice(sorted(choices))
        mine.advance(token)
        theirs.advance(token)
    assert mine.is_terminated() and theirs.is_terminated()


@pytest.mark.parametrize("name,arguments", [("get_weather", {"city": "Paris", "unit": "c"}),
                                            ("get_weekday", {"text": "hi"}), ("add", {"a": 12, "b": -3})])
def test_the_tokenizers_own_tokens_cross_from_name_to_arguments(union_and_reference, name, arguments):
    """The tokenizer's encoding of a call (tokens such as `",` span the name's end and what follows)
    is allowed token by token, and forced() chains agree with it."""
    union, _ = union_and_reference
    text = "\n" + json.dumps({"name": name, "arguments": arguments}, separators=(", ", ": ")).replace(
        json.dumps(arguments, separators=(", ", ": ")), json.dumps(arguments, separators=(",", ":"))) + "\n"
    matcher = union.matcher()
    for token in smollm2_tokenizer().encode(text, add_special_tokens=False):
        assert token in allowed(matcher), f"{smollm2_tokenizer().decode([token])!r} refused in {text!r}"
        matcher.advance(token)
    assert matcher.is_terminated()
    matcher.rollback(3)
    assert not matcher.is_terminated()


def test_rollback_revives_the_units_a_token_dropped(union_and_reference):
    union, _ = union_and_reference
    matcher = union.matcher()
    tokens = smollm2_tokenizer().encode('\n{"name": "add"', add_special_tokens=False)
    for token in tokens:
        matcher.advance(token)
    assert matcher.only is not None and matcher.only.grammar is union.units[2]
    matcher.rollback(len(tokens))
    assert matcher.only is None and allowed(matcher) == allowed(union.matcher())


@pytest.mark.parametrize("seed", range(4))
def test_random_turns_with_many_tools_are_valid_calls(seed):
    """Ten tools, parallel hermes calls: every random walk under the masks parses into valid calls."""
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "parameters": schema}}
             for i, schema in enumerate([WEATHER, ADD, NOTE] * 3 + [WEATHER])]
    grammar = tool_grammar("hermes", tools, schema_to_regex, parallel=True)
    constraint = compile_tool_constraint(grammar, shared_compiler(), smollm2_tokenizer(), required=True)
    rng, out = random.Random(seed), []
    while not constraint.is_terminated() and len(out) < 400:
        forced = constraint.forced()
        for token in forced or [rng.choice(sorted(allowed(constraint)))]:
            constraint.advance(token)
            out.append(token)
    text = smollm2_tokenizer().decode(out, skip_special_tokens=False)
    _, calls = get_tool_format("hermes").parse(text.replace("<|im_end|>", ""))
    assert calls
    for name, arguments in calls:
        jsonschema.validate(json.loads(arguments), [WEATHER, ADD, NOTE][int(name.split("_")[1]) % 3])


def test_changing_one_tool_compiles_one_unit():
    """Units are cached by their own text: a tool list with one tool changed compiles that tool only,
    and the order of the tools or naming one in tool_choice compiles nothing."""
    compiler = shared_compiler()
    tools = [{"type": "function", "function": {"name": f"lookup_{i}", "parameters": NOTE}} for i in range(6)]

    def compile_all(tool_list, forced=None):
        grammar = tool_grammar("hermes", tool_list, schema_to_regex, parallel=True, forced_name=forced)
        return [compiler.compile_regex(regex) for regex in grammar.units]

    compile_all(tools)
    before = compiler.stats["compiles"]
    changed = tools[:3] + [{"type": "function", "function": {"name": "lookup_3", "parameters": ADD}}] + tools[4:]
    compile_all(changed)
    assert compiler.stats["compiles"] == before + 1
    compile_all(list(reversed(changed)))
    compile_all(changed, forced="lookup_5")
    assert compiler.stats["compiles"] == before + 1


def test_the_vocabulary_has_units_for_each_format():
    """Mistral's parallel list: the first block opens the list, later ones follow `, `, `]` ends it."""
    for fmt in ("hermes", "llama3_json", "mistral"):
        grammar = tool_grammar(fmt, TOOLS, schema_to_regex, parallel=True)
        assert len(grammar.units) == len(TOOLS) == len(grammar.next_units)
        assert grammar.names == tuple(SCHEMAS)
    mistral = tool_grammar("mistral", TOOLS, schema_to_regex, parallel=True)
    assert mistral.units[0].startswith(r" ?\[") and not mistral.next_units[0].startswith(r" ?\[")
    assert mistral.separator == ", " and mistral.end == "]"
    assert smollm2_vocabulary().size == 49152


@pytest.mark.parametrize("regexes,side", [([r'\{"name": "get_weather"\}', r'\{"name": "get_weekday"\}', r'\{"name": "add"\}'], True),
                                          ([r'"[^"]*"1', r'"[^"\n]*"2', r'"[a-z ]*"3'], False)])
def test_a_union_merged_from_the_units_id_lists_equals_the_union_of_their_rows(regexes, side):
    """A union's first visit is merged from its units' id lists (no rows; the allowed lists joined, or
    the banned lists' common ids less the allowed ones): on random walks, each merged mask allows the
    tokens the union's row (the units' rows ORed) allows."""
    compiler = shared_compiler()
    union = UnitUnion([compiler.compile_regex(regex) for regex in regexes])
    unit_union._UNION_CACHE.clear()
    merged = 0
    for seed in range(4):
        matcher, rng = union.matcher(), random.Random(seed)
        for _ in range(12):
            sparse = matcher.sparse_mask()
            fresh = [e for e in unit_union._UNION_CACHE.values() if e is not unit_union._ASKED and e[0] is None]
            merged += sum(e[1].allowed == side for e in fresh)
            choices = allowed(matcher)  # the row: made now, beside the merged mask
            if sparse is not None:
                ids = set(sparse.array.tolist())
                assert (ids if sparse.allowed else set(range(union.vocabulary.size)) - ids) == choices
            if matcher.is_terminated() or not choices:
                break
            matcher.advance(rng.choice(sorted(choices)))
    assert merged > 0
