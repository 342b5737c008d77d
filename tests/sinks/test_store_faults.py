"""Faults between cdcflow and its store (issue 34, item 5): cdcflow's own apply
(:class:`~cdcflow.apply.batch.BatchApplier` on a :class:`~cdcflow.sinks.warehouse.DeltaWarehouse`
at an ``s3://`` URI) writes to moto's S3 server through a fault-injecting proxy
(``cdcflow_testkit.services.store_proxy``): throttling, server errors, a cut upload, a
lost commit response, latency, a store that hangs or never recovers.

Each run is read back from the store itself, past the proxy: the mirror equals the model
of the changes, every offset is accounted for once, every changelog event is there once,
and in every table's Delta log each data file is added once and each application
transaction is recorded by one commit. See docs/decisions/0066-store-faults.md.
"""

from __future__ import annotations

import pytest
from tests.apply.helpers import dele, ins, table_of, upd
from tests.e2e.helpers import check_accounting, check_changelog_once, delta_log_problems

from cdcflow.apply.batch import BatchApplier
from cdcflow.errors import StorageError
from cdcflow.sinks.faults import GLOBAL_KINDS
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow_testkit.services.store_proxy import Fault
from cdcflow_testkit.workload import mirror_by_key

pytestmark = pytest.mark.slow

TARGET = "db.items"
#: a commit of any table: ``<table>/_delta_log/<version>.json``
COMMIT = r"/_delta_log/\d+\.json$"
#: a data file of any table
DATA = r"\.parquet(\?.*)?$"


def _batches():
    """Two micro-batches of one table, offsets 0..9 then 10..16: inserts, then updates
    (a rewrite of the stored file), a delete and new keys."""
    first = [ins(k, f"n{k}", seq=k, offset=k - 1) for k in range(1, 9)] + [
        ins(9, "n9", seq=9, offset=8),
        ins(10, "n10", seq=10, offset=9),
    ]
    second = [
        upd(1, "u1", qty=2, seq=11, offset=10),
        upd(2, "u2", qty=2, seq=12, offset=11),
        dele(3, seq=13, offset=12),
        ins(11, "n11", seq=14, offset=13),
        ins(12, "n12", seq=15, offset=14),
        upd(11, "u11", qty=3, seq=16, offset=15),
        dele(10, seq=17, offset=16),
    ]
    return [first, second]


def _model(batches):
    """The mirror the changes make, by key (the source's final state)."""
    rows: dict[int, dict] = {}
    for batch in batches:
        for e in batch:
            if e.after is None:
                rows.pop(e.key["id"], None)
            else:
                rows[e.key["id"]] = dict(e.after)
    return rows


def _warehouse(moto_s3, endpoint, **options):
    uri = moto_s3.warehouse_uri()
    opts = {**moto_s3.storage_options(), "aws_endpoint_url": endpoint, **options}
    return DeltaWarehouse(uri, pipeline_id="faults", storage_options=opts)


def _check_store(moto_s3, wh, batches):
    """The warehouse read back from moto directly (not through the proxy)."""
    options = {**wh.storage_options, "aws_endpoint_url": moto_s3.endpoint_url}
    direct = DeltaWarehouse(wh.root, pipeline_id="faults", storage_options=options)
    assert mirror_by_key(direct.read(TARGET)) == _model(batches)
    records = sum(len(b) for b in batches)
    check_accounting(direct, records)
    check_changelog_once(direct)
    assert delta_log_problems(wh.root, options) == []


# --------------------------------------------------------------------------- the proxy


def test_the_proxy_forwards_signed_requests_and_counts_them(s3_store):
    """Through the proxy a table is written and read as without it, on moto and on
    S3Proxy (which checks AWS signatures: the Host header reaches it as signed)."""
    from cdcflow_testkit.services.store_proxy import StoreProxy

    with StoreProxy(s3_store.endpoint_url) as proxy:
        uri = s3_store.warehouse_uri()
        options = {**s3_store.storage_options(), "aws_endpoint_url": proxy.endpoint_url}
        wh = DeltaWarehouse(uri, pipeline_id="faults", storage_options=options)
        BatchApplier(wh).apply(table_of(*_batches()[0]), 0)
        assert len(wh.read(TARGET)) == 10
        counts = proxy.counts()
        commits = proxy.counts(COMMIT)
    assert counts[("PUT", False)] >= 5 and counts[("GET", False)] > 0
    assert not any(faulted for _, faulted in counts)
    assert commits[("PUT", False)] >= 5  # intent, mirror, changelog, progress, accounting


# --------------------------------------------------------------------------- faults survived

