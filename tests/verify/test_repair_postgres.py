"""``cdcflow verify --repair`` against a real PostgreSQL 15: every way issue 35 damages a
mirror of Debezium's real capture is written back from the source through the
pipeline's own apply, each key checked, and the next verify is equal; the repair keeps
the mirror row's sequence (the stream's next change still wins), is refused while the
pipeline holds its lease, and a repair killed after its intent is finished by the next
one with exactly the events it recorded; an interrupted verify resumes without reading
its finished tables again."""

from __future__ import annotations

import dataclasses
import json

import pytest
from deltalake import DeltaTable
from tests.verify.helpers import (
    PG_CAPTURES,
    config_for,
    damage,
    golden_state,
    mirror_capture,
    pg_url,
    write_config,
)

from cdcflow.cli import main
from cdcflow.commands.verify import run_verify, settled, unfinished
from cdcflow.errors import LeaseHeld
from cdcflow.sinks.lease import PipelineLease
from cdcflow.sinks.system_tables import REPAIRS, REPAIRS_SCHEMA
from cdcflow.sinks.warehouse import DeltaWarehouse
from cdcflow.verify import repair as repair_module
from cdcflow.verify import verifier as verifier_module
from cdcflow.verify.verifier import VerifyOptions

pytestmark = [pytest.mark.services]

OPTIONS = VerifyOptions(recheck_after_s=0, wait_s=0)
DAMAGED = {
    ("shop.public.customers", '{"id": 5}'): ("missing", "upsert"),
    ("shop.public.customers", '{"id": 777}'): ("extra", "delete"),
    ("shop.public.customers", '{"id": 6}'): ("different", "upsert"),
    ("shop.public.customers", '{"id": 7}'): ("different", "upsert"),
    ("shop.public.customers", '{"id": 9}'): ("different", "upsert"),
    ("shop.public.order_lines", '{"order_id": 8, "line_no": 1}'): ("missing", "upsert"),
}


def _seqs(root, target: str) -> dict:
    table = DeltaTable(str(root / target)).to_pyarrow_table(columns=["id", "_cdc_seq"])
    return dict(zip(table["id"].to_pylist(), table["_cdc_seq"].to_pylist(), strict=True))


def _marks(root) -> list[dict]:
    return DeltaWarehouse(str(root)).read_system(REPAIRS, REPAIRS_SCHEMA).to_pylist()


@pytest.mark.parametrize("capture", PG_CAPTURES)
def test_repair_mends_each_damage_and_the_next_verify_is_equal(pg, tmp_path, capture):
    messages, state = golden_state(capture)
    root = tmp_path / "wh"
    mirror_capture(messages, root, state["schemas"])
    before = _seqs(root, "shop.public.customers")
    damage(root, "shop.public", "email")
    config = config_for(root, state["schemas"])
    lines: list[str] = []

    run = run_verify(config, pg_url(pg), OPTIONS, say=lines.append, repair=True)
    assert not run.equal  # what verify found is reported as found
    [report] = run.repairs
    assert report.generation == 1 and not report.refused
    done = {(k.target, json.dumps(k.key)): (k.found, k.action) for k in report.keys}
    assert done == DAMAGED
    assert {k.outcome for k in report.keys} == {"repaired"}
    assert settled(run)
    assert any(line == "repair 1 of verify.debezium-json: 6 events" for line in lines), lines

    # the next verify: equal; the rows the mirror held keep their sequence, so the
    # stream's next change of them still wins
    again = run_verify(config, pg_url(pg), OPTIONS, say=lines.append)
    assert again.equal, [t for t in again.tables if not t.equal]
    # the repaired rows hash as the source's: no range even differs
    assert [t.differing_ranges for t in again.tables] == [0, 0]
    after = _seqs(root, "shop.public.customers")
    assert after[6] == before[6] and after[7] == before[7] and after[9] == before[9]
    assert 777 not in after and after[5] == ""  # no tombstone, no truncate: the least
    # intents, then outcomes, one generation; the pipeline's own offsets untouched
    marks = _marks(root)
    assert [m["outcome"] for m in marks].count(None) == 6
    assert sorted(m["outcome"] for m in marks if m["outcome"]) == ["repaired"] * 6
    offsets = DeltaWarehouse(str(root)).read_system("offsets", None)
    assert {r["topic"] for r in offsets.to_pylist() if r["source"].endswith(".repair.1")} == {
        repair_module.REPAIR_TOPIC
    }
    # nothing left: a second --repair repairs nothing
    quiet = run_verify(config, pg_url(pg), OPTIONS, say=lines.append, repair=True)
    assert quiet.equal and quiet.repairs == []


