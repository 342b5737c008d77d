"""``cdcflow verify`` while both sides move: a writer keeps changing a real PostgreSQL
table (updates, inserts, deletes, ~40 transactions a second), Debezium's PostgreSQL
connector captures it into Apache Kafka, ``cdcflow run`` applies it every second -- and
verify, run in the middle of all that, must report no missing, extra or different key (a
key still moving is *in flight*, which is not a mismatch). Once the writer stops and the
pipeline has caught up, verify must find the mirror equal, with nothing in flight, and
each of two shards routed into one target equal to the rows that name it; and a damage
done to the mirrors meanwhile must still be found, live, in the right shard. Then
``verify --repair``, the pipeline stopped and the writer going on, mends the damages
(and the rows the stopped pipeline has not applied yet, which the stream's later changes
then overwrite in order); once the pipeline has run again and caught up, the mirrors
equal the source and every Kafka offset is accounted for once."""

from __future__ import annotations

import random
import subprocess
import threading
import time
import uuid

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable, write_deltalake
from tests.capture.helpers import postgres_connector, wait_snapshot_done
from tests.e2e.helpers import CDCFLOW, check_accounting, cli_env

from cdcflow.commands.status import brokers_log_ends
from cdcflow.commands.verify import describe, run_verify, settled
from cdcflow.config import load_config
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow.verify.verifier import VerifyOptions
from cdcflow_testkit.services.kafka_connect import ConnectStandalone
from cdcflow_testkit.services.postgres import LocalPostgres

pytestmark = [pytest.mark.kafka, pytest.mark.services, pytest.mark.slow]

ROWS = 3000
TARGET = "shop.public.accounts"
SHARDS = "shop.public.shards"


def _writer(
    pg: LocalPostgres,
    stop: threading.Event,
    counts: dict[str, int],
    spare: frozenset[int] = frozenset(),
) -> None:
    """Random single-row transactions until ``stop``: 60 % updates, 20 % inserts, 20 %
    deletes, about 40 a second; the rows of ``spare`` are never updated or deleted."""
    rng = random.Random(11 + sum(counts.values()))
    with pg.connect() as c:
        next_id = c.execute("SELECT max(id) + 1 FROM accounts").fetchone()[0]
        while not stop.is_set():
            op = rng.random()
            if op < 0.6:
                c.execute(
                    "UPDATE accounts SET balance = balance + %s, note = %s, touched = now(), "
                    "score = %s WHERE id = %s AND NOT id = ANY(%s)",
                    (
                        rng.randint(1, 999) / 100,
                        f"n{rng.random()}",
                        rng.random(),
                        rng.randint(1, next_id),
                        list(spare),
                    ),
                )
                counts["update"] += 1
            elif op < 0.8:
                c.execute("INSERT INTO accounts VALUES (%s, 1.00, 'new', now(), 0.5)", (next_id,))
                next_id += 1
                counts["insert"] += 1
            else:
                c.execute(
                    "DELETE FROM accounts WHERE id = %s AND NOT id = ANY(%s)",
                    (rng.randint(1, next_id), list(spare)),
                )
                counts["delete"] += 1
            time.sleep(0.025)


def _mirror_rows(path: str) -> int:
    try:
        return DeltaTable(path).to_pyarrow_dataset().count_rows()
    except Exception:  # noqa: BLE001 - not created yet
        return -1


