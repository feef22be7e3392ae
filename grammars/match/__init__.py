"""A compiled unit and its per-request cursors: GrammarCore (index, masks), CompiledGrammar (grammar: a
core that makes its matchers), Matcher, HoleMatcher (a unit with free-value holes), UnitUnion (units
stepped side by side) and the budget-narrowed masks made ahead (narrowed_ahead).
"""
