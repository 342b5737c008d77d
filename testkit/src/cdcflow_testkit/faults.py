"""Process faults: the pipeline killed with SIGKILL mid-batch, restarted, and checked.

The property (issue "fault oracle"): after the stream is drained, every Delta mirror
equals the source table, the changelog holds each Kafka record's events exactly once
(so each source change once per copy of its message that was delivered), and every
Kafka offset is accounted for: applied, skipped on purpose (a tombstone), or a dead
letter -- with no gap and no overlap in ``_cdcflow/batches``.

Three parts, used by ``tests/e2e/test_faults.py`` (small) and ``bench/soak.py`` (large):

1. a source stream: Debezium (PostgreSQL connector) messages of random inserts, updates,
   deletes and truncates, with the source tables they leave behind
   (:func:`workload_stream` from :class:`~cdcflow_testkit.workload.Workload`: typed, with
   the Connect schema, ~2.9 KB a message; :func:`fast_stream`: schemaless, ~430 bytes,
   ~4x faster, for a million changes), plus a Kafka tombstone after each delete as
   Debezium publishes;
2. delivery faults (:func:`inject_faults`): partitions chosen by the hash of the message
   key (per-key order holds within a partition), exact duplicates, replays of an earlier
   range of a partition (a producer re-sending it), malformed messages;
3. process faults (:func:`run_with_kills`): ``cdcflow run CONFIG`` as a child process in
   its own session, SIGKILLed (with its JVM and Python workers) at a random moment while
   a micro-batch is in flight, restarted, and finally drained with ``--once``; then
   :func:`verify` reads the warehouse back and checks everything above.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from cdcflow.errors import CdcflowError
from cdcflow.model import Op, seq_key
from cdcflow.sinks.storage import Storage

__all__ = [
    "MALFORMED",
    "TOMBSTONE",
    "Accounting",
    "FaultCounts",
    "FaultHarnessError",
    "FaultyTopic",
    "Kill",
    "KillRun",
    "SourceStream",
    "check_accounting",
    "check_changelog",
    "check_dead_letters",
    "check_mirrors",
    "fast_stream",
    "inject_faults",
    "run_with_kills",
    "verify",
    "workload_stream",
    "write_config",
]

#: Label of a message that carries no source change: a Kafka tombstone (value ``None``).
TOMBSTONE = -2
#: Label of a malformed message (must end as a dead letter).
MALFORMED = -1

Key = bytes | None
Value = bytes | None


class FaultHarnessError(CdcflowError):
    """The harness itself could not run: the pipeline died on its own, or never progressed."""

    code = "FAULT_HARNESS"


# --------------------------------------------------------------------------- source stream


@dataclass
class SourceStream:
    """A source's changes as Debezium messages, in source (commit) order.

    Attributes:
        messages: ``(key, value, label)`` per Kafka message; ``label`` is the index of the
            change in ``changes``, or :data:`TOMBSTONE`.
        changes: ``(table, seq_key)`` of every source change, in source order (``seq_key``
            as :func:`cdcflow.model.seq_key` stores it in ``_cdc_seq`` and the changelog).
        expected: target table -> (the source table's rows after every change, key columns).
    """

    messages: list[tuple[Key, Value, int]]
    changes: list[tuple[str, str]]
    expected: dict[str, tuple[list[dict[str, Any]], tuple[str, ...]]]


def workload_stream(workload: Any, n_changes: int, truncate_every: int = 0) -> SourceStream:
    """Typed Debezium messages (Connect schema included) of ``n_changes`` workload changes.

    Args:
        workload: a :class:`~cdcflow_testkit.workload.Workload`; its state is advanced.
        n_changes: source changes to generate (about 25k per second; ~2.9 KB a message).
        truncate_every: a TRUNCATE every this many changes (0: none).

    Returns:
        The stream; each delete is followed by a Kafka tombstone (Debezium's default
        ``tombstones.on.delete=true``). Targets use the default template
        ``{database}.{schema}.{table}``.
    """
    from cdcflow_testkit.encoders import encoder_for

    encoder = encoder_for("debezium-json")
    messages: list[tuple[Key, Value, int]] = []
    changes: list[tuple[str, str]] = []
    for change in workload.changes(n_changes, truncate_every=truncate_every):
        label = len(changes)
        # the PostgreSQL connector's rule: seq = (last commit LSN, LSN); the encoder
        # writes source.sequence = [null, seq] and lsn = seq (docs/formats/debezium-json.md)
        changes.append((change.table.table, seq_key((0, change.seq))))
        # one message per change; a key change would be two (delete + create), same seq
        for message in encoder.encode(change):
            messages.append((message.key, message.value, label))
        if change.op is Op.DELETE and messages[-1][0] is not None:
            messages.append((messages[-1][0], None, TOMBSTONE))
    expected = {
        f"{workload.database}.{workload.schema}.{spec.name}": (
            workload.expected_rows(spec.name),
            tuple(spec.key_columns),
        )
        for spec in workload.tables
    }
    return SourceStream(messages, changes, expected)


#: Tables of :func:`fast_stream`: name -> key columns.
FAST_TABLES: dict[str, tuple[str, ...]] = {
    "customers": ("id",),
    "orders": ("order_id",),
    "order_lines": ("order_id", "line_no"),
}


#: The rest of a :func:`fast_stream` envelope after ``after``, per table: ts_ms, the last
#: commit LSN, LSN, txId, LSN, op code, and the envelope's ts_ms.
_FAST_SOURCE = {
    t: (
        b',"source":{"version":"2.7.0.Final","connector":"postgresql","name":"soak",'
        b'"ts_ms":%d,"snapshot":"false","db":"shop","sequence":"[\\"%d\\",\\"%d\\"]",'
        b'"schema":"public","table":"' + t.encode() + b'","txId":%d,"lsn":%d,"xmin":null},'
        b'"op":"%s","ts_ms":%d,"transaction":null}'
    )
    for t in FAST_TABLES
}


#: Kafka message keys of :func:`fast_stream`, as orjson.dumps writes ``{column: value}``.
_FAST_KEY = {
    t: b"{" + b",".join(b'"%s":%%d' % c.encode() for c in cols) + b"}"
    for t, cols in FAST_TABLES.items()
}


def _fast_row(rng: random.Random, table: str, key: tuple[int, ...]) -> dict[str, Any]:
    r = rng.random
    if table == "customers":
        return {
            "id": key[0],
            "name": f"name {rng.randrange(10**6)}",
            "email": f"user{key[0]}@example.com",
            "balance": rng.randrange(10**8) / 100,
            "active": r() < 0.5,
            "visits": rng.randrange(10**5),
        }
    if table == "orders":
        return {
            "order_id": key[0],
            "customer_id": rng.randrange(1, 10**6),
            "amount": rng.randrange(10**7) / 100,
            "status": rng.choice(("new", "paid", "shipped", "returned")),
        }
    return {
        "order_id": key[0],
        "line_no": key[1],
        "sku": f"sku-{rng.randrange(10**5)}",
        "qty": rng.randrange(1, 50),
    }


def fast_stream(
    n_changes: int,
    keys_per_table: int | None = None,
    seed: int = 42,
    p_delete: float = 0.06,
    truncate_every: int = 0,
) -> SourceStream:
    """Schemaless Debezium messages (PostgreSQL connector) over :data:`FAST_TABLES`.

    Each change picks a table and a random key: an insert if the key is absent, else an
    update or (``p_delete``) a delete; a deleted key is inserted again by its next
    change. Values are never null, so the types the decoder infers are the ones meant
    (int64, string, float64, boolean). About 100k changes per second, ~430 bytes each.

    Args:
        n_changes: source changes.
        keys_per_table: key space per table; default ``max(100, n_changes // 10)``.
        seed: random seed; the same seed gives the same stream.
        p_delete: probability that a change of a present key deletes it.
        truncate_every: a TRUNCATE of a random table every this many changes (0: none).
    """
    rng = random.Random(seed)
    keys = keys_per_table or max(100, n_changes // 10)
    tables = list(FAST_TABLES)
    state: dict[str, dict[tuple[int, ...], dict[str, Any]]] = {t: {} for t in tables}
    messages: list[tuple[Key, Value, int]] = []
    changes: list[tuple[str, str]] = []
    lsn = commit_lsn = 20_000_000
    dumps = orjson.dumps
    for i in range(n_changes):
        table = tables[rng.randrange(3)]
        rows = state[table]
        lsn += rng.randint(1, 64)
        if i % 5 == 0:  # a transaction of five changes: they share the last commit LSN
            commit_lsn = lsn - 1
        key_cols = FAST_TABLES[table]
        if truncate_every and i and i % truncate_every == 0:
            op, before, after, key = "t", None, None, None
            rows.clear()
        else:
            if len(key_cols) == 1:
                key = (rng.randint(1, keys),)
            else:
                key = (rng.randint(1, max(1, keys // 4)), rng.randint(1, 4))
            before = rows.get(key)
            if before is None:
                op, after = "c", _fast_row(rng, table, key)
                rows[key] = after
            elif rng.random() < p_delete:
                op, after = "d", None
                del rows[key]
            else:
                op, after = "u", _fast_row(rng, table, key)
                rows[key] = after
        ts = 1_700_000_000_000 + i
        # the envelope as orjson.dumps would write it, with the source block templated
        envelope = b"".join(
            (
                b'{"before":',
                dumps(before),
                b',"after":',
                dumps(after),
                _FAST_SOURCE[table]
                % (ts, commit_lsn, lsn, 7_000 + i // 5, lsn, op.encode(), ts + 100),
            )
        )
        label = len(changes)
        changes.append((table, seq_key((commit_lsn, lsn))))
        # templated too: orjson's small outputs keep a ~4 KB buffer each, 4 GB for 1M keys
        k = None if key is None else _FAST_KEY[table] % key
        messages.append((k, envelope, label))
        if op == "d":
            messages.append((k, None, TOMBSTONE))
    expected = {
        f"shop.public.{t}": ([state[t][k] for k in sorted(state[t])], FAST_TABLES[t])
        for t in tables
    }
    return SourceStream(messages, changes, expected)


# --------------------------------------------------------------------------- delivery faults


@dataclass
class FaultyTopic:
    """What is produced to one topic, offset by offset, and what was injected.

    Attributes:
        topic: the topic name.
        messages: per partition, ``(key, value)`` at offsets 0, 1, ... of a new topic.
        labels: per partition and offset: the source change's index, :data:`TOMBSTONE`
            or :data:`MALFORMED`.
        changes, expected: from the :class:`SourceStream`.
        duplicates: exact duplicates injected (each right after its original).
        replays: ranges re-sent; ``replayed`` the records they hold.
        malformed: malformed messages injected (replays may re-send some).
    """

    topic: str
    messages: list[list[tuple[Key, Value]]]
    labels: list[list[int]]
    changes: list[tuple[str, str]]
    expected: dict[str, tuple[list[dict[str, Any]], tuple[str, ...]]]
    duplicates: int = 0
    replays: int = 0
    replayed: int = 0
    malformed: int = 0

    @property
    def records(self) -> int:
        """Records produced over all partitions."""
        return sum(len(m) for m in self.messages)

    def count(self, label: int) -> int:
        """How many records carry ``label`` (:data:`TOMBSTONE`, :data:`MALFORMED`)."""
        return sum(ls.count(label) for ls in self.labels)

    def produce(self, broker: Any, round_index: int = 0, rounds: int = 1) -> int:
        """Produce round ``round_index`` of ``rounds`` (an equal slice of every partition).

        Produces with :meth:`EmbeddedBroker.produce` (every record visible afterwards).
        Returns the records produced. The topic must have been empty before round 0:
        offsets are taken as the positions in :attr:`messages` (checked by :func:`verify`).
        """
        n = 0
        for p, msgs in enumerate(self.messages):
            lo = len(msgs) * round_index // rounds
            hi = len(msgs) * (round_index + 1) // rounds
            if hi > lo:
                broker.produce(self.topic, msgs[lo:hi], partition=p)
                n += hi - lo
        return n


def _malformed_value(rng: random.Random, real: bytes | None, i: int) -> bytes:
    """The ``i``-th malformed value; ``real`` is a nearby message value to spoil."""
    kind = i % 5
    if kind == 0:
        return b"{this is not json"
    if kind == 1:
        return b'["an", "array", "is", "no", "change", "event"]'
    if kind == 2:
        return b"\xff\xfe\x00 binary garbage " + str(rng.random()).encode()
    if real is not None:
        if kind == 3:
            return real[: max(1, len(real) // 2)]  # cut off mid-message
        obj = orjson.loads(real)
        body = obj["payload"] if "payload" in obj and "op" not in obj else obj
        body["op"] = "x"  # an op code Debezium does not define
        return orjson.dumps(obj)
    return b"{}"


def inject_faults(
    stream: SourceStream,
    topic: str,
    partitions: int,
    rng: random.Random,
    duplicate_rate: float = 0.01,
    replays: int = 3,
    max_replay_length: int = 50,
    malformed: int = 5,
) -> FaultyTopic:
    """Lay ``stream`` out over ``partitions`` with delivery faults.

    Every message goes to partition ``crc32(key) % partitions`` (the value's hash for a
    keyless TRUNCATE), so one key's messages keep their order in one partition. Then:

    * each message is delivered twice in a row with probability ``duplicate_rate``;
    * ``malformed`` malformed messages (not JSON, a JSON array, binary garbage, a cut-off
      message, an unknown op code) land at random places of random partitions;
    * ``replays`` times, a range of up to ``max_replay_length`` records of a partition is
      re-sent later in that partition (replays may contain duplicates, tombstones and
      malformed messages too).

    Args:
        stream: the source stream.
        topic: the topic name (must be new and have ``partitions`` partitions).
        partitions: partition count (>= 1).
        rng: randomness for the faults.
        duplicate_rate: probability of an exact duplicate per message.
        replays: ranges re-sent.
        max_replay_length: records per replayed range, at most.
        malformed: malformed messages to inject.
    """
    msgs: list[list[tuple[Key, Value]]] = [[] for _ in range(partitions)]
    labels: list[list[int]] = [[] for _ in range(partitions)]
    duplicates = 0
    for key, value, label in stream.messages:
        p = zlib.crc32(key if key is not None else value or b"") % partitions
        copies = 2 if rng.random() < duplicate_rate else 1
        duplicates += copies - 1
        for _ in range(copies):
            msgs[p].append((key, value))
            labels[p].append(label)
    for i in range(malformed):
        p = rng.randrange(partitions)
        at = rng.randint(0, len(msgs[p]))
        near = msgs[p][min(at, len(msgs[p]) - 1)][1] if msgs[p] else None
        msgs[p].insert(at, (None, _malformed_value(rng, near, i)))
        labels[p].insert(at, MALFORMED)
    replayed = ranges = 0
    for _ in range(replays):
        p = rng.randrange(partitions)
        if len(msgs[p]) < 2:
            continue
        ranges += 1
        end = rng.randint(1, len(msgs[p]))
        start = max(0, end - rng.randint(1, max_replay_length))
        at = rng.randint(end, len(msgs[p]))  # re-sent after the original range
        msgs[p][at:at] = msgs[p][start:end]
        labels[p][at:at] = labels[p][start:end]
        replayed += end - start
    return FaultyTopic(
        topic=topic,
        messages=msgs,
        labels=labels,
        changes=stream.changes,
        expected=stream.expected,
        duplicates=duplicates,
        replays=ranges,
        replayed=replayed,
        malformed=malformed,
    )


def write_config(
    path: str | Path,
    bootstrap_servers: str,
    topic: str,
    warehouse: str | Path,
    checkpoint: str | Path,
    max_offsets_per_trigger: int,
    processing_time: str = "1 second",
    pipeline_id: str = "faults",
    more_topics: Sequence[str] = (),
    storage: Mapping[str, str] | None = None,
) -> Path:
    """Write the YAML configuration of a one-topic ``debezium-json`` pipeline (with
    ``more_topics``, one more ``debezium-json`` source per topic, named ``s1``, ``s2``,
    ...; with ``storage``, the ``storage:`` section of a warehouse on a store); returns
    ``path``."""
    import yaml

    config = {
        "pipeline_id": pipeline_id,
        "warehouse": str(warehouse),
        "checkpoint": str(checkpoint),
        "trigger": {"processing_time": processing_time},
        "kafka": {
            "bootstrap_servers": bootstrap_servers,
            "max_offsets_per_trigger": max_offsets_per_trigger,
        },
        "sources": [{"format": "debezium-json", "topics": [topic]}]
        + [
            {"name": f"s{i}", "format": "debezium-json", "topics": [t]}
            for i, t in enumerate(more_topics, start=1)
        ],
        **({"storage": dict(storage)} if storage else {}),
    }
    path = Path(path)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


# --------------------------------------------------------------------------- process faults


@dataclass
class Kill:
    """One SIGKILL of the pipeline's process session.

    Attributes:
        cycle: 0 for the first process, 1 for the first restart, ...
        after_s: seconds since that process started.
        committed: last batch id done at the kill (-1: none): committed in Spark's
            checkpoint ``commits`` and its apply completed in the warehouse.
        in_flight: the oldest batch not done (planned in ``offsets``; its apply may run
            beside the next batch's decode), or ``None`` if the stream was idle.
        stage: where the in-flight batch was: ``"before-apply"`` (start-up, or Spark
            reading and decoding; no Delta commit of the batch yet), ``"apply"`` (some of
            its Delta commits made, not all), ``"checkpoint"`` (all made, Spark's commit
            file not yet written), or ``"idle"`` (no batch in flight).
        first_of_process: no batch had been committed by this process yet (the batch in
            flight is usually the one the previous kill interrupted, run again).
    """

    cycle: int
    after_s: float
    committed: int
    in_flight: int | None
    stage: str
    first_of_process: bool


@dataclass
class KillRun:
    """What :func:`run_with_kills` did.

    Attributes:
        kills: each kill, in order.
        starts: processes started (kills + the drain).
        drain_exit_code: exit code of ``cdcflow run CONFIG --once``.
        drain_output: its standard output (the run summary line).
        committed: last committed batch id after the drain.
        seconds: wall time from the first start to the end of the drain.
        peak_rss_bytes: peak resident memory of a pipeline process session (driver, JVM
            and Python workers), sampled every 0.5 s.
        logs: the log file of each process (stdout and stderr).
    """

    kills: list[Kill] = field(default_factory=list)
    starts: int = 0
    drain_exit_code: int | None = None
    drain_output: str = ""
    committed: int = -1
    seconds: float = 0.0
    peak_rss_bytes: int = 0
    logs: list[str] = field(default_factory=list)


def _proc_stat(pid: str) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (index 0 = state), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].decode().split()
    except (OSError, IndexError):
        return None


def _session(sid: int) -> list[tuple[int, int]]:
    """``(pid, rss_bytes)`` of the live (non-zombie) processes of session ``sid``."""
    page = os.sysconf("SC_PAGE_SIZE")
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = _proc_stat(name)
        # fields: 0 state, 1 ppid, 2 pgrp, 3 session, ..., 21 rss (pages)
        if st is None or int(st[3]) != sid or st[0] in ("Z", "X"):
            continue
        out.append((int(name), int(st[21]) * page))
    return out


def _kill_session(proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """SIGKILL every process of the child's session, and wait until none is left.

    Killing the process group is not enough: PySpark's worker daemon moves itself to a
    process group of its own (``os.setpgid(0, 0)`` in ``pyspark/daemon.py``), but it
    stays in the session.
    """
    sid = proc.pid
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(sid, signal.SIGKILL)
        for pid, _ in _session(sid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            try:
                proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                continue
        if not _session(sid):
            return
        if time.monotonic() > deadline:
            raise FaultHarnessError(f"processes of session {sid} survive SIGKILL")
        time.sleep(0.05)


def _modified(store: Storage, folder: str) -> dict[str, float]:
    """``{name: modification time (s since the epoch)}`` of the files in ``folder`` of
    ``store`` (a folder or a prefix on an object store; empty when absent)."""
    try:
        infos = store.listing(folder)
    except FileNotFoundError:
        return {}
    return {
        i.base_name: i.mtime.timestamp() if i.mtime is not None else time.time()
        for i in infos
        if i.is_file and i.size
    }


class _Checkpoint:
    """Spark's checkpoint of one streaming query: planned and committed batch ids (in a
    folder or on S3)."""

    def __init__(self, path: str, storage_options: Mapping[str, str] | None = None) -> None:
        self.store = Storage(path, storage_options or {})

    def _batches(self, folder: str) -> dict[int, float]:
        return {int(n): t for n, t in _modified(self.store, folder).items() if n.isdigit()}

    def state(self) -> tuple[int, int]:
        """``(last committed batch id, last planned batch id)``; -1 for none."""
        committed = max(self._batches("commits"), default=-1)
        return committed, max(max(self._batches("offsets"), default=-1), committed)

    def planned_at(self, batch_id: int) -> float | None:
        return self._batches("offsets").get(batch_id)

    def committed_at(self, batch_id: int) -> float | None:
        return self._batches("commits").get(batch_id)


def _stage(warehouse: Any, batch_id: int | None) -> str:
    """How far the apply of ``batch_id`` got (see :class:`Kill`)."""
    if batch_id is None:
        return "idle"
    if warehouse.committed(warehouse.system_path("batches"), batch_id):
        return "checkpoint"  # the accounting is the apply's last Delta commit
    for name in ("offsets", "changelog", "dead_letters", "decoder_state", "progress"):
        if warehouse.committed(warehouse.system_path(name), batch_id):
            return "apply"
    for target in warehouse.mirrors():
        if warehouse.committed(warehouse.table_path(target), batch_id):
            return "apply"
    return "before-apply"


def _tail(path: str, lines: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_with_kills(
    config_path: str | Path,
    kills: int,
    rng: random.Random,
    before_start: Callable[[int], Any] | None = None,
    early_kill_probability: float = 0.25,
    apply_kill_probability: float = 0.5,
    min_commits: int = 1,
    max_commits: int = 3,
    idle_timeout_s: float = 30.0,
    timeout_s: float = 600.0,
    log_dir: str | Path | None = None,
) -> KillRun:
    """Run ``cdcflow run CONFIG``, SIGKILL it mid-batch ``kills`` times, then drain.

    Each process is ``python -m cdcflow.cli -v run CONFIG`` (the real command line) in a
    session of its own, so the kill reaches Spark's JVM and its Python workers too. The
    moment of each kill is read from Spark's checkpoint of the config's first source and
    the warehouse (a batch is in flight when ``offsets/N`` exists and either ``commits/N``
    or the warehouse's completion of apply N does not) and from the changelog's Delta log
    (the apply of a batch has begun). Each process is killed:

    * with probability ``early_kill_probability`` (restarted processes only): before its
      first commit, at a random moment of the time the first batch of a process took
      earlier (the batch in flight is usually the one the previous kill interrupted);
    * otherwise after ``min_commits..max_commits`` (random) commits, in the next batch:
      with probability ``apply_kill_probability`` after its apply began (its first
      Delta commit made, the changelog's), at a random moment of the time an apply took
      earlier; else at a random moment of the batch's expected duration.

    A batch that commits before the moment chosen passes the kill on to the next one.
    After the last kill, ``cdcflow run CONFIG --once`` drains the topics.

    Args:
        config_path: the pipeline's YAML configuration (its trigger should be a
            ``processing_time`` so the killed runs keep going).
        kills: SIGKILL/restart cycles.
        rng: randomness of the kill moments.
        before_start: called with the process index (0..kills; ``kills`` is the drain)
            before each process starts, e.g. to produce the next slice of the topic.
        early_kill_probability: chance that a restarted process dies before its first
            commit.
        apply_kill_probability: chance that another kill waits for the batch's apply.
        min_commits, max_commits: commits before a kill that is not early.
        idle_timeout_s: kill anyway when, after a commit, no batch has been in flight
            this long (the stream ran dry; the kill is recorded as ``idle``).
        timeout_s: give up on a process that has committed nothing for this long, or a
            drain that takes longer.
        log_dir: where each process's output goes; default a new temporary folder.

    Returns:
        :class:`KillRun`; check ``drain_exit_code`` (0 expected).

    Raises:
        FaultHarnessError: a killed-to-be process exited on its own, made no progress
            within ``timeout_s``, or the drain timed out; the message has its log's tail.
    """
    from cdcflow.config import load_config
    from cdcflow.runtime.checkpoint import Checkpoint
    from cdcflow.sinks.warehouse import DeltaWarehouse

    config = load_config(config_path)
    source = config.sources[0]
    # the application-transaction id of the source, as Pipeline.warehouse_for names it
    warehouse = DeltaWarehouse(
        config.warehouse,
        pipeline_id=f"{config.pipeline_id}.{source.name}",
        storage_options=config.storage,
    )
    checkpoint = Checkpoint.of(config)  # its folder or URI, and the options to reach it
    killer = _Killer(
        _Checkpoint(checkpoint.path, checkpoint.store.options),
        warehouse,
        rng,
        idle_timeout_s,
        timeout_s,
    )
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="cdcflow-faults-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    import cdcflow

    package_root = str(Path(cdcflow.__file__).resolve().parents[1])  # the product's src
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "cdcflow.cli", "-v", "run", str(config_path)]
    run = killer.run
    started = time.monotonic()

    def start(i: int, extra: Sequence[str] = ()) -> tuple[subprocess.Popen, str]:
        if before_start is not None:
            before_start(i)
        log = str(log_dir / f"process-{i}.log")
        run.logs.append(log)
        run.starts += 1
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [*command, *extra],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        return proc, log

    for cycle in range(kills):
        if cycle > 0 and rng.random() < early_kill_probability:
            aim, want = "early", 0
        else:
            aim = "apply" if rng.random() < apply_kill_probability else "batch"
            want = rng.randint(min_commits, max_commits)
        proc, log = start(cycle)
        try:
            run.kills.append(killer.kill(proc, log, cycle, aim, want))
        finally:
            _kill_session(proc)

    proc, log = start(kills, ["--once"])
    try:
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None:
            killer.sample_rss(proc)
            if time.monotonic() > deadline:
                raise FaultHarnessError(
                    f"the drain did not finish within {timeout_s:.0f} s; log {log}:\n{_tail(log)}"
                )
            time.sleep(0.5)
    finally:
        _kill_session(proc)  # anything left over (workers, a JVM) goes too
    run.drain_exit_code = proc.returncode
    run.drain_output = _tail(log, 5)
    run.committed = killer.state()[0]
    run.seconds = time.monotonic() - started
    return run


def _median(values: Sequence[float], default: float) -> float:
    return sorted(values)[len(values) // 2] if values else default


class _Killer:
    """Chooses the moment of each kill; learns how long batches take as it goes."""

    def __init__(
        self,
        checkpoint: _Checkpoint,
        warehouse: Any,
        rng: random.Random,
        idle_timeout_s: float,
        timeout_s: float,
    ) -> None:
        self.checkpoint = checkpoint
        self.warehouse = warehouse
        self.changelog_log = Storage(
            f"{warehouse.system_path('changelog')}/_delta_log", warehouse.storage_options
        )
        self.rng = rng
        self.idle_timeout_s = idle_timeout_s
        self.timeout_s = timeout_s
        self.first_commit_s: list[float] = []  # process start -> its first commit
        self.durations: list[float] = []  # batch planned -> committed
        self.applies: list[float] = []  # batch's changelog commit -> batch committed
        self.run = KillRun()
        self._last_rss = 0.0
        self._batches = warehouse.system_path("batches")
        # each look lists the checkpoint and the changelog's log: on a store, a few
        # requests the server must answer on the same cores as the pipeline
        on_store = not (checkpoint.store.local and self.changelog_log.local)
        self.poll_s = 0.2 if on_store else 0.02
        self._applied = -1  # the last apply id the warehouse completed, as last seen

    def state(self) -> tuple[int, int]:
        """``(last batch done, last batch planned)``: done when Spark's checkpoint has
        committed it *and* the warehouse completed its apply. Spark commits a micro-batch
        once its offsets are in the warehouse's intent, and its tables are written after
        that, beside the next micro-batch (decision 32): a batch is in flight until both."""
        committed, planned = self.checkpoint.state()
        done = min(self._applied, committed)
        while done < committed and self.warehouse.committed(self._batches, done + 1):
            done += 1
        self._applied = done
        return done, planned

    def sample_rss(self, proc: subprocess.Popen) -> None:
        now = time.monotonic()
        if now - self._last_rss >= 0.5:
            self._last_rss = now
            rss = sum(r for _, r in _session(proc.pid))
            self.run.peak_rss_bytes = max(self.run.peak_rss_bytes, rss)

    def _changelog_commits(self) -> tuple[int, float]:
        """Commits of the changelog table so far, and the time of the last one."""
        commits = {
            n: t
            for n, t in _modified(self.changelog_log, "").items()
            if n.endswith(".json") and n[0].isdigit()
        }
        if not commits:
            return 0, 0.0
        return len(commits), commits[max(commits)]

    def kill(self, proc: subprocess.Popen, log: str, cycle: int, aim: str, want: int) -> Kill:
        """Wait for the moment (``aim``: early, batch or apply), SIGKILL, describe the kill."""
        ck, rng = self.checkpoint, self.rng
        t0 = time.time()
        base, _ = self.state()
        last_committed = base
        target: int | None = None  # the batch the kill is aimed at
        kill_at: float | None = None
        applies_before = 0  # changelog commits when the target batch was chosen
        apply_began: float | None = None  # when the target batch's changelog commit landed
        idle_since = last_progress = t0
        while True:
            now = time.time()
            if proc.poll() is not None:
                raise FaultHarnessError(
                    f"the pipeline exited on its own (code {proc.returncode}) before kill "
                    f"{cycle}; log {log}:\n{_tail(log)}"
                )
            self.sample_rss(proc)
            committed, planned = self.state()
            if committed > last_committed:  # progress: learn how long batches take
                if target is not None and committed >= target and apply_began is not None:
                    self.applies.append(max(0.0, now - apply_began))  # seen done now
                if last_committed == base:
                    self.first_commit_s.append((ck.committed_at(base + 1) or now) - t0)
                for b in range(max(last_committed + 1, base + 2), committed + 1):
                    p, c = ck.planned_at(b), ck.committed_at(b)
                    if p is not None and c is not None:
                        self.durations.append(c - p)
                last_committed, last_progress = committed, now
            if aim == "early" and committed > base:
                aim, want = "batch", 0  # it committed first: aim at the next batch
            in_flight = planned > committed
            if in_flight:
                idle_since = now
            # the oldest batch not done (its apply may run beside the next one's decode)
            oldest = committed + 1
            if in_flight and committed - base >= want and target != oldest:
                target, kill_at, apply_began = oldest, None, None
                applies_before = self._changelog_commits()[0]
                if aim == "early":
                    expected = _median(self.first_commit_s, default=15.0)
                    kill_at = t0 + rng.uniform(0.5, 1.0) * expected
                elif aim == "batch":
                    expected = _median(self.durations[-5:], default=1.0)
                    kill_at = max(ck.planned_at(oldest) or now, t0) + rng.uniform(0, expected)
            if target == oldest and apply_began is None:
                n, at = self._changelog_commits()
                if n > applies_before:  # the batch's apply has begun: its first commit
                    apply_began = at
                    if aim == "apply" and kill_at is None:
                        expected = _median(self.applies[-5:], default=0.1)
                        kill_at = at + rng.uniform(0.0, 1.0) * expected
            fire = in_flight and target == oldest and kill_at is not None and now >= kill_at
            # the stream ran dry after this process made progress: kill it idle
            idle = committed > base and not in_flight and now - idle_since > self.idle_timeout_s
            if fire or idle:
                after_s = now - t0
                _kill_session(proc)
                committed, planned = self.state()  # the final state, after the kill
                batch = committed + 1 if planned > committed else None
                return Kill(
                    cycle=cycle,
                    after_s=after_s,
                    committed=committed,
                    in_flight=batch,
                    stage=_stage(self.warehouse, batch),
                    first_of_process=committed == base,
                )
            if now - last_progress > self.timeout_s:
                raise FaultHarnessError(
                    f"process {cycle} committed no batch for {self.timeout_s:.0f} s; "
                    f"log {log}:\n{_tail(log)}"
                )
            time.sleep(self.poll_s)


# --------------------------------------------------------------------------- checks


def _read(warehouse: Any, path: str, columns: list[str] | None = None, topics: Any = None) -> Any:
    """A Delta table of ``warehouse`` (a ``DeltaWarehouse``: its storage options) as Arrow
    (``None`` when it does not exist); with ``topics``, only the rows of those topics (a
    warehouse shared with other sources)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        wanted = columns if topics is None or columns is None else [*columns, "topic"]
        table = DeltaTable(path, storage_options=warehouse.storage_options or None)
        table = table.to_pyarrow_table(columns=list(dict.fromkeys(wanted or [])) or None)
    except TableNotFoundError:
        return None
    if topics is not None:
        table = table.filter(pc.is_in(table["topic"], value_set=pa.array(list(topics))))
        if columns is not None:
            table = table.select(columns)
    return table


def check_mirrors(
    warehouse: Any, expected: Mapping[str, tuple[Sequence[Mapping[str, Any]], Sequence[str]]]
) -> list[str]:
    """Differences between each mirror and its source table (``[]`` when all are equal).

    Args:
        warehouse: the :class:`~cdcflow.sinks.warehouse.DeltaWarehouse`.
        expected: target -> (source rows, key columns).
    """
    from cdcflow_testkit.workload import compare_with_mirror

    problems = []
    for target, (rows, key_columns) in sorted(expected.items()):
        mirror = _read(warehouse, warehouse.table_path(target))
        if mirror is None:
            if rows:
                problems.append(f"{target}: no Delta table, {len(rows)} source rows")
            continue
        diff = compare_with_mirror(rows, mirror, key_columns)
        problems += [f"{target}: {d}" for d in diff[:20]]
        if len(diff) > 20:
            problems.append(f"{target}: ... {len(diff) - 20} more differences")
    return problems


def check_changelog(warehouse: Any, faulty: FaultyTopic, shared: bool = False) -> list[str]:
    """The changelog holds the event of every change record exactly once.

    Every changelog row's Kafka coordinates (topic, partition, offset, event index) are
    unique; the record at that offset is a change (not a tombstone or malformed
    message), and the row's (table, seq) is that change's. Every change record produced
    has its row, so each source change appears once per delivered copy of its message,
    and once when deduplicated by (table, seq).
    """
    cl = _read(
        warehouse,
        warehouse.system_path("changelog"),
        ["table", "seq", "topic", "partition", "offset", "event_index"],
        topics=[faulty.topic] if shared else None,
    )
    if cl is None:
        return ["no changelog table"]
    problems: list[str] = []
    coords = Counter(
        zip(
            cl["topic"].to_pylist(),
            cl["partition"].to_pylist(),
            cl["offset"].to_pylist(),
            cl["event_index"].to_pylist(),
            strict=True,
        )
    )
    twice = [c for c, n in coords.items() if n > 1]
    if twice:
        problems.append(f"{len(twice)} Kafka record events are in the changelog twice: {twice[:5]}")
    seen: set[tuple[int, int]] = set()
    wrong: list[str] = []
    for table, seq, topic, p, offset in zip(
        cl["table"].to_pylist(),
        cl["seq"].to_pylist(),
        cl["topic"].to_pylist(),
        cl["partition"].to_pylist(),
        cl["offset"].to_pylist(),
        strict=True,
    ):
        labels = faulty.labels[p] if topic == faulty.topic and 0 <= p < len(faulty.labels) else []
        if not 0 <= offset < len(labels):
            wrong.append(f"{topic}[{p}]@{offset}: no such record was produced")
            continue
        label = labels[offset]
        if label < 0:
            kind = "a tombstone" if label == TOMBSTONE else "a malformed record"
            wrong.append(f"{topic}[{p}]@{offset} is {kind} but has an event")
        elif faulty.changes[label] != (table, seq):
            wrong.append(
                f"{topic}[{p}]@{offset}: event ({table}, {seq}) but the record is "
                f"change {faulty.changes[label]}"
            )
        seen.add((p, offset))
    problems += wrong[:20]
    missing = [
        (p, o)
        for p, labels in enumerate(faulty.labels)
        for o, label in enumerate(labels)
        if label >= 0 and (p, o) not in seen
    ]
    if missing:
        problems.append(f"{len(missing)} change records have no changelog event: {missing[:5]}")
    distinct = {(t, s) for t, s in zip(cl["table"].to_pylist(), cl["seq"].to_pylist(), strict=True)}
    lost = set(faulty.changes) - distinct
    if lost:
        problems.append(f"{len(lost)} source changes are not in the changelog: {sorted(lost)[:5]}")
    return problems


def check_dead_letters(warehouse: Any, faulty: FaultyTopic, shared: bool = False) -> list[str]:
    """The dead letters are exactly the malformed records, once each, with their bytes."""
    dl = _read(
        warehouse, warehouse.system_path("dead_letters"), topics=[faulty.topic] if shared else None
    )
    rows = [] if dl is None else dl.to_pylist()
    want = {
        (faulty.topic, p, o): faulty.messages[p][o]
        for p, labels in enumerate(faulty.labels)
        for o, label in enumerate(labels)
        if label == MALFORMED
    }
    problems = []
    got = Counter((r["topic"], r["partition"], r["offset"]) for r in rows)
    twice = [c for c, n in got.items() if n > 1]
    if twice:
        problems.append(f"dead letters written twice: {twice[:5]}")
    if set(got) != set(want):
        problems.append(
            f"dead letters at {sorted(set(got) - set(want))[:5]} were not injected; injected "
            f"ones missing: {sorted(set(want) - set(got))[:5]}"
        )
    for r in rows:
        key = (r["topic"], r["partition"], r["offset"])
        if key in want:
            raw_key, raw_value = want[key]
            if (r["raw_key"], r["raw_value"], r["stage"]) != (raw_key, raw_value, "decode"):
                problems.append(f"dead letter {key}: raw bytes or stage differ ({r['code']})")
    return problems


@dataclass
class Accounting:
    """Totals of ``_cdcflow/batches`` and what is wrong with it (``problems``)."""

    problems: list[str] = field(default_factory=list)
    batches: int = 0
    records: int = 0
    events: int = 0
    joined: int = 0
    skipped: int = 0
    dead_letters: int = 0
    per_partition: dict[tuple[str, int], dict[str, int]] = field(default_factory=dict)


def check_accounting(
    warehouse: Any,
    end_offsets: Mapping[str, Mapping[int, int]],
    start_offsets: Mapping[str, Mapping[int, int]] | None = None,
    shared: bool = False,
) -> Accounting:
    """Every offset of every partition is accounted for exactly once in ``batches``.

    Per partition the rows, ordered by offset, cover ``[start, end)`` with no gap and no
    overlap, each row's ``records == last_offset - first_offset + 1`` and (one event per
    record, as in Debezium) ``records == events + joined + skipped + dead_letters``.

    Args:
        warehouse: the :class:`~cdcflow.sinks.warehouse.DeltaWarehouse`.
        end_offsets: ``{topic: {partition: high watermark}}`` when the stream was drained.
        start_offsets: first offsets read, default 0 everywhere.
        shared: the warehouse holds other sources' topics too: only the rows of the
            topics of ``end_offsets`` are checked.
    """
    out = Accounting()
    table = _read(
        warehouse, warehouse.system_path("batches"), topics=list(end_offsets) if shared else None
    )
    rows = [] if table is None else table.to_pylist()
    by_partition: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        by_partition.setdefault((r["topic"], r["partition"]), []).append(r)
    out.batches = len({r["batch_id"] for r in rows})
    for topic, ends in end_offsets.items():
        for p, end in ends.items():
            start = (start_offsets or {}).get(topic, {}).get(p, 0)
            part = sorted(by_partition.pop((topic, p), []), key=lambda r: r["first_offset"])
            where = f"{topic}[{p}]"
            ids = Counter(r["batch_id"] for r in part)
            if any(n > 1 for n in ids.values()):
                out.problems.append(f"{where}: a batch has two accounting rows")
            expect = start
            for r in part:
                if r["first_offset"] != expect:
                    kind = "gap" if r["first_offset"] > expect else "overlap"
                    out.problems.append(
                        f"{where}: {kind} before batch {r['batch_id']}: offset "
                        f"{r['first_offset']}, expected {expect}"
                    )
                if r["records"] != r["last_offset"] - r["first_offset"] + 1:
                    out.problems.append(f"{where} batch {r['batch_id']}: offsets not contiguous")
                parts = r["events"] + r["joined"] + r["skipped"] + r["dead_letters"]
                if r["records"] != parts:
                    out.problems.append(
                        f"{where} batch {r['batch_id']}: records {r['records']} != events + "
                        f"joined + skipped + dead letters = {parts}"
                    )
                expect = r["last_offset"] + 1
            if expect != end:
                out.problems.append(f"{where}: accounted up to offset {expect}, the end is {end}")
            sums = {
                k: sum(r[k] for r in part)
                for k in ("records", "events", "joined", "skipped", "dead_letters")
            }
            out.per_partition[(topic, p)] = sums
    for (topic, p), part in by_partition.items():
        out.problems.append(f"{topic}[{p}]: {len(part)} accounting rows for a partition not read")
    for sums in out.per_partition.values():
        out.records += sums["records"]
        out.events += sums["events"]
        out.joined += sums["joined"]
        out.skipped += sums["skipped"]
        out.dead_letters += sums["dead_letters"]
    return out


@dataclass
class FaultCounts:
    """Counts of a fault run, with :meth:`summary` for printing.

    ``applied`` is the mirror rows changed (upserts + deletes after net change and the
    sequence guards) as ``_cdcflow/progress`` reports them; a batch re-run after a kill
    reports only the tables it still had to write.
    """

    produced: int = 0
    source_changes: int = 0
    duplicates: int = 0
    replays: int = 0
    replayed: int = 0
    malformed: int = 0
    tombstones: int = 0
    records: int = 0
    events: int = 0
    applied: int = 0
    skipped: int = 0
    dead_letters: int = 0
    batches: int = 0
    kills: int = 0
    restarts: int = 0
    kill_stages: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    peak_rss_bytes: int = 0
    mirror_rows: int = 0

    def summary(self) -> str:
        """Aligned ``name value`` lines."""
        rate = self.records / self.seconds if self.seconds else 0.0
        lines = [
            ("records produced", f"{self.produced:,}"),
            ("  source changes", f"{self.source_changes:,}"),
            ("  tombstones", f"{self.tombstones:,}"),
            ("  duplicates injected", f"{self.duplicates:,}"),
            ("  replays injected", f"{self.replays:,} ranges, {self.replayed:,} records"),
            ("  malformed records", f"{self.malformed:,}"),
            ("records accounted", f"{self.records:,}"),
            ("  events (changelog)", f"{self.events:,}"),
            ("  skipped on purpose", f"{self.skipped:,}"),
            ("  dead letters", f"{self.dead_letters:,}"),
            ("applied (mirror rows changed)", f"{self.applied:,}"),
            ("mirror rows at the end", f"{self.mirror_rows:,}"),
            ("micro-batches", f"{self.batches:,}"),
            ("kills (SIGKILL)", f"{self.kills} {dict(sorted(self.kill_stages.items()))}"),
            ("restarts", f"{self.restarts}"),
            ("seconds (pipeline)", f"{self.seconds:.1f}"),
            ("records/s (incl. restarts)", f"{rate:,.0f}"),
            ("peak RSS (driver+JVM+workers)", f"{self.peak_rss_bytes / 2**30:.2f} GiB"),
        ]
        return "\n".join(f"{k:32} {v}" for k, v in lines)


def verify(
    warehouse: Any,
    faulty: FaultyTopic,
    end_offsets: Mapping[int, int],
    run: KillRun | None = None,
    shared: bool = False,
) -> tuple[list[str], FaultCounts]:
    """Run every check on a drained warehouse.

    Args:
        warehouse: the :class:`~cdcflow.sinks.warehouse.DeltaWarehouse` of the pipeline.
        faulty: what was produced.
        end_offsets: ``{partition: high watermark}`` of the topic now.
        run: the kill run, for its counts.
        shared: the warehouse holds other sources too (other topics, other targets):
            only this topic's bookkeeping rows are checked.

    Returns:
        ``(problems, counts)``; ``problems`` is empty when every check passed.
    """
    problems = []
    for p, msgs in enumerate(faulty.messages):
        if end_offsets.get(p, 0) != len(msgs):
            problems.append(
                f"partition {p} ends at {end_offsets.get(p, 0)} but {len(msgs)} records were "
                "produced (was the topic new?)"
            )
    accounting = check_accounting(warehouse, {faulty.topic: dict(end_offsets)}, shared=shared)
    problems += accounting.problems
    for p, labels in enumerate(faulty.labels):
        sums = accounting.per_partition.get((faulty.topic, p), {})
        for what, label in (("skipped", TOMBSTONE), ("dead_letters", MALFORMED)):
            if sums.get(what, 0) != labels.count(label):
                problems.append(
                    f"{faulty.topic}[{p}]: {sums.get(what, 0)} {what} accounted, "
                    f"{labels.count(label)} expected"
                )
    problems += check_changelog(warehouse, faulty, shared)
    problems += check_dead_letters(warehouse, faulty, shared)
    problems += check_mirrors(warehouse, faulty.expected)
    progress = _read(
        warehouse, warehouse.system_path("progress"), ["source", "batch_id", "rows_changed"]
    )
    if progress is not None and shared:
        import pyarrow.compute as pc

        progress = progress.filter(pc.equal(progress["source"], warehouse.pipeline_id))
    counts = FaultCounts(
        produced=faulty.records,
        source_changes=len(faulty.changes),
        duplicates=faulty.duplicates,
        replays=faulty.replays,
        replayed=faulty.replayed,
        malformed=faulty.count(MALFORMED),
        tombstones=faulty.count(TOMBSTONE),
        records=accounting.records,
        events=accounting.events,
        applied=0 if progress is None else sum(progress["rows_changed"].to_pylist()),
        skipped=accounting.skipped,
        dead_letters=accounting.dead_letters,
        batches=accounting.batches,
        mirror_rows=sum(len(rows) for rows, _ in faulty.expected.values()),
    )
    if run is not None:
        counts.kills = len(run.kills)
        counts.restarts = run.starts - 1
        counts.kill_stages = dict(Counter(k.stage for k in run.kills))
        counts.seconds = run.seconds
        counts.peak_rss_bytes = run.peak_rss_bytes
        if run.drain_exit_code != 0:
            problems.append(f"the drain exited with code {run.drain_exit_code}: {run.drain_output}")
    return problems, counts