def test_verify_during_live_writes_finds_no_false_mismatch(apache_kafka, tmp_path):
    slot = f"cdcflow_{uuid.uuid4().hex[:8]}"
    prefix = "live"
    with LocalPostgres() as pg:
        with pg.connect() as c:
            c.execute(
                "CREATE TABLE accounts (id bigint PRIMARY KEY, balance numeric(12, 2), "
                "note text, touched timestamptz, score double precision)"
            )
            c.execute(
                "INSERT INTO accounts SELECT i, i / 100.0, 'seed ' || i, "
                "timestamptz '2026-01-01 00:00:00+00' + i * interval '1 second', i / 7.0 "
                "FROM generate_series(1, %s) AS i",
                (ROWS,),
            )
            # two shards routed into one target, the shard named in a column
            for shard, first in (("shard_a", 1), ("shard_b", 1001)):
                c.execute(f"CREATE TABLE {shard} (id bigint PRIMARY KEY, v text)")
                c.execute(
                    f"INSERT INTO {shard} SELECT i, '{shard} ' || i "
                    f"FROM generate_series({first}, {first + 49}) AS i"
                )
        connector = postgres_connector(pg, slot, prefix)
        config_path = tmp_path / "pipeline.yaml"
        config_path.write_text(
            yaml.safe_dump(
                {
                    "pipeline_id": "live",
                    "warehouse": str(tmp_path / "wh"),
                    "checkpoint": str(tmp_path / "ck"),
                    "trigger": {"processing_time": "1 second"},
                    "kafka": {"bootstrap_servers": apache_kafka.bootstrap_servers},
                    "sources": [
                        {
                            "format": "debezium-json",
                            "topic_pattern": rf"{prefix}\..*",
                            "routes": [
                                {
                                    "source_table": r"shop\.public\.shard_.*",
                                    "target_table": "shop.public.shards",
                                    "shard_column": "source_table",
                                }
                            ],
                        }
                    ],
                }
            )
        )
        config = load_config(config_path)
        url = f"postgresql://{pg.user}@{pg.host}:{pg.port}/{pg.database}"
        mirror_path = str(tmp_path / "wh" / TARGET)
        with ConnectStandalone(apache_kafka.bootstrap_servers, {"pg": connector}) as connect:
            wait_snapshot_done(apache_kafka, prefix, connect)
            stderr = tmp_path / "run.stderr"
            run = _start(config_path, stderr)
            stop = threading.Event()
            counts = {"update": 0, "insert": 0, "delete": 0}
            writer = threading.Thread(target=_writer, args=(pg, stop, counts), daemon=True)
            try:
                deadline = time.monotonic() + 240
                while _mirror_rows(mirror_path) < ROWS:
                    assert run.poll() is None, stderr.read_text()[-3000:]
                    assert time.monotonic() < deadline, stderr.read_text()[-3000:]
                    time.sleep(1)
                writer.start()
                time.sleep(5)  # the stream is busy when verify starts

                options = VerifyOptions(
                    mode="full", chunk_rows=250, wait_s=60, rechecks=4, recheck_after_s=3
                )
                lines: list[str] = []
                moving = run_verify(config, url, options, say=lines.append)
                table = {t.target: t for t in moving.tables}[TARGET]
                print("\n".join(lines + describe(moving)), counts, sep="\n")
                assert (table.missing, table.extra, table.different) == ([], [], []), table
                assert table.rows_source > 0 and table.ranges > 1

                # the writer stops; once the pipeline has caught up, equal and nothing moves
                stop.set()
                writer.join(10)
                still = run_verify(config, url, options, say=lines.append)
                table = {t.target: t for t in still.tables}[TARGET]
                assert table.equal and table.in_flight == [], table
                assert still.caught_up is True
                # each shard against the mirror's rows that name it
                shards = {t.source_table: t for t in still.tables if t.target == SHARDS}
                assert set(shards) == {"shop.public.shard_a", "shop.public.shard_b"}
                for shard in shards.values():
                    assert shard.equal and shard.rows_source == shard.rows_mirror == 50, shard
                    assert shard.left_out_columns == {"source_table": "the shard column"}

                # a damage is still found on a live pipeline: one row deleted in the mirror
                victim = DeltaTable(mirror_path).to_pyarrow_table(columns=["id"])["id"][0].as_py()
                DeltaTable(mirror_path).delete(f"id = {victim}")
                shards_path = str(tmp_path / "wh" / SHARDS)
                DeltaTable(shards_path).update({"v": "'changed'"}, predicate="id = 1010")
                damaged = run_verify(config, url, options, say=lines.append)
                table = {t.target: t for t in damaged.tables}[TARGET]
                assert table.missing == [{"id": victim}], table
                assert (table.extra, table.different, table.in_flight) == ([], [], [])
                shards = {t.source_table: t for t in damaged.tables if t.target == SHARDS}
                assert shards["shop.public.shard_a"].equal
                assert [d["key"] for d in shards["shop.public.shard_b"].different] == [{"id": 1010}]
                print(f"moving: {moving.rounds} rounds; writes {counts}")

                # --repair while the source keeps changing: the pipeline stopped (the repair
                # takes its lease), the writer going on, an extra row added to the damages
                # the victim is spared: its repair must find it missing, not deleted meanwhile
                stop.clear()
                writer = threading.Thread(
                    target=_writer, args=(pg, stop, counts, frozenset({victim})), daemon=True
                )
                writer.start()
                _stop(run)
                extra = DeltaTable(mirror_path).to_pyarrow_table().slice(0, 1)
                at = extra.schema.get_field_index("id")
                extra = extra.set_column(at, "id", pa.array([10**9], pa.int64()))
                write_deltalake(mirror_path, extra, mode="append")
                mended = run_verify(config, url, options, say=lines.append, repair=True)
                print("\n".join(describe(mended)))
                assert settled(mended), describe(mended)  # nothing found was left unrepaired
                keys = {
                    (k.target, tuple(k.key.values())): k for r in mended.repairs for k in r.keys
                }
                assert keys[(TARGET, (10**9,))].action == "delete"
                assert keys[(SHARDS, (1010,))].outcome == "repaired"
                assert keys[(TARGET, (victim,))].found == "missing"
                repaired = sum(len(r.keys) for r in mended.repairs)

                # the writer stops, the pipeline runs again and catches up over the repair:
                # the mirrors equal the source, and every Kafka offset is accounted once
                stop.set()
                writer.join(10)
                run = _start(config_path, stderr)
                final = run_verify(config, url, options, say=lines.append)
                assert final.caught_up is True and final.equal, describe(final)
                assert all(t.in_flight == [] for t in final.tables), describe(final)
                _stop(run)
                ends, _ = brokers_log_ends(config)
                assert ends
                wh = DeltaWarehouse(str(tmp_path / "wh"))
                check_accounting(wh, sum(ends.values()) + repaired)
                print(f"repair: {repaired} keys; writes {counts}")
            finally:
                stop.set()
                _stop(run)


def _start(config_path, stderr) -> subprocess.Popen:
    """``cdcflow run CONFIG`` in the background, its stderr appended to ``stderr``."""
    with open(stderr, "ab") as err:
        return subprocess.Popen(
            [*CDCFLOW, "run", str(config_path)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=cli_env(),
            start_new_session=True,
        )


def _stop(run: subprocess.Popen) -> None:
    """Stop ``cdcflow run`` as an operator does (SIGTERM: its running apply ends)."""
    if run.poll() is not None:
        return
    run.terminate()
    try:
        run.wait(60)
    except subprocess.TimeoutExpired:
        run.kill()
        run.wait(10)
