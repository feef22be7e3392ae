"""Fuzz: the HTTP API, in process, with hypothesis-built requests and schemathesis cases from its OpenAPI document.

    python benchmarks/fuzz.py [--requests 10000] [--schemathesis-share 0.2] [--tool-format hermes] [--seed 0]

The app is the real one over a real engine (a tiny random-weight Llama with the embedded model's
tokenizer, the grammar compiler with a 2 s limit, forced text), as tests/api_fuzz.py builds it; the
requests and the properties are that module's: never a 5xx (nor a server error inside a stream), a
4xx in the API's error shape, and every 200 carrying a constrained output valid against the
request's schema. /health is asked after every request and a one-token chat (the canary) every 50;
both must answer 200. Prints counts (requests, by status, 5xx, invalid constrained outputs, other
problems) and writes benchmarks/results/fuzz.json with the first problems found.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the requests and checks live beside the test that uses them

import api_fuzz  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed, settings, strategies as st  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
CANARY = {"model": api_fuzz.MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--schemathesis-share", type=float, default=0.2, help="share of requests from schemathesis")
    parser.add_argument("--tool-format", default="hermes", choices=["hermes", "llama3_json", "mistral"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(RESULTS / "fuzz.json"))
    parser.add_argument("--verbose", action="store_true", help="print every request as it is sent")
    args = parser.parse_args()

    from fastapi.testclient import TestClient

    from server.app import create_app

    state = api_fuzz.build_state(api_fuzz.tiny_llama(), api_fuzz.load_tokenizer(), args.tool_format)
    app = create_app(state)
    http = TestClient(app, raise_server_exceptions=False).__enter__()  # one event loop; the lifespan starts the engine
    counts: Counter = Counter()
    by_status: Counter = Counter()
    by_code: Counter = Counter()  # 4xx answers by error code (type where there is no code)
    found: list[dict] = []
    started = time.perf_counter()
    sx_strategy = api_fuzz.schemathesis_cases(app)

    def one(case: api_fuzz.Case, source: str) -> None:
        sent = time.perf_counter()
        reply = case.send(http)
        if args.verbose:
            print(f"{reply.status_code} {time.perf_counter() - sent:6.3f}s {case.method} {case.path} "
                  f"{_short(case)[:150]}", flush=True)
        counts["requests"] += 1
        counts[f"from {source}"] += 1
        by_status[reply.status_code] += 1
        if 400 <= reply.status_code < 500:
            by_code[_code(reply)] += 1
        counts["5xx"] += reply.status_code >= 500
        wrong = api_fuzz.problems(case, reply)
        if reply.status_code == 200 and api_fuzz.constrained(case):
            counts["200 constrained"] += 1
        for problem in wrong:
            kind = "invalid constrained output" if ("arguments" in problem or "structured output" in problem
                                                    or "a call to" in problem) else "other problem"
            counts[kind] += 1
            if len(found) < 50:
                found.append({"problem": problem, "path": case.path, "body": _short(case)})
        if http.get("/health").status_code != 200:
            counts["health failures"] += 1
        if counts["requests"] % 50 == 0:
            counts["canary failures"] += http.post("/v1/chat/completions", json=CANARY).status_code != 200
        if counts["requests"] % 500 == 0:
            rate = counts["requests"] / (time.perf_counter() - started)
            print(f"{counts['requests']} requests, {rate:.1f}/s, 5xx {counts['5xx']}, "
                  f"problems {len(found)}", flush=True)

    n_sx = int(args.requests * args.schemathesis_share)
    quiet = settings(max_examples=args.requests, database=None, deadline=None, phases=[Phase.generate], derandomize=False,
                     suppress_health_check=list(HealthCheck))

    @quiet
    @given(st.data())
    def run(data):
        source = "schemathesis" if data.draw(st.integers(0, 999)) < 1000 * n_sx / args.requests else "hypothesis"
        case = api_fuzz.as_case(data.draw(sx_strategy)) if source == "schemathesis" else data.draw(api_fuzz.CASES)
        if counts["requests"] < args.requests:
            one(case, source)

    try:
        rounds = 0
        while counts["requests"] < args.requests:  # hypothesis may end a run early; the next goes on
            seed(args.seed + rounds)(run)()
            rounds += 1
    finally:
        http.__exit__(None, None, None)
        state.compiler.close()
    seconds = time.perf_counter() - started
    report = {"requests": counts["requests"], "seconds": round(seconds, 1),
              "rate_per_s": round(counts["requests"] / seconds, 1), "by_status": dict(sorted(by_status.items())),
              "4xx_by_code": dict(by_code.most_common()),
              "5xx": counts["5xx"], "invalid_constrained_outputs": counts["invalid constrained output"],
              "other_problems": counts["other problem"], "200_constrained": counts["200 constrained"],
              "health_failures": counts["health failures"], "canary_failures": counts["canary failures"],
              "from_hypothesis": counts["from hypothesis"], "from_schemathesis": counts["from schemathesis"],
              "tool_format": args.tool_format, "grammar_timeouts": state.compiler.stats.get("timeouts"),
              "first_problems": found}
    print(f"\n{'requests':28} {report['requests']}  ({report['rate_per_s']}/s over {report['seconds']} s)")
    for key in ("from_hypothesis", "from_schemathesis", "5xx", "invalid_constrained_outputs", "other_problems",
                "200_constrained", "health_failures", "canary_failures", "grammar_timeouts"):
        print(f"{key:28} {report[key]}")
    print("by status:", ", ".join(f"{k}: {v}" for k, v in report["by_status"].items()))
    print("4xx by code:", ", ".join(f"{k}: {v}" for k, v in report["4xx_by_code"].items()))
    for item in found[:10]:
        print("PROBLEM", item["problem"], item["path"], item["body"][:300])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if not found and not counts["5xx"] else 1


def _code(reply) -> str:
    try:
        error = reply.json()["error"]
        return str(error.get("code") or error.get("type"))
    except (ValueError, KeyError, TypeError, AttributeError):
        return "unreadable"


def _short(case: api_fuzz.Case) -> str:
    text = case.raw.decode("utf-8", "replace") if case.raw is not None else json.dumps(case.body, default=str)
    return text[:2000]


if __name__ == "__main__":
    sys.exit(main())
