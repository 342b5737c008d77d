"""The mirror comparator every end-to-end, oracle, fault and demo check relies on must see
what a wrong merge leaves: a second row for a key, a column too many, a value of another
type. Each case breaks one thing in an otherwise equal mirror."""

from __future__ import annotations

import decimal

import pyarrow as pa
import pytest

from cdcflow_testkit.workload import compare_with_mirror, mirror_by_key

SOURCE = [
    {"id": 1, "name": "a", "balance": decimal.Decimal("1.50"), "active": True},
    {"id": 2, "name": "b", "balance": None, "active": False},
]


def mirror(rows, **extra_columns) -> pa.Table:
    table = pa.Table.from_pylist(
        rows,
        schema=pa.schema(
            [
                ("id", pa.int64()),
                ("name", pa.string()),
                ("balance", pa.decimal128(10, 2)),
                ("active", pa.bool_()),
            ]
        ),
    )
    for name, values in extra_columns.items():
        table = table.append_column(name, pa.array(values))
    return table


def test_an_equal_mirror_has_no_differences():
    bookkeeping = mirror(SOURCE, _cdc_seq=[7, 8])  # _cdc_* columns are the pipeline's own
    assert compare_with_mirror(SOURCE, bookkeeping, ["id"]) == []


def test_a_second_row_for_a_key_is_a_difference():
    doubled = mirror([*SOURCE, {**SOURCE[0], "name": "a"}])
    assert compare_with_mirror(SOURCE, doubled, ["id"]) == [
        "3 rows, expected 2",
        "key (1,) stands 2 times",
    ]


def test_a_column_the_source_never_had_is_a_difference():
    extra = mirror(SOURCE, leftover=[None, None])
    assert compare_with_mirror(SOURCE, extra, ["id"]) == [
        "columns the source does not have: ['leftover']"
    ]


def test_values_compare_with_their_type():
    source = [{"id": 1, "score": 1.0, "flag": True}]
    as_ints = pa.Table.from_pylist([{"id": 1, "score": 1, "flag": 1}])
    assert compare_with_mirror(source, as_ints, ["id"]) == [
        "row (1,) column 'score': expected 1.0, got 1",
        "row (1,) column 'flag': expected True, got 1",
    ]


def test_missing_and_unexpected_rows():
    other = mirror([SOURCE[0], {**SOURCE[1], "id": 3}])
    assert compare_with_mirror(SOURCE, other, ["id"]) == ["missing row (2,)", "unexpected row (3,)"]


def test_mirror_by_key_fails_on_a_key_stored_twice():
    assert mirror_by_key(mirror(SOURCE), column="name") == {1: "a", 2: "b"}
    assert mirror_by_key(mirror(SOURCE, _cdc_seq=[7, 8]))[2] == {
        "id": 2,
        "name": "b",
        "balance": None,
        "active": False,
    }
    doubled = mirror([*SOURCE, {**SOURCE[0], "name": "z"}])
    with pytest.raises(AssertionError, match=r"keys stored more than once: 1 2 times"):
        mirror_by_key(doubled, column="name")
    pairs = [{"id": 1, "k2": "x"}, {"id": 1, "k2": "y"}, {"id": 1, "k2": "x"}]
    with pytest.raises(AssertionError, match=r"\(1, 'x'\) 2 times"):
        mirror_by_key(pairs, ("id", "k2"))
