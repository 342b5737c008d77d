"""``cdcflow verify`` against a real PostgreSQL 15: the mirrors of Debezium's real capture
(with and without schemas) equal the database they came from, and each way of damaging a
mirror is reported as exactly the keys damaged -- no more, no fewer -- whatever the range
sizes make the bisection do."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from deltalake import DeltaTable
from tests.verify.helpers import (
    PG_CAPTURES,
    config_for,
    damage,
    golden_state,
    mirror_capture,
    pg_url,
    write_config,
)

from cdcflow.cli import main
from cdcflow.verify.databases import SourceDatabase
from cdcflow.verify.verifier import VerifyOptions, verify

pytestmark = [pytest.mark.services]


def _run(pg, config, **options):
    options.setdefault("recheck_after_s", 0)
    options.setdefault("wait_s", 0)
    db = SourceDatabase(pg_url(pg))
    try:
        return verify(config, db, VerifyOptions(**options))
    finally:
        db.close()


def _by_target(run):
    return {t.target: t for t in run.tables}


@pytest.mark.parametrize("capture", PG_CAPTURES)
@pytest.mark.parametrize("chunk_rows", [100_000, 4])
def test_the_mirrors_of_a_real_capture_equal_the_database(pg, tmp_path, capture, chunk_rows):
    messages, state = golden_state(capture)
    mirror_capture(messages, tmp_path / "wh", state["schemas"])
    run = _run(pg, config_for(tmp_path / "wh", state["schemas"]), chunk_rows=chunk_rows)
    tables = _by_target(run)
    assert set(tables) == {"shop.public.customers", "shop.public.order_lines"}
    customers = tables["shop.public.customers"]
    assert customers.equal, customers
    assert (customers.rows_source, customers.rows_mirror) == (38, 38)
    # every column of the type matrix is compared; nothing left out
    assert len(customers.compared_columns) == 20 and customers.left_out_columns == {}
    # equal checksums at once: no range differed, not even by formatting
    assert customers.differing_ranges == 0
    assert customers.ranges == (1 if chunk_rows > 38 else 10)
    assert tables["shop.public.order_lines"].equal
    assert run.equal


@pytest.mark.parametrize("chunk_rows,leaf_rows", [(100_000, 256), (4, 2)])
def test_eachdamage_is_reported_as_exactly_its_key(pg, tmp_path, chunk_rows, leaf_rows):
    messages, state = golden_state(PG_CAPTURES[0])
    mirror_capture(messages, tmp_path / "wh", True)
    damage(tmp_path / "wh", "shop.public", "email")
    config = config_for(tmp_path / "wh", True)

    run = _run(pg, config, chunk_rows=chunk_rows, leaf_rows=leaf_rows, fanout=2)
    tables = _by_target(run)
    customers = tables["shop.public.customers"]
    assert not run.equal
    assert customers.missing == [{"id": 5}]
    assert customers.extra == [{"id": 777}]
    different = {d["key"]["id"]: d["columns"] for d in customers.different}
    assert set(different) == {6, 7, 9}
    assert set(different[6]) == {"name"} and different[6]["name"]["mirror"] == "renamed"
    assert set(different[7]) == {"email"} and different[7]["email"]["mirror"] is None
    assert different[7]["email"]["source"] == "c7@example.com"
    assert set(different[9]) == {"created_at"}
    created = different[9]["created_at"]  # readable: ISO 8601, naive as the column
    source, mirror = (dt.datetime.fromisoformat(created[s]) for s in ("source", "mirror"))
    assert mirror - source == dt.timedelta(microseconds=1), created
    assert customers.in_flight == [] and customers.settled == 0
    lines = tables["shop.public.order_lines"]
    assert lines.missing == [{"order_id": 8, "line_no": 1}]
    assert lines.extra == lines.different == []

    # quick: counts and key hashes see the rows lost and added, not the values
    quick = _by_target(_run(pg, config, mode="quick", chunk_rows=chunk_rows, leaf_rows=leaf_rows))
    assert quick["shop.public.customers"].missing == [{"id": 5}]
    assert quick["shop.public.customers"].extra == [{"id": 777}]
    assert quick["shop.public.customers"].different == []


def test_the_command_prints_the_keys_records_the_run_and_exits_1(pg, tmp_path, capsys):
    messages, state = golden_state(PG_CAPTURES[0])
    mirror_capture(messages, tmp_path / "wh", True)
    config_path = write_config(tmp_path)
    args = ["verify", str(config_path), "--source-db", pg_url(pg), "--wait-s", "0"]
    assert main([*args, "--recheck-after-s", "0"]) == 0
    out = capsys.readouterr().out
    assert "EQUAL: every mirror matches its source" in out

    DeltaTable(str(tmp_path / "wh" / "shop.public.customers")).delete("id = 5")
    metrics = tmp_path / "verify.prom"
    code = main([*args, "--recheck-after-s", "0", "--json", "--metrics-file", str(metrics)])
    assert code == 1
    report = json.loads(capsys.readouterr().out)
    assert report["equal"] is False
    customers = next(t for t in report["tables"] if t["target"] == "shop.public.customers")
    assert customers["missing"] == [{"id": 5}]
    assert report["source_db"].startswith("postgresql://postgres@127.0.0.1:")
    prom = metrics.read_text()
    assert 'cdcflow_verify_missing_keys{pipeline="verify",table="shop.public.customers"} 1' in prom
    assert 'cdcflow_verify_equal{pipeline="verify",table="shop.public.order_lines"} 1' in prom

    from cdcflow.commands.verify import last_verifications
    from cdcflow.sinks.warehouse import DeltaWarehouse

    last = {
        r["target_table"]: r for r in last_verifications(DeltaWarehouse(str(tmp_path / "wh")), None)
    }
    assert last["shop.public.customers"]["equal"] is False
    assert last["shop.public.customers"]["missing"] == 1
    assert json.loads(last["shop.public.customers"]["details"])["missing"] == [{"id": 5}]
    assert last["shop.public.order_lines"]["equal"] is True

    # cdcflow report shows each table's last verify
    from cdcflow.commands.report import write_report

    page = write_report(str(tmp_path / "wh"), tmp_path / "report.html").path.read_text()
    row = page[page.index("<td>shop.public.customers</td>") :].split("</tr>")[0]
    assert "differs " in row and "(full): 1 missing" in row, row
    row = page[page.index("<td>shop.public.order_lines</td>") :].split("</tr>")[0]
    assert "<span class='ok'>equal " in row, row


def test_a_bad_source_url_is_one_line_naming_the_flag(pg, tmp_path, capsys):
    config_path = write_config(tmp_path)
    assert main(["verify", str(config_path), "--source-db", "oracle://x/y"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "cdcflow: [BAD_CONFIG] --source-db oracle://x/y: give a postgresql:// or mysql:// URL "
        "(MariaDB: mysql:// too)"
    )
    assert main(["verify", str(config_path), "--source-db", "${env:CDCFLOW_NO_SUCH_VAR}"]) == 2
    assert "CDCFLOW_NO_SUCH_VAR" in capsys.readouterr().err
    # a database that does not answer: one line, the password not shown
    closed = f"postgresql://u:secret@127.0.0.1:{pg.port + 1}/shop"
    assert main(["verify", str(config_path), "--source-db", closed]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "secret" not in err, err
    assert err.startswith(
        f"cdcflow: [BAD_CONFIG] --source-db postgresql://u:***@127.0.0.1:{pg.port + 1}/shop: cannot connect ("
    )


def test_a_filtered_table_with_excluded_and_computed_columns_compares_what_lands(pg, tmp_path):
    """The source side gets the target's row filter (evaluated as the pipeline evaluates
    it) and loses the excluded column; the computed column is the mirror's only."""
    messages, state = golden_state(PG_CAPTURES[0])
    rule = {
        "match": "shop.public.customers",
        "filter": "visits > 0",
        "columns": {"exclude": ["notes"]},
        "computed_columns": {"name_upper": "upper(name)"},
    }
    config = config_for(tmp_path / "wh", True, tables=[rule])
    mirror_capture(messages, tmp_path / "wh", True, config)
    kept = [r for r in state["tables"]["customers"]["rows"] if (r["visits"] or 0) > 0]
    assert 0 < len(kept) < 38

    customers = _by_target(_run(pg, config, chunk_rows=5, leaf_rows=2, fanout=2))[
        "shop.public.customers"
    ]
    assert customers.equal, customers
    assert customers.rows_source == customers.rows_mirror == len(kept)
    assert "notes" not in customers.compared_columns and len(customers.compared_columns) == 19
    assert customers.left_out_columns == {
        "notes": "not in the mirror (excluded or not yet added)",
        "name_upper": "the mirror's only (computed or metadata)",
    }

    # the filter is not a blind spot: a kept row lost, and a filtered-out row added
    dropped = next(r for r in state["tables"]["customers"]["rows"] if (r["visits"] or 0) < 0)
    path = str(tmp_path / "wh" / "shop.public.customers")
    DeltaTable(path).delete(f"id = {kept[0]['id']}")
    DeltaTable(path).update({"id": str(dropped["id"])}, predicate=f"id = {kept[1]['id']}")
    customers = _by_target(_run(pg, config, chunk_rows=5, leaf_rows=2, fanout=2))[
        "shop.public.customers"
    ]
    assert customers.missing == [{"id": kept[0]["id"]}, {"id": kept[1]["id"]}]
    assert customers.extra == [{"id": dropped["id"]}]


