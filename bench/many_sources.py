"""Many sources in one pipeline: what ``cdcflow run --once`` costs per source.

    python bench/many_sources.py                      # 13 sources x 2,000 changes
    python bench/many_sources.py --changes 500

A pipeline of every embedded format as a source of its own (``make demo``'s set: one
topic each, 2 partitions, the demo's workload) is drained by ``cdcflow run --once`` in a
child process, start-up included, and measured: wall time and the peak memory of its
processes (driver, JVM, Spark's Python workers). The reference, in the same run: one
``debezium-json`` source with as many source changes on one topic, so the ratio is what
the number of sources costs beside the records (issue 18: the sources are one query
since decision 53; before, each source paid a query's processes of its own). Issue 18's
figure for ``make demo`` is the pipeline part well under 15 s warm on 2 cores.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import emit, row, run_cdcflow_once  # noqa: E402

PARTITIONS = 2
TEMPLATE = "{format}.{database}.{schema}.{table}"


def _produce(broker: Any, topic: str, fmt: str, changes: int, seed: int) -> dict[str, Any]:
    """Produce ``changes`` workload changes in format ``fmt`` to a new ``topic``; returns
    the format's decoder options."""
    from cdcflow_testkit.encoders import encoder_for
    from cdcflow_testkit.workload import Workload, tables_for

    encoder = encoder_for(fmt)
    own = getattr(encoder, "event_format", fmt) == fmt
    database = "shop" if own else f"shop_via_{fmt}"
    workload = Workload(tables_for(encoder.exact_types), database=database, seed=seed)
    generated = list(workload.changes(changes))
    broker.create_topic(topic, partitions=PARTITIONS)
    by_partition: dict[int, list[Any]] = {}
    for change in generated:
        for m in encoder.encode(change):
            by_partition.setdefault(zlib.crc32(m.key or m.value or b"") % PARTITIONS, []).append(m)
    for p, messages in sorted(by_partition.items()):
        broker.produce(topic, messages, partition=p)
    return dict(encoder.decoder_options(generated) or {})


def _config(root: Path, bootstrap: str, sources: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "pipeline_id": "bench",
        "warehouse": str(root / "wh"),
        "checkpoint": str(root / "ck"),
        "trigger": "available_now",
        "target_template": TEMPLATE,
        "kafka": {"bootstrap_servers": bootstrap, "max_offsets_per_trigger": 200_000},
        "sources": sources,
    }


def run(changes: int = 2000, keep: Path | None = None) -> list[dict[str, Any]]:
    """Both runs; result rows (:func:`common.row`)."""
    from cdcflow.formats import embedded_formats
    from cdcflow_testkit.services.broker import EmbeddedBroker

    formats = embedded_formats()
    root = keep or Path(tempfile.mkdtemp(prefix="cdcflow-many-sources-"))
    with EmbeddedBroker() as broker:
        sources = []
        for fmt in formats:
            options = _produce(broker, f"many.{fmt}", fmt, changes, seed=7)
            sources.append({"format": fmt, "topics": [f"many.{fmt}"], "options": options})
        _produce(broker, "one.debezium-json", "debezium-json", changes * len(formats), seed=7)
        print(
            f"many sources: {len(formats)} sources x {changes} changes, and one source", flush=True
        )
        many = run_cdcflow_once(
            _config(root / "many", broker.bootstrap_servers, sources), root / "many"
        )
        one_source = [{"format": "debezium-json", "topics": ["one.debezium-json"]}]
        one = run_cdcflow_once(
            _config(root / "one", broker.bootstrap_servers, one_source), root / "one"
        )
    n = len(formats)
    bench = "many_sources"
    return [
        row(
            bench,
            f"run --once, {n} sources x {changes} changes (start-up incl.)",
            many["wall_s"],
            "s",
            reference=one["wall_s"],
            reference_name=f"1 source x {n * changes} changes",
            target="pipeline part well under 15 s warm (make demo; issue 18)",
        ),
        *(
            row(
                bench,
                f"peak {kind}, {n} sources",
                many[key] / 2**30,
                "GiB",
                reference=one[key] / 2**30,
                reference_name="1 source",
            )
            for kind, key in (("RSS", "peak_rss_bytes"), ("PSS", "peak_pss_bytes"))
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--changes", type=int, default=2000, help="source changes per source")
    parser.add_argument("--keep", type=Path, help="keep warehouses and logs in this folder")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    emit(run(args.changes, args.keep), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
