"""A small SQL-like expression language, evaluated column-wise on Arrow tables.

Used for computed columns (like Apache Paimon's Kafka CDC
``--computed_column 'order_date=date(created_at)'``) and row filters (like Flink CDC's
``transform: ... filter: "amount > 100 AND status <> 'test'"``). :func:`parse_expression` and
:func:`parse_filter` parse the text once into an :class:`Expression`; its
:meth:`~Expression.evaluate` maps the tree onto ``pyarrow.compute`` for all rows at once.

Grammar (keywords and function names in any case; column names are case-sensitive)::

    expression = or
    or         = and { OR and }
    and        = not { AND not }
    not        = NOT not | predicate
    predicate  = sum [ ( "=" | "<>" | "!=" | "<" | "<=" | ">" | ">=" ) sum
                     | IS [NOT] NULL
                     | [NOT] IN "(" literal { "," literal } ")"
                     | [NOT] LIKE string
                     | [NOT] BETWEEN sum AND sum ]       (comparisons do not chain)
    sum        = product { ( "+" | "-" | "||" ) product }
    product    = unary { ( "*" | "/" ) unary }
    unary      = "-" unary | primary
    primary    = literal | column | "(" expression ")"
               | CAST "(" expression AS type ")" | function "(" expression { "," expression } ")"
    literal    = integer (int64) | decimal like 1.5 (float64) | 'text' ('' is a quote)
               | TRUE | FALSE | NULL | DATE 'YYYY-MM-DD' | TIMESTAMP 'YYYY-MM-DD hh:mm[:ss[.ffffff]]'
                 (with a zone suffix, Z or +hh:mm, a TIMESTAMP literal is a timestamptz)
    column     = identifier [A-Za-z_][A-Za-z0-9_]* (not a keyword) | `any name` (`` is a backquote)
    type       = boolean | int32 | int64 | float32 | float64 | decimal(p,s) | string | binary
               | date | timestamp | timestamptz          (cdcflow's logical type names)

Operators: ``+ - *`` on numbers (Arrow's checked kernels: overflow is an error);
``/`` is float64 division and division by zero is an error (SQL's "division by zero"
exception, not NULL or infinity); ``||`` concatenates text (other types are cast to text);
comparisons, ``IN`` and ``BETWEEN`` bring both sides to one type first: numbers to the
widest (float64 if any float), text to the date/timestamp it is compared with, a date to
the timestamp, a naive timestamp to a timestamptz as UTC; other mixes are an error.
``LIKE`` is SQL LIKE (``%`` any run, ``_`` one character, ``\\`` escapes), case-sensitive.

Functions (``x`` may be any expression; parameters in *italics* must be literals):

===============================  ===========================================================
``date(x)``                      date32 from a timestamp (a timestamptz's UTC date), a date,
                                 or text starting ``YYYY-MM-DD``
``year/month/day/hour(x)``       int32 from a date or timestamp (timestamptz: UTC fields)
``date_format(x, 'fmt')``        string: strftime of a date or timestamp (timestamptz in UTC)
``substring(s, start[, len])``   string: SQL 1-based, *start* >= 1, *len* >= 0, in characters
``upper/lower(s)``               string
``trim(s)``                      string without leading and trailing spaces (SQL TRIM)
``length(s)``                    int32: characters
``cast(x AS type)``              Arrow's safe cast (an unparsable or out-of-range value fails
                                 that row); integers to floats round; text without a zone
                                 to timestamptz is read as UTC; timestamp <-> timestamptz
                                 keep the UTC wall clock
``coalesce(a, b, ...)``          the first non-NULL, in the arguments' common type
``concat(a, b, ...)``            string; SQL standard: any NULL argument gives NULL
``if(cond, a, b)``               ``a`` where ``cond`` is TRUE, else ``b`` (a NULL condition
                                 takes ``b``, as in CASE WHEN)
``abs(x)``                       the type of x (overflow is an error)
``round(x[, digits])``           the type of x (a decimal keeps its scale); half away from
                                 zero; *digits* may be < 0
``bucket(x, n)``                 int32 in [0, *n*): Apache Iceberg's bucket transform
===============================  ===========================================================

``bucket`` is ``(murmur3_x86_32(bytes(x)) & 0x7FFFFFFF) % n`` with Iceberg's bytes: integers
and dates (days) as 8-byte little-endian longs, timestamps as microseconds (long), text as
UTF-8, binary as is, decimals as the unscaled value's minimal two's-complement big-endian
bytes; booleans and floats have no bucket (an error).

NULL: every operator and function gives NULL for a NULL input (``concat`` too), except
``IS [NOT] NULL``, ``coalesce`` and ``if``'s condition; ``AND``/``OR``/``NOT`` are three-valued (``FALSE AND
NULL`` is FALSE, ``TRUE OR NULL`` is TRUE); ``x IN (..., NULL)`` is TRUE or NULL.

Results are Arrow arrays of one value per row (a constant is repeated); types stay Arrow's
(int32/int64, float64, decimal128, string, bool, date32, timestamp[us]); 8/16-bit and
unsigned integers are widened to int32/int64.

Sources: Paimon's computed functions
(https://paimon.apache.org/docs/master/cdc-ingestion/overview/#computed-functions), Flink
CDC's transform (https://nightlies.apache.org/flink/flink-cdc-docs-stable/docs/core-concept/transform/),
Iceberg's bucket transform (https://iceberg.apache.org/spec/#bucket-transform-details and
Appendix B, "32-bit Hash Requirements").
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import math
import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import mmh3
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.types import INT64_MAX, INT64_MIN, arrow_type

__all__ = ["Expression", "ExpressionError", "parse_expression", "parse_filter"]


class ExpressionError(ValueError):
    """An expression could not be evaluated: a value failed (a cast, a division by zero,
    an overflow), the column types do not fit the operators, or a column is missing.

    ``str(error)`` names the expression; :attr:`detail` names the failing part and, when
    one row was evaluated, shows it with that row's values, e.g.
    ``cast('abc' AS int64): Failed to parse string: 'abc' as a scalar of type int64``.
    """

    def __init__(self, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.detail = message if detail is None else detail
        self.every_row = False  # a type mismatch or a missing column, not a value's failure


class _Problem(Exception):
    """A type mismatch found while evaluating; becomes an :class:`ExpressionError`."""


# --------------------------------------------------------------------------- syntax tree


@dataclass(frozen=True, slots=True)
class _Literal:
    start: int
    end: int
    value: Any
    type: pa.DataType


@dataclass(frozen=True, slots=True)
class _Column:
    start: int
    end: int
    name: str


@dataclass(frozen=True, slots=True)
class _Op:
    """An operator or a function call: ``op`` is the operator (``+``, ``=``, ``and``,
    ``neg``, ``is_null``, ``in``, ...) or the function's lower-case name; ``params`` are its
    literal parameters (the cast type, the LIKE pattern, the IN values, a bucket count)."""

    start: int
    end: int
    op: str
    args: tuple[_Node, ...]
    params: tuple[Any, ...] = ()


_Node = _Literal | _Column | _Op

# function -> (fewest arguments, most arguments or None, index of the first literal parameter)
_FUNCTIONS: dict[str, tuple[int, int | None, int | None]] = {
    "date": (1, 1, None),
    "year": (1, 1, None),
    "month": (1, 1, None),
    "day": (1, 1, None),
    "hour": (1, 1, None),
    "date_format": (2, 2, 1),
    "substring": (2, 3, 1),
    "upper": (1, 1, None),
    "lower": (1, 1, None),
    "trim": (1, 1, None),
    "length": (1, 1, None),
    "coalesce": (1, None, None),
    "concat": (1, None, None),
    "if": (3, 3, None),
    "abs": (1, 1, None),
    "round": (1, 2, 1),
    "bucket": (2, 2, 1),
}
# literal parameters: (what, str or int, lowest, highest)
_PARAMS: dict[str, tuple[tuple[str, type, int | None, int | None], ...]] = {
    "date_format": (("format", str, None, None),),
    "substring": (("start", int, 1, None), ("length", int, 0, None)),
    "round": (("digits", int, -38, 38),),
    "bucket": (("bucket count", int, 1, 2**31 - 1),),
}
_CAST_TYPES = (
    "boolean int32 int64 float32 float64 decimal(p,s) string binary date timestamp timestamptz"
)
#: how deep an expression may nest: parentheses, function calls, NOT and unary minus while
#: parsing, and operators over operators in the parsed tree (``a + b + c`` is two deep).
#: Parsing and evaluation recurse once per level, so a bound keeps far from Python's limit.
MAX_DEPTH = 64
_RESERVED = {"AND", "OR", "NOT", "IS", "NULL", "IN", "LIKE", "BETWEEN", "TRUE", "FALSE", "AS"}
_COMPARISONS = {"=", "<>", "!=", "<", "<=", ">", ">="}
_TOKEN = re.compile(
    r"(?P<space>\s+)|(?P<num>[0-9]+(?:\.[0-9]+)?)|(?P<str>'(?:[^']|'')*')"
    r"|(?P<qid>`(?:[^`]|``)*`)|(?P<id>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<op>\|\||<>|!=|<=|>=|[-+*/=<>(),])"
)
_DATE_TEXT = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_TIMESTAMP_TEXT = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}(?:[ T][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]{1,6})?)?)?"
    r"(?P<zone>Z|[+-][0-9]{2}:[0-9]{2})?"
)


class _Token(NamedTuple):
    kind: str  # num, str, qid, id, op, end
    text: str
    pos: int
    end: int


def _tokenize(text: str, fail: Callable[[int, str], ValueError]) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            what = {"'": "unterminated string literal", "`": "unterminated quoted name"}
            raise fail(pos, what.get(text[pos], f"unexpected character {text[pos]!r}"))
        if m.lastgroup != "space":
            tokens.append(_Token(str(m.lastgroup), m.group(), pos, m.end()))
        pos = m.end()
    tokens.append(_Token("end", "", len(text), len(text)))
    return tokens


class _Parser:
    """Recursive descent over the grammar in the module docstring."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text, self.error)
        self.i = 0
        self.columns: dict[str, None] = {}
        self.depth = 0

    # ---- helpers
    def error(self, pos: int, message: str) -> ValueError:
        return ValueError(f"cannot parse {_shown(self.text)} at character {pos + 1}: {message}")

    def deeper(self, pos: int) -> None:
        """One more level of nesting, at ``pos``; refused past :data:`MAX_DEPTH`."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error(pos, _TOO_DEEP)

    def fail(self, expected: str) -> ValueError:
        tok = self.tok
        found = "the end of the expression" if tok.kind == "end" else repr(tok.text)
        return self.error(tok.pos, f"expected {expected}, found {found}")

    @property
    def tok(self) -> _Token:
        return self.tokens[self.i]

    def peek(self) -> _Token:
        return self.tokens[min(self.i + 1, len(self.tokens) - 1)]

    def advance(self) -> _Token:
        tok = self.tokens[self.i]
        self.i = min(self.i + 1, len(self.tokens) - 1)
        return tok

    def at_op(self, *ops: str) -> bool:
        return self.tok.kind == "op" and self.tok.text in ops

    @staticmethod
    def is_word(tok: _Token, *words: str) -> bool:
        return tok.kind == "id" and tok.text.upper() in words

    def expect_op(self, op: str, expected: str | None = None) -> _Token:
        if not self.at_op(op):
            raise self.fail(expected or repr(op))
        return self.advance()

    def expect_word(self, word: str) -> _Token:
        if not self.is_word(self.tok, word):
            raise self.fail(word)
        return self.advance()

    # ---- grammar
    def parse(self) -> _Node:
        node = self.or_()
        if self.tok.kind != "end":
            if self.tok.text in _COMPARISONS:
                raise self.error(self.tok.pos, "comparisons do not chain; combine them with AND")
            raise self.fail("an operator or the end of the expression")
        deep = _too_deep(node)
        if deep is not None:
            raise self.error(deep.start, _TOO_DEEP)
        return node

    def or_(self) -> _Node:
        node = self.and_()
        while self.is_word(self.tok, "OR"):
            self.advance()
            right = self.and_()
            node = _Op(node.start, right.end, "or", (node, right))
        return node

    def and_(self) -> _Node:
        node = self.not_()
        while self.is_word(self.tok, "AND"):
            self.advance()
            right = self.not_()
            node = _Op(node.start, right.end, "and", (node, right))
        return node

    def not_(self) -> _Node:
        if self.is_word(self.tok, "NOT"):
            start = self.advance().pos
            self.deeper(start)
            operand = self.not_()
            self.depth -= 1
            return _Op(start, operand.end, "not", (operand,))
        return self.predicate()

    def predicate(self) -> _Node:
        left = self.sum_()
        tok = self.tok
        if tok.kind == "op" and tok.text in _COMPARISONS:
            self.advance()
            right = self.sum_()
            return _Op(left.start, right.end, "<>" if tok.text == "!=" else tok.text, (left, right))
        if self.is_word(tok, "IS"):
            self.advance()
            negated = self.is_word(self.tok, "NOT")
            if negated:
                self.advance()
            end = self.expect_word("NULL").end
            return _Op(left.start, end, "is_not_null" if negated else "is_null", (left,))
        negated = self.is_word(tok, "NOT") and self.is_word(self.peek(), "IN", "LIKE", "BETWEEN")
        if negated:
            self.advance()
        if self.is_word(self.tok, "IN"):
            node = self.in_list(left)
        elif self.is_word(self.tok, "LIKE"):
            self.advance()
            pattern = self.tok
            if pattern.kind != "str":
                raise self.fail("a string literal (the LIKE pattern)")
            self.advance()
            node = _Op(left.start, pattern.end, "like", (left,), (_unquote(pattern.text),))
        elif self.is_word(self.tok, "BETWEEN"):
            self.advance()
            low = self.sum_()
            self.expect_word("AND")
            high = self.sum_()
            node = _Op(left.start, high.end, "between", (left, low, high))
        else:
            return left
        return _Op(node.start, node.end, "not", (node,)) if negated else node

    def in_list(self, left: _Node) -> _Node:
        self.advance()
        self.expect_op("(")
        values = []
        while True:
            item = self.unary()
            if not isinstance(item, _Literal):
                raise self.error(item.start, "an IN list holds literals (numbers, 'text', ...)")
            values.append((item.value, item.type))
            if not self.at_op(","):
                break
            self.advance()
        end = self.expect_op(")", "',' or ')'").end
        return _Op(left.start, end, "in", (left,), tuple(values))

    def sum_(self) -> _Node:
        node = self.product()
        while self.at_op("+", "-", "||"):
            op = self.advance().text
            right = self.product()
            node = _Op(node.start, right.end, op, (node, right))
        return node

    def product(self) -> _Node:
        node = self.unary()
        while self.at_op("*", "/"):
            op = self.advance().text
            right = self.unary()
            node = _Op(node.start, right.end, op, (node, right))
        return node

    def unary(self) -> _Node:
        if self.at_op("-"):
            start = self.advance().pos
            if self.tok.kind == "num":  # a negative literal: -9223372036854775808 fits
                return self.number(start, negative=True)
            self.deeper(start)
            operand = self.unary()
            self.depth -= 1
            return _Op(start, operand.end, "neg", (operand,))
        return self.primary()

    def primary(self) -> _Node:
        tok = self.tok
        if tok.kind == "num":
            return self.number(tok.pos)
        if tok.kind == "str":
            self.advance()
            return _Literal(tok.pos, tok.end, _unquote(tok.text), pa.string())
        if tok.kind == "qid":
            self.advance()
            name = tok.text[1:-1].replace("``", "`")
            if not name:
                raise self.error(tok.pos, "empty quoted name")
            return self.column(tok, name)
        if self.at_op("("):
            self.advance()
            self.deeper(tok.pos)
            inner = self.or_()
            close = self.expect_op(")", "')'")
            self.depth -= 1
            return dataclasses.replace(inner, start=tok.pos, end=close.end)
        if tok.kind != "id":
            raise self.fail("a value (a column, a literal, a function or '(')")
        word = tok.text.upper()
        if word in ("TRUE", "FALSE"):
            self.advance()
            return _Literal(tok.pos, tok.end, word == "TRUE", pa.bool_())
        if word == "NULL":
            self.advance()
            return _Literal(tok.pos, tok.end, None, pa.null())
        if word in _RESERVED:
            raise self.fail("a value (a column, a literal, a function or '(')")
        nxt = self.peek()
        if word in ("DATE", "TIMESTAMP") and nxt.kind == "str":
            return self.typed_literal()
        if nxt.kind == "op" and nxt.text == "(":
            self.deeper(tok.pos)
            node = self.cast() if word == "CAST" else self.call()
            self.depth -= 1
            return node
        self.advance()
        return self.column(tok, tok.text)

    def column(self, tok: _Token, name: str) -> _Column:
        self.columns.setdefault(name, None)
        return _Column(tok.pos, tok.end, name)

    def number(self, start: int, negative: bool = False) -> _Literal:
        tok = self.advance()
        if "." in tok.text:
            value: float | int = -float(tok.text) if negative else float(tok.text)
            if math.isinf(value):
                raise self.error(tok.pos, "number out of the float64 range")
            return _Literal(start, tok.end, value, pa.float64())
        value = -int(tok.text) if negative else int(tok.text)
        if not INT64_MIN <= value <= INT64_MAX:
            raise self.error(tok.pos, "integer out of the int64 range")
        return _Literal(start, tok.end, value, pa.int64())

    def typed_literal(self) -> _Literal:
        kind, tok = self.advance(), self.advance()
        text = _unquote(tok.text)
        try:
            if kind.text.upper() == "DATE":
                if not _DATE_TEXT.fullmatch(text):
                    raise ValueError
                return _Literal(kind.pos, tok.end, dt.date.fromisoformat(text), pa.date32())
            m = _TIMESTAMP_TEXT.fullmatch(text)
            if not m:
                raise ValueError
            value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            form = "'YYYY-MM-DD'" if kind.text.upper() == "DATE" else "'YYYY-MM-DD hh:mm:ss'"
            raise self.error(tok.pos, f"expected a {kind.text.upper()} literal {form}") from None
        if m.group("zone"):
            return _Literal(kind.pos, tok.end, value, pa.timestamp("us", tz="UTC"))
        return _Literal(kind.pos, tok.end, value, pa.timestamp("us"))

    def cast(self) -> _Op:
        start = self.advance().pos
        self.expect_op("(")
        operand = self.or_()
        self.expect_word("AS")
        type_tok = self.tok
        base = type_tok.text.lower() if type_tok.kind == "id" else ""
        if base == "decimal":
            self.advance()
            self.expect_op("(")
            precision = self.integer_token()
            self.expect_op(",")
            scale = self.integer_token()
            self.expect_op(")")
            if not (1 <= precision <= 38 and 0 <= scale <= precision):
                raise self.error(type_tok.pos, "decimal(p,s) needs 1 <= p <= 38 and 0 <= s <= p")
            name = f"decimal({precision},{scale})"
        elif base in _CAST_TYPES.split():
            self.advance()
            name = base
        else:
            raise self.fail(f"a type ({_CAST_TYPES})")
        end = self.expect_op(")", "')'").end
        return _Op(start, end, "cast", (operand,), (name,))

    def integer_token(self) -> int:
        if self.tok.kind != "num" or "." in self.tok.text:
            raise self.fail("an integer")
        return int(self.advance().text)

    def call(self) -> _Op:
        name_tok = self.advance()
        name = name_tok.text.lower()
        if name not in _FUNCTIONS:
            known = ", ".join(["cast", *_FUNCTIONS])
            raise self.error(name_tok.pos, f"unknown function {name_tok.text!r} (known: {known})")
        self.expect_op("(")
        args: list[_Node] = []
        if not self.at_op(")"):
            args.append(self.or_())
            while self.at_op(","):
                self.advance()
                args.append(self.or_())
        end = self.expect_op(")", "',' or ')'").end
        fewest, most, first_param = _FUNCTIONS[name]
        if len(args) < fewest or (most is not None and len(args) > most):
            takes = (
                f"{fewest} or more"
                if most is None
                else (str(fewest) if fewest == most else f"{fewest} to {most}")
            )
            plural = "" if takes == "1" else "s"
            raise self.error(
                name_tok.pos, f"{name}() takes {takes} argument{plural}, got {len(args)}"
            )
        if first_param is None:
            return _Op(name_tok.pos, end, name, tuple(args))
        params = []
        for arg, (what, kind, low, high) in zip(args[first_param:], _PARAMS[name], strict=False):
            value = arg.value if isinstance(arg, _Literal) else None
            if kind is str:
                ok, wants = isinstance(value, str), "a string literal"
            else:
                ok = (
                    isinstance(value, int)
                    and not isinstance(value, bool)
                    and (low is None or value >= low)
                    and (high is None or value <= high)
                )
                wants = "an integer literal" + ("" if low is None else f" from {low}")
                wants += "" if high is None else f" to {high}"
            if not ok:
                raise self.error(arg.start, f"{name}()'s {what} must be {wants}")
            params.append(value)
        return _Op(name_tok.pos, end, name, tuple(args[:first_param]), tuple(params))


_TOO_DEEP = (
    f"nested more than {MAX_DEPTH} levels deep (parentheses, functions, NOT, operators over "
    "operators); split it into computed columns, a later one reading an earlier"
)


def _shown(text: str) -> str:
    """``text`` quoted for a message, its middle left out when long."""
    return repr(text if len(text) <= 80 else f"{text[:60]}...{text[-10:]}")


def _too_deep(root: _Node) -> _Node | None:
    """The first node below more than :data:`MAX_DEPTH` operators (``None``: none is)."""
    stack: list[tuple[_Node, int]] = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, _Op):
            if depth >= MAX_DEPTH:
                return node
            stack.extend((arg, depth + 1) for arg in node.args)
    return None


def _unquote(token: str) -> str:
    return token[1:-1].replace("''", "'")


def _kind(node: _Node) -> str | None:
    """``"bool"`` / ``"value"`` where the syntax tells whether ``node`` is a condition;
    ``None`` where only the column types will (a column, ``coalesce`` of columns)."""
    if isinstance(node, _Column):
        return None
    if isinstance(node, _Literal):
        if pa.types.is_null(node.type):
            return None
        return "bool" if pa.types.is_boolean(node.type) else "value"
    if node.op in ("and", "or", "not", "is_null", "is_not_null", "in", "like", "between"):
        return "bool"
    if node.op in _COMPARISONS:
        return "bool"
    if node.op == "cast":
        return "bool" if node.params[0] == "boolean" else "value"
    if node.op in ("if", "coalesce"):
        kinds = {_kind(a) for a in (node.args[1:] if node.op == "if" else node.args)}
        return "value" if "value" in kinds else ("bool" if "bool" in kinds else None)
    return "value"


# --------------------------------------------------------------------------- the API


@dataclass(frozen=True)
class Expression:
    """A parsed expression. Picklable; parse once, evaluate on many tables.

    Attributes:
        text: the source text.
        columns: the column names it reads, in first-use order, no duplicates.
    """

    text: str
    columns: tuple[str, ...]
    _root: _Node = field(repr=False)
    _filter: bool = field(default=False, repr=False)

    def evaluate(self, table: pa.Table) -> pa.Array:
        """Evaluate over all rows of ``table`` at once.

        Args:
            table: any table holding (at least) :attr:`columns`.

        Returns:
            An array of ``table.num_rows`` values (a constant is repeated); for a filter a
            boolean array (NULL rows are "not kept", as in SQL's WHERE, at the caller's end).

        Raises:
            ExpressionError: a column is missing, the column types do not fit the
                expression, or a value fails for some row (a cast, a division by zero, an
                overflow). :meth:`evaluate_rows` tells which rows.
        """
        missing = [c for c in self.columns if c not in table.column_names]
        if missing:
            raise _every_row(self.text, f"unknown column {missing[0]!r}")
        out = _norm(_Evaluator(self.text, table).eval(self._root))
        if self._filter:
            if pa.types.is_null(out.type):
                return pa.nulls(len(out), pa.bool_())
            if not pa.types.is_boolean(out.type):
                detail = f"a filter must be a condition (boolean), this is {out.type}"
                raise _every_row(self.text, detail)
        return out

    def evaluate_rows(self, table: pa.Table) -> tuple[pa.Array, list[str | None]]:
        """Evaluate, finding the rows that fail instead of raising.

        Tries :meth:`evaluate`; when it fails, evaluates halves of the table until each
        failing row stands alone (the values are those of one-row evaluations: every
        operation is row-wise).

        Returns:
            ``(values, messages)``: ``table.num_rows`` values (NULL where the row failed;
            typed like the successful rows' result, or ``pa.null()`` if all failed) and one
            message per row, ``None`` where the row succeeded, else the failure's
            :attr:`ExpressionError.detail` (e.g. ``"cast('abc' AS int64): ..."``).
        """
        n = table.num_rows
        try:
            return self.evaluate(table), [None] * n
        except ExpressionError as exc:
            if n <= 1 or exc.every_row:
                return pa.nulls(n), [exc.detail] * n
        parts: list[tuple[pa.Array | None, list[str | None]]] = []

        def visit(offset: int, length: int) -> None:
            try:
                parts.append((self.evaluate(table.slice(offset, length)), [None] * length))
            except ExpressionError as exc:
                if length == 1:
                    parts.append((None, [exc.detail]))
                    return
                visit(offset, length // 2)
                visit(offset + length // 2, length - length // 2)

        visit(0, n // 2)
        visit(n // 2, n - n // 2)
        typ = next((a.type for a, _ in parts if a is not None), pa.null())
        values = [a.cast(typ) if a is not None else pa.nulls(len(m), typ) for a, m in parts]
        return pa.concat_arrays(values), [m for _, ms in parts for m in ms]


def _every_row(text: str, detail: str) -> ExpressionError:
    error = ExpressionError(f"cannot evaluate {text!r}: {detail}", detail)
    error.every_row = True
    return error


def _parse(text: str, is_filter: bool) -> Expression:
    parser = _Parser(text)
    root = parser.parse()
    if is_filter and _kind(root) == "value":
        raise parser.error(root.start, "filter must be a condition, e.g. amount > 0")
    return Expression(text, tuple(parser.columns), root, is_filter)


def parse_expression(text: str) -> Expression:
    """Parse a computed-column expression, e.g. ``date(created_at)``.

    Raises:
        ValueError: a one-line message ``cannot parse '<text>' at character N: expected
            ..., found ...`` (N counts from 1); also for an unknown function or cast type,
            a wrong number of arguments, or a parameter that must be a literal.
    """
    return _parse(text, is_filter=False)


def parse_filter(text: str) -> Expression:
    """Parse a row filter, e.g. ``amount > 100 AND status <> 'test'``.

    As :func:`parse_expression`; the expression must be a condition where the syntax
    tells (a comparison, AND/OR/NOT, IS NULL, IN, LIKE, BETWEEN, TRUE/FALSE, a cast to
    boolean, ``if``/``coalesce`` of conditions). A bare column, whose type only the table
    tells, is accepted and must be boolean at evaluation.

    Raises:
        ValueError: as :func:`parse_expression`, or ``... filter must be a condition, e.g.
            amount > 0`` for an arithmetic, text, function or literal value.
    """
    return _parse(text, is_filter=True)


# --------------------------------------------------------------------------- evaluation

_INT_DIGITS = {8: 3, 16: 5, 32: 10, 64: 19}
_WIDEN = {
    pa.int8(): pa.int32(),
    pa.int16(): pa.int32(),
    pa.uint8(): pa.int32(),
    pa.uint16(): pa.int32(),
    pa.uint32(): pa.int64(),
    pa.uint64(): pa.int64(),
    pa.float16(): pa.float32(),
    pa.large_string(): pa.string(),
    pa.large_binary(): pa.binary(),
    pa.date64(): pa.date32(),
}
_ZONED_TEXT = (
    r"[0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]+)?)?\s*(?:[Zz]|[+-][0-9]{2}(?::?[0-9]{2})?)$"
)
_DECIMAL_CONTEXT = decimal.Context(prec=100)


def _norm(arr: pa.Array) -> pa.Array:
    """Arrow types the evaluation works in: no dictionaries, 8/16-bit or unsigned ints."""
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    wider = _WIDEN.get(arr.type)
    return arr if wider is None else pc.cast(arr, wider)


def _is_num(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t))


def _is_moment(t: pa.DataType) -> bool:
    return bool(pa.types.is_date(t) or pa.types.is_timestamp(t))


def _common_type(types: Sequence[pa.DataType]) -> pa.DataType | None:
    """The one type values of ``types`` are compared or merged in; ``None`` if none."""
    known = [t for t in types if not pa.types.is_null(t)]
    if not known:
        return pa.null()
    if all(t == known[0] for t in known):
        return known[0]
    if all(_is_num(t) for t in known):
        if any(pa.types.is_floating(t) for t in known):
            return pa.float64()
        decimals = [t for t in known if pa.types.is_decimal(t)]
        if not decimals:
            return pa.int64()
        scale = max(t.scale for t in decimals)
        digits = max(
            [t.precision - t.scale for t in decimals]
            + [_INT_DIGITS[t.bit_width] for t in known if pa.types.is_integer(t)]
        )
        return pa.decimal128(min(38, digits + scale), scale)
    moments = [t for t in known if _is_moment(t)]
    if moments and all(_is_moment(t) or pa.types.is_string(t) for t in known):
        stamps = [t for t in moments if pa.types.is_timestamp(t)]
        if not stamps:
            return pa.date32()
        zones = {t.tz for t in stamps if t.tz}
        units = {t.unit for t in stamps}
        unit = units.pop() if len(units) == 1 else "us"
        return pa.timestamp(unit, tz=(zones.pop() if len(zones) == 1 else "UTC") if zones else None)
    return None


def _unify(arrays: Sequence[pa.Array], what: str) -> list[pa.Array]:
    common = _common_type([a.type for a in arrays])
    if common is None:
        shown = " and ".join(dict.fromkeys(str(a.type) for a in arrays))
        raise _Problem(f"{what} {shown}")
    return [_cast(a, common) for a in arrays]


def _utc(arr: pa.Array) -> pa.Array:
    """A timestamp with a zone other than UTC relabelled as UTC (the same instants)."""
    t = arr.type
    if pa.types.is_timestamp(t) and t.tz is not None and t.tz != "UTC":
        return pc.cast(arr, pa.timestamp(t.unit, "UTC"))
    return arr


def _cast(arr: pa.Array, target: pa.DataType) -> pa.Array:
    """Arrow's safe cast, and where it has none or a narrower one: integers to floats round
    (as SQL does), decimals to floats correctly rounded, integers to any decimal that holds
    the values, text without a zone to a timestamptz as UTC, a timestamptz to a date by its
    UTC date."""
    source = arr.type
    if source == target:
        return arr
    if pa.types.is_null(source):
        return pa.nulls(len(arr), target)
    if pa.types.is_integer(source) and pa.types.is_floating(target):
        return pc.cast(arr, target, safe=False)
    if pa.types.is_decimal(source) and pa.types.is_floating(target):
        # through text: Arrow's direct cast is not correctly rounded (14.20 -> 14.200000000000001)
        return pc.cast(pc.cast(arr, pa.string()), target)
    if pa.types.is_integer(source) and pa.types.is_decimal(target):
        precision = _INT_DIGITS[source.bit_width] + target.scale
        wide = (pa.decimal128 if precision <= 38 else pa.decimal256)(precision, target.scale)
        return pc.cast(pc.cast(arr, wide), target)
    if pa.types.is_string(source) and pa.types.is_timestamp(target) and target.tz:
        zoned = pc.match_substring_regex(arr, _ZONED_TEXT)
        none = pa.scalar(None, pa.string())
        with_zone = pc.cast(pc.if_else(zoned, arr, none), target)
        naive = pc.cast(pc.if_else(zoned, none, arr), pa.timestamp(target.unit))
        return pc.coalesce(with_zone, pc.cast(naive, target))
    if pa.types.is_timestamp(source) and pa.types.is_date(target):
        arr = _utc(arr)
    return pc.cast(arr, target, safe=True)


def _text(arr: pa.Array) -> pa.Array:
    return arr if pa.types.is_string(arr.type) else _cast(arr, pa.string())


def _need(arr: pa.Array, test: Callable[[pa.DataType], bool], fn: str, wants: str) -> None:
    if not (test(arr.type) or pa.types.is_null(arr.type)):
        raise _Problem(f"{fn} takes {wants}, got {arr.type}")


def _condition(arr: pa.Array, fn: str) -> pa.Array:
    _need(arr, pa.types.is_boolean, fn, "a condition (boolean)")
    return _cast(arr, pa.bool_())


def _compare(op: str, a: pa.Array, b: pa.Array) -> pa.Array:
    a, b = _unify([a, b], "cannot compare")
    if pa.types.is_null(a.type):
        return pa.nulls(len(a), pa.bool_())
    return _COMPARE[op](a, b)


_COMPARE = {
    "=": pc.equal,
    "<>": pc.not_equal,
    "<": pc.less,
    "<=": pc.less_equal,
    ">": pc.greater,
    ">=": pc.greater_equal,
}


def _arithmetic(node: _Op, args: list[pa.Array]) -> pa.Array:
    for arg in args:
        _need(arg, _is_num, node.op, "numbers")
    a, b = args
    if pa.types.is_floating(a.type) or pa.types.is_floating(b.type):  # a decimal joins as float
        a, b = (_cast(x, pa.float64()) if pa.types.is_decimal(x.type) else x for x in args)
    if node.op == "/":
        a, b = _cast(a, pa.float64()), _cast(b, pa.float64())
        return pc.divide_checked(a, b)
    if pa.types.is_null(a.type) or pa.types.is_null(b.type):
        a, b = _unify([a, b], "")
        if pa.types.is_null(a.type):
            return a
    kernel = {"+": pc.add_checked, "-": pc.subtract_checked, "*": pc.multiply_checked}
    return kernel[node.op](a, b)


def _in(node: _Op, args: list[pa.Array]) -> pa.Array:
    (x,) = args
    literals = [pa.array([value], typ) for value, typ in node.params]
    common = _common_type([x.type, *(v.type for v in literals)])
    if common is None:
        shown = ", ".join(dict.fromkeys(str(v.type) for v in literals))
        raise _Problem(f"cannot compare {x.type} with the IN list's {shown}")
    x = _cast(x, common)
    if pa.types.is_null(common):
        return pa.nulls(len(x), pa.bool_())
    values = [_cast(v, common) for v in literals if not pa.types.is_null(v.type)]
    found = pc.is_in(x, value_set=pa.concat_arrays(values) if values else pa.array([], common))
    found = pc.if_else(pc.is_valid(x), found, pa.scalar(None, pa.bool_()))
    if len(values) < len(literals):  # x IN (..., NULL) is TRUE or NULL, never FALSE
        found = pc.or_kleene(found, pa.scalar(None, pa.bool_()))
    return found


def _to_date(node: _Op, args: list[pa.Array]) -> pa.Array:
    (x,) = args
    if pa.types.is_string(x.type):
        return pc.cast(pc.utf8_slice_codeunits(x, 0, 10), pa.date32())
    _need(x, _is_moment, "date()", "a timestamp, a date or text")
    return _cast(x, pa.date32())


def _part(kernel: Callable[[pa.Array], pa.Array]) -> Callable[[_Op, list[pa.Array]], pa.Array]:
    def part(node: _Op, args: list[pa.Array]) -> pa.Array:
        (x,) = args
        _need(x, _is_moment, f"{node.op}()", "a date or a timestamp")
        if pa.types.is_null(x.type):
            return pa.nulls(len(x), pa.int32())
        if pa.types.is_date(x.type) and node.op == "hour":
            x = pc.cast(x, pa.timestamp("s"))
        return pc.cast(kernel(_utc(x)), pa.int32())

    return part


def _date_format(node: _Op, args: list[pa.Array]) -> pa.Array:
    (x,) = args
    _need(x, _is_moment, "date_format()", "a date or a timestamp")
    if pa.types.is_null(x.type):
        return pa.nulls(len(x), pa.string())
    return pc.strftime(_utc(x), format=node.params[0])


def _string_fn(kernel: Callable[..., pa.Array]) -> Callable[[_Op, list[pa.Array]], pa.Array]:
    def string_fn(node: _Op, args: list[pa.Array]) -> pa.Array:
        _need(args[0], pa.types.is_string, f"{node.op}()", "text")
        return kernel(_cast(args[0], pa.string()), *node.params)

    return string_fn


def _substring(s: pa.Array, start: int, length: int | None = None) -> pa.Array:
    return pc.utf8_slice_codeunits(s, start - 1, None if length is None else start - 1 + length)


def _coalesce(node: _Op, args: list[pa.Array]) -> pa.Array:
    args = _unify(args, "coalesce() arguments have different types:")
    return args[0] if len(args) == 1 or pa.types.is_null(args[0].type) else pc.coalesce(*args)


def _concat(node: _Op, args: list[pa.Array]) -> pa.Array:
    texts = [_text(a) for a in args]
    return texts[0] if len(texts) == 1 else pc.binary_join_element_wise(*texts, "")


def _if(node: _Op, args: list[pa.Array]) -> pa.Array:
    cond = pc.fill_null(_condition(args[0], "if()"), False)
    a, b = _unify(args[1:], "if() branches have different types:")
    return a if pa.types.is_null(a.type) else pc.if_else(cond, a, b)


def _abs(node: _Op, args: list[pa.Array]) -> pa.Array:
    _need(args[0], _is_num, "abs()", "a number")
    return args[0] if pa.types.is_null(args[0].type) else pc.abs_checked(args[0])


def _round(node: _Op, args: list[pa.Array]) -> pa.Array:
    (x,) = args
    digits = node.params[0] if node.params else 0
    _need(x, _is_num, "round()", "a number")
    if pa.types.is_null(x.type) or (pa.types.is_integer(x.type) and digits >= 0):
        return x
    return pc.round(x, ndigits=digits, round_mode="half_towards_infinity")


def _long(value: int) -> bytes:
    return struct.pack("<q", value)


def _unscaled(value: decimal.Decimal, scale: int) -> bytes:
    """Java's ``BigDecimal.unscaledValue().toByteArray()``: minimal big-endian two's
    complement."""
    n = int(value.scaleb(scale, _DECIMAL_CONTEXT))
    return n.to_bytes((n if n >= 0 else ~n).bit_length() // 8 + 1, "big", signed=True)


def _bucket(node: _Op, args: list[pa.Array]) -> pa.Array:
    (x,) = args
    count, t = node.params[0], x.type
    keys: list[bytes | None]
    if pa.types.is_null(t):
        return pa.nulls(len(x), pa.int32())
    if pa.types.is_integer(t) or pa.types.is_date32(t):  # a date: its days since 1970
        ints = pc.cast(x, pa.int32()) if pa.types.is_date32(t) else x
        keys = [None if v is None else _long(v) for v in ints.to_pylist()]
    elif pa.types.is_timestamp(t):
        per_us = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": 1}[t.unit]
        raw = pc.cast(x, pa.int64()).to_pylist()
        micros = [v if v is None else (v // 1000 if t.unit == "ns" else v * per_us) for v in raw]
        keys = [None if v is None else _long(v) for v in micros]
    elif pa.types.is_string(t):
        keys = [None if v is None else v.encode() for v in x.to_pylist()]
    elif pa.types.is_binary(t) or pa.types.is_fixed_size_binary(t):
        keys = x.to_pylist()
    elif pa.types.is_decimal(t):
        keys = [None if v is None else _unscaled(v, t.scale) for v in x.to_pylist()]
    else:
        raise _Problem(
            f"bucket() takes an integer, decimal, date, timestamp, text or binary, got {t}"
        )
    hashes = [None if k is None else (mmh3.hash(k, 0) & 0x7FFFFFFF) % count for k in keys]
    return pa.array(hashes, pa.int32())


def _logic(kernel: Callable[..., pa.Array]) -> Callable[[_Op, list[pa.Array]], pa.Array]:
    def logic(node: _Op, args: list[pa.Array]) -> pa.Array:
        return kernel(*(_condition(a, node.op.upper()) for a in args))

    return logic


def _numeric(node: _Op, args: list[pa.Array]) -> pa.Array:
    _need(args[0], _is_num, "-", "a number")
    return args[0] if pa.types.is_null(args[0].type) else pc.negate_checked(args[0])


def _like(node: _Op, args: list[pa.Array]) -> pa.Array:
    _need(args[0], pa.types.is_string, "LIKE", "text")
    return pc.match_like(_cast(args[0], pa.string()), pattern=node.params[0])


_Handler = Callable[[_Op, list[pa.Array]], pa.Array]
_HANDLERS: dict[str, _Handler] = {
    **{op: _arithmetic for op in ("+", "-", "*", "/")},
    **{op: (lambda n, a: _compare(n.op, *a)) for op in _COMPARE},
    "||": _concat,
    "neg": _numeric,
    "and": _logic(pc.and_kleene),
    "or": _logic(pc.or_kleene),
    "not": _logic(pc.invert),
    "is_null": lambda n, a: pc.is_null(a[0]),
    "is_not_null": lambda n, a: pc.is_valid(a[0]),
    "in": _in,
    "like": _like,
    "between": lambda n, a: pc.and_kleene(_compare(">=", a[0], a[1]), _compare("<=", a[0], a[2])),
    "cast": lambda n, a: _cast(a[0], arrow_type(n.params[0])),
    "date": _to_date,
    "year": _part(pc.year),
    "month": _part(pc.month),
    "day": _part(pc.day),
    "hour": _part(pc.hour),
    "date_format": _date_format,
    "substring": _string_fn(_substring),
    "upper": _string_fn(pc.utf8_upper),
    "lower": _string_fn(pc.utf8_lower),
    "trim": _string_fn(lambda s: pc.utf8_trim(s, characters=" ")),
    "length": _string_fn(pc.utf8_length),
    "coalesce": _coalesce,
    "concat": _concat,
    "if": _if,
    "abs": _abs,
    "round": _round,
    "bucket": _bucket,
}


def _sql(value: Any) -> str:
    """A value as a literal in an error message."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, str):
        shown = value if len(value) <= 60 else value[:57] + "..."
        return "'" + shown.replace("'", "''").replace("\n", "\\n").replace("\r", "\\r") + "'"
    if isinstance(value, dt.datetime):
        return f"TIMESTAMP '{value.isoformat(sep=' ')}'"
    if isinstance(value, dt.date):
        return f"DATE '{value.isoformat()}'"
    if isinstance(value, bytes):
        return f"X'{value[:30].hex()}'"
    return str(value)


class _Evaluator:
    """One evaluation of a tree over one table."""

    def __init__(self, text: str, table: pa.Table) -> None:
        self.text = text
        self.table = table
        self.one_row = table.num_rows == 1
        self.values: dict[int, pa.Array] = {}  # one-row evaluations: for the messages

    def eval(self, node: _Node) -> pa.Array:
        try:
            if isinstance(node, _Literal):
                if pa.types.is_null(node.type):
                    out = pa.nulls(self.table.num_rows)
                else:
                    out = pa.repeat(pa.scalar(node.value, node.type), self.table.num_rows)
            elif isinstance(node, _Column):
                found = self.table.schema.get_all_field_indices(node.name)
                if len(found) != 1:
                    raise _Problem(f"{len(found)} columns are named {node.name!r}")
                out = _norm(self.table.column(found[0]).combine_chunks())
            else:
                args = [self.eval(a) for a in node.args]
                out = _HANDLERS[node.op](node, args)
        except ExpressionError:
            raise
        except (_Problem, pa.ArrowException, OverflowError, decimal.DecimalException) as exc:
            message = " ".join(str(exc).splitlines()) or type(exc).__name__
            detail = f"{self.render(node)}: {message}"
            error = ExpressionError(f"cannot evaluate {self.text!r}: {detail}", detail)
            # a type mismatch fails every row alike: evaluate_rows need not look for the rows
            error.every_row = isinstance(exc, _Problem | pa.ArrowNotImplementedError)
            raise error from exc
        if self.one_row:
            self.values[id(node)] = out
        return out

    def render(self, node: _Node) -> str:
        """The failing part: with its arguments' values when one row failed."""
        source = self.text[node.start : node.end]
        if not isinstance(node, _Op) or any(id(a) not in self.values for a in node.args):
            return source
        shown = [_sql(self.values[id(a)][0].as_py()) for a in node.args]
        if node.op == "cast":
            return f"cast({shown[0]} AS {node.params[0]})"
        if node.op in _FUNCTIONS:
            return f"{node.op}({', '.join(shown + [_sql(p) for p in node.params])})"
        if node.op == "neg":
            return f"-{shown[0]}"
        if node.op in ("+", "-", "*", "/", "||", "and", "or", *_COMPARE):
            return f"{shown[0]} {node.op.upper()} {shown[1]}"
        return source
