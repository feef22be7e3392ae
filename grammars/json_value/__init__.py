"""The free JSON value: one token-level pushdown automaton per vocabulary for any compact JSON value
(json_value, its lexer, tables, distance and matcher, cached per vocabulary), and the holes through
which a unit's regex hands a value to it (hole_*, value_exits, value_rungs).
"""
