"""Tables without a primary key (``keyless: full_row``) through decode, flatten and the
Delta apply: the whole row is the identity, matched NULL-safely.

The merges run with both sinks (delta-rs, and Delta Lake's Spark commands).

Input: Canal JSON shaped as Paimon's ``nonpk`` corpus case (``pkNames: []``).
"""

from __future__ import annotations

import itertools

import orjson
import pyarrow as pa
import pytest

from cdcflow.apply.batch import BatchApplier
from cdcflow.decode.batches import flatten
from cdcflow.formats import decoder_for
from cdcflow.formats.base import Record
from cdcflow.model import Origin
from cdcflow.sinks.warehouse import DeltaWarehouse

TYPES = {"v0": "VARCHAR(10)", "v1": "INT"}


def _msg(typ, data, old=None, es=1):
    return orjson.dumps(
        {
            "data": data,
            "old": old,
            "database": "non_pk",
            "es": es,
            "id": es,
            "isDdl": False,
            "mysqlType": TYPES,
            "pkNames": [],
            "sql": "",
            "sqlType": {"v0": 12, "v1": 4},
            "table": "t",
            "ts": es,
            "type": typ,
        }
    )


class _Stream:
    def __init__(self, tmp_path, keyless="full_row", factory=None):
        root = tmp_path / "wh"
        self.wh = factory(root, "kl") if factory else DeltaWarehouse(str(root), pipeline_id="kl")
        self.decoder = decoder_for("canal-json", {"keyless": keyless})
        self.offsets = itertools.count()
        self.batches = itertools.count()

    def batch(self, *messages):
        records = [Record(m, origin=Origin("t", 0, next(self.offsets))) for m in messages]
        result = self.decoder.decode_batch(records)
        events = pa.Table.from_batches([flatten(result, self.decoder.state_items, records)])
        return BatchApplier(self.wh).apply(events, next(self.batches))

    def rows(self):
        table = self.wh.open(self.wh.table_path("non_pk.t"))
        data = table.to_pyarrow_table(columns=["v0", "v1"]).to_pylist()
        return sorted((r["v0"], r["v1"]) for r in data)


def test_full_row_identity_updates_and_deletes_the_matching_row_only(tmp_path, warehouse_factory):
    s = _Stream(tmp_path, factory=warehouse_factory)
    s.batch(_msg("INSERT", [{"v0": "five", "v1": "50"}, {"v0": "six", "v1": None}], es=1))
    s.batch(_msg("UPDATE", [{"v0": "five", "v1": "51"}], old=[{"v1": "50"}], es=2))
    assert s.rows() == [("five", 51), ("six", None)]
    # a NULL column is matched NULL-safely
    s.batch(_msg("UPDATE", [{"v0": "seven", "v1": None}], old=[{"v0": "six"}], es=3))
    assert s.rows() == [("five", 51), ("seven", None)]
    s.batch(_msg("DELETE", [{"v0": "seven", "v1": None}], es=4))
    assert s.rows() == [("five", 51)]


def test_full_row_identity_in_one_batch_and_against_replays(tmp_path, warehouse_factory):
    s = _Stream(tmp_path, factory=warehouse_factory)
    s.batch(_msg("INSERT", [{"v0": "five", "v1": "51"}], es=1))
    s.batch(
        _msg("INSERT", [{"v0": "a", "v1": None}], es=2),
        _msg("UPDATE", [{"v0": "b", "v1": None}], old=[{"v0": "a"}], es=3),
        _msg("UPDATE", [{"v0": "b", "v1": "2"}], old=[{"v1": None}], es=4),
        _msg("DELETE", [{"v0": "five", "v1": "51"}], es=5),
    )
    assert s.rows() == [("b", 2)]
    s.batch(_msg("INSERT", [{"v0": "five", "v1": "51"}], es=1))  # a replayed old insert
    assert s.rows() == [("b", 2)]


def test_a_row_with_a_value_left_out_does_not_match_a_fuller_row(tmp_path, warehouse_factory):
    s = _Stream(tmp_path, factory=warehouse_factory)
    s.batch(_msg("INSERT", [{"v0": "x", "v1": "5"}, {"v0": "x", "v1": None}], es=1))
    s.batch(_msg("DELETE", [{"v0": "x", "v1": None}], es=2))
    assert s.rows() == [("x", 5)]


def test_identical_rows_are_one_row_of_the_mirror(tmp_path, warehouse_factory):
    """The documented limit: without a row id, exact duplicates collapse."""
    s = _Stream(tmp_path, factory=warehouse_factory)
    s.batch(_msg("INSERT", [{"v0": "dup", "v1": "1"}, {"v0": "dup", "v1": "1"}], es=1))
    assert s.rows() == [("dup", 1)]


@pytest.mark.parametrize("keyless", ["dead_letter"])
def test_by_default_a_keyless_change_is_a_missing_key_dead_letter(tmp_path, keyless):
    s = _Stream(tmp_path, keyless)
    report = s.batch(_msg("INSERT", [{"v0": "five", "v1": "50"}], es=1))
    assert dict(report.dead_letters) == {"MISSING_KEY": 1}
