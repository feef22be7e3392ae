"""JSON Schema -> regex: normalising (schema_normalizer), $ref cycles, numeric bounds as regexes
(numeric_bounds, numeric_range), oneOf and object branches, free-form values as holes (free_values),
and schema_to_regex with its refusals (json_schema).
"""
