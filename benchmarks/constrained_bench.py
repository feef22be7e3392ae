"""Constrained vs unconstrained decode tokens/s: the same `overhead` suite as decode_bench.py (one
copy of the logic, server/bench/overhead.py); kept under this name for the notes that cite it.

    python benchmarks/constrained_bench.py [--tokens 64] [--rounds 4]
"""

from __future__ import annotations

import sys

from decode_bench import main  # benchmarks/ is on sys.path when run as a script

if __name__ == "__main__":
    if "--rounds" not in sys.argv:
        sys.argv += ["--rounds", "4"]
    main()
