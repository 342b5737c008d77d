"""Shared pieces of the end-to-end tests: a keyed producer, a pipeline configuration, a
workload scenario over the demo tables, and the accounting checks every test ends with."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
from deltalake.fs import DeltaStorageHandler

from cdcflow.config import PipelineConfig, parse_config
from cdcflow_testkit.encoders import Message, encoder_for
from cdcflow_testkit.workload import Workload, compare_with_mirror, tables_for

#: ``cdcflow`` as a user runs it, with this interpreter (``+ [args]``)
CDCFLOW = [sys.executable, "-c", "from cdcflow.cli import entry; entry()"]

PARTITIONS = 2
TEMPLATE = "{format}.{database}.{schema}.{table}"
_topics = itertools.count()


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of a ``cdcflow`` subprocess: this one, with ``extra``, Spark's
    Python workers on this interpreter and the source tree first on the path."""
    env = {**os.environ, **extra}
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


def run_cli(
    *args: str, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``cdcflow ARGS`` in a subprocess (:func:`cli_env` with ``env``), its output kept as
    text; ``timeout`` seconds at most."""
    return subprocess.run(
        [*CDCFLOW, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(**(env or {})),
    )


def partition_of(m: Message) -> int:
    """The partition a message goes to: ``crc32(key or value) % PARTITIONS``, so each row's
    changes stay in one partition."""
    return zlib.crc32(m.key or m.value or b"") % PARTITIONS


def produce(broker, topic, messages) -> int:
    """Produce ``messages`` by :func:`partition_of`, in order per partition; returns how many."""
    by_partition: dict[int, list[Message]] = {}
    for m in messages:
        by_partition.setdefault(partition_of(m), []).append(m)
    for p, ms in sorted(by_partition.items()):
        broker.produce(topic, ms, partition=p)
    return sum(len(ms) for ms in by_partition.values())


def config_dict(
    tmp_path, broker, fmt, topic, options=None, batch=100_000, **overrides: Any
) -> dict[str, Any]:
    """A one-source pipeline configuration as its YAML file holds it (``overrides`` replace
    top-level keys, e.g. ``trigger``)."""
    return {
        "pipeline_id": "e2e",
        "warehouse": str(tmp_path / "wh"),
        "checkpoint": str(tmp_path / "ck"),
        "trigger": "available_now",
        "target_template": TEMPLATE,
        "kafka": {
            "bootstrap_servers": broker.bootstrap_servers,
            "max_offsets_per_trigger": batch,
        },
        "sources": [{"format": fmt, "topics": [topic], "options": options or {}}],
        **overrides,
    }


def pipeline_config(tmp_path, broker, fmt, topic, options=None, batch=100_000) -> PipelineConfig:
    """:func:`config_dict`, parsed and validated as ``cdcflow run`` does."""
    return parse_config(config_dict(tmp_path, broker, fmt, topic, options, batch))


class Scenario:
    """A format, a topic and a workload over the demo tables."""

    def __init__(self, broker, fmt, seed=11, topic_config=None, create_topic=True):
        self.fmt = fmt
        self.broker = broker
        self.encoder = encoder_for(fmt)
        own = getattr(self.encoder, "event_format", fmt) == fmt
        self.workload = Workload(
            tables_for(self.encoder.exact_types),
            database="shop" if own else f"shop_via_{fmt}",
            seed=seed,
        )
        self.topic = f"e2e.{fmt}.{next(_topics)}"
        if create_topic:  # else the test creates it when it wants
            broker.create_topic(self.topic, partitions=PARTITIONS, config=topic_config)
        self.options: dict = {}
        self.produced = 0

    def produce(self, n_changes, extra=()):
        changes = list(self.workload.changes(n_changes))
        opts = self.encoder.decoder_options(changes) or {}
        for k, v in opts.items():  # merge per-table keys across rounds
            self.options[k] = {**self.options.get(k, {}), **v} if isinstance(v, dict) else v
        messages = [m for c in changes for m in self.encoder.encode(c)] + list(extra)
        self.produced += produce(self.broker, self.topic, messages)

    def check_mirrors(self, wh):
        from cdcflow_testkit.demo import _target

        for spec in self.workload.tables:
            target = _target(self.fmt, self.workload, spec, self.options)
            problems = compare_with_mirror(
                self.workload.expected_rows(spec.name), wh.read(target), spec.key_columns
            )
            assert problems == [], f"{target}: {problems[:5]}"


def _system_rows(wh, name: str) -> list[dict[str, Any]]:
    """The rows of the system table ``name``, none when it was never written."""
    if wh.open(wh.system_path(name)) is None:
        return []
    return wh.read(name, system=True).to_pylist()


#: the changelog's row operations: an offset with one of these changed a mirror
ROW_OPS = frozenset({"insert", "update", "delete", "snapshot", "truncate"})


def check_accounting(wh, produced, first_offsets=None):
    """Every offset accounted for once: the strict check every e2e path ends with.

    - ``_cdcflow/batches`` holds every offset once, in contiguous ranges, and each
      partition's ranges cover its offsets 0..end with no gap (the helpers' producer is
      not transactional, so a partition's offsets have no commit markers between them);
      the total is ``produced``;
    - per batch row, the records are exactly those with a row change in the changelog,
      plus those joined into another record's event, skipped on purpose or dead letters
      (``records == changed + joined + skipped + dead_letters``), and its ``events`` are
      the changelog's events of that batch and partition;
    - every changelog event and every dead letter lies inside a range of its batch.

    ``first_offsets``: ``{partition: offset}`` where the pipeline was to start reading
    (``starting_offsets: latest`` over a topic with history); 0 when not given.

    Returns the batch rows.
    """
    batches = wh.read("batches", system=True).to_pylist()
    assert sum(b["records"] for b in batches) == produced
    changelog, dead = (_system_rows(wh, name) for name in ("changelog", "dead_letters"))
    seen: dict[tuple[str, int], set[int]] = {}
    ranges: dict[tuple[int, str, int], list[range]] = {}
    for b in batches:
        rng = range(b["first_offset"], b["last_offset"] + 1)
        assert b["records"] == len(rng), "a batch's offsets must be contiguous"
        ranges.setdefault((b["batch_id"], b["topic"], b["partition"]), []).append(rng)
        offsets = seen.setdefault((b["topic"], b["partition"]), set())
        for o in rng:
            assert o not in offsets, f"offset {o} of {b['topic']}[{b['partition']}] applied twice"
            offsets.add(o)
    for (topic, partition), offsets in sorted(seen.items()):
        first = (first_offsets or {}).get(partition, 0)
        assert min(offsets) >= first, f"{topic}[{partition}]: read before offset {first}"
        gaps = sorted(set(range(first, max(offsets) + 1)) - offsets)
        assert not gaps, f"{topic}[{partition}]: offsets {gaps[:5]} were never accounted for"

    def where(row):
        at = (row["batch_id"], row["topic"], row["partition"])
        inside = [r for r in ranges.get(at, []) if row["offset"] in r]
        assert inside, f"{at} offset {row['offset']} lies in no range of its batch"
        return (*at, inside[0].start)

    changed: dict[tuple, set[int]] = {}
    events: dict[tuple, int] = {}
    for e in changelog:
        at = where(e)
        events[at] = events.get(at, 0) + 1
        if e["op"] in ROW_OPS:
            changed.setdefault(at, set()).add(e["offset"])
    for d in dead:
        where(d)
    for b in batches:
        at = (b["batch_id"], b["topic"], b["partition"], b["first_offset"])
        parts = len(changed.get(at, ())) + b["joined"] + b["skipped"] + b["dead_letters"]
        assert b["records"] == parts, (
            f"batch {at}: {b['records']} records, but {len(changed.get(at, ()))} changed + "
            f"{b['joined']} joined + {b['skipped']} skipped + {b['dead_letters']} dead letters"
        )
        assert b["events"] == events.get(at, 0), (
            f"batch {at}: {b['events']} events, {events.get(at, 0)} in the changelog"
        )
    return batches


def check_changelog_once(wh):
    """No event (topic, partition, offset, index) is in the changelog twice."""
    changelog = wh.read("changelog", system=True)
    coords = list(
        zip(
            changelog["topic"].to_pylist(),
            changelog["partition"].to_pylist(),
            changelog["offset"].to_pylist(),
            changelog["event_index"].to_pylist(),
            strict=True,
        )
    )
    assert len(coords) == len(set(coords)), "an event reached the changelog twice"


def delta_log_problems(uri, options):
    """What is wrong in the Delta logs under ``uri``: a data file added by two commits of
    one table, or one application transaction ``(app_id, version)`` in two commits."""
    fs = pafs.PyFileSystem(DeltaStorageHandler(uri, options))
    commits: dict[str, list[tuple[str, list[dict]]]] = {}
    for info in fs.get_file_info(pafs.FileSelector("", recursive=True)):
        if info.is_file and "_delta_log/" in info.path and info.path.endswith(".json"):
            table, name = info.path.rsplit("/_delta_log/", 1)
            with fs.open_input_stream(info.path) as f:
                actions = [json.loads(line) for line in f.read().decode().splitlines() if line]
            commits.setdefault(table, []).append((name, actions))
    assert commits, f"no Delta log under {uri}"
    problems = []
    for table, logs in sorted(commits.items()):
        added: dict[str, list[str]] = {}
        txns: dict[tuple[str, int], list[str]] = {}
        for name, actions in sorted(logs):
            for action in actions:
                if "add" in action:
                    added.setdefault(action["add"]["path"], []).append(name)
                if "txn" in action:
                    txn = (action["txn"]["appId"], action["txn"]["version"])
                    txns.setdefault(txn, []).append(name)
        problems += [f"{table}: file {p} added by {c}" for p, c in added.items() if len(c) > 1]
        problems += [f"{table}: transaction {t} in {c}" for t, c in txns.items() if len(c) > 1]
    return problems
