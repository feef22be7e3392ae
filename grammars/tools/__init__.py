"""Tool calls: the grammar of a tool-call turn (tool_grammar), its per-request constraint
(tool_constraint), the name stage that writes a call's opening while its units compile, the texts
read off a unit's regex (regex_text), and each model family's call format (formats/).
"""
