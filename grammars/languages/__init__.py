"""What clients constrain besides JSON Schema and tool calls: a regex (the syntax Python's `re`
and JSON Schema's `pattern` share) and a choice among strings, each rewritten into the regex the
token index reads (python_regex.py). Grammars (GBNF, Lark) are refused with a 400 until they land.
"""
