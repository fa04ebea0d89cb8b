"""MariaDB/MySQL column types: canonical Spark types, chunk projections, binlog decoding.

One :class:`SourceType` describes a column whether it comes from ``information_schema``
or from a binlog TABLE_MAP event, so both paths give the same :class:`Column`.

=====================================  ==============================
source type                            canonical (Spark) type
=====================================  ==============================
TINYINT (incl. BOOL, TINYINT(1))       TINYINT (unsigned: SMALLINT)
SMALLINT                               SMALLINT (unsigned: INT)
MEDIUMINT                              INT
INT                                    INT (unsigned: BIGINT)
BIGINT                                 BIGINT (unsigned: DECIMAL(20,0))
DECIMAL(p,s)                           DECIMAL(p,s) (p > 38: STRING)
FLOAT / DOUBLE                         FLOAT / DOUBLE
DATE                                   DATE (*)
DATETIME(n)                            TIMESTAMP_NTZ (*)
TIMESTAMP(n)                           TIMESTAMP (UTC) (*)
TIME(n)                                STRING ('-838:59:59.000000')
YEAR                                   INT
BIT(n)                                 BIGINT (BIT(64) two's complement)
CHAR/VARCHAR/TEXT/JSON/ENUM/SET        STRING (SET: 'a,c' in definition order)
BINARY/VARBINARY/BLOB                  BINARY (BINARY(n) zero-padded to n)
=====================================  ==============================

(*) Values the lake cannot hold read as NULL, from the log and from chunk selects alike:
zero dates ('0000-00-00'), partial zero dates ('2020-00-15', '2020-05-00'), dates in year 0
('0000-01-01') and invalid dates stored under ALLOW_INVALID_DATES ('2020-02-31'; the log
reader fails on such a DATE). A TIMESTAMP holds only the zero value of these. In a primary
key such a NULL would merge distinct rows, so key columns are refused up front when the
server's sql_mode allows those values, and a NULL key value stops the log reader and the
chunk read (see ``checks.check_temporal_key`` and ``MySqlDialect``).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from dblog.core.errors import SourceError
from dblog.sources.mysql import temporal_numbers

Converter = Callable[[Any], Any]

INT_TYPES: dict[str, tuple[str, str]] = {
    "tinyint": ("TINYINT", "SMALLINT"),
    "smallint": ("SMALLINT", "INT"),
    "mediumint": ("INT", "INT"),
    "int": ("INT", "BIGINT"),
    "bigint": ("BIGINT", "DECIMAL(20,0)"),
}
TEXT_TYPES = frozenset(
    {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set", "json"}
)
BARE_TEXT_TYPES = frozenset({"varchar", "tinytext", "text", "mediumtext", "longtext"})
"""Text types Spark's JDBC reader gives as plain strings, so a chunk selects them bare."""
BINARY_TYPES = frozenset({"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"})
TEMPORAL_TYPES = frozenset({"date", "datetime", "timestamp"})
OTHER_TYPES = frozenset({"decimal", "float", "double", "time", "year", "bit"}) | TEMPORAL_TYPES
SUPPORTED = frozenset(INT_TYPES) | TEXT_TYPES | BINARY_TYPES | OTHER_TYPES
MAX_SPARK_DECIMAL = 38

_DATA_TYPE_ALIASES = {
    "integer": "int", "bool": "tinyint", "boolean": "tinyint", "numeric": "decimal",
    "dec": "decimal", "fixed": "decimal", "real": "double", "double precision": "double",
}

_EPOCH = dt.datetime(1970, 1, 1)


