"""Reading Spark's checkpoint folder: whether its finished micro-batches can have read a
record (``Checkpoint.read_nothing``), on the files Spark writes (``offsets/<id>``: a
version line, a metadata line, then one offsets object per source)."""

from __future__ import annotations

import pytest

from cdcflow.errors import ConfigError
from cdcflow.runtime.checkpoint import FINGERPRINT_FILE, Checkpoint, Fingerprint

HEADER = 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1795730091692,"conf":{}}\n'


def _checkpoint(tmp_path, offsets_by_batch: dict[int, str], committed: list[int]) -> Checkpoint:
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    for batch, offsets in offsets_by_batch.items():
        (tmp_path / "offsets" / str(batch)).write_text(HEADER + offsets + "\n")
    for batch in committed:
        (tmp_path / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    return Checkpoint(str(tmp_path))


@pytest.mark.parametrize(
    "offsets, nothing",
    [
        ("{}", True),  # the topic did not exist yet (what Spark wrote here for it)
        ('{"orders":{"0":0,"1":0}}', True),  # it existed, with no record
        ('{"orders":{"0":0,"1":3}}', False),  # partition 1 was read
        ('{"orders":{"0":"x"}}', False),  # not offsets as Spark writes them
        ("not json", False),
    ],
)
def test_read_nothing_follows_the_last_finished_batch(tmp_path, offsets, nothing):
    assert _checkpoint(tmp_path, {0: offsets}, [0]).read_nothing() is nothing


def test_a_planned_batch_that_did_not_finish_does_not_count(tmp_path):
    checkpoint = _checkpoint(tmp_path, {0: "{}", 1: '{"orders":{"0":7}}'}, committed=[0])
    assert checkpoint.read_nothing()
    (tmp_path / "commits" / "1").write_text("v1\n{}\n")
    assert not checkpoint.read_nothing()


# ------------------------------------------------ the pipeline's one query (decision 53)


def _fp(source: str, topics=("t",), fmt="debezium-json") -> Fingerprint:
    return Fingerprint("p", source, fmt, tuple(topics), None, "wh")


def test_a_checkpoint_holds_every_source_and_refuses_one_configured_otherwise(tmp_path):
    checkpoint = Checkpoint(str(tmp_path / "_query"))
    assert checkpoint.claim([_fp("a", ["t1"]), _fp("b", ["t2"])]) is True
    assert set(checkpoint.fingerprints()) == {"a", "b"}
    assert checkpoint.claim([_fp("a", ["t1"]), _fp("b", ["t2"])]) is True
    with pytest.raises(ConfigError, match=r"format 'debezium-json' \(configured: 'canal-json'\)"):
        checkpoint.claim([_fp("a", ["t1"]), _fp("b", ["t2"], fmt="canal-json")])
    # a source added or removed: the checkpoint must start over (and is not claimed)
    assert checkpoint.claim([_fp("a", ["t1"]), _fp("b", ["t2"]), _fp("c", ["t3"])]) is False
    assert checkpoint.claim([_fp("a", ["t1"])]) is False
    assert set(checkpoint.fingerprints()) == {"a", "b"}
    assert checkpoint.forget(["b", "x"]) == ["b"]
    assert checkpoint.claim([_fp("a", ["t1"])]) is True


def test_a_checkpoint_of_cdcflow_before_0_4_reads_as_its_one_source(tmp_path):
    (tmp_path / FINGERPRINT_FILE).write_text(
        '{"pipeline_id": "p", "source": "a", "format": "debezium-json", "topics": ["t"],'
        ' "topic_pattern": null, "warehouse": "wh"}'
    )
    assert Checkpoint(str(tmp_path)).fingerprints() == {"a": _fp("a")}


def test_reads_are_tracked_per_source(tmp_path):
    checkpoint = Checkpoint(str(tmp_path))
    checkpoint.track_reads()
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    for batch in (0, 1):
        (tmp_path / "offsets" / str(batch)).write_text(HEADER + '{"t1":{"0":5},"t2":{"0":9}}\n')
    checkpoint.delivered(0, ["a"])
    checkpoint.delivered(1, ["a", "b"])
    (tmp_path / "commits" / "0").write_text("v1\n{}\n")
    again = Checkpoint(str(tmp_path))  # as the next run reads it
    assert not again.read_nothing("a") and again.read_nothing("b") and again.read_nothing("c")
    (tmp_path / "commits" / "1").write_text("v1\n{}\n")
    assert not Checkpoint(str(tmp_path)).read_nothing("b")
    assert again.committed_end_offsets() == {("t1", 0): 5, ("t2", 0): 9}
    again.restart()
    assert not tmp_path.exists() and again.is_new()
