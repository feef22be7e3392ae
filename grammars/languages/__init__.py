"""What clients constrain besides JSON Schema and tool calls: a regex (the syntax Python's `re`
and JSON Schema's `pattern` share), a choice among strings (python_regex.py) and a regular GBNF
grammar (gbnf.py), each rewritten into the regex the token index reads. Recursive grammars and
Lark wait for a grammar engine.
"""
