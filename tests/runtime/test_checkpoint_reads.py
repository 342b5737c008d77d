"""A checkpoint tracked from its first micro-batch (``Checkpoint.track_reads``) knows
whether a finished micro-batch delivered a record, whatever its end offsets are
(``latest``, a trimmed topic): ``Checkpoint.read_nothing`` follows that record, and an
untracked checkpoint is still judged by its offsets."""

from __future__ import annotations

from cdcflow.runtime.checkpoint import READ_FILE, Checkpoint

HEADER = 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1795730091692,"conf":{}}\n'
READ_AT_LATEST = '{"orders":{"0":120,"1":95}}'  # end offsets of a batch that read nothing


def _batch(tmp_path, batch: int, offsets: str, committed: bool = True) -> None:
    (tmp_path / "offsets").mkdir(exist_ok=True)
    (tmp_path / "commits").mkdir(exist_ok=True)
    (tmp_path / "offsets" / str(batch)).write_text(HEADER + offsets + "\n")
    if committed:
        (tmp_path / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')


def test_an_empty_batch_at_latest_does_not_count_on_a_tracked_checkpoint(tmp_path):
    checkpoint = Checkpoint(str(tmp_path))
    checkpoint.track_reads()
    _batch(tmp_path, 0, READ_AT_LATEST)  # no delivered(): it had no record
    assert checkpoint.read_nothing()


def test_a_batch_that_delivered_records_counts_once_it_finished(tmp_path):
    checkpoint = Checkpoint(str(tmp_path))
    checkpoint.track_reads()
    _batch(tmp_path, 0, "{}")
    _batch(tmp_path, 1, READ_AT_LATEST, committed=False)
    checkpoint.delivered(1)  # delivered, applied, not finished yet (or crashed)
    assert checkpoint.read_nothing()
    (tmp_path / "commits" / "1").write_text("v1\n{}\n")
    assert not checkpoint.read_nothing()
    checkpoint.delivered(2)  # the first batch with records is what counts
    assert not checkpoint.read_nothing()


def test_tracking_starts_only_on_a_new_checkpoint(tmp_path):
    _batch(tmp_path, 0, READ_AT_LATEST)  # written before tracking: judged by offsets
    checkpoint = Checkpoint(str(tmp_path))
    checkpoint.track_reads()
    assert not (tmp_path / READ_FILE).exists()
    checkpoint.delivered(1)
    assert not (tmp_path / READ_FILE).exists()
    assert not checkpoint.read_nothing()


def test_an_unreadable_record_is_judged_by_the_offsets(tmp_path):
    _batch(tmp_path, 0, READ_AT_LATEST)
    (tmp_path / READ_FILE).write_text("not json")
    assert not Checkpoint(str(tmp_path)).read_nothing()


def test_delivered_reads_the_record_once_per_run(tmp_path, monkeypatch):
    """A run writes the record once (the lease makes it the only writer), so a non-empty
    micro-batch after the first opens no file."""
    checkpoint = Checkpoint(str(tmp_path))
    checkpoint.track_reads()
    checkpoint.delivered(3)
    opened = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda *a, **k: opened.append(a[0]) or real_open(*a, **k))
    for batch in range(4, 50):
        checkpoint.delivered(batch)
    assert opened == []
    monkeypatch.undo()
    assert Checkpoint(str(tmp_path))._first_read() == (True, 3)  # as a new run reads it
