"""`maskd bench`: the benchmark suites (overhead, compile, budget, tools, prefix, batch), one module
each, run by server/bench/run.py; the developer scripts in benchmarks/ call the same code."""