def test_a_statement_over_the_timeout_is_one_line_and_exit_69(pg, tmp_path, capsys):
    """The source is protected by a statement timeout; hitting it ends verify with one
    line naming the flag (exit 69), never a traceback."""
    import pyarrow as pa
    from deltalake import write_deltalake

    with pg.connect() as c:
        c.execute(
            "CREATE TABLE IF NOT EXISTS big AS SELECT i AS id, md5(i::text) AS v "
            "FROM generate_series(1, 300000) AS i"
        )
        c.execute("ALTER TABLE big DROP CONSTRAINT IF EXISTS big_pkey")
        c.execute("ALTER TABLE big ADD PRIMARY KEY (id)")
    ids = pa.array(range(1, 300_001), pa.int64())
    write_deltalake(
        str(tmp_path / "wh" / "shop.public.big"), pa.table({"id": ids, "v": ids.cast(pa.string())})
    )
    config_path = write_config(tmp_path)
    code = main(
        [
            "verify",
            str(config_path),
            "--source-db",
            pg_url(pg),
            "--wait-s",
            "0",
            "--statement-timeout-s",
            "0.001",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 69, err
    assert "\n" not in err
    assert err.startswith("cdcflow: [SOURCE_DB_ERROR] --source-db postgresql://"), err
    assert "statement timeout" in err and err.endswith("--statement-timeout-s (0.001 s)")


def test_sample_mode_compares_only_the_ranges_it_draws(pg, tmp_path):
    messages, state = golden_state(PG_CAPTURES[0])
    mirror_capture(messages, tmp_path / "wh", True)
    config = config_for(tmp_path / "wh", True)
    run = _by_target(_run(pg, config, mode="sample", sample_ranges=3, chunk_rows=4))
    customers = run["shop.public.customers"]
    assert customers.equal and customers.ranges == 3
    assert 0 < customers.rows_source == customers.rows_mirror < 38
