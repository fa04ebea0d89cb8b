"""Source databases: one dialect per database behind ``SourceDialect`` (base.py)."""
