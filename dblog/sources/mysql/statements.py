"""What a statement in the binlog (a Query event) does to the rows of the tables it names.

Row changes reach the binlog as row events (``binlog_format=ROW``); a Query event carries
DDL, and, from a session that set ``binlog_format`` to STATEMENT or MIXED, DML as text. Rows
such a statement changes have no row events, so the lake learns of them only here:

* **resets**: every row of the table is gone (TRUNCATE, DROP TABLE, DROP DATABASE,
  CREATE OR REPLACE TABLE, a table renamed away): the lake table is emptied at that position;
* **rewrites**: rows may have changed without row events (a column added with a value for
  existing rows, a type or character-set conversion, a partition truncated, dropped or
  exchanged, a table renamed into the name, statement-format DML): the table is healed
  (captured again).

The rule is an allowlist: an ALTER TABLE clause is harmless only when it is known to leave
every stored value as it was (an index, a nullable column without a default, a table
option); any other clause, or one this parser cannot read, counts as a rewrite. A heal costs
a capture; a missed rewrite would leave the lake wrong without a word.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from dblog.core.events import TableId

_TOKEN = re.compile(
    r"""(?P<ws>\s+)
      | (?P<comment>/\*.*?\*/|--[^\n]*|\#[^\n]*)
      | (?P<bq>`(?:[^`]|``)*`)
      | (?P<str>'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.|"")*")
      | (?P<punct>[().,;=])
      | (?P<word>[^\s`'"().,;=]+)
    """,
    re.X | re.S,
)
_MODIFIERS = frozenset({
    "OR", "REPLACE", "TEMPORARY", "ONLINE", "OFFLINE", "IGNORE", "UNIQUE", "FULLTEXT",
    "SPATIAL",
})
DML_VERBS = frozenset({"INSERT", "REPLACE", "UPDATE", "DELETE", "LOAD", "WITH"})
"""Statements that change rows: logged as text only by a statement-format session."""

Token = tuple[str, str]


def tokens(sql: str) -> list[Token]:
    """``(kind, text)`` tokens of ``sql``: ``ident`` (a backtick-quoted name, unquoted),
    ``word``, ``str``, ``punct``; whitespace and comments dropped."""
    out: list[Token] = []
    pos = 0
    while pos < len(sql):
        m = _TOKEN.match(sql, pos)
        if m is None:
            break
        pos = m.end()
        kind = m.lastgroup or ""
        if kind in ("ws", "comment"):
            continue
        text = m.group()
        if kind == "bq":
            out.append(("ident", text[1:-1].replace("``", "`")))
        else:
            out.append((kind, text))
    return out


class _Parser:
    def __init__(self, toks: list[Token], default_db: str) -> None:
        self.toks = toks
        self.i = 0
        self.default_db = default_db

    def up(self, offset: int = 0) -> str:
        j = self.i + offset
        if j < len(self.toks) and self.toks[j][0] == "word":
            return self.toks[j][1].upper()
        return ""

    def is_punct(self, text: str) -> bool:
        return self.i < len(self.toks) and self.toks[self.i] == ("punct", text)

    def skip_if_exists(self) -> None:
        if self.up() == "IF":
            self.i += 1
            if self.up() == "NOT":
                self.i += 1
            if self.up() == "EXISTS":
                self.i += 1

    def ident(self) -> str | None:
        if self.i < len(self.toks) and self.toks[self.i][0] in ("ident", "word"):
            self.i += 1
            return self.toks[self.i - 1][1]
        return None

    def name(self) -> TableId | None:
        first = self.ident()
        if first is None:
            return None
        if self.is_punct("."):
            self.i += 1
            second = self.ident()
            if second is None:
                return None
            return TableId(first, second)
        return TableId(self.default_db, first)

    def names(self, separator_word: str | None = None) -> list[TableId]:
        out: list[TableId] = []
        while True:
            name = self.name()
            if name is None:
                break
            out.append(name)
            if separator_word and self.up() == separator_word:
                self.i += 1
                continue
            if self.is_punct(","):
                self.i += 1
                continue
            break
        return out


@dataclass
class StatementEffect:
    """What one statement does to the tables it names (see the module docstring)."""

    tables: list[TableId] = field(default_factory=list)
    """Every table the DDL changes (its schema, its rows or its name)."""
    databases: list[str] = field(default_factory=list)
    """Databases it drops."""
    resets: set[TableId] = field(default_factory=set)
    rewrites: set[TableId] = field(default_factory=set)
    dml: bool = False
    """A statement-format DML: ``rewrites`` holds every table it names (those it changes
    among them)."""

    def add(self, table: TableId, *, resets: bool = False, rewrites: bool = False) -> None:
        if table not in self.tables:
            self.tables.append(table)
        if resets:
            self.resets.add(table)
        if rewrites:
            self.rewrites.add(table)


def statement_effect(sql: str, default_db: str) -> StatementEffect:
    """What ``sql`` (a Query event's text, ``default_db`` its default database) does."""
    toks = tokens(sql)
    p = _Parser(toks, default_db)
    effect = StatementEffect()
    verb = p.up()
    if verb in DML_VERBS:
        effect.dml = True
        for table in named_tables(toks, default_db):
            effect.add(table, rewrites=True)
        return effect
    if verb not in ("ALTER", "CREATE", "DROP", "TRUNCATE", "RENAME"):
        return effect
    p.i = 1
    modifiers: set[str] = set()
    while p.up() in _MODIFIERS:
        modifiers.add(p.up())
        p.i += 1
    if "TEMPORARY" in modifiers:
        return effect  # a session's own table: never logged rows, never a tracked one
    kw = p.up()
    if kw in ("DATABASE", "SCHEMA") and verb == "DROP":
        p.i += 1
        p.skip_if_exists()
        db = p.ident()
        if db is not None:
            effect.databases.append(db)
        return effect
    if kw == "INDEX" and verb in ("CREATE", "DROP"):
        while p.i < len(toks) and p.up() != "ON":
            p.i += 1
        p.i += 1
        name = p.name()
        if name is not None:
            effect.add(name)
        return effect
    if kw in ("TABLE", "TABLES"):
        p.i += 1
    elif verb != "TRUNCATE":
        return effect
    p.skip_if_exists()
    if verb in ("DROP", "TRUNCATE"):
        for table in p.names():
            effect.add(table, resets=True)
        return effect
    if verb == "RENAME":
        _renames(p.names(separator_word="TO"), effect)
        return effect
    first = p.name()
    if first is None:
        return effect
    if verb == "CREATE":
        replaced = "OR" in modifiers and "REPLACE" in modifiers
        # Rows a CREATE ... SELECT inserts are row events only in a row-format session.
        selects = any(t[0] == "word" and t[1].upper() == "SELECT" for t in toks[p.i:])
        effect.add(first, resets=replaced, rewrites=selects)
        return effect
    _alter(p, first, effect)
    return effect


def _renames(names: list[TableId], effect: StatementEffect) -> None:
    """``RENAME TABLE a TO b, c TO d``: a name renamed away holds no rows any more (reset);
    one renamed into holds the other table's rows (rewrite)."""
    for i, table in enumerate(names):
        if i % 2 == 0:
            effect.add(table, resets=True)
        else:
            effect.add(table, rewrites=True)


def named_tables(toks: list[Token], default_db: str) -> list[TableId]:
    """Every name in ``toks`` read as a table (``db.t``, or ``t`` in ``default_db``): a
    superset of the tables a DML statement changes (a column named like a table is one
    too: healing it costs a capture, never a wrong lake)."""
    out: list[TableId] = []
    i = 0
    while i < len(toks):
        kind, text = toks[i]
        if kind in ("ident", "word"):
            if (i + 2 < len(toks) and toks[i + 1] == ("punct", ".")
                    and toks[i + 2][0] in ("ident", "word")):
                out.append(TableId(text, toks[i + 2][1]))
                i += 3
                continue
            out.append(TableId(default_db, text))
        i += 1
    return list(dict.fromkeys(out))


def _clauses(toks: list[Token]) -> list[list[Token]]:
    """ALTER TABLE's clauses: ``toks`` split at the commas outside parentheses."""
    clauses: list[list[Token]] = [[]]
    depth = 0
    for tok in toks:
        if tok == ("punct", "("):
            depth += 1
        elif tok == ("punct", ")"):
            depth -= 1
        if tok == ("punct", ",") and depth == 0:
            clauses.append([])
            continue
        clauses[-1].append(tok)
    return [c for c in clauses if c]


def _words(clause: list[Token]) -> list[str]:
    return [t[1].upper() if t[0] == "word" else "" for t in clause]


_TABLE_OPTIONS = frozenset({
    "ENGINE", "ROW_FORMAT", "COMMENT", "AUTO_INCREMENT", "KEY_BLOCK_SIZE",
    "STATS_AUTO_RECALC", "STATS_PERSISTENT", "STATS_SAMPLE_PAGES", "FORCE", "ALGORITHM",
    "LOCK", "ORDER", "CHECKSUM", "PACK_KEYS", "AVG_ROW_LENGTH", "MAX_ROWS", "MIN_ROWS",
    "DELAY_KEY_WRITE", "INSERT_METHOD", "PAGE_CHECKSUM", "TRANSACTIONAL", "ENCRYPTED",
    "ENCRYPTION_KEY_ID", "PAGE_COMPRESSED", "PAGE_COMPRESSION_LEVEL", "IETF_QUOTES",
    "UNION", "CONNECTION", "PASSWORD", "DISABLE", "ENABLE", "NOWAIT", "WAIT",
    "CHARSET", "COLLATE", "DATA", "INDEX",
})
"""Clauses that change a table's options, not its stored values."""
_KEPT_PARTITIONING = frozenset({
    "PARTITION", "REMOVE", "COALESCE", "REORGANIZE", "REBUILD", "OPTIMIZE", "ANALYZE",
    "CHECK",
})
"""Partition maintenance that moves rows between partitions but keeps every one of them."""
_HARMLESS_ADDS = frozenset({
    "INDEX", "KEY", "UNIQUE", "FULLTEXT", "SPATIAL", "FOREIGN", "CHECK", "PERIOD", "PARTITION",
})


def _alter(p: _Parser, table: TableId, effect: StatementEffect) -> None:
    rest = p.toks[p.i:]
    rewrites = False
    for clause in _clauses(rest):
        words = _words(clause)
        if words[0] == "RENAME" and words[1:2] not in (["COLUMN"], ["INDEX"], ["KEY"]):
            sub = _Parser(clause, p.default_db)
            sub.i = 1
            if sub.up() in ("TO", "AS"):
                sub.i += 1
            renamed = sub.name()
            effect.add(table, resets=True)
            if renamed is not None:
                effect.add(renamed, rewrites=True)
            continue
        if words[0] == "EXCHANGE":  # EXCHANGE PARTITION p WITH TABLE t2: both change
            sub = _Parser(clause, p.default_db)
            while sub.i < len(clause) and sub.up() != "TABLE":
                sub.i += 1
            sub.i += 1
            other = sub.name()
            if other is not None:
                effect.add(other, rewrites=True)
            rewrites = True
            continue
        rewrites = rewrites or clause_rewrites(clause)
    effect.add(table, rewrites=rewrites)


def clause_rewrites(clause: list[Token]) -> bool:
    """Whether one ALTER TABLE clause may change stored values (True when unknown)."""
    words = _words(clause)
    first = words[0]
    second = words[1] if len(words) > 1 else ""
    if first == "ADD":
        if second == "CONSTRAINT":
            return "PRIMARY" in words
        if second in _HARMLESS_ADDS:
            return False
        if second in ("PRIMARY", "SYSTEM"):
            return True
        return _added_columns_fill(clause[1:])
    if first == "DROP":
        if second in ("PRIMARY", "PARTITION", "SYSTEM"):
            return True
        return False  # a column, an index, a key, a constraint, a period
    if first == "ALTER":
        # ALTER [COLUMN] c SET/DROP DEFAULT, SET [IN]VISIBLE; ALTER INDEX i [NOT] IGNORED
        return not ({"DEFAULT", "VISIBLE", "INVISIBLE", "IGNORED"} & set(words))
    if first in ("MODIFY", "CHANGE", "CONVERT", "TRUNCATE", "DISCARD", "IMPORT", "REPAIR"):
        return True
    if first == "RENAME":  # RENAME COLUMN moves values to another name; RENAME INDEX/KEY
        return second == "COLUMN"
    if first == "DEFAULT" or first == "CHARACTER":
        return False  # [DEFAULT] CHARACTER SET / COLLATE: the table's default only
    if first in ("WITH", "WITHOUT"):
        return "VERSIONING" in words  # WITH [OUT] VALIDATION is harmless
    if first in _TABLE_OPTIONS or first in _KEPT_PARTITIONING:
        return False
    return True


def _added_columns_fill(toks: list[Token]) -> bool:
    """Whether ``ADD [COLUMN] [IF NOT EXISTS] c type ...`` (or a parenthesized list of
    column definitions) gives existing rows a value other than NULL: NOT NULL (the type's
    implicit default), a DEFAULT, AUTO_INCREMENT/SERIAL, a generated column, a TIMESTAMP
    not declared NULL (explicit_defaults_for_timestamp=OFF makes it NOT NULL DEFAULT
    CURRENT_TIMESTAMP), system versioning."""
    words = _words(toks)
    if words[:1] == ["COLUMN"]:
        toks, words = toks[1:], words[1:]
    if words[:3] == ["IF", "NOT", "EXISTS"]:
        toks, words = toks[3:], words[3:]
    if toks[:1] == [("punct", "(")]:
        inner = toks[1:-1] if toks[-1:] == [("punct", ")")] else toks[1:]
        return any(_column_fills(c) for c in _clauses(inner))
    return _column_fills(toks)


def _column_fills(definition: list[Token]) -> bool:
    words = _words(definition)
    if len(words) < 2:
        return True  # not a column definition this parser knows
    body = words[1:]
    for i, word in enumerate(body):
        if word == "NOT" and body[i + 1:i + 2] == ["NULL"]:
            return True
        if word == "DEFAULT" and body[i + 1:i + 2] != ["NULL"]:
            return True
        if word in ("AUTO_INCREMENT", "SERIAL", "AS", "GENERATED", "VERSIONING"):
            return True
    return body[0] == "TIMESTAMP" and "NULL" not in body


# ---- the earlier, narrower questions (kept for their callers) ----------------------------


def ddl_targets(sql: str, default_db: str) -> tuple[list[TableId], list[str]]:
    """Tables (and dropped databases) a DDL statement changes; ([], []) for anything else
    (DML included)."""
    effect = statement_effect(sql, default_db)
    if effect.dml:
        return [], []
    return effect.tables, effect.databases


def resets_rows(query: str) -> bool:
    """Whether a DDL statement removes every row of a table it names without row events."""
    effect = statement_effect(query, "")
    return bool(effect.resets or effect.databases)


def rewrites_rows(query: str) -> bool:
    """Whether a DDL statement may change stored values of a table it names without row
    events."""
    effect = statement_effect(query, "")
    return bool(effect.rewrites) and not effect.dml
