"""The ``cdcflow`` command: run, decode, apply, resume, reset.

(The demo is the test kit's ``cdcflow-demo``: ``make demo``.)

Exit codes: 0 success; 1 the command ran but found a problem (dead letters in ``decode``,
a table that does not match in ``cdcflow-demo``); 2 bad usage or configuration; 74 (sysexits'
``EX_IOERR``) the warehouse cannot be written: disk full, a read-only volume, a damaged
``_cdcflow`` system table (``STORAGE_ERROR``; the unfinished micro-batch is applied again by
the next run); 75 (``run`` only;
sysexits' ``EX_TEMPFAIL``, "try again later") another run of the same pipeline holds the
warehouse: refused at start (``PIPELINE_RUNNING``, before Spark starts), or this run's lease
was taken over and it stopped (``LEASE_LOST``). The one line on stderr names the holder
and how long to wait if it died without releasing its lease. 69 (``run`` only; sysexits'
``EX_UNAVAILABLE``) the Kafka brokers stayed unreachable for ``kafka.outage_budget_s``
(``SOURCE_UNAVAILABLE``); the one line names the brokers, the last client error and the fix.
"""

from __future__ import annotations

import argparse
import base64
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from cdcflow.errors import CdcflowError, Code, ConfigError, LeaseHeld, StorageError

__all__ = [
    "EXIT_PIPELINE_RUNNING",
    "EXIT_SOURCE_UNAVAILABLE",
    "EXIT_STORAGE_ERROR",
    "exit_after",
    "main",
]

#: the warehouse cannot be written (disk full, read-only, a damaged system table)
EXIT_STORAGE_ERROR = 74

#: ``cdcflow run``: another run of the pipeline holds (or took over) its lease
EXIT_PIPELINE_RUNNING = 75
#: ``cdcflow run``: the Kafka brokers stayed unreachable for ``kafka.outage_budget_s``
#: (sysexits ``EX_UNAVAILABLE``); a supervisor may restart it later
EXIT_SOURCE_UNAVAILABLE = 69

log = logging.getLogger("cdcflow.cli")


def _primary_keys(values: Sequence[str] | None) -> dict[str, list[str]]:
    """``--primary-key id`` (every table) or ``--primary-key customers=id,region``."""
    out: dict[str, list[str]] = {}
    for v in values or ():
        table, sep, cols = v.partition("=")
        if not sep:
            table, cols = "*", v
        names = [c.strip() for c in cols.split(",") if c.strip()]
        if not names:
            raise ConfigError(
                f"--primary-key {v!r}: give column names, e.g. --primary-key orders=id"
            )
        out[table.strip()] = names
    return out


def _records(fmt: str, files: Sequence[str]):
    """Records from files: one message value per line (``null`` = tombstone); base64 lines
    for binary formats. Origin: file name as topic, line number (0-based) as offset."""
    from cdcflow.formats import decoder_class
    from cdcflow.formats.base import Record
    from cdcflow.model import Origin

    binary = decoder_class(fmt).binary_values
    for name in files:
        data = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
        for i, line in enumerate(data.splitlines()):
            text = line.strip()
            if not text:
                continue
            if text == b"null":
                value = None
            elif binary:
                value = base64.b64decode(text)
            else:
                value = line
            yield Record(value=value, origin=Origin(topic=name, partition=0, offset=i))


def _decoder(fmt: str, primary_keys: Sequence[str] | None, keyless: str | None = None):
    from cdcflow.formats import decoder_for

    options: dict = {"primary_keys": _primary_keys(primary_keys)} if primary_keys else {}
    if keyless:
        options["keyless"] = keyless
    return decoder_for(fmt, options or None)


def cmd_decode(args: argparse.Namespace) -> int:
    from cdcflow.model import dumps, event_to_json_dict

    decoder = _decoder(args.format, args.primary_key, args.keyless)
    result = decoder.decode_batch(_records(args.format, args.files))
    out = sys.stdout.buffer
    for event in result.events:
        out.write(dumps(event_to_json_dict(event)) + b"\n")
    out.flush()
    for d in result.dead_letters:
        o = d.origin
        sys.stderr.write(
            dumps(
                {
                    "dead_letter": {
                        "code": d.code,
                        "message": d.message,
                        "file": o.topic,
                        "line": o.offset + 1,
                    }
                }
            ).decode()
            + "\n"
        )
    print(
        f"{result.records} records: {result.decoded_records} decoded into {len(result.events)} events, "
        f"{len(result.skipped)} skipped, {len(result.dead_letters)} dead letters",
        file=sys.stderr,
    )
    return 1 if result.dead_letters else 0


