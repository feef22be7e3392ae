"""Suite `languages`: compiling the constraints clients of other servers send (issue 55): regexes,
a choice and a GBNF grammar, each cold (every cache off: a fresh maskd compiler per round, xgrammar's
cache disabled), maskd against xgrammar and llguidance where installed, rounds interleaved.

maskd's time holds its rewrite (grammars/languages/) and the token index; xgrammar's its grammar and
mask tables; llguidance builds its masks lazily, so its time is mostly parsing (its first masks are
paid while decoding). llguidance reads the GBNF grammar as maskd's check regex of it.
"""

from __future__ import annotations

import statistics
import time

from server.bench.peers import missing

REGEXES = {
    "phone": r"\(\d{3}\) \d{3}-\d{4}",
    "email-like": r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}",
    "date-time": r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z",
    "IPv4": r"((25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(25[0-5]|2[0-4]\d|1?\d?\d)",
    "sentence of 4-13 words": r"[A-Z][a-z]+( [a-z]+){3,12}\.",
}
CHOICE = ["positive", "negative", "neutral", "mixed", "unknown"]
GBNF = '''root   ::= answer ", because " reason
answer ::= "yes" | "no"
reason ::= [a-z] [a-z ]{0,20}'''
NAMES = [*REGEXES, "choice of 5", "GBNF (3 rules)"]


def _maskd(compiler, name: str) -> None:
    from grammars import choice_regex, gbnf_regexes, index_regex

    if name in REGEXES:
        compiler.compile_regex(index_regex(REGEXES[name]))
    elif name == "choice of 5":
        compiler.compile_regex(choice_regex(CHOICE))
    else:
        compiler.compile_regex(gbnf_regexes(GBNF)[0])


def _peers(stack) -> dict:
    """name -> compile(name) for the peers installed."""
    tokenizer, size = stack.loaded.tokenizer, stack.vocabulary.size
    eos = sorted(stack.engine.eos_token_ids)
    out = {}
    skipped = missing()
    if "xgrammar" not in skipped:
        import xgrammar

        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=size, stop_token_ids=eos)
        xc = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        out["xgrammar"] = lambda name: xc.compile_grammar(GBNF) if name == NAMES[-1] else \
            xc.compile_regex(REGEXES.get(name) or "(" + "|".join(CHOICE) + ")")
    if "llguidance" not in skipped:
        import llguidance
        import llguidance.hf

        from grammars import gbnf_regexes

        lltok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=size, eos_token=eos)

        def ll(name):
            regex = gbnf_regexes(GBNF)[1] if name == NAMES[-1] else REGEXES.get(name) or "(" + "|".join(CHOICE) + ")"
            matcher = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_regex(regex))
            if matcher.is_error():
                raise ValueError(matcher.get_error())
        out["llguidance"] = ll
    return out


def run(ctx, progress) -> dict:
    from grammars import GrammarCompiler
    from server.bench.stats import fmt

    stack = ctx.stack()
    rounds = 1 if ctx.tiny else 3
    peers = _peers(stack)
    engines = ["maskd", *peers]
    times: dict[tuple[str, str], list[float]] = {}
    bar = progress("languages", rounds)
    for _ in range(rounds):
        with GrammarCompiler(stack.vocabulary, workers=1, timeout_s=30.0) as compiler:  # empty caches
            compiler.compile_regex("a")  # its worker started and warm
            for name in NAMES:
                for engine in engines:
                    started = time.perf_counter()
                    _maskd(compiler, name) if engine == "maskd" else peers[engine](name)
                    times.setdefault((name, engine), []).append(time.perf_counter() - started)
        bar.update()
    bar.close()
    ms = {key: statistics.median(values) * 1e3 for key, values in times.items()}
    rows, ratios = [], {}
    for name in NAMES:
        row = [name] + [fmt(ms.get((name, e)), ".2f") for e in ("maskd", "xgrammar", "llguidance")]
        x = ms.get((name, "xgrammar"))
        row.append(fmt(ms[(name, "maskd")] / x if x else None, ".1f"))
        rows.append(row)
    for peer in peers:
        ratios[f"maskd / {peer} cold compile, median over constraints"] = statistics.median(
            ms[(name, "maskd")] / ms[(name, peer)] for name in NAMES)
    return {
        "rounds": rounds, "ms": {f"{name} | {engine}": v for (name, engine), v in ms.items()}, "ratios": ratios,
        "notes": ["Cold compiles, every cache off; medians of the rounds. llguidance builds masks lazily: its time is "
                  "mostly parsing, its first masks are paid while decoding."]
                 + [f"{name}: skipped ({why})." for name, why in missing().items() if name in ("xgrammar", "llguidance")],
        "tables": [{"title": f"Compile time of the constraint languages (cold, {stack.vocabulary.size} vocab, "
                             f"median of {rounds} rounds)",
                    "columns": ["constraint", "maskd ms", "xgrammar ms", "llguidance ms", "maskd / xgrammar"],
                    "rows": rows}],
    }


def plot(result: dict, path) -> None:
    from server.bench.plots import figure

    by_engine: dict[str, dict[str, float]] = {}
    for key, value in result["ms"].items():
        name, engine = key.split(" | ")
        by_engine.setdefault(engine, {})[name] = value
    with figure(path, 1, width=7.0) as ax:
        width = 0.8 / max(1, len(by_engine))
        for i, (engine, values) in enumerate(by_engine.items()):
            ax.bar([j + i * width for j in range(len(NAMES))], [values.get(n, 0) for n in NAMES], width, label=engine)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(NAMES))], NAMES, fontsize=6, rotation=20)
        ax.set_yscale("log"), ax.set_ylabel("cold compile (ms)"), ax.legend(fontsize=7)
        ax.set_title("constraint languages: compile time", fontsize=9)