def test_repair_is_refused_while_the_pipeline_holds_its_lease(pg, tmp_path):
    messages, state = golden_state(PG_CAPTURES[0])
    root = tmp_path / "wh"
    mirror_capture(messages, root, True)
    damage(root, "shop.public", "email")
    config = config_for(root, True)
    with PipelineLease(str(root), config.pipeline_id), pytest.raises(LeaseHeld):
        run_verify(config, pg_url(pg), OPTIONS, repair=True)
    assert _marks(root) == []


@pytest.mark.parametrize("dies_in", ["applier_for", "_check"])
def test_a_repair_killed_after_its_intent_is_finished_by_the_next(
    pg, tmp_path, monkeypatch, dies_in
):
    """Killed before its apply (``applier_for``) or after it, before the outcomes
    (``_check``): the next repair applies the recorded events, once."""
    messages, state = golden_state(PG_CAPTURES[0])
    root = tmp_path / "wh"
    mirror_capture(messages, root, True)
    DeltaTable(str(root / "shop.public.customers")).delete("id = 5")
    config = config_for(root, True)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # the process dies here

    monkeypatch.setattr(repair_module, dies_in, killed)
    with pytest.raises(KeyboardInterrupt):
        run_verify(config, pg_url(pg), OPTIONS, repair=True)
    assert [m["outcome"] for m in _marks(root)] == [None]
    monkeypatch.undo()
    version = DeltaTable(str(root / "shop.public.customers")).version()

    lines: list[str] = []
    run = run_verify(config, pg_url(pg), OPTIONS, say=lines.append, repair=True)
    assert "repair 1 of verify.debezium-json: finished after an interruption (1 keys)" in lines
    assert run.equal and run.repairs == []  # finished before verify read anything
    assert sorted(m["outcome"] or "" for m in _marks(root)) == ["", "applied"]
    # applied once: by the finish when the killed run had not, never twice
    writes = DeltaTable(str(root / "shop.public.customers")).version() - version
    assert writes == (1 if dies_in == "applier_for" else 0)


def test_an_interrupted_verify_resumes_without_reading_its_finished_tables(
    pg, tmp_path, monkeypatch
):
    """Killed in its second table's first round, verify --resume reads only that table
    again, rechecks the first table's differing keys, and reports what an uninterrupted
    run reports."""
    messages, state = golden_state(PG_CAPTURES[0])
    root = tmp_path / "wh"
    mirror_capture(messages, root, True)
    damage(root, "shop.public", "email")
    config = config_for(root, True)
    whole = run_verify(config, pg_url(pg), OPTIONS, say=lambda line: None)

    real, read = verifier_module._first_round, []

    def first_round(config, plan, *args, **kwargs):
        read.append(plan.target)
        if plan.target == "shop.public.order_lines" and len(read) == 2:
            raise KeyboardInterrupt  # killed while it reads the second table
        return real(config, plan, *args, **kwargs)

    monkeypatch.setattr(verifier_module, "_first_round", first_round)
    with pytest.raises(KeyboardInterrupt):
        run_verify(config, pg_url(pg), OPTIONS, say=lambda line: None)
    assert read == ["shop.public.customers", "shop.public.order_lines"]

    lines: list[str] = []
    resumed = run_verify(
        config, pg_url(pg), dataclasses.replace(OPTIONS, resume=True), say=lines.append
    )
    assert read[2:] == ["shop.public.order_lines"]  # customers was not read again
    assert any(line.startswith("resuming the run of ") for line in lines), lines
    assert any(line.endswith("[resumed]") for line in lines), lines

    def found(run):
        return {
            t.target: (t.missing, t.extra, sorted(d["key"]["id"] for d in t.different))
            if t.target.endswith("customers")
            else (t.missing, t.extra, t.different)
            for t in run.tables
        }

    assert found(resumed) == found(whole)
    assert (resumed.tables[0].rows_source, resumed.tables[0].rows_mirror) == (38, 38)
    # recorded as one run, and nothing is left to resume
    assert unfinished(DeltaWarehouse(str(root)), config.pipeline_id, "full") is None
    again: list[str] = []
    run_verify(config, pg_url(pg), dataclasses.replace(OPTIONS, resume=True), say=again.append)
    assert "nothing to resume: a new run" in again