def cmd_apply(args: argparse.Namespace) -> int:
    import pyarrow as pa

    from cdcflow.apply.batch import BatchApplier, Router
    from cdcflow.decode.batches import decode_records, load_decoder_state
    from cdcflow.sinks.delta import DeltaWarehouse

    decoder = _decoder(args.format, args.primary_key, args.keyless)
    warehouse = DeltaWarehouse(str(Path(args.warehouse).resolve()), pipeline_id=args.pipeline_id)
    decoder.load_state(
        load_decoder_state(warehouse.system_path("decoder_state"), warehouse.pipeline_id)
    )
    records = list(_records(args.format, args.files))
    events = pa.Table.from_batches([decode_records(decoder, records)])
    report = BatchApplier(warehouse, Router(args.target_template)).apply(events)
    print(
        f"batch {report.batch_id}: {report.records} records, {report.events} events, "
        f"skipped {dict(report.skipped) or 0}, dead letters {dict(report.dead_letters) or 0}"
    )
    if report.replayed:
        print(
            f"{report.replayed} records were applied before and were skipped (a file's lines "
            "are its offsets: a line is applied once per warehouse)"
        )
    print(f"{'source table':40} {'rows':>8}  delta path")
    for m in report.mirrors:
        rows = warehouse.open(m.path)
        count = rows.to_pyarrow_table(columns=[]).num_rows if rows is not None else 0
        print(f"{m.target:40} {count:>8}  {m.path}")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from cdcflow.sinks.delta import DeltaWarehouse

    warehouse = DeltaWarehouse(str(Path(args.warehouse).resolve()))
    for target in args.tables:
        warehouse.resume_table(target, by="cdcflow resume")
        print(f"{target}: resumed; the next micro-batch applies its changes again")
    return 0


def cmd_reset(args: argparse.Namespace) -> int:
    """Start sources over: delete their checkpoints (and, with --warehouse, the tables)."""
    import shutil

    from cdcflow.config import load_config

    config = load_config(args.config)
    names = [s.name for s in config.sources]
    chosen = args.source or names
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        raise ConfigError(f"--source {unknown[0]!r} is not a source of {args.config}: {names}")
    folders = [Path(config.checkpoint) / name for name in chosen]
    plan = [f"delete checkpoint {f}" for f in folders if f.exists()]
    if args.warehouse:
        if "://" in config.warehouse:
            raise ConfigError(
                f"--warehouse: {config.warehouse} is not a local folder; delete it with the "
                "object store's own tools"
            )
        if set(chosen) != set(names):
            raise ConfigError("--warehouse deletes the tables of every source: leave out --source")
        if Path(config.warehouse).exists():
            plan.append(f"delete warehouse {config.warehouse} (every table)")
    if not plan:
        print("nothing to reset")
        return 0
    after = (
        "the next run applies the topics again from kafka.starting_offsets"
        if args.warehouse
        else "the next run starts from the offsets the warehouse applied (nothing is lost "
        "or applied twice)"
    )
    if not args.yes:
        print("cdcflow reset would:\n  " + "\n  ".join(plan) + f"\n{after}. Add --yes to do it.")
        return 1
    from cdcflow.sinks.lease import PipelineLease

    # a running pipeline holds the lease: reset refuses (exit 75) instead of pulling its
    # checkpoint or tables away
    lease = PipelineLease(config.warehouse, config.pipeline_id, renew_every_s=0)
    lease.acquire()
    for f in folders:
        shutil.rmtree(f, ignore_errors=True)
    if args.warehouse:
        shutil.rmtree(config.warehouse, ignore_errors=True)  # the lease goes with it
    else:
        lease.release()
    print("done: " + "; ".join(plan) + f". {after[0].upper()}{after[1:]}.")
    return 0


def _interrupt_on_sigterm() -> None:
    """SIGTERM (``kill``, ``docker stop``, Kubernetes) stops a run as Ctrl-C does, so the
    lease is released on the way out and the next run, anywhere, takes it at once."""
    import signal

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


