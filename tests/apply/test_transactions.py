"""Transaction-consistent micro-batches (apply/transactions.py).

Events are real messages decoded by the format decoders and flattened to EVENT_SCHEMA rows:
the golden cases under tests/formats/cases/ (their SOURCES.md say where each comes from).
Where a scenario needs a message the sources do not show, it is a documented message
changed in the one field named next to it.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from cdcflow.apply.transactions import (
    HELD_SCHEMA,
    TransactionPolicy,
    batch_clock_ms,
    load_pending,
    save_pending,
    split_transactions,
)
from cdcflow.decode.batches import flatten
from cdcflow.event_schema import KIND_EVENT
from cdcflow.formats import decoder_for
from cdcflow.formats.base import Record
from cdcflow.model import Origin
from cdcflow.sinks.warehouse import DeltaWarehouse

CASES = Path(__file__).parents[1] / "formats" / "cases"
POLICY = TransactionPolicy()


def lines(fmt: str, case: str) -> list[bytes]:
    path = CASES / fmt / f"{case}.input.jsonl"
    return [line for line in path.read_bytes().splitlines() if line.strip()]


def records(values: list[bytes], topic: str = "t", partition: int = 0, first: int = 0):
    return [
        Record(value=v, key=None, origin=Origin(topic, partition, first + i))
        for i, v in enumerate(values)
    ]


def events(decoder, recs: list[Record]) -> pa.Table:
    """EVENT_SCHEMA rows of kind event, as the applier gets them."""
    table = pa.Table.from_batches([flatten(decoder.decode_batch(recs))])
    return table.filter(pc.equal(table["kind"], KIND_EVENT))


def coords(table: pa.Table) -> list[tuple[str, int, int]]:
    return list(
        zip(
            table["topic"].to_pylist(),
            table["partition"].to_pylist(),
            table["offset"].to_pylist(),
            strict=True,
        )
    )


# Maxwell (SeaTunnel e2e data): xid 246 = 8 rows (xoffset 0..7) + its "commit": true row,
# then xids 248, 250, 252 of one committed row each
MAXWELL = lines("maxwell-json", "seatunnel-e2e-maxwell-data")


def maxwell():
    return decoder_for("maxwell-json", {"primary_keys": {"*": ["id"]}})


def test_a_whole_transaction_in_one_batch_is_applied_at_once():
    # Qlik Replicate: MD, a full-load row, then txn 2A51C (counter 1 last=false, counter 2
    # last=true) and two one-event transactions
    decoder = decoder_for("qlik-json", None)
    batch = events(decoder, records(lines("qlik-json", "full-load-and-cdc")))
    split = split_transactions(batch, None, 1_000, 7, POLICY)
    assert split.ready.equals(batch)
    assert split.held.num_rows == 0 and split.held.schema == HELD_SCHEMA
    assert (split.complete, split.released_open, split.held_transactions) == (3, 0, 0)
    assert split.max_wait_ms == 0


def test_a_transaction_split_across_batches_is_held_then_released_whole():
    decoder = maxwell()
    first = events(decoder, records(MAXWELL[:5]))  # xid 246, xoffset 0..4
    second = events(decoder, records(MAXWELL[5:], first=5))  # 246 rest + commit, 248, ...

    s1 = split_transactions(first, None, 10_000, 1, POLICY)
    assert s1.ready.num_rows == 0
    assert coords(s1.held) == coords(first)
    assert s1.held["held_since_ms"].to_pylist() == [10_000] * 5
    assert s1.held["held_batch_id"].to_pylist() == [1] * 5
    assert (s1.complete, s1.held_transactions) == (0, 1)

    s2 = split_transactions(second, s1.held, 12_500, 2, POLICY)
    # held rows first, then the batch's, in source order: the whole of 246, then the rest
    assert [o for _, _, o in coords(s2.ready)] == list(range(len(MAXWELL)))
    assert s2.ready["txn_id"].to_pylist()[:9] == ["246"] * 9
    assert s2.held.num_rows == 0
    assert (s2.complete, s2.released_open, s2.held_transactions) == (4, 0, 0)
    assert s2.max_wait_ms == 2_500


def test_wherever_a_batch_ends_no_transaction_is_applied_in_two_batches():
    for cut in range(len(MAXWELL) + 1):
        decoder = maxwell()
        a = events(decoder, records(MAXWELL[:cut]))
        b = events(decoder, records(MAXWELL[cut:], first=cut))
        s1 = split_transactions(a, None, 0, 1, POLICY)
        s2 = split_transactions(b, s1.held, 1, 2, POLICY)
        assert s2.held.num_rows == 0
        applied_in: dict[str, set[int]] = {}
        for n, ready in enumerate((s1.ready, s2.ready)):
            for txn in ready["txn_id"].to_pylist():
                applied_in.setdefault(txn, set()).add(n)
        assert all(len(batches) == 1 for batches in applied_in.values()), (cut, applied_in)
        assert sorted(o for _, _, o in coords(s1.ready) + coords(s2.ready)) == list(
            range(len(MAXWELL))
        )


def test_an_open_transaction_is_released_after_max_wait_ms():
    decoder = maxwell()
    open_246 = events(decoder, records(MAXWELL[:5]))
    nothing = open_246.slice(0, 0)
    s1 = split_transactions(open_246, None, 100_000, 1, POLICY)
    s2 = split_transactions(nothing, s1.held, 100_000 + 59_999, 2, POLICY)
    assert s2.ready.num_rows == 0 and s2.held_transactions == 1
    s3 = split_transactions(nothing, s2.held, 100_000 + 60_000, 3, POLICY)
    assert coords(s3.ready) == coords(open_246)
    assert (s3.complete, s3.released_open, s3.held_transactions) == (0, 1, 0)
    assert s3.max_wait_ms == 60_000


def test_max_wait_ms_zero_holds_nothing():
    batch = events(maxwell(), records(MAXWELL[:5]))
    split = split_transactions(batch, None, 5, 1, TransactionPolicy(max_wait_ms=0))
    assert split.ready.equals(batch) and split.released_open == 1


def test_held_events_above_max_events_release_the_oldest_open_transactions():
    policy = TransactionPolicy(max_events=5)
    open_246 = events(maxwell(), records(MAXWELL[:5]))  # 5 events: at the bound, held
    s1 = split_transactions(open_246, None, 0, 1, policy)
    assert s1.held.num_rows == 5
    # Qlik txn 2A51C's first event (last=false): a younger open transaction
    qlik = events(decoder_for("qlik-json", None), records(lines("qlik-json", "full-load-and-cdc")))
    younger = qlik.filter(pc.equal(qlik["txn_last"], False))
    s2 = split_transactions(younger, s1.held, 1, 2, policy)
    assert coords(s2.ready) == coords(open_246)  # the oldest went
    assert coords(s2.held) == coords(younger)
    assert (s2.released_open, s2.held_transactions, s2.max_wait_ms) == (1, 1, 1)


def test_a_transaction_larger_than_max_events_is_never_held():
    batch = events(maxwell(), records(MAXWELL[:5]))
    split = split_transactions(batch, None, 0, 1, TransactionPolicy(max_events=4))
    assert split.ready.equals(batch) and split.held.num_rows == 0
    assert split.released_open == 1


def test_events_without_a_transaction_the_format_ends_pass_through():
    # an open Maxwell transaction is held while, beside it: Maxwell rows without xid,
    # Debezium PostgreSQL events whose txn is source.txId only (no transaction metadata:
    # no END will come), a Qlik full-load row without transaction fields
    held = split_transactions(events(maxwell(), records(MAXWELL[:5])), None, 0, 1, POLICY).held
    free = [
        events(maxwell(), records(lines("maxwell-json", "docs-dataformat")[1:5], "m2")),
        events(
            decoder_for("debezium-json", {"primary_keys": {"*": ["id"]}}),
            records(lines("debezium-json", "docs-postgresql-changes"), "pg"),
        ),
        events(
            decoder_for("qlik-json", None),
            records(lines("qlik-json", "full-load-and-cdc")[:2], "q"),
        ),
    ]
    batch = pa.concat_tables(free)
    assert pc.count(batch["txn_id"]).as_py() == 4  # Debezium's txId 556 is there
    split = split_transactions(batch, held, 10, 2, POLICY)
    assert split.ready.equals(batch)
    assert coords(split.held) == coords(held) and split.held_transactions == 1


def test_shareplex_operation_1_of_11_waits_for_the_other_ten():
    # DTS SharePlex JSON, the document's examples: an insert with trans/seq 1/size 11,
    # then an update and a delete without transaction fields
    options = {"primary_keys": {"CL_BIZ1.MIO_LOG": ["MIO_LOG_ID"]}}
    case = lines("shareplex-json", "doc-examples-corrected")
    batch = events(decoder_for("shareplex-json", options), records(case))
    split = split_transactions(batch, None, 0, 1, POLICY)
    assert split.held["txn_id"].to_pylist() == ["7.0.411499"]
    assert [o for _, _, o in coords(split.ready)] == [1, 2]


def _debezium_second_event() -> bytes:
    """The documented data event of txn ``...:10`` as its second event: another table
    (``orders``), ``total_order`` 2, another key."""
    doc = orjson.loads(lines("debezium-json", "docs-mysql-transaction")[1])
    doc["source"]["table"] = "orders"
    doc["after"]["pk"] = "3"
    doc["transaction"]["total_order"] = "2"
    return orjson.dumps(doc)


def test_debezium_end_completes_only_with_event_count_data_events():
    # BEGIN, one data event, END with event_count 2 (the document's own example)
    doc = lines("debezium-json", "docs-mysql-transaction")
    options = {"primary_keys": {"*": ["pk"]}}
    decoder = decoder_for("debezium-json", options)
    begin_data_end = events(decoder, records(doc))
    s1 = split_transactions(begin_data_end, None, 0, 1, POLICY)
    assert s1.ready.num_rows == 0 and s1.held_transactions == 1  # END seen, 1 of 2 events

    late = events(decoder, records([_debezium_second_event()], "data", 1, 40))
    s2 = split_transactions(late, s1.held, 3, 2, POLICY)
    assert s2.ready["op"].to_pylist() == ["begin", "insert", "commit", "insert"]
    assert s2.ready["table"].to_pylist()[-1] == "orders"
    assert (s2.complete, s2.held_transactions, s2.max_wait_ms) == (1, 0, 3)

    together = events(
        decoder_for("debezium-json", options), records([*doc, _debezium_second_event()])
    )
    assert split_transactions(together, None, 0, 1, POLICY).complete == 1


def test_debezium_data_events_with_transaction_metadata_wait_for_their_end():
    # a data event with the transaction block arrives before its BEGIN / END records
    doc = lines("debezium-json", "docs-mysql-transaction")
    decoder = decoder_for("debezium-json", {"primary_keys": {"*": ["pk"]}})
    data = events(decoder, records(doc[1:2], "data"))
    s1 = split_transactions(data, None, 0, 1, POLICY)
    assert s1.ready.num_rows == 0 and s1.held_transactions == 1


def test_events_arriving_after_their_end_wait_as_an_open_transaction():
    # xid 246's commit row (another partition) and xoffset 0..4 come in batch 1; its
    # rows xoffset 5..7 are read one batch behind
    decoder = maxwell()
    b1 = pa.concat_tables(
        [events(decoder, records(MAXWELL[:5])), events(decoder, records(MAXWELL[8:9], "t", 1))]
    )
    s1 = split_transactions(b1, None, 0, 1, POLICY)
    assert s1.ready.equals(b1) and s1.complete == 1
    b2 = events(decoder, records(MAXWELL[5:8], first=5))
    s2 = split_transactions(b2, s1.held, 1_000, 2, POLICY)
    assert s2.ready.num_rows == 0 and s2.held_transactions == 1  # nothing remembers 246
    s3 = split_transactions(b2.slice(0, 0), s2.held, 61_000, 3, POLICY)
    assert coords(s3.ready) == coords(b2) and s3.released_open == 1


# DataWorks: TRANSACTION_BEGIN / TRANSACTION_END carry no transaction id. The messages are
# the document's heartbeat message with payload.op (one of the op values the document
# lists) and a sequenceId; the data rows are the document's insert example.
DW_HEARTBEAT = lines("dataworks-json", "doc-heartbeat")[0]
DW_INSERT = lines("dataworks-json", "doc-insert")[0]


def dw(op: str, seq: int) -> bytes:
    if op == "INSERT":
        doc = orjson.loads(DW_INSERT)
    else:
        doc = orjson.loads(DW_HEARTBEAT)
        doc["payload"]["op"] = op
    doc["payload"]["sequenceId"] = str(seq)
    return orjson.dumps(doc)


def test_dataworks_begin_and_end_bracket_a_transaction_in_its_partition():
    decoder = decoder_for("dataworks-json", None)
    first = [dw("INSERT", 1), dw("TRANSACTION_BEGIN", 2), dw("INSERT", 3), dw("INSERT", 4)]
    second = [
        dw("INSERT", 5),
        dw("TRANSACTION_END", 6),
        dw("INSERT", 7),  # between transactions: passes
        dw("TRANSACTION_END", 8),  # no BEGIN open: passes
        dw("TRANSACTION_BEGIN", 9),
        dw("INSERT", 10),
    ]
    # partition 1 starts inside a transaction whose BEGIN was never read: it passes
    other = events(decoder, records([dw("INSERT", 1), dw("TRANSACTION_END", 2)], "t", 1))
    b1 = pa.concat_tables([events(decoder, records(first)), other])
    s1 = split_transactions(b1, None, 0, 1, POLICY)
    assert coords(s1.ready) == [("t", 0, 0), ("t", 1, 0), ("t", 1, 1)]
    assert [o for _, _, o in coords(s1.held)] == [1, 2, 3]
    assert (s1.complete, s1.held_transactions) == (0, 1)

    s2 = split_transactions(events(decoder, records(second, first=4)), s1.held, 5, 2, POLICY)
    assert [o for _, _, o in coords(s2.ready)] == [1, 2, 3, 4, 5, 6, 7]
    assert s2.ready["op"].to_pylist()[:5] == ["begin", "insert", "insert", "insert", "commit"]
    assert [o for _, _, o in coords(s2.held)] == [8, 9]
    assert (s2.complete, s2.held_transactions) == (1, 1)

    # the next BEGIN in the partition closes the open one (its END never came)
    third = events(decoder, records([dw("TRANSACTION_BEGIN", 11)], first=10))
    s3 = split_transactions(third, s2.held, 6, 3, POLICY)
    assert [o for _, _, o in coords(s3.ready)] == [8, 9]
    assert [o for _, _, o in coords(s3.held)] == [10]
    assert (s3.complete, s3.released_open) == (1, 0)


def test_policy_bounds_must_not_be_negative():
    with pytest.raises(ValueError, match="max_wait_ms"):
        TransactionPolicy(max_wait_ms=-1)


# --------------------------------------------------------------------------- persistence


def test_pending_transactions_survive_batches_and_replays(tmp_path):
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="p.maxwell")
    source = "p.maxwell"
    decoder = maxwell()
    first = events(decoder, records(MAXWELL[:5]))
    second = events(decoder, records(MAXWELL[5:], first=5))
    assert load_pending(wh, source, 0) is None  # no table yet

    # batch 0 holds xid 246's first five rows
    s0 = split_transactions(first, load_pending(wh, source, 0), 1_000, 0, POLICY)
    assert save_pending(wh, source, s0.held, wh.commit_context(0), now_ms=1_000)
    assert load_pending(wh, source, 1).to_pylist() == s0.held.to_pylist()

    # batch 1 releases them: the empty snapshot is recorded, so they are not loaded again
    held = load_pending(wh, source, 1)
    s1 = split_transactions(second, held, 2_000, 1, POLICY)
    assert s1.held.num_rows == 0 and s1.ready.num_rows == len(MAXWELL)
    assert save_pending(wh, source, s1.held, wh.commit_context(1), now_ms=2_000)
    assert load_pending(wh, source, 2) is None

    # batch 1 replayed after a crash: same snapshot in, same clock, nothing written again
    assert load_pending(wh, source, 1).to_pylist() == s0.held.to_pylist()
    assert batch_clock_ms(wh, source, 1, 999_999) == 2_000
    assert not save_pending(wh, source, s1.held, wh.commit_context(1), now_ms=999_999)
    assert load_pending(wh, source, 2) is None

    # batch 2 holds nothing after an empty snapshot: nothing to record
    assert not save_pending(
        wh, source, HELD_SCHEMA.empty_table(), wh.commit_context(2), now_ms=3_000
    )
    assert batch_clock_ms(wh, source, 2, 4_000) == 4_000
    assert load_pending(wh, source, 3) is None

    # another source's snapshots are its own
    other = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="p.other")
    assert save_pending(other, "p.other", s0.held, other.commit_context(5), now_ms=1)
    assert load_pending(wh, source, 6) is None
    assert load_pending(other, "p.other", 6).num_rows == 5


def test_a_replayed_batch_splits_as_its_first_run_did(tmp_path):
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="p.s")
    batch = events(maxwell(), records(MAXWELL[:5]))
    s0 = split_transactions(batch, None, 0, 0, POLICY)
    save_pending(wh, "p.s", s0.held, wh.commit_context(0), now_ms=0)
    first_run = split_transactions(batch.slice(0, 0), load_pending(wh, "p.s", 1), 30_000, 1, POLICY)
    assert save_pending(wh, "p.s", first_run.held, wh.commit_context(1), now_ms=30_000)
    # the process dies before the mirrors commit; Spark re-runs batch 1 two minutes later
    late_clock = 150_000
    assert (
        split_transactions(
            batch.slice(0, 0), load_pending(wh, "p.s", 1), late_clock, 1, POLICY
        ).released_open
        == 1
    )  # what a fresh clock would do: apply rows the snapshot still holds
    now = batch_clock_ms(wh, "p.s", 1, late_clock)
    replay = split_transactions(batch.slice(0, 0), load_pending(wh, "p.s", 1), now, 1, POLICY)
    assert replay.ready.num_rows == 0 and replay.held.equals(first_run.held)
