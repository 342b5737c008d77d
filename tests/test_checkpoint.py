"""Reading Spark's checkpoint folder: whether its finished micro-batches can have read a
record (``Checkpoint.read_nothing``), on the files Spark writes (``offsets/<id>``: a
version line, a metadata line, then one offsets object per source)."""

from __future__ import annotations

import pytest

from cdcflow.checkpoint import Checkpoint

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
