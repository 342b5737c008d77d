"""``cdcflow-demo`` (``make demo``): the whole pipeline on the embedded default, checked against its source.

1. start the embedded broker (tansu) on 127.0.0.1 with a free port;
2. for every format: a topic with 2 partitions, a workload of inserts, updates and
   deletes over three tables (one with a composite key), encoded as that replication
   tool publishes it, keyed so each row's changes stay in one partition, plus two
   malformed records that must end in the dead-letter table;
3. run the pipeline once over all topics (local Spark, Delta tables in a local folder);
4. print each table's row count and a few rows, and compare every table with the
   workload's final state; print the verdict; stop the broker.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import time
import zlib
from pathlib import Path

from cdcflow.formats import embedded_formats
from cdcflow.model import dumps
from cdcflow_testkit.encoders import Message, encoder_for
from cdcflow_testkit.workload import (
    Workload,
    compare_with_mirror,
    start_ts_ms_before,
    tables_for,
)

__all__ = ["MALFORMED", "main", "run_demo"]

PARTITIONS = 2
#: Every format replicates the same source database; the format prefix keeps their
#: mirrors apart (formats without a schema level give ``canal-json.shop.customers``).
TARGET_TEMPLATE = "{format}.{database}.{schema}.{table}"
#: Two malformed records per topic: not JSON at all, and JSON of the wrong shape.
MALFORMED = (b"{this is not json", b'["an", "array", "is", "no", "change", "event"]')


def _partition(message: Message) -> int:
    return zlib.crc32(message.key or message.value or b"") % PARTITIONS


def _target(fmt: str, workload: Workload, spec, options: dict) -> str:
    """The mirror a table lands in: encode one insert, decode it, route its source."""
    from cdcflow.formats import decoder_for
    from cdcflow.formats.base import Record
    from cdcflow.model import Op
    from cdcflow.transform.router import Router
    from cdcflow_testkit.encoders import SourceChange

    key = {c: 1 for c in spec.key_columns}
    change = SourceChange(
        Op.INSERT,
        workload.source_table(spec),
        dict(spec.columns),
        spec.key_columns,
        None,
        {c: key.get(c) for c in spec.columns},
        1,
        0,
    )
    records = [
        Record(value=m.value, key=m.key, headers=m.headers) for m in encoder_for(fmt).encode(change)
    ]
    events = [e for e in decoder_for(fmt, options or None).decode_batch(records).events if e.key]
    src = events[0].source
    return Router(TARGET_TEMPLATE).target(src.format, src.database, src.schema, src.table)


def run_demo(
    warehouse: str = "demo-warehouse",
    changes_per_format: int = 2000,
    formats: list[str] | None = None,
    seed: int = 7,
    sink: str = "delta-rs",
) -> bool:
    """Run the demo; returns ``True`` when every table matches its source. ``sink``: who
    merges the mirrors (``delta-rs`` or ``delta-spark``, the YAML's ``sink``)."""
    from cdcflow.config import parse_config
    from cdcflow.runtime.pipeline import Pipeline
    from cdcflow.sinks.warehouse import DeltaWarehouse
    from cdcflow_testkit.services.broker import EmbeddedBroker

    formats = formats or embedded_formats()
    root = Path(warehouse).resolve()
    if root.exists():
        shutil.rmtree(root)
    print(f"cdcflow demo: {len(formats)} formats x {changes_per_format} source changes -> {root}")
    workloads: dict[str, Workload] = {}
    decoder_options: dict[str, dict] = {}
    with EmbeddedBroker() as broker:
        print(f"embedded broker (tansu) on {broker.bootstrap_servers}")
        started = time.perf_counter()
        for fmt in formats:
            encoder = encoder_for(fmt)
            # a format whose encoder writes another format's messages (auto) gets its own database
            own = getattr(encoder, "event_format", fmt) == fmt
            database = "shop" if own else f"shop_via_{fmt}"
            workload = Workload(
                tables_for(encoder.exact_types),
                database=database,
                seed=seed,
                # source times of just now: status and the report show the pipeline's lag
                start_ts_ms=start_ts_ms_before(int(time.time() * 1000), changes_per_format),
            )
            workloads[fmt] = workload
            changes = list(workload.changes(changes_per_format))
            messages = [m for change in changes for m in encoder.encode(change)]
            decoder_options[fmt] = dict(encoder.decoder_options(changes) or {})
            topic = f"demo.{fmt}"
            broker.create_topic(topic, partitions=PARTITIONS)
            by_partition: dict[int, list[Message]] = {}
            for m in messages:
                by_partition.setdefault(_partition(m), []).append(m)
            binary = fmt.endswith("avro")
            for i, bad in enumerate(MALFORMED):
                value = bad[:7] if binary else bad  # truncated bytes for Avro formats
                by_partition.setdefault(i % PARTITIONS, []).append(Message(value=value))
            for p, ms in sorted(by_partition.items()):
                broker.produce(topic, ms, partition=p)
            print(f"  produced {len(messages) + len(MALFORMED):>6} messages to {topic}")
        print(f"produced in {time.perf_counter() - started:.1f}s; starting Spark")

        config = parse_config(
            {
                "pipeline_id": "demo",
                "warehouse": str(root),
                "checkpoint": str(root / "_checkpoint"),
                "trigger": "available_now",
                "target_template": TARGET_TEMPLATE,
                "sink": sink,
                "kafka": {
                    "bootstrap_servers": broker.bootstrap_servers,
                    "max_offsets_per_trigger": 50_000,
                },
                "sources": [
                    {"format": fmt, "topics": [f"demo.{fmt}"], "options": decoder_options[fmt]}
                    for fmt in formats
                ],
            }
        )
        started = time.perf_counter()
        summary = Pipeline(config).run(once=True)
        elapsed = time.perf_counter() - started
        totals = summary.totals()
        print(
            f"pipeline: {totals['batches']} micro-batches, {totals['records']} records, "
            f"{totals['events']} events, {totals['skipped']} skipped, {totals['dead_letters']} dead letters "
            f"in {elapsed:.1f}s"
        )

    ok = True
    wh = DeltaWarehouse(str(root))
    for fmt, workload in workloads.items():
        print(f"\n== {fmt}")
        for spec in workload.tables:
            target = _target(fmt, workload, spec, decoder_options[fmt])
            expected = workload.expected_rows(spec.name)
            try:
                mirror = wh.read(target)
            except FileNotFoundError:
                print(f"  {target}: MISSING (no Delta table)")
                ok = False
                continue
            problems = compare_with_mirror(expected, mirror, spec.key_columns)
            print(f"  {target}: {mirror.num_rows} rows")
            shown = sorted(mirror.to_pylist(), key=lambda r: tuple(r[k] for k in spec.key_columns))[
                :2
            ]
            for row in shown:
                row = {k: v for k, v in row.items() if not k.startswith("_cdc_")}
                print(f"    {dumps(row).decode()[:160]}")
            if problems:
                ok = False
                print(f"  MISMATCH {target}: {len(problems)} differences, first: {problems[:3]}")
            else:
                print(f"  verified: {target} equals the source table ({len(expected)} rows)")
    dead = (
        wh.read("dead_letters", system=True)
        if (root / "_cdcflow" / "dead_letters").exists()
        else None
    )
    want_dead = len(MALFORMED) * len(workloads)
    got_dead = 0 if dead is None else dead.num_rows
    codes = (
        {}
        if dead is None
        else {c: dead["code"].to_pylist().count(c) for c in set(dead["code"].to_pylist())}
    )
    verdict = "verified" if got_dead == want_dead else "MISMATCH"
    print(f"\ndead letters: {got_dead} (expected {want_dead}, codes {codes}) -> {verdict}")
    ok = ok and got_dead == want_dead
    print(
        "\nRESULT: every table equals its source"
        if ok
        else "\nRESULT: FAILED, see MISMATCH lines above"
    )
    return ok


def build_parser() -> argparse.ArgumentParser:
    from cdcflow.config import SINKS

    parser = argparse.ArgumentParser(
        prog="cdcflow-demo",
        description="Start the embedded broker on 127.0.0.1, produce a workload in every "
        "format, run the pipeline, and check every Delta table against the "
        "workload's own final state. Exit 0 when every table matches, 1 when one does not.",
    )
    parser.add_argument(
        "--warehouse",
        default="demo-warehouse",
        help="folder for the Delta tables (default: %(default)s)",
    )
    parser.add_argument(
        "--changes", type=int, default=2000, help="source changes per format (default: %(default)s)"
    )
    parser.add_argument(
        "--format", action="append", help="only this format (repeatable); default: all"
    )
    parser.add_argument(
        "--sink",
        choices=SINKS,
        default="delta-rs",
        help="who merges the mirrors: delta-rs on the driver (default) or Delta Lake's Spark "
        "commands on the executors",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log every batch")
    return parser


def _main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("py4j.clientserver").setLevel(logging.CRITICAL)
    ok = run_demo(
        warehouse=args.warehouse,
        changes_per_format=args.changes,
        formats=args.format or None,
        sink=args.sink,
    )
    return 0 if ok else 1


def main() -> None:
    """Console-script entry point of ``cdcflow-demo``."""
    from cdcflow.cli import exit_after

    exit_after(_main)


if __name__ == "__main__":
    main()
