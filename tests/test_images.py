"""Typed rows from canonical-JSON images: the columnar reader (``rows_from_json``) gives
exactly the table of the exact way (``rows_to_arrow``: a dict per row), or declines.

The merge source of every mirror apply is built by one of the two (``sinks/mirror.py``);
a value the reader would read differently from the exact way must make it decline, so
the property is: declined, or the same table -- and where the exact way refuses a value
(``TYPE_CONFLICT``), the reader declines too.
"""

from __future__ import annotations

import orjson
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdcflow.errors import ApplyError
from cdcflow.images import rows_from_json, rows_to_arrow

TYPES = ["int64", "float64", "string", "boolean"]

_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([2**53, 2**53 + 1, 2**63 - 1, -(2**63), 10**15, 10**16 + 1]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.1, 1.0, -0.0, 1e300, 5e-324, 0.30000000000000004, 1.5]),
    st.text(max_size=8),
    st.sampled_from(["", "1", "1.5", "true", 'a"b', "\\", "\n", "é€\u0000", "12345678901234567"]),
    st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.sampled_from(["a", "b"]), st.integers(0, 3), max_size=2),
)


@st.composite
def _tables(draw):
    names = draw(st.lists(st.sampled_from(["id", "a", "b", "c", "d"]), min_size=1, unique=True))
    types = {c: draw(st.sampled_from(TYPES)) for c in names}
    rows = draw(
        st.lists(
            st.dictionaries(st.sampled_from([*names, "extra"]), _values, max_size=6),
            min_size=0,
            max_size=8,
        )
    )
    return names, types, rows


@settings(max_examples=400, deadline=None)
@given(_tables())
def test_the_reader_gives_the_exact_table_or_declines(table):
    columns, types, rows = table
    images = pa.array([orjson.dumps(r).decode() for r in rows], pa.string())
    read = rows_from_json(images, types, columns)
    try:
        exact = rows_to_arrow(rows, types, columns)
    except ApplyError:
        assert read is None, "the exact way refuses a value the reader accepted"
        return
    if read is not None:
        assert read.schema == exact.schema
        assert read.to_pylist() == exact.to_pylist()
        for c in columns:  # 1, 1.0 and True are equal in Python: compare the types too
            assert [type(v) for v in read[c].to_pylist()] == [type(v) for v in exact[c].to_pylist()]


def test_the_common_shapes_are_read():
    # the point of the reader: the bench's and the usual Debezium images are not declined
    rows = [
        {"id": i, "name": f"n{i}", "balance": i / 4, "ok": i % 2 == 0, "note": None}
        for i in range(1000)
    ]
    types = {"id": "int64", "name": "string", "balance": "float64", "ok": "boolean"}
    columns = ["id", "name", "balance", "ok", "note", "gone"]
    images = pa.chunked_array(
        [
            pa.array([orjson.dumps(r).decode() for r in rows[:400]]),
            pa.array([orjson.dumps(r).decode() for r in rows[400:]]),
        ]
    )
    read = rows_from_json(images, types, columns)
    assert read is not None
    assert read.to_pylist() == rows_to_arrow(rows, types, columns).to_pylist()
    sliced = pa.array([orjson.dumps(r).decode() for r in rows]).slice(10, 5)
    assert (
        rows_from_json(sliced, types, columns).to_pylist()
        == rows_to_arrow(rows[10:15], types, columns).to_pylist()
    )


@pytest.mark.parametrize(
    "image, column_type",
    [
        ('{"c": 1.0}', "int64"),  # the exact way truncates to an integer
        ('{"c": 5}', "string"),  # the exact way writes "5"
        ('{"c": 9007199254740993}', "float64"),  # not exactly a double
        ('{"c": "12"}', "int64"),  # numbers carried as text
        ('{"c": {"a": 1}}', "string"),  # nested: JSON text
        ('{"c": 1}', "decimal(10,2)"),  # a type the reader does not read
    ],
)
def test_the_reader_declines_what_the_exact_way_converts(image, column_type):
    assert rows_from_json(pa.array([image]), {"c": column_type}, ["c"]) is None


def test_a_key_image_with_other_members_is_declined_when_asked():
    images = pa.array(['{"id": 1, "a": 2}'])
    assert rows_from_json(images, {"id": "int64"}, ["id"], unexpected="error") is None
    assert rows_from_json(images, {"id": "int64"}, ["id"]).to_pylist() == [{"id": 1}]


@pytest.mark.parametrize("value", [1.5, -0.25, 1e300])
def test_a_fraction_is_not_truncated_into_an_integer_column(value):
    with pytest.raises(ApplyError) as exc:
        rows_to_arrow([{"c": 1}, {"c": value}], {"c": "int64"}, ["c"])
    assert exc.value.code == "TYPE_CONFLICT" and "'c'" in exc.value.message


def test_a_whole_float_fits_an_integer_column():
    table = rows_to_arrow([{"c": 1.0}, {"c": 2}, {"c": None}], {"c": "int64"}, ["c"])
    assert table["c"].to_pylist() == [1, 2, None] and table["c"].type == pa.int64()


def _typed_tables(seed: int, n: int):
    """``n`` tables whose values all fit their column's type (NULLs too), with numbers of
    fewer than 16 digits (longer ones beside a float column are declined on purpose):
    what decoders hand the apply, so what the reader exists to read."""
    import random

    rng = random.Random(seed)
    makers = {
        "int64": lambda: rng.randint(-(10**12), 10**12),
        "float64": lambda: round(rng.uniform(-1e6, 1e6), rng.randint(0, 6)),
        "string": lambda: "".join(rng.choice('abcé€ "\\\n1') for _ in range(rng.randint(0, 8))),
        "boolean": lambda: rng.random() < 0.5,
    }
    for _ in range(n):
        columns = rng.sample(["id", "a", "b", "c", "d"], rng.randint(1, 5))
        types = {c: rng.choice(TYPES) for c in columns}
        rows = [
            {c: None if rng.random() < 0.2 else makers[types[c]]() for c in columns}
            for _ in range(rng.randint(1, 8))
        ]
        yield columns, types, rows


def test_the_reader_reads_well_typed_tables_rather_than_declining():
    # the property above holds for a reader that declines everything: this one does not
    tables = list(_typed_tables(seed=17, n=300))
    read = 0
    for columns, types, rows in tables:
        images = pa.array([orjson.dumps(r).decode() for r in rows], pa.string())
        got = rows_from_json(images, types, columns)
        if got is not None:
            read += 1
            assert got.to_pylist() == rows_to_arrow(rows, types, columns).to_pylist()
    assert read == len(tables), f"declined {len(tables) - read} of {len(tables)}"