#: (fault, what the apply meets): each is survived by delta-rs's retries or cdcflow's
SURVIVED = {
    "503 SlowDown x3 on the mirror's commit": Fault(
        "slow_down", "PUT", rf"{TARGET}{COMMIT}", times=3
    ),
    "503 SlowDown x3 on every table's data files": Fault("slow_down", "PUT", DATA, times=3),
    "500 x3 on the changelog's commit": Fault(
        "internal_error", "PUT", rf"_cdcflow/changelog{COMMIT}", times=3
    ),
    "500 x2 on reads of the log": Fault("internal_error", "GET", COMMIT, times=2),
    "the mirror's data file upload cut after 100 bytes": Fault(
        "cut", "PUT", rf"{TARGET}/[^/]+{DATA}", after_bytes=100
    ),
    "the mirror's commit cut after 10 bytes": Fault(
        "cut", "PUT", rf"{TARGET}{COMMIT}", after_bytes=10
    ),
    "the response to the mirror's data file upload lost": Fault(
        "drop_response", "PUT", rf"{TARGET}/[^/]+{DATA}"
    ),
    "the response to the mirror's commit lost": Fault("drop_response", "PUT", rf"{TARGET}{COMMIT}"),
    "the response to the changelog's commit lost": Fault(
        "drop_response", "PUT", rf"_cdcflow/changelog{COMMIT}"
    ),
    "the response to the intent's commit lost": Fault(
        "drop_response", "PUT", rf"_cdcflow/offsets{COMMIT}"
    ),
    "the response to the accounting's commit lost": Fault(
        "drop_response", "PUT", rf"_cdcflow/batches{COMMIT}"
    ),
    "30 ms on every request": Fault("delay", seconds=0.03, times=None),
}


@pytest.mark.parametrize("fault", SURVIVED.values(), ids=SURVIVED.keys())
def test_a_transient_fault_changes_nothing_in_the_warehouse(moto_s3, store_proxy, fault):
    wh = _warehouse(moto_s3, store_proxy.endpoint_url)
    applier = BatchApplier(wh, parallel_tables=1)
    first, second = _batches()
    applier.apply(table_of(*first), 0)
    store_proxy.inject(fault)
    report = applier.apply(table_of(*second), 1)
    assert report.records == len(second)
    (taken,) = store_proxy.faults
    assert taken.hits >= 1 and (taken.times is None or taken.spent), taken  # it was met
    _check_store(moto_s3, wh, [first, second])


# --------------------------------------------------------------------------- faults that outlast

#: the retry budget of these tests (delta-rs's keys; the default is 10 retries over 180 s)
BUDGET = {"max_retries": "2", "retry_timeout": "10s"}


@pytest.mark.parametrize(
    ("fault", "options", "kind"),
    [
        (Fault("slow_down", "PUT", COMMIT, times=None), BUDGET, "unavailable"),
        (Fault("internal_error", "PUT", DATA, times=None), BUDGET, "unavailable"),
        # the mirror's alone: a store's fault, not the table's (the table is not stopped)
        (Fault("slow_down", "PUT", rf"{TARGET}/[^/]+{DATA}", times=None), BUDGET, "unavailable"),
        (Fault("hang", "PUT", COMMIT, seconds=30), {**BUDGET, "timeout": "2s"}, "unreachable"),
    ],
    ids=[
        "503 SlowDown on every commit",
        "500 on every upload",
        "503 SlowDown on the mirror's uploads",
        "a commit that hangs",
    ],
)
def test_a_fault_that_outlasts_the_retries_stops_the_run_in_one_line(
    moto_s3, store_proxy, fault, options, kind
):
    """Within the retry budget, one line of a kind no table escapes (``unavailable``: 5xx
    beyond the retries; ``unreachable``: a time-out): the run stops with exit 74
    (:mod:`cdcflow.sinks.faults`), no table is stopped, and the next run applies the batch."""
    wh = _warehouse(moto_s3, store_proxy.endpoint_url, **options)
    applier = BatchApplier(wh, parallel_tables=1)
    first, second = _batches()
    applier.apply(table_of(*first), 0)
    store_proxy.inject(fault)
    with pytest.raises(StorageError) as raised:
        applier.apply(table_of(*second), 1)
    assert raised.value.kind == kind and kind in GLOBAL_KINDS, raised.value
    assert "\n" not in str(raised.value)
    (taken,) = store_proxy.faults  # retried within the budget, then given up
    assert 1 <= taken.hits <= 1 + int(options["max_retries"]), taken
    store_proxy.clear()
    BatchApplier(wh, parallel_tables=1).apply(table_of(*second), 1)  # the next run
    _check_store(moto_s3, wh, [first, second])


@pytest.mark.parametrize("engine", ["delta-rs"])
def test_a_lost_commit_response_of_delta_rs_merge_is_not_applied_twice(
    moto_s3, store_proxy, engine
):
    """The lost-response check of every commit path, not only the Arrow merge's: the
    mirror merged by delta-rs's MERGE (``apply.merge_engine: delta-rs``), the response to
    its commit lost after the store took it."""
    uri = moto_s3.warehouse_uri()
    options = {**moto_s3.storage_options(), "aws_endpoint_url": store_proxy.endpoint_url}
    wh = DeltaWarehouse(uri, pipeline_id="faults", storage_options=options, merge_engine=engine)
    applier = BatchApplier(wh, parallel_tables=1)
    first, second = _batches()
    applier.apply(table_of(*first), 0)
    store_proxy.inject(Fault("drop_response", "PUT", rf"{TARGET}{COMMIT}"))
    report = applier.apply(table_of(*second), 1)
    assert report.records == len(second)
    (taken,) = store_proxy.faults
    assert taken.spent, taken
    _check_store(moto_s3, wh, [first, second])
