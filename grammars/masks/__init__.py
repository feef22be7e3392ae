"""Token masks and their application to logits: packed bitmasks (bitmask), short id lists (sparse_mask)
and their memo (second_ask), the trigger-aware free-text mask (trigger_mask), and the forced text a
constraint allows alone (forced_text).
"""
