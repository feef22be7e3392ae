"""Files grammars keeps on disk: cache folders nobody else can write (private_dir) and the versions
that key every disk cache (cache_version).
"""