@dataclass(frozen=True, slots=True)
class SourceType:
    """A normalized MariaDB/MySQL column type.

    ``precision`` is the DECIMAL precision, the BIT width, the fractional-second digits of
    DATETIME/TIMESTAMP/TIME, or the length of BINARY(n); ``scale`` the DECIMAL scale.
    """

    base: str
    unsigned: bool = False
    precision: int = 0
    scale: int = 0

    def __post_init__(self) -> None:
        if self.base not in SUPPORTED:
            raise ValueError(f"unsupported type {self.base!r}")

    @property
    def name(self) -> str:
        """The source type as recorded in :attr:`Column.source_type`."""
        b = self.base
        if b in INT_TYPES:
            return f"{b} unsigned" if self.unsigned else b
        if b == "decimal":
            return f"decimal({self.precision},{self.scale})"
        if b in ("datetime", "timestamp", "time", "bit", "binary"):
            return f"{b}({self.precision})"
        return b

    @property
    def spark_type(self) -> str:
        b = self.base
        if b in INT_TYPES:
            return INT_TYPES[b][1 if self.unsigned else 0]
        if b == "decimal":
            if self.precision > MAX_SPARK_DECIMAL:
                return "STRING"
            return f"DECIMAL({self.precision},{self.scale})"
        simple = {
            "float": "FLOAT", "double": "DOUBLE", "date": "DATE", "datetime": "TIMESTAMP_NTZ",
            "timestamp": "TIMESTAMP", "time": "STRING", "year": "INT", "bit": "BIGINT",
        }
        if b in simple:
            return simple[b]
        return "STRING" if b in TEXT_TYPES else "BINARY"

    def chunk_projections(self, quoted: str) -> tuple[str, ...]:
        """The SELECT expressions a chunk select sends for the column: :meth:`projection`,
        except for DATE, DATETIME and TIMESTAMP, sent as numbers (``temporal_numbers``)."""
        if self.base in TEMPORAL_TYPES:
            return temporal_numbers.chunk_select_sql(self.base, self.precision, quoted)
        return (self.projection(quoted),)

    def projection(self, quoted: str) -> str:
        """A SELECT expression for the column giving a JDBC value of its canonical type
        (temporal ones as text): what key reads and checksums select.

        Temporal values travel as text (no JVM time-zone conversion); the session time
        zone must be UTC for TIMESTAMP (``jdbc_options`` sets it). The server formats the
        text: a bare DATETIME read as a string is the driver's rendering, not the server's
        (MariaDB Connector/J gives '0000-01-01 10:00:00' as '0001-01-01 10:00:00.000' and a
        zero DATETIME as NULL). Chunk selects send temporal values as numbers instead
        (:meth:`chunk_projections`): ``DATE_FORMAT`` costs the server most of a chunk
        select's work beyond the bare columns.
        """
        b = self.base
        if b in INT_TYPES or b in BARE_TEXT_TYPES:
            # Bare: Spark's JDBC reader gives integers (BIGINT UNSIGNED as DECIMAL(20,0)) and
            # strings as they are, and each CAST cost the server ~0.05-0.2 CPU-s per 1M rows.
            return quoted
        if b in ("year", "bit"):
            return f"CAST({quoted} AS SIGNED)"
        if b == "decimal":
            return f"CAST({quoted} AS CHAR)" if self.spark_type == "STRING" else quoted
        if b == "float":
            return f"CAST({quoted} AS DOUBLE)"
        # Year 0 ('0000-01-01') is a valid MariaDB date but not a Python one: the log
        # decodes it as NULL, so the chunk does too. Zero, partial zero ('2020-00-15') and
        # invalid dates ('2020-02-31') fail Spark's try_cast and read as NULL as well.
        if b == "date":
            return f"CASE WHEN YEAR({quoted}) > 0 THEN DATE_FORMAT({quoted}, '%Y-%m-%d') END"
        if b == "datetime":
            return (f"CASE WHEN YEAR({quoted}) > 0 THEN"
                    f" DATE_FORMAT({quoted}, '%Y-%m-%d %H:%i:%s.%f') END")
        if b == "timestamp":
            return f"CONCAT(DATE_FORMAT({quoted}, '%Y-%m-%d %H:%i:%s.%f'), 'Z')"
        if b == "time" or b in TEXT_TYPES:
            # CAST AS CHAR: plain CHAR/ENUM/SET would be space-padded by Spark's CHAR(n) reads;
            # JSON is kept as the server renders it.
            return f"CAST({quoted} AS CHAR)"
        return quoted


NO_PAD_BINARY_COLLATIONS = frozenset({
    "utf8mb4_nopad_bin", "utf8mb3_nopad_bin", "utf8_nopad_bin", "ascii_nopad_bin",
    "utf8mb4_0900_bin",
})
"""Text collations that compare by code point with trailing spaces significant: exactly
Spark's order of the UTF-8 strings. ``*_bin`` collations pad ('a' = 'a ', 'a\t' < 'a');
latin1 is cp1252 in MariaDB, whose byte order is not code-point order."""

