"""``cdcflow.run`` takes the pipeline's lease whoever calls it: from Python as from the
command line, a second run of the same pipeline and warehouse is refused before Spark
starts (decision 21)."""

from __future__ import annotations

import time

import pytest

import cdcflow
from cdcflow.config import parse_config
from cdcflow.errors import LeaseHeld
from cdcflow.sinks.lease import PipelineLease


def _config(tmp_path):
    return parse_config(
        {
            "pipeline_id": "orders",
            "warehouse": str(tmp_path / "wh"),
            "checkpoint": str(tmp_path / "ckpt"),
            "kafka": {"bootstrap_servers": "127.0.0.1:9"},
            "sources": [{"format": "debezium-json", "topics": ["orders"]}],
        }
    )


def test_a_library_run_is_refused_while_another_run_holds_the_lease(tmp_path):
    config = _config(tmp_path)
    with PipelineLease(config.warehouse, config.pipeline_id, ttl_s=600):
        started = time.monotonic()
        with pytest.raises(LeaseHeld):
            cdcflow.run(config, once=True)
        assert time.monotonic() - started < 5, "refused only after Spark started"
