"""The text of a FLOAT or DOUBLE value in a range checksum, for every source.

A checksum covers every column: the database side (``sources/*/checksum.py``) and the lake
side (:mod:`dblog.app.compare`) render each value to the same text. The engines print floats
differently (MariaDB prints a FLOAT with 6 significant digits, Spark a DOUBLE as Java does),
so a FLOAT or DOUBLE value, alone or as an array element, is rendered as its bits instead:
the 16 uppercase hex digits of the IEEE 754 binary64 encoding of the value, a FLOAT widened
to DOUBLE first (exact and one-to-one). Two values that differ in any bit give different
texts, except NaNs: every NaN (whatever its sign and payload) renders as :data:`NAN_BITS`.
-0.0 renders as ``8000000000000000``, apart from 0.0: PostgreSQL stores -0.0 (and the lake
keeps it), MariaDB stores -0.0 as 0.0. MariaDB holds no NaN or infinity.
"""

from __future__ import annotations

FLOAT_TYPES = frozenset({"FLOAT", "DOUBLE"})
"""Canonical types rendered as their IEEE 754 bits."""

NAN_BITS = "7FF8000000000000"
"""The text of every NaN: the bits of the canonical quiet NaN (Java's, PostgreSQL's)."""

POSITIVE_ZERO_BITS, NEGATIVE_ZERO_BITS = "0000000000000000", "8000000000000000"
POSITIVE_INFINITY_BITS, NEGATIVE_INFINITY_BITS = "7FF0000000000000", "FFF0000000000000"
