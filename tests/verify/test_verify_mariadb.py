"""``cdcflow verify`` against a real MariaDB 10.11: the mirrors of Debezium's real MariaDB
capture (with and without schemas: ``TINYINT(1)``, ``DECIMAL``, ``FLOAT``, ``TIME(6)``,
``DATETIME(6)``, ``TIMESTAMP(6)``, ``BLOB``, ``JSON``, ``ENUM``, ``SET``) equal the
database, and each damage is reported as exactly its key."""

from __future__ import annotations

import datetime as dt

import pytest
from tests.verify.helpers import config_for, damage, fill_mariadb, golden_state, mirror_capture

from cdcflow.commands.verify import run_verify, settled
from cdcflow.verify.databases import SourceDatabase
from cdcflow.verify.verifier import VerifyOptions, verify
from cdcflow_testkit.services.mariadb import LocalMariaDB

pytestmark = [pytest.mark.services]

CAPTURES = ["debezium-mariadb", "debezium-mariadb-schemaless"]


@pytest.fixture(scope="module")
def mariadb():
    with LocalMariaDB() as server:
        _, state = golden_state(CAPTURES[0])
        fill_mariadb(server, state)
        yield server


def _run(db_server, config, **options):
    options.setdefault("recheck_after_s", 0)
    options.setdefault("wait_s", 0)
    s = db_server
    db = SourceDatabase(f"mysql://{s.user}:{s.password}@{s.host}:{s.port}/{s.database}")
    try:
        return {t.target: t for t in verify(config, db, VerifyOptions(**options)).tables}
    finally:
        db.close()


@pytest.mark.parametrize("capture", CAPTURES)
def test_the_mirrors_of_a_real_mariadb_capture_equal_the_database(mariadb, tmp_path, capture):
    messages, state = golden_state(capture)
    mirror_capture(messages, tmp_path / "wh", state["schemas"])
    tables = _run(mariadb, config_for(tmp_path / "wh", state["schemas"]), chunk_rows=8)
    assert set(tables) == {"shop.customers", "shop.order_lines"}
    customers = tables["shop.customers"]
    assert customers.equal, customers
    assert (customers.rows_source, customers.rows_mirror) == (28, 28)
    assert len(customers.compared_columns) == 18 and customers.left_out_columns == {}
    assert tables["shop.order_lines"].equal


def test_each_damage_of_a_mariadb_mirror_is_reported_as_exactly_its_key(mariadb, tmp_path):
    messages, state = golden_state(CAPTURES[0])
    mirror_capture(messages, tmp_path / "wh", True)
    damage(tmp_path / "wh", "shop", "balance")
    tables = _run(mariadb, config_for(tmp_path / "wh", True), chunk_rows=4, leaf_rows=2, fanout=2)
    customers = tables["shop.customers"]
    assert customers.missing == [{"id": 5}]
    assert customers.extra == [{"id": 777}]
    different = {d["key"]["id"]: d["columns"] for d in customers.different}
    assert {k: set(v) for k, v in different.items()} == {
        6: {"name"},
        7: {"balance"},
        9: {"created_at"},
    }
    assert different[7]["balance"]["mirror"] is None
    created = different[9]["created_at"]
    source, mirror = (dt.datetime.fromisoformat(created[s]) for s in ("source", "mirror"))
    assert mirror - source == dt.timedelta(microseconds=1), created
    assert tables["shop.order_lines"].missing == [{"order_id": 8, "line_no": 1}]


@pytest.mark.parametrize("capture", CAPTURES)
def test_repair_mends_each_damage_of_a_mariadb_mirror(mariadb, tmp_path, capture):
    """Every column of the type matrix written back in the mirror's types (the deleted
    row 5 whole: ``TIME`` as PyMySQL's timedelta, ``SET``, ``BLOB``, ``JSON``...; with
    schemas and without, where times are integers and bytes base64 text)."""
    messages, state = golden_state(capture)
    mirror_capture(messages, tmp_path / "wh", state["schemas"])
    damage(tmp_path / "wh", "shop", "balance")
    config = config_for(tmp_path / "wh", state["schemas"])
    s = mariadb
    url = f"mysql://{s.user}:{s.password}@{s.host}:{s.port}/{s.database}"
    options = VerifyOptions(recheck_after_s=0, wait_s=0)
    run = run_verify(config, url, options, say=lambda line: None, repair=True)
    [report] = run.repairs
    assert sorted(
        (k.target, k.key.get("id", k.key.get("order_id")), k.outcome) for k in report.keys
    ) == [
        ("shop.customers", 5, "repaired"),
        ("shop.customers", 6, "repaired"),
        ("shop.customers", 7, "repaired"),
        ("shop.customers", 9, "repaired"),
        ("shop.customers", 777, "repaired"),
        ("shop.order_lines", 8, "repaired"),
    ]
    assert settled(run)
    tables = _run(mariadb, config, chunk_rows=4, leaf_rows=2, fanout=2)
    assert all(t.equal for t in tables.values()), tables