_TEXT_KEY_TYPES = frozenset({"varchar", "tinytext", "text", "mediumtext", "longtext"})
_ORDERED_TYPES = frozenset(INT_TYPES) | BINARY_TYPES | {"date", "datetime", "timestamp", "year"}


def spark_orders_like_source(st: SourceType, collation: str | None) -> bool:
    """Whether Spark's natural order of the canonical values of a column of type ``st``
    (with ``collation``, for text) is the database's ``ORDER BY`` of that column.

    Integers (any signedness), DECIMAL up to 38 digits, DATE, DATETIME, TIMESTAMP, YEAR,
    BINARY, VARBINARY and BLOB: yes. VARCHAR/TEXT only under a no-pad binary collation of
    a Unicode or ASCII character set. CHAR (trailing spaces dropped), ENUM and SET (ordered
    by index), TIME and DECIMAL > 38 digits (strings), FLOAT/DOUBLE (-0.0, NaN), BIT
    (BIT(64) wraps negative) and JSON: no.
    """
    b = st.base
    if b == "decimal":
        return st.spark_type != "STRING"
    if b in _ORDERED_TYPES:
        return True
    if b in _TEXT_KEY_TYPES:
        return (collation or "").strip().lower() in NO_PAD_BINARY_COLLATIONS
    return False


def from_information_schema(row: Mapping[str, Any], where: str) -> SourceType:
    """The type of one ``information_schema.COLUMNS`` row; SourceError if unsupported."""
    data_type = str(row["DATA_TYPE"]).lower()
    base = _DATA_TYPE_ALIASES.get(data_type, data_type)
    column_type = str(row["COLUMN_TYPE"]).lower()
    if base not in SUPPORTED:
        raise SourceError(f"{where}: type {column_type} is not supported")
    unsigned = base in INT_TYPES and "unsigned" in column_type
    if base == "decimal":
        return SourceType(base, precision=int(row["NUMERIC_PRECISION"]),
                          scale=int(row["NUMERIC_SCALE"] or 0))
    if base == "bit":
        return SourceType(base, precision=int(row["NUMERIC_PRECISION"]))
    if base in ("datetime", "timestamp", "time"):
        return SourceType(base, precision=int(row["DATETIME_PRECISION"] or 0))
    if base == "binary":
        return SourceType(base, precision=int(row["CHARACTER_OCTET_LENGTH"]))
    return SourceType(base, unsigned=unsigned)


# mysql-replication FIELD_TYPE codes
_T_DECIMAL, _T_TINY, _T_SHORT, _T_LONG, _T_FLOAT, _T_DOUBLE = 0, 1, 2, 3, 4, 5
_T_TIMESTAMP, _T_LONGLONG, _T_INT24, _T_DATE, _T_TIME, _T_DATETIME = 7, 8, 9, 10, 11, 12
_T_YEAR, _T_NEWDATE, _T_VARCHAR, _T_BIT, _T_TIMESTAMP2, _T_DATETIME2, _T_TIME2 = (
    13, 14, 15, 16, 17, 18, 19)
_T_JSON, _T_NEWDECIMAL, _T_ENUM, _T_SET, _T_BLOB, _T_VAR_STRING, _T_STRING = (
    245, 246, 247, 248, 252, 253, 254)
_BINLOG_INTS = {_T_TINY: "tinyint", _T_SHORT: "smallint", _T_INT24: "mediumint",
                _T_LONG: "int", _T_LONGLONG: "bigint"}
_BLOB_SIZES = {1: "tiny", 2: "", 3: "medium", 4: "long"}


def from_binlog_column(col: Any, where: str) -> SourceType:
    """The type of a mysql-replication TABLE_MAP column (FULL row metadata)."""
    t = col.type
    binary = getattr(col, "character_set_name", None) == "binary"
    if t in _BINLOG_INTS:
        return SourceType(_BINLOG_INTS[t], unsigned=bool(col.unsigned))
    if t == _T_NEWDECIMAL:
        return SourceType("decimal", precision=col.precision, scale=col.decimals)
    if t in (_T_FLOAT, _T_DOUBLE):
        return SourceType("float" if t == _T_FLOAT else "double")
    if t in (_T_DATE, _T_NEWDATE):
        return SourceType("date")
    if t in (_T_DATETIME, _T_DATETIME2):
        return SourceType("datetime", precision=getattr(col, "fsp", 0))
    if t in (_T_TIMESTAMP, _T_TIMESTAMP2):
        return SourceType("timestamp", precision=getattr(col, "fsp", 0))
    if t in (_T_TIME, _T_TIME2):
        return SourceType("time", precision=getattr(col, "fsp", 0))
    if t == _T_YEAR:
        return SourceType("year")
    if t == _T_BIT:
        return SourceType("bit", precision=col.bits)
    if t == _T_STRING:
        return SourceType("binary", precision=col.max_length) if binary else SourceType("char")
    if t in (_T_VARCHAR, _T_VAR_STRING):
        return SourceType("varbinary" if binary else "varchar")
    if t == _T_BLOB:
        size = _BLOB_SIZES.get(col.length_size, "")
        return SourceType(size + ("blob" if binary else "text"))
    if t == _T_ENUM:
        return SourceType("enum")
    if t == _T_SET:
        return SourceType("set")
    if t == _T_JSON:
        return SourceType("json")
    raise SourceError(f"{where}: binlog column type code {t} is not supported")