def cmd_run(args: argparse.Namespace) -> int:
    from cdcflow.runner import run

    _interrupt_on_sigterm()
    summary = run(args.config, once=args.once)  # loads the configuration, then the lease
    totals = summary.totals()
    print(
        f"{totals['batches']} batches: {totals['records']} records, {totals['events']} events, "
        f"{totals['skipped']} skipped, {totals['dead_letters']} dead letters"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    from cdcflow import __version__

    parser = argparse.ArgumentParser(
        prog="cdcflow",
        description="Kafka CDC topics (Debezium, DataWorks, Qlik, DTS, DRS, ...) to Delta tables on PySpark.",
    )
    parser.add_argument("--version", action="version", version=f"cdcflow {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every batch")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "run",
        help="run the streaming pipeline of a YAML configuration",
        description="Run the pipeline described by CONFIG (see docs/configuration.md). "
        "One run per pipeline_id and warehouse: while another run holds the pipeline's "
        "lease, this one exits at once with code 75. Transient Kafka errors are retried "
        "for kafka.outage_budget_s; if the brokers stay unreachable longer, it exits "
        "with code 69.",
    )
    p.add_argument("config", metavar="CONFIG.yaml")
    p.add_argument(
        "--once",
        action="store_true",
        help="drain what the topics hold now (Trigger.AvailableNow), then stop",
    )
    p.set_defaults(func=cmd_run)

    from cdcflow.formats import format_names

    def add_format_args(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--format",
            required=True,
            choices=format_names(),
            metavar="NAME",
            help=f"message format: {', '.join(format_names())}",
        )
        p.add_argument(
            "--primary-key",
            action="append",
            metavar="[TABLE=]COLS",
            help="key columns where messages lack them: 'id' for every table or "
            "'orders=id,region' for one (repeatable)",
        )
        p.add_argument(
            "--keyless",
            choices=["dead_letter", "full_row"],
            help="a table with no key at all: dead-letter its changes (default) or use the "
            "whole row as its identity",
        )
        p.add_argument(
            "files",
            nargs="+",
            metavar="FILE",
            help="one Kafka message value per line ('null' = tombstone; base64 for Avro); - for stdin",
        )

    p = sub.add_parser(
        "decode",
        help="print the change events of message files as JSON lines",
        description="Decode FILEs and print one JSON object per change event on stdout; "
        "dead letters and a summary go to stderr. Exit 1 if any record is a dead letter.",
    )
    add_format_args(p)
    p.set_defaults(func=cmd_decode)

    p = sub.add_parser(
        "apply",
        help="decode message files and apply them to Delta tables in one batch",
        description="The same decode and apply path as 'run', as one batch, from files.",
    )
    add_format_args(p)
    p.add_argument("--warehouse", required=True, help="folder for the Delta tables")
    p.add_argument(
        "--pipeline-id", default="cli", help="application-transaction id (default: %(default)s)"
    )
    p.add_argument(
        "--target-template",
        default="{database}.{schema}.{table}",
        help="target table name template (default: %(default)s)",
    )
    p.set_defaults(func=cmd_apply)

    p = sub.add_parser(
        "resume",
        help="let tables stopped by a schema change take changes again",
        description=(
            "Records a 'resume' in _cdcflow/schema_changes. Fix the table (or its "
            "schema_changes policy) first; changes dead-lettered while it was stopped stay "
            "in _cdcflow/dead_letters."
        ),
    )
    p.add_argument("--warehouse", required=True, help="folder of the Delta tables")
    p.add_argument("tables", nargs="+", metavar="TABLE", help="target table name")
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser(
        "reset",
        help="start sources over: delete their Spark checkpoints (the warehouse keeps its offsets)",
        description=(
            "Deletes the checkpoint of each source (or of --source ones). The warehouse "
            "records the Kafka offsets it applied, so the next run starts there: nothing is "
            "lost or applied twice. With --warehouse, also deletes the warehouse so the next "
            "run applies the topics again from kafka.starting_offsets. Prints what it would "
            "do unless --yes is given."
        ),
    )
    p.add_argument("config", help="pipeline YAML file")
    p.add_argument("--source", action="append", help="only this source (repeatable)")
    p.add_argument("--warehouse", action="store_true", help="also delete the warehouse")
    p.add_argument("--yes", action="store_true", help="do it (without: only print the plan)")
    p.set_defaults(func=cmd_reset)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # py4j logs an exception of a foreachBatch function with its traceback before handing
    # it to Spark, which fails the query with it; the command reports that failure once.
    logging.getLogger("py4j.clientserver").setLevel(logging.CRITICAL)
    try:
        return args.func(args)
    except LeaseHeld as exc:  # and LeaseLost
        print(f"cdcflow: {exc}", file=sys.stderr)
        return EXIT_PIPELINE_RUNNING
    except ConfigError as exc:
        print(f"cdcflow: {exc}", file=sys.stderr)
        return 2
    except StorageError as exc:
        print(f"cdcflow: {exc}", file=sys.stderr)
        return EXIT_STORAGE_ERROR
    except KeyboardInterrupt:
        print("cdcflow: stopped (interrupted); a run resumes where it stopped", file=sys.stderr)
        return 130
    except CdcflowError as exc:
        print(f"cdcflow: {exc}", file=sys.stderr)
        if exc.code == Code.SOURCE_UNAVAILABLE:
            return EXIT_SOURCE_UNAVAILABLE
        return 1


def entry() -> None:
    """Console-script entry point of ``cdcflow``: :func:`exit_after` :func:`main`."""
    exit_after(main)


def exit_after(main_function: Callable[[], int]) -> NoReturn:
    """Run ``main_function`` (returns an exit code), then leave without interpreter teardown.

    Arrow's and delta-rs's native thread pools can still be alive when CPython finalizes,
    and their destructors then abort the process (``terminate called without an active
    exception``, exit 134) after all work is done (delta-io/delta-rs#2184). Everything is
    flushed and the Spark session stopped first, so skipping finalization loses nothing.
    """
    import gc
    import os

    try:
        code = main_function()
    except SystemExit as exc:  # argparse --help / usage errors
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    try:
        from pyspark.sql import SparkSession

        session = SparkSession.getActiveSession()
        if session is not None:
            session.stop()
    except ImportError:
        pass
    except Exception as exc:  # noqa: BLE001 - e.g. the gateway gone after a signal
        log.debug("could not stop the Spark session: %s", exc)
    gc.collect()
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


if __name__ == "__main__":
    entry()