def test_repair_of_a_filtered_table_runs_its_shaping(pg, tmp_path):
    """The repair's events go through the target's shaping like the stream's: the row
    filter (a filtered-out source row in the mirror is deleted), the excluded column
    (never written) and the computed column (computed from the repaired row)."""
    messages, state = golden_state(PG_CAPTURES[0])
    rule = {
        "match": "shop.public.customers",
        "filter": "visits > 0",
        "columns": {"exclude": ["notes"]},
        "computed_columns": {"name_upper": "upper(name)"},
    }
    root = tmp_path / "wh"
    config = config_for(root, True, tables=[rule])
    mirror_capture(messages, root, True, config)
    rows = state["tables"]["customers"]["rows"]
    kept = [r for r in rows if (r["visits"] or 0) > 0]
    dropped = next(r for r in rows if (r["visits"] or 0) < 0)
    path = str(root / "shop.public.customers")
    DeltaTable(path).delete(f"id = {kept[0]['id']}")
    DeltaTable(path).update({"id": str(dropped["id"])}, predicate=f"id = {kept[1]['id']}")
    DeltaTable(path).update({"name": "'renamed'"}, predicate=f"id = {kept[2]['id']}")

    run = run_verify(config, pg_url(pg), OPTIONS, say=lambda line: None, repair=True)
    [report] = run.repairs
    actions = {k.key["id"]: (k.found, k.action, k.outcome) for k in report.keys}
    assert actions == {
        kept[0]["id"]: ("missing", "upsert", "repaired"),
        kept[1]["id"]: ("missing", "upsert", "repaired"),
        kept[2]["id"]: ("different", "upsert", "repaired"),
        dropped["id"]: ("extra", "delete", "repaired"),
    }
    assert run_verify(config, pg_url(pg), OPTIONS, say=lambda line: None).equal
    mirror = DeltaTable(path).to_pyarrow_table()
    assert "notes" not in mirror.column_names
    by_id = {r["id"]: r for r in mirror.to_pylist()}
    for row in (kept[0], kept[2]):
        assert by_id[row["id"]]["name_upper"] == row["name"].upper()


def test_a_history_table_is_refused_by_repair_and_the_run_exits_1(pg, tmp_path):
    """SCD type 2: a repair would write a version no source change made. The table is
    named as not repaired, nothing is written, and the run is not settled (exit 1)."""
    messages, state = golden_state(PG_CAPTURES[0])
    root = tmp_path / "wh"
    config = config_for(root, True, tables=[{"match": "shop.public.customers", "mode": "history"}])
    mirror_capture(messages, root, True, config)
    path = str(root / "shop.public.customers")
    DeltaTable(path).update({"name": "'renamed'"}, predicate="id = 6 AND __is_current")
    version = DeltaTable(path).version()

    run = run_verify(config, pg_url(pg), OPTIONS, say=lambda line: None, repair=True)
    customers = {t.target: t for t in run.tables}["shop.public.customers"]
    assert [d["key"] for d in customers.different] == [{"id": 6}]
    [report] = run.repairs
    assert list(report.refused) == ["shop.public.customers"]
    assert "history (SCD type 2)" in report.refused["shop.public.customers"]
    assert report.keys == [] and not settled(run)
    assert DeltaTable(path).version() == version and _marks(root) == []


def test_the_command_repairs_and_exits_0_and_says_so_in_json(pg, tmp_path, capsys):
    messages, _ = golden_state(PG_CAPTURES[0])
    mirror_capture(messages, tmp_path / "wh", True)
    DeltaTable(str(tmp_path / "wh" / "shop.public.customers")).delete("id = 5")
    args = ["verify", str(write_config(tmp_path)), "--source-db", pg_url(pg), "--wait-s", "0"]
    assert main([*args, "--recheck-after-s", "0", "--repair", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["equal"] is False and report["settled"] is True
    [repair] = report["repairs"]
    assert repair["outcomes"] == {"repaired": 1} and repair["keys"][0]["key"] == {"id": 5}
    assert "mismatches" not in report
    assert main([*args, "--recheck-after-s", "0"]) == 0  # and the next verify is equal