def format_time(value: dt.timedelta, fsp: int) -> str:
    """A TIME value as MariaDB prints it: ``[-]HH:MM:SS[.fff]`` with ``fsp`` digits."""
    total = (value.days * 86400 + value.seconds) * 1_000_000 + value.microseconds
    sign = "-" if total < 0 else ""
    seconds, micros = divmod(abs(total), 1_000_000)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{sign}{hours:02d}:{minutes:02d}:{secs:02d}"
    if fsp > 0:
        text += "." + f"{micros:06d}"[:fsp]
    return text


def fix_negative_time2(value: dt.timedelta) -> dt.timedelta:
    """Undo mysql-replication 1.0.17's decoding of negative TIME(n>0) with a fraction.

    The library negates the floored whole-second part and the (already negative) fraction
    separately, so ``-12:34:56.789`` decodes as ``-(12:34:57 - 0.789)``. With the decoded
    magnitude ``A`` (microseconds, not whole) and ``H = ceil(A)``, the true magnitude is
    ``(H - 1) + (H - A)``.
    """
    total = (value.days * 86400 + value.seconds) * 1_000_000 + value.microseconds
    if total >= 0 or total % 1_000_000 == 0:
        return value
    magnitude = -total
    whole = -(-magnitude // 1_000_000) * 1_000_000
    true = (whole - 1_000_000) + (whole - magnitude)
    return dt.timedelta(microseconds=-true)


def _json_text(value: Any) -> str:
    def plain(v: Any) -> Any:
        if isinstance(v, bytes):
            return v.decode("utf-8", errors="replace")
        if isinstance(v, dict):
            return {plain(k): plain(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [plain(x) for x in v]
        return v

    return json.dumps(plain(value), ensure_ascii=False)


def binlog_converter(st: SourceType, set_values: Sequence[str] = ()) -> Converter | None:
    """Convert a non-NULL mysql-replication value to its canonical Python value.

    None means the library's value is already canonical. SET's empty value and NULL both
    arrive as None; the log reader tells them apart with the row's none_sources.
    """
    b = st.base
    if b == "bigint" and st.unsigned:
        return Decimal
    if b == "year":
        return lambda v: 0 if v == 1900 else v
    if b == "bit":
        width = st.precision

        def bit(v: str) -> int:
            n = int(v, 2) if v else 0
            return n - (1 << 64) if width == 64 and n >= 1 << 63 else n

        return bit
    if b == "decimal" and st.spark_type == "STRING":
        return lambda v: format(v, "f")
    if b == "timestamp":
        return lambda v: None if v == _EPOCH else v.replace(tzinfo=dt.UTC)
    if b == "time":
        fsp = st.precision
        return lambda v: format_time(fix_negative_time2(v) if fsp else v, fsp)
    if b == "binary":
        length = st.precision
        return lambda v: _as_bytes(v).ljust(length, b"\x00")
    if b == "set":
        order = tuple(set_values)
        return lambda v: ",".join(x for x in order if x in v)
    if b == "json":
        return lambda v: v if isinstance(v, str) else _json_text(v)
    if b in BINARY_TYPES:
        return _as_bytes
    return None


def _as_bytes(value: Any) -> bytes:
    # mysql-replication decodes binary strings with the codec "binary", which does not
    # exist, and keeps the bytes -- except for an empty value, which CPython decodes to ""
    # without looking the codec up.
    return value if isinstance(value, bytes) else str(value).encode("utf-8")
