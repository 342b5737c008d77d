"""The Arrow merge against a model, on mirrors of many small files it has to prune.

The engine comparison in ``test_arrow_merge.py`` mostly takes the small-table path (a
mirror of at most ``SMALL_TABLE_BYTES`` is rewritten whole), so file pruning by the
files' min/max key statistics (``cdcflow.sinks.file_stats.files_in_range``, called by
``arrow_merge._candidate_files``) is barely seen there. Here that path is turned off
(``SMALL_TABLE_BYTES = 0``) and files hold four rows (``target_file_rows=4``), so every
merge after the first load picks its candidate files from the bounds in the Delta log
and skips the others. Seeded random micro-batches, through ``BatchApplier`` (net change,
tombstones, merge), aim at:

- keys that are exactly some data file's smallest or largest key (read from the files
  themselves before each batch), updated, deleted and changed late;
- keys in a file's range that the file does not hold (gaps), and new keys past the top;
- string keys of more than ``STRING_PREFIX`` (64) characters sharing a 73-character
  prefix, so the stored minimum is cut and the maximum left out;
- late events (a sequence older than the stored row's or the key's delete), hard and
  soft deletes, deletes of keys never stored.

After every batch the whole mirror is compared with a model that applies each event on
its own (the newest sequence per key wins; a hard delete keeps the key's sequence as a
tombstone) by ``compare_with_mirror``, which also sees a key stored twice.

Mutants checked by hand (2026-11-28), each applied alone, the test run, then reverted;
each made this file FAIL (``key ... stands 2 times``, ``unexpected row``):
mutants 1 and 2 all 16 cases, mutant 3 the 8 string-key cases.

1. ``arrow_merge._candidate_files``: a key equal to a file's max counts as outside it::

       keep = files_in_range(files, first, source[first].combine_chunks())
       keep = pc.and_(keep, pc.invert(pc.fill_null(pc.is_in(
           files[f"max.{first}"], value_set=source[first].combine_chunks()), False)))
       files = files.filter(keep)

2. ``file_stats.files_in_range``: ``past = np.searchsorted(sorted_values, highs,
   side="left")`` (was ``side="right"``), the same mistake where the bounds are read.
3. ``file_stats._bound``: a long string's maximum cut to 64 characters instead of left
   out (``return value[:STRING_PREFIX]``): the cut maximum sorts below the file's keys.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from tests.apply.helpers import dele, ev, ins, table_of, upd

from cdcflow.apply.batch import BatchApplier
from cdcflow.apply.options import TableOptions
from cdcflow.model import Op, SourceTable
from cdcflow.sinks.file_stats import STRING_PREFIX
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow_testkit.workload import compare_with_mirror

#: rows per data file: small, so a few dozen keys make a dozen files
FILE_ROWS = 4
#: keys of the first load (even indexes, leaving gaps), batches after it
BASE_KEYS, BATCHES = 40, 12

STRING_TABLE = SourceTable("test", "db", "", "skeys")
STRING_COLUMNS = {"id": "string", "name": "string", "qty": "int64"}


def _string_key(i: int) -> str:
    """Key ``i`` as text sorting as ``i`` does: bands of 12 keys, every other band with a
    shared 73-character prefix (past ``STRING_PREFIX``)."""
    band = i // 12
    filler = "~" * 70 if band % 2 else ""
    return f"{band:03d}{filler}{i:05d}"


assert len(_string_key(12)) > STRING_PREFIX + 8


@dataclass
class _Entry:
    """The model's key: its row (``None``: not stored), sequence, soft-delete flag."""

    row: dict | None
    seq: int
    deleted: bool = False


class _Model:
    """The mirror as each event applied on its own would leave it."""

    def __init__(self, soft_delete: bool):
        self.soft_delete = soft_delete
        self.keys: dict[object, _Entry] = {}

    def apply(self, op: Op, key: object, row: dict | None, seq: int) -> None:
        entry = self.keys.get(key)
        if entry is not None and seq <= entry.seq:
            return  # older than the stored row or the key's delete (sequences are unique)
        if op != Op.DELETE:
            self.keys[key] = _Entry(row, seq)
        elif self.soft_delete and entry is not None and entry.row is not None:
            self.keys[key] = _Entry(entry.row, seq, deleted=True)
        else:
            self.keys[key] = _Entry(None, seq)

    def expected(self) -> list[dict]:
        rows = []
        for entry in self.keys.values():
            if entry.row is None:
                continue
            if self.soft_delete:
                rows.append({**entry.row, "_deleted": entry.deleted})
            elif not entry.deleted:
                rows.append(entry.row)
        return rows


def _file_bound_keys(table_path: str) -> list[object]:
    """The smallest and largest key of each data file, read from the files."""
    table = DeltaTable(table_path)
    keys = []
    for uri in table.file_uris():
        ids = pq.read_table(uri, columns=["id"])["id"].to_pylist()
        if ids:
            keys += [min(ids), max(ids)]
    return keys


