"""The pure parts of verify: key ranges, their SQL, the row comparison's tolerance, and
the bisection driven by two in-memory sides (the real databases are in the other tests)."""

from __future__ import annotations

import hashlib

from cdcflow.verify.canonical import Column, readable, same_value
from cdcflow.verify.ranges import KeyRange, Row, bisect, range_predicate, row_differences


def test_a_range_is_cut_at_its_bounds_and_empty_pieces_are_dropped():
    assert KeyRange().cut([(5,), (9,)]) == [
        KeyRange(None, (5,)),
        KeyRange((5,), (9,)),
        KeyRange((9,), None),
    ]
    assert KeyRange((5,), (9,)).cut([(5,), (7,)]) == [KeyRange((5,), (7,)), KeyRange((7,), (9,))]


def test_range_predicates_compare_key_tuples():
    assert range_predicate(KeyRange(), ['"id"'], "%s") == ("TRUE", [])
    assert range_predicate(KeyRange((1,), (5,)), ['"id"'], "%s") == (
        '"id" >= %s AND "id" < %s',
        [1, 5],
    )
    where, params = range_predicate(KeyRange((1, "a"), None), ["a", 'b COLLATE "C"'], "?")
    assert (where, params) == ('(a, b COLLATE "C") >= (?, ?)', [1, "a"])


def test_floats_one_apart_in_the_last_digit_and_json_equal_once_parsed_are_the_same():
    f = Column("f", "float", "float8")
    assert same_value(f, "123456789012345e-14", "123456789012346e-14")  # a rounding edge
    assert not same_value(f, "123456789012345e-14", "123456789012347e-14")
    assert not same_value(f, "1e0", None)
    j = Column("j", "json", "jsonb")
    assert same_value(j, '{"a": 1, "b": [1, 2]}', '{"b":[1,2],"a":1}')
    assert not same_value(j, '{"a": 1}', '{"a": 2}')
    t = Column("t", "text", "text")
    assert not same_value(t, '{"a": 1}', '{"a":1}')  # a text is compared as text


def test_readable_values():
    assert readable(Column("t", "timestamp", "timestamptz", zoned=True), "1") == (
        "1970-01-01T00:00:00.000001Z"
    )
    assert readable(Column("t", "timestamp", "timestamp"), "86400000000") == "1970-01-02T00:00:00"
    assert readable(Column("d", "date", "date"), "10956") == "1999-12-31"
    assert readable(Column("w", "time", "time"), "3600000001") == "01:00:00.000001"
    assert readable(Column("f", "float", "float8"), "150000000000000e-14") == "1.5"
    assert readable(Column("s", "text", "text"), "x") == "x"


class _Side:
    """A side over a dict of rows: key -> text (the hash is MD5's low 60 bits, as SQL's)."""

    def __init__(self, rows: dict[int, str]):
        self.data = dict(sorted(rows.items()))
        self.checksums = 0

    def _in(self, r: KeyRange) -> list[int]:
        return [
            k for k in self.data if (r.lo is None or (k,) >= r.lo) and (r.hi is None or (k,) < r.hi)
        ]

    def checksum(self, r):
        self.checksums += 1
        keys = self._in(r)
        h = sum(int(hashlib.md5(f"{k}|{self.data[k]}".encode()).hexdigest()[17:], 16) for k in keys)
        return len(keys), h

    def split(self, r, parts, rows=None):
        keys = self._in(r)
        step = max(1, -(-len(keys) // parts))
        return [(k,) for k in keys[step::step]]

    def rows(self, ranges):
        return {(str(k),): Row((k,), (self.data[k],)) for r in ranges for k in self._in(r)}


def test_bisection_finds_exactly_the_differences_and_reads_few_rows():
    source = {k: f"v{k}" for k in range(10_000)}
    mirror = dict(source)
    del mirror[17]  # missing
    mirror[10_001] = "x"  # extra
    mirror[5_000] = "changed"  # different
    s, m = _Side(source), _Side(mirror)
    found, _ = bisect(s, m, [KeyRange()], [Column("v", "text", "text")], leaf_rows=16, fanout=8)
    assert {k: (d.kind, d.key, d.columns) for k, d in found.items()} == {
        ("17",): ("missing", (17,), {}),
        ("10001",): ("extra", (10_001,), {}),
        ("5000",): ("different", (5_000,), {"v": ("v5000", "changed")}),
    }
    # the cost follows the differences, not the table: a few checksums per level
    assert s.checksums < 100


def test_equal_sides_cost_one_checksum_per_range():
    rows = {k: "v" for k in range(1_000)}
    s, m = _Side(rows), _Side(dict(rows))
    ranges = KeyRange().cut([(250,), (500,), (750,)])
    found, _ = bisect(s, m, ranges, [Column("v", "text", "text")])
    assert found == {} and s.checksums == 4


def test_row_differences_name_each_column():
    cols = [Column("a", "text", "text"), Column("b", "int", "int4")]
    src = {("1",): Row((1,), ("x", "1")), ("2",): Row((2,), ("y", "2"))}
    mir = {("1",): Row((1,), ("x", "9")), ("3",): Row((3,), ("z", "3"))}
    diff = row_differences(src, mir, cols)
    assert {k: (d.kind, d.columns) for k, d in diff.items()} == {
        ("1",): ("different", {"b": ("1", "9")}),
        ("2",): ("missing", {}),
        ("3",): ("extra", {}),
    }


def test_a_key_as_read_keeps_its_type_through_a_resumed_run():
    """``--resume`` keeps each differing key as read (JSON in ``_cdcflow/verify_progress``)
    and binds it again: every type the drivers give a key comes back as it was."""
    import datetime as dt
    import decimal
    import json

    from cdcflow.verify.verifier import _typed, _untyped

    values = [
        None, True, 7, -2**63, 1.5, "text", b"\x00\xffbytes", decimal.Decimal("12.30"),
        dt.datetime(2024, 1, 2, 3, 4, 5, 6), dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC),
        dt.date(2024, 1, 2), dt.time(3, 4, 5, 6), dt.timedelta(hours=-838, microseconds=1),
    ]  # fmt: skip
    back = [_untyped(v) for v in json.loads(json.dumps([_typed(v) for v in values]))]
    assert back == values
    assert [type(v) for v in back] == [type(v) for v in values]


def test_a_missing_rows_repair_sequence_is_the_least_past_its_guards():
    """Just above the key's tombstone (the guard drops an upsert at or below it), at or
    above the table's truncate, and below every later sequence of the source, so the
    stream's next change of the key still wins."""
    from cdcflow.model import seq_key
    from cdcflow.verify.repair import _above

    tombstone = seq_key((5, 20))
    above = _above(tombstone, None)
    assert tombstone < above
    later = [seq_key((5, 21)), seq_key((6, 0)), seq_key((5, 20, 1)), seq_key((10**12, 3))]
    assert all(above < s for s in later)
    assert _above(None, None) == "" and _above(None, seq_key((9, 9))) == seq_key((9, 9))
    assert _above(tombstone, seq_key((9, 9))) == seq_key((9, 9))  # the truncate is later
    assert _above(seq_key((9, 9, 9)), seq_key((9, 9))) > seq_key((9, 9, 9))
