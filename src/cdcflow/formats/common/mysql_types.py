"""MySQL column-type text, as binlog tools print it: ``"int(11) unsigned zerofill"``,
``"decimal(10,2)"``, ``"DOUBLE PRECISION"``, ``"enum('a','b')"``.

One parser (:func:`parse_mysql_type`) and the names MySQL gives each family of types;
each format maps a parsed type to its logical type with its own policy (``canal-json``:
``tinyint1_as_boolean``, ``FLOAT(p)``; DRS: JDBC codes), from these same families.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

__all__ = [
    "BIGINTS",
    "BINARIES",
    "DECIMALS",
    "DOUBLES",
    "FLOATS",
    "GEOMETRIES",
    "INTS",
    "SMALL_INTS",
    "TEXTS",
    "MysqlType",
    "parse_mysql_type",
]

#: integers that fit int32 signed or unsigned
SMALL_INTS = frozenset({"tinyint", "smallint", "mediumint", "int1", "int2", "int3", "middleint"})
#: 32-bit integers: int64 when unsigned
INTS = frozenset({"int", "integer", "int4"})
#: 64-bit integers: decimal(20,0) when unsigned
BIGINTS = frozenset({"bigint", "int8"})
FLOATS = frozenset({"float", "float4"})
DOUBLES = frozenset({"double", "double precision", "real", "float8"})
DECIMALS = frozenset({"decimal", "numeric", "dec", "fixed"})
TEXTS = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set"})
BINARIES = frozenset(
    {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob", "long varbinary"}
)
GEOMETRIES = frozenset(
    {
        "geometry",
        "point",
        "linestring",
        "polygon",
        "multipoint",
        "multilinestring",
        "multipolygon",
        "geometrycollection",
        "geomcollection",
    }
)


class MysqlType(NamedTuple):
    """A parsed MySQL column type."""

    #: the type name, lower case, without ``unsigned``/``signed``/``zerofill``
    base: str
    #: the arguments in parentheses, stripped (``("10", "2")``); empty when there are
    #: none or when they are quoted labels (ENUM, SET)
    args: tuple[str, ...]
    unsigned: bool
    #: the text in parentheses as written (ENUM and SET labels keep their case)
    raw_args: str


@lru_cache(maxsize=4096)
def parse_mysql_type(text: str) -> MysqlType:
    """``"DOUBLE PRECISION(10,7) unsigned zerofill"`` -> ``MysqlType("double precision",
    ("10", "7"), True, "10,7")``."""
    p = text.find("(")
    if p < 0:
        head, raw, tail = text, "", ""
    else:
        q = text.rfind(")")
        q = q if q > p else len(text)
        head, raw, tail = text[:p], text[p + 1 : q], text[q + 1 :]
    head_words, tail_words = head.lower().split(), tail.lower().split()
    unsigned = "unsigned" in head_words or "unsigned" in tail_words
    base = " ".join(w for w in head_words if w not in ("unsigned", "signed", "zerofill"))
    args = tuple(a.strip() for a in raw.split(",")) if raw and "'" not in raw else ()
    return MysqlType(base, args, unsigned, raw)