class _Workload:
    """Seeded batches of one table's changes, applied to the model as they are made."""

    def __init__(self, seed: int, string_keys: bool, model: _Model):
        self.rng = random.Random(seed)
        self.string_keys = string_keys
        self.model = model
        self.seq = 0
        self.top = 2 * BASE_KEYS  # next index past the stored keys
        self.offset = 0

    def key(self, i: int) -> object:
        return _string_key(i) if self.string_keys else i

    def event(self, op: Op, key: object, seq: int):
        self.offset += 1
        name = f"n{seq}"
        row = None if op == Op.DELETE else {"id": key, "name": name, "qty": seq}
        self.model.apply(op, key, row, seq)
        kw = {"seq": seq, "offset": self.offset}
        if self.string_keys:
            kw |= {"columns": STRING_COLUMNS, "table": STRING_TABLE}
            if op == Op.DELETE:
                return ev(op, key, before={"id": key}, **kw)
            return ev(op, key, after=row, **kw)
        if op == Op.DELETE:
            return dele(key, **kw)
        return (ins if op == Op.INSERT else upd)(key, name, qty=seq, **kw)

    def newer(self) -> int:
        self.seq += 10
        return self.seq

    def first_load(self) -> list:
        return [self.event(Op.INSERT, self.key(2 * i), self.newer()) for i in range(BASE_KEYS)]

    def batch(self, bounds: list[object]) -> list:
        rng, events = self.rng, []
        known = list(self.model.keys)
        for _ in range(rng.randint(2, 6)):
            roll = rng.random()
            if roll < 0.35 and bounds:  # a file's smallest or largest key, changed now
                op = rng.choice([Op.UPDATE, Op.UPDATE, Op.DELETE])
                events.append(self.event(op, rng.choice(bounds), self.newer()))
            elif roll < 0.55:  # late: older than the key's stored row or delete
                key = rng.choice(bounds if bounds and rng.random() < 0.5 else known)
                seq = self.model.keys[key].seq - rng.randint(1, 9)
                op = rng.choice([Op.INSERT, Op.UPDATE, Op.DELETE])
                events.append(self.event(op, key, seq))
            elif roll < 0.7:  # any key stored once: updated (back), deleted
                op = rng.choice([Op.UPDATE, Op.DELETE, Op.INSERT])
                events.append(self.event(op, rng.choice(known), self.newer()))
            elif roll < 0.8:  # a gap: within some file's range, in no file
                key = self.key(2 * rng.randrange(BASE_KEYS) + 1)
                op = Op.DELETE if rng.random() < 0.3 else Op.INSERT
                events.append(self.event(op, key, self.newer()))
            else:  # a new key past the top (auto-increment)
                events.append(self.event(Op.INSERT, self.key(self.top), self.newer()))
                self.top += 1
        return events


@pytest.fixture
def file_per_batch(monkeypatch):
    """No small-table rewrite (``SMALL_TABLE_BYTES``): candidate files by their bounds."""
    from cdcflow.sinks import arrow_merge

    monkeypatch.setattr(arrow_merge, "SMALL_TABLE_BYTES", 0)


@pytest.mark.parametrize("string_keys", [False, True], ids=["int-keys", "string-keys"])
@pytest.mark.parametrize("soft_delete", [False, True], ids=["hard-delete", "soft-delete"])
@pytest.mark.parametrize("seed", range(4))
def test_the_pruned_arrow_merge_keeps_the_models_mirror(
    tmp_path, file_per_batch, seed, soft_delete, string_keys
):
    wh = DeltaWarehouse(str(tmp_path / "wh"), pipeline_id="t", target_file_rows=FILE_ROWS)
    options = TableOptions(soft_delete=soft_delete)
    applier = BatchApplier(wh, tables=lambda _t, o=options: o)
    target = "db.skeys" if string_keys else "db.items"
    model = _Model(soft_delete)
    workload = _Workload(seed, string_keys, model)
    skipped = pruned_rewrites = 0
    for batch_id in range(BATCHES + 1):
        if batch_id == 0:
            events = workload.first_load()
        else:
            events = workload.batch(_file_bound_keys(wh.table_path(target)))
        report = applier.apply(table_of(*events), batch_id)
        assert not report.dead_letters
        for mirror in report.mirrors:
            metrics = mirror.metrics
            skipped += metrics.get("num_target_files_skipped", 0)
            if metrics.get("num_target_files_removed", 0) and metrics.get(
                "num_target_files_skipped", 0
            ):
                pruned_rewrites += 1
        diffs = compare_with_mirror(model.expected(), wh.read(target), ["id"])
        assert diffs == [], f"batch {batch_id}: {diffs[:10]}"
    # the pruning path ran: files were ruled out by their bounds while others were rewritten
    assert len(DeltaTable(wh.table_path(target)).file_uris()) > 5
    assert skipped > 0 and pruned_rewrites > 0
