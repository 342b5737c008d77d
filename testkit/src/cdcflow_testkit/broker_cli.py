"""``cdcflow-broker`` (also ``cdcflow broker``): the embedded broker, kept running for
trying cdcflow by hand.

Starts tansu (the broker ``make demo`` uses) on 127.0.0.1, optionally loads message files
into topics, prints its address and how to produce to it, and serves until Ctrl-C. Its
storage is memory: everything is gone when it stops.

tansu 0.6.0 reports a partition's log end (high watermark) as the start of the
partition's newest record batch plus one, so a producer that batches leaves the tail of a
partition invisible to Kafka consumers that stop at the log end, cdcflow and Spark among
them (:mod:`cdcflow_testkit.services.broker`). ``--topic T FILE`` loads with the test
kit's producer, which sends each partition's last message alone; the printed advice says
``batch.num.messages=1`` for anything else.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

__all__ = ["main"]


def _advice(servers: str) -> str:
    return f"""broker at {servers} (tansu, in memory: everything is gone when it stops)

produce to it:
  kcat -P -b {servers} -t T -X batch.num.messages=1 -K '\\t' < keyed.txt
  python: confluent_kafka.Producer({{"bootstrap.servers": "{servers}", "batch.num.messages": 1}})

mind: this broker reports a partition's log end as the start of its newest record batch,
so records sent in a batch after the first stay invisible to cdcflow (and Spark) until a
later batch lands: produce one message per batch (batch.num.messages=1), as above.

files can be loaded at start: cdcflow broker --topic T values.jsonl [--topic U more.jsonl]
point a pipeline at it: kafka: {{bootstrap_servers: "{servers}"}}
Ctrl-C stops it."""


def _load(broker, topic: str, path: Path, key_delimiter: str | None) -> int:
    """Produce a file's lines (``null`` = tombstone; ``KEY<DELIM>VALUE`` with a
    delimiter) to ``topic``, every record visible afterwards."""
    messages = []
    for line in path.read_bytes().splitlines():
        key: bytes | None = None
        if key_delimiter is not None:
            raw_key, found, line = line.partition(key_delimiter.encode())
            if not found:
                raw_key, line = b"", raw_key
            key = raw_key or None
        value = None if line.strip() in (b"", b"null") else line
        if value is None and key is None:
            continue
        messages.append((key, value))
    if messages:
        broker.produce(topic, messages)
    return len(messages)


def main(argv: list[str] | None = None) -> int:
    from cdcflow_testkit.services.broker import BrokerError, EmbeddedBroker

    parser = argparse.ArgumentParser(
        prog="cdcflow-broker",
        description="The embedded broker (tansu), kept running for trying cdcflow by hand, "
        "in memory, until Ctrl-C.",
    )
    parser.add_argument("--port", type=int, help="listen on this port (default: a free one)")
    parser.add_argument("--topic", action="append", default=[], metavar="T",
                        help="load FILE into topic T at start (repeatable, with one FILE each)")  # fmt: skip
    parser.add_argument("--partitions", type=int, default=1, help="of each --topic (default: 1)")
    parser.add_argument("-K", "--key-delimiter", help="FILE lines are KEY<DELIM>VALUE")
    parser.add_argument("files", nargs="*", metavar="FILE", help="one file per --topic")
    parser.add_argument(
        "--exit-after-load", action="store_true", help=argparse.SUPPRESS
    )  # for the tests: start, load, print, stop
    args = parser.parse_args(argv)
    if len(args.files) != len(args.topic):
        parser.error("give one FILE per --topic")
    delimiter = None
    if args.key_delimiter is not None:
        delimiter = args.key_delimiter.encode().decode("unicode_escape")
    try:
        broker = EmbeddedBroker(port=args.port).start()
    except BrokerError as exc:
        print(f"cdcflow-broker: {exc}", file=sys.stderr)
        return 69
    try:
        for topic, file in zip(args.topic, args.files, strict=True):
            broker.create_topic(topic, partitions=args.partitions, exist_ok=True)
            n = _load(broker, topic, Path(file), delimiter)
            print(f"loaded {n} messages into {topic}")
        print(_advice(broker.bootstrap_servers), flush=True)
        if args.exit_after_load:
            return 0
        stop = threading.Event()
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, lambda *_: stop.set())
        while not stop.wait(1.0):
            if not broker.running:
                print(
                    f"cdcflow-broker: the broker exited; its log: {broker.log_path}",
                    file=sys.stderr,
                )
                return 69
        print("stopped", file=sys.stderr)
        return 0
    finally:
        broker.stop()


if __name__ == "__main__":
    sys.exit(main())
