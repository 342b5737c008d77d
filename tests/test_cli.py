"""The cdcflow command, called in-process through cli.main."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from cdcflow.cli import main

CASES = Path(__file__).parent / "formats" / "cases"


def _events(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize(
    "fmt, case",
    [
        ("dataworks-json", "doc-all-examples"),
        ("debezium-json", "seed-4-update-corrected"),
        ("canal-json", "seatunnel-canal-data"),
    ],
)
def test_decode_prints_the_golden_events(capsys, fmt, case):
    path = CASES / fmt / f"{case}.input.jsonl"
    if not path.exists():
        pytest.fail(f"golden input {path} is missing")
    opts = CASES / fmt / f"{case}.options.json"
    args = ["decode", "--format", fmt, str(path)]
    if opts.exists():
        for table, cols in json.loads(opts.read_text()).get("primary_keys", {}).items():
            args += ["--primary-key", f"{table}={','.join(cols)}"]
    code = main(args)
    out, err = capsys.readouterr()
    expected = [
        x
        for x in _events((CASES / fmt / f"{case}.expected.jsonl").read_text())
        if "dead_letter" not in x and "skipped" not in x
    ]
    assert _events(out) == expected
    assert "records:" in err
    assert code == (
        1 if "dead_letter" in (CASES / fmt / f"{case}.expected.jsonl").read_text() else 0
    )


def test_decode_reports_dead_letters_on_stderr_and_exits_1(tmp_path, capsys):
    f = tmp_path / "m.jsonl"
    f.write_text('{"not": "debezium"}\nnull\n{oops\n')
    assert main(["decode", "--format", "debezium-json", str(f)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    dead = [json.loads(line)["dead_letter"] for line in err.splitlines() if line.startswith("{")]
    assert [(d["line"], d["code"]) for d in dead] == [(1, "MISSING_FIELD"), (3, "BAD_JSON")]
    assert "1 skipped, 2 dead letters" in err


def test_apply_writes_delta_tables_and_prints_them(tmp_path, capsys):
    wh = tmp_path / "wh"
    src = CASES / "dataworks-json" / "paimon-aliyun-insert.input.jsonl"
    assert main(["apply", "--format", "dataworks-json", "--warehouse", str(wh), str(src)]) == 0
    out = capsys.readouterr().out
    assert "batch 0: 1 records, 1 events" in out
    assert "bigdata_test.sync_test_table" in out and str(wh) in out
    # a second call is the next batch of the same warehouse
    upd = CASES / "dataworks-json" / "paimon-aliyun-update-in-one.input.jsonl"
    assert main(["apply", "--format", "dataworks-json", "--warehouse", str(wh), str(upd)]) == 0
    assert "batch 1:" in capsys.readouterr().out
    from deltalake import DeltaTable

    rows = DeltaTable(str(wh / "bigdata_test.sync_test_table")).to_pyarrow_table().to_pylist()
    assert [(r["id"], r["val"]) for r in rows] == [(2, 2.2)]


def test_apply_primary_key_option(tmp_path, capsys):
    f = tmp_path / "m.jsonl"
    f.write_text(
        '{"before": null, "after": {"code": "A", "n": 1}, "op": "c", '
        '"source": {"db": "d", "schema": "s", "table": "t", "lsn": 1}}\n'
    )
    main(["apply", "--format", "debezium-json", "--warehouse", str(tmp_path / "wh"), str(f)])
    assert "dead letters {'MISSING_KEY': 1}" in capsys.readouterr().out
    # the same file again: its line was applied (as a dead letter) once, and stays so
    main(["apply", "--format", "debezium-json", "--warehouse", str(tmp_path / "wh"), str(f)])
    assert "1 records were applied before and were skipped" in capsys.readouterr().out
    f = f.rename(tmp_path / "again.jsonl")
    main(
        [
            "apply",
            "--format",
            "debezium-json",
            "--warehouse",
            str(tmp_path / "wh"),
            "--primary-key",
            "t=code",
            str(f),
        ]
    )
    assert "d.s.t" in capsys.readouterr().out


def test_bad_config_exits_2_naming_the_key(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "warehouse: w\ncheckpoint: c\nkafka: {bootstrap: x}\nsources: [{format: debezium-json, topics: [a]}]\n"
    )
    assert main(["run", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "kafka.bootstrap: unknown key" in err and "bootstrap_servers" in err


def test_report_to_an_output_that_cannot_be_written_exits_2_in_one_line(tmp_path, capsys):
    from tests.report_warehouse import build_warehouse

    built = build_warehouse(tmp_path / "wh")
    (tmp_path / "taken").write_text("a file where the output's folder should be")
    output = tmp_path / "taken" / "report.html"
    assert main(["report", "--warehouse", str(built.root), "-o", str(output)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1  # one line, no traceback
    assert captured.err.startswith(f"cdcflow: [BAD_CONFIG] cannot write the report to {output}: ")
    assert "cdcflow report -o FILE" in captured.err


def test_source_unavailable_exits_69_with_one_line(monkeypatch, capsys):
    """Where the run stops on SOURCE_UNAVAILABLE (start-up or a failed query), main maps
    it to 69 (tests/e2e/test_broker_outage.py runs the real thing); other source errors
    stay 1."""
    import cdcflow.cli as cli
    from cdcflow.errors import Code, SourceError

    def unavailable(args):
        raise SourceError("Kafka brokers h:1 unavailable for 300 s (...)", Code.SOURCE_UNAVAILABLE)

    monkeypatch.setattr(cli, "cmd_run", unavailable)
    assert main(["run", "pipeline.yaml"]) == cli.EXIT_SOURCE_UNAVAILABLE == 69
    captured = capsys.readouterr()
    assert captured.err == (
        "cdcflow: [SOURCE_UNAVAILABLE] Kafka brokers h:1 unavailable for 300 s (...)\n"
    )
    assert captured.out == ""

    def data_loss(args):
        raise SourceError("records were deleted", Code.DATA_LOSS)

    monkeypatch.setattr(cli, "cmd_run", data_loss)
    assert main(["run", "pipeline.yaml"]) == 1


def test_unknown_format_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["decode", "--format", "nope", "x"])
    assert e.value.code == 2


@pytest.mark.spark
@pytest.mark.kafka
def test_run_once_from_a_yaml_file(spark, broker, tmp_path, capsys):
    from cdcflow_testkit.encoders import encoder_for
    from cdcflow_testkit.workload import Workload, compare_with_mirror, tables_for

    enc = encoder_for("debezium-json")
    w = Workload(tables_for(enc.exact_types), seed=2)
    broker.create_topic("cli.run", partitions=1)
    broker.produce("cli.run", [m for c in w.changes(100) for m in enc.encode(c)], partition=0)
    cfg = tmp_path / "pipeline.yaml"
    cfg.write_text(
        f"pipeline_id: cli\nwarehouse: wh\ncheckpoint: ck\n"
        f"kafka: {{bootstrap_servers: '{broker.bootstrap_servers}'}}\n"
        f"sources: [{{format: debezium-json, topics: [cli.run]}}]\n"
    )
    assert main(["run", str(cfg), "--once"]) == 0
    assert "100 records, 100 events" in capsys.readouterr().out
    from cdcflow.sinks.warehouse import DeltaWarehouse

    wh = DeltaWarehouse(str(tmp_path / "wh"))
    for spec in w.tables:
        assert (
            compare_with_mirror(
                w.expected_rows(spec.name), wh.read(f"shop.public.{spec.name}"), spec.key_columns
            )
            == []
        )

    # cdcflow status: the warehouse's view, with the brokers' log ends (issue 19, item 4)
    started = time.monotonic()
    assert main(["status", str(cfg)]) == 0
    out = capsys.readouterr().out
    with capsys.disabled():
        print(f"status in {time.monotonic() - started:.1f} s:\n{out}")
    assert "lease     pipeline cli: no run holds its lease" in out
    assert re.search(
        r"^  cli\.debezium-json: micro-batch 0 \(apply 0\) applied .*; 100 records; 0 records behind",
        out,
        re.M,
    )
    assert "    cli.run[0] next offset 100 of 100 (0 behind)" in out
    for spec in w.tables:
        rows = len(w.expected_rows(spec.name))
        assert re.search(
            rf"^  shop\.public\.{spec.name} +{rows:,} rows .* taking changes$", out, re.M
        )
    assert out.rstrip().endswith("dead letters 0")
    assert main(["status", "--warehouse", str(tmp_path / "wh"), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    [source] = found["sources"]
    assert (source["name"], source["records"], source["behind"]) == ("cli.debezium-json", 100, None)
    assert source["partitions"] == [
        {"topic": "cli.run", "partition": 0, "next_offset": 100, "log_end": None, "behind": None}
    ]
    assert found["brokers"] == "give CONFIG to ask the brokers"

    # cdcflow report: one HTML file from the _cdcflow tables (its content: test_report.py)
    report = tmp_path / "out" / "report.html"
    assert main(["report", str(cfg), "-o", str(report)]) == 0
    assert capsys.readouterr().out.startswith(f"{report}: 1 micro-batches of 1 source(s), 3 tables")
    assert report.stat().st_size > 100_000 and b"cli.debezium-json" in report.read_bytes()

    # resume refuses what does not exist, and writes nothing
    assert main(["resume", "--warehouse", str(tmp_path / "wh"), "shop.public.nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cdcflow: [BAD_CONFIG] no table 'shop.public.nope' in ")
    assert "(no table is stopped)" in err
    assert main(["resume", "--warehouse", str(tmp_path / "wh"), "shop.public.orders"]) == 0
    assert capsys.readouterr().out == "shop.public.orders: not stopped; nothing to resume\n"
    assert main(["resume", "--warehouse", str(tmp_path / "nowhere"), "t"]) == 2
    assert "no cdcflow warehouse there" in capsys.readouterr().err
    assert not (tmp_path / "nowhere").exists()


def test_decode_keyless_full_row(tmp_path, capsys):
    line = (
        b'{"data":[{"v0":"five","v1":"50"}],"old":null,"database":"d","es":1,"id":1,'
        b'"isDdl":false,"mysqlType":{"v0":"VARCHAR(10)","v1":"INT"},"pkNames":[],"sql":"",'
        b'"sqlType":{},"table":"t","ts":1,"type":"INSERT"}\n'
    )
    path = tmp_path / "keyless.jsonl"
    path.write_bytes(line)
    assert main(["decode", "--format", "canal-json", str(path)]) == 1
    assert "keyless: full_row" in capsys.readouterr().err
    assert main(["decode", "--format", "canal-json", "--keyless", "full_row", str(path)]) == 0
    event = json.loads(capsys.readouterr().out)
    assert event["key"] == {"v0": "five", "v1": 50}


def test_run_refuses_while_another_run_holds_the_pipeline(tmp_path):
    """A second ``cdcflow run`` of a held pipeline: exit 75 and one line, before any Spark.

    The test process holds the lease in place of a running pipeline. JAVA_HOME points
    nowhere, so a run that got as far as starting Spark would fail another way.
    """
    import os
    import re
    import subprocess
    import sys
    import time

    from cdcflow.cli import EXIT_PIPELINE_RUNNING
    from cdcflow.sinks.lease import PipelineLease

    cfg = tmp_path / "pipeline.yaml"
    cfg.write_text(
        "pipeline_id: orders\nwarehouse: wh\ncheckpoint: ck\n"
        "kafka: {bootstrap_servers: '127.0.0.1:1'}\n"
        "sources: [{format: debezium-json, topics: [t]}]\n"
    )
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src, "JAVA_HOME": str(tmp_path / "no-java")}
    with PipelineLease(str(tmp_path / "wh"), "orders", ttl_s=30) as holder:
        before = holder.read()
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "cdcflow.cli", "run", str(cfg)],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        elapsed = time.monotonic() - started
        assert holder.read().version == before.version  # the running one was not touched
        assert holder.held
    assert done.returncode == EXIT_PIPELINE_RUNNING == 75, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("cdcflow: [PIPELINE_RUNNING] pipeline 'orders' is already running")
    assert f"(pid {os.getpid()}) since " in lines[0]
    assert f"stop that process (kill {os.getpid()})" in lines[0]
    assert re.search(r"if it died without releasing its lease, run again in [123]\d s$", lines[0])
    assert done.stdout == ""
    assert elapsed < 10, f"refusal took {elapsed:.1f} s"  # ~0.5 s here: Python start + config


def test_reset_prints_its_plan_then_deletes_only_the_checkpoint(tmp_path, capsys):
    config = tmp_path / "p.yaml"
    config.write_text(
        "pipeline_id: r\nwarehouse: wh\ncheckpoint: ck\n"
        "kafka: {bootstrap_servers: '127.0.0.1:1'}\n"
        "sources: [{format: debezium-json, topics: [t]}]\n"
    )
    (tmp_path / "ck" / "debezium-json" / "offsets").mkdir(parents=True)
    (tmp_path / "wh" / "t").mkdir(parents=True)
    assert main(["reset", str(config)]) == 1  # only the plan
    out = capsys.readouterr().out
    assert "delete checkpoint" in out and "--yes" in out
    assert (tmp_path / "ck" / "debezium-json").exists()
    assert main(["reset", str(config), "--yes"]) == 0
    assert not (tmp_path / "ck" / "debezium-json").exists() and (tmp_path / "wh" / "t").exists()
    assert main(["reset", str(config), "--warehouse", "--yes"]) == 0
    assert not (tmp_path / "wh").exists()


@pytest.mark.parametrize(
    ("argv", "level"),
    [
        ([], "WARNING"),
        (["-v"], "INFO"),
        (["--log-level", "debug"], "DEBUG"),
        (["--log-level", "ERROR", "-v"], "ERROR"),  # the named level wins
    ],
)
def test_log_level_and_verbose_before_or_after_the_command(argv, level):
    from cdcflow.cli import build_parser, log_level

    parser = build_parser()
    command = ["resume", "--warehouse", "w", "t"]
    assert log_level(parser.parse_args(argv + command)) == level
    assert log_level(parser.parse_args(command[:1] + argv + command[1:])) == level


def test_decode_reads_kcat_key_value_lines(tmp_path, capsys):
    """``kcat -K'\\t'`` prints ``key<TAB>value``: the key reaches the decoder (the Debezium
    case whose key names the row's key column, tests/formats/cases/debezium-json/SOURCES.md),
    and ``key<TAB>`` with no value is a tombstone."""
    case = CASES / "debezium-json" / "seed-2-key-corrected"
    keys = Path(f"{case}.keys.jsonl").read_text().splitlines()
    values = Path(f"{case}.input.jsonl").read_text().splitlines()
    lines = [f"{'' if k == 'null' else k}\t{v}" for k, v in zip(keys, values, strict=True)]
    lines.append(keys[0] + "\t")  # the tombstone that follows a delete
    f = tmp_path / "kcat.txt"
    f.write_text("\n".join(lines) + "\n")
    expected = [
        x
        for x in _events(Path(f"{case}.expected.jsonl").read_text())
        if "dead_letter" not in x and "skipped" not in x
    ]
    assert main(["decode", "--format", "debezium-json", "-K", "\\t", str(f)]) == 0
    out, err = capsys.readouterr()
    assert _events(out) == expected
    assert f"{len(lines)} records" in err and "1 skipped, 0 dead letters" in err
    # without -K the same lines are not JSON: every one a dead letter
    assert main(["decode", "--format", "debezium-json", str(f)]) == 1
    assert "0 events" in capsys.readouterr().err


def test_decode_ends_quietly_when_the_reader_closes_the_pipe(tmp_path):
    """``cdcflow decode ... | head -1``: no BrokenPipe traceback, exit 0."""
    import subprocess
    import sys

    case = CASES / "canal-json" / "seatunnel-canal-data.input.jsonl"
    f = tmp_path / "many.jsonl"
    f.write_text(case.read_text() * 400)  # far more output than a pipe buffers
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from cdcflow.cli import entry; entry()",
            "decode",
            "--format",
            "canal-json",
            str(f),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    first = proc.stdout.readline()
    proc.stdout.close()  # as head -1 does
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, err.decode()
    assert json.loads(first)["op"]
    assert b"Traceback" not in err and b"BrokenPipe" not in err


def _debezium_read_as_canal(broker, tmp_path, topic: str, apply: str = ""):
    """A pipeline whose source says canal-json over a topic of Debezium messages (issue 19:
    every record is a dead letter)."""
    from cdcflow_testkit.encoders import encoder_for
    from cdcflow_testkit.workload import Workload, tables_for

    enc = encoder_for("debezium-json")
    w = Workload(tables_for(enc.exact_types), seed=3)
    broker.create_topic(topic, partitions=1)
    broker.produce(topic, [m for c in w.changes(40) for m in enc.encode(c)], partition=0)
    tmp_path.mkdir(exist_ok=True)
    cfg = tmp_path / "pipeline.yaml"
    cfg.write_text(
        f"pipeline_id: cli\nwarehouse: wh\ncheckpoint: ck\n{apply}"
        f"kafka: {{bootstrap_servers: '{broker.bootstrap_servers}'}}\n"
        f"sources: [{{name: mysql, format: canal-json, topics: [{topic}]}}]\n"
    )
    return cfg, w


@pytest.mark.spark
@pytest.mark.kafka
def test_a_batch_of_dead_letters_is_warned_about_and_the_limit_stops_the_run(
    spark, broker, tmp_path, capsys
):
    """Found in issue 19: 1,700 dead letters and not one console line. Now the micro-batch's
    line counts them by code and a warning names the top code and what to check; with
    ``apply.dead_letter_limit`` the run stops after committing them (exit 1, one line)."""
    cfg, w = _debezium_read_as_canal(broker, tmp_path, "cli.wrong-format")
    started = time.monotonic()
    assert main(["run", str(cfg), "--once"]) == 0
    lines = capsys.readouterr().err.splitlines()
    [line] = [x for x in lines if x.startswith("batch ")]
    assert re.fullmatch(
        r"batch 0 mysql: 40 records -> 0 events, .*; 40 dead letters \((\w+) 40\); 0 behind", line
    )
    code = re.search(r"40 dead letters \((\w+) 40\)", line).group(1)
    [warning] = [x for x in lines if x.startswith("WARNING")]
    assert warning.startswith(
        f"WARNING source mysql: every record of micro-batch 0 failed, most with {code} (40): "
        "is cli.wrong-format really canal-json? `cdcflow inspect CONFIG` shows what the topics "
        "hold, `cdcflow dead-letters show CONFIG --source mysql"
    )
    with capsys.disabled():
        print(f"warned in {time.monotonic() - started:.1f} s: {warning}")

    # cdcflow inspect: the topic's first messages, what they look like and what the
    # configured format makes of them
    started = time.monotonic()
    assert main(["inspect", str(cfg), "-n", "2"]) == 0
    shown = capsys.readouterr().out.splitlines()
    inspect_s = time.monotonic() - started
    assert shown[0].startswith("cli.wrong-format[0]@0  ") and shown[0].endswith(
        " UTC  (source mysql)"
    )
    assert shown[1].startswith('  key:      {"schema"') and shown[2].startswith(
        '  value:    {"schema"'
    )
    assert shown[3] == "  looks like: debezium-json  <- the source says canal-json"
    assert shown[4].startswith(f"  canal-json: DEAD LETTER {code}: ")
    assert shown[5].startswith("cli.wrong-format[0]@1  ") and len(shown) == 10
    assert inspect_s < 10, "no Spark: seconds"
    assert (
        main(["inspect", str(cfg), "--topic", "cli.wrong-format", "-n", "1", "--last", "--json"])
        == 0
    )
    [last] = json.loads(capsys.readouterr().out)
    assert (last["offset"], last["detected"], last["dead_letter"][0]) == (
        39,
        ["debezium-json"],
        code,
    )
    assert main(["inspect", str(cfg), "--topic", "nope"]) == 2
    assert "--topic 'nope': no source reads it" in capsys.readouterr().err

    # what the warning says to run: the dead letters, by code, in full, and exported in the
    # form `cdcflow decode` reads, where the right format decodes every one
    assert main(["dead-letters", "list", str(cfg)]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0].startswith("40 dead letters in ")
    assert re.fullmatch(rf"{code} +decode +40 +0-39  cli\.wrong-format", listed[2])
    assert main(["dead-letters", "show", str(cfg), "--source", "mysql", "--code", code]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[0] == "5 of 40 dead letters (newest last)"
    assert shown[1] == f"cli.wrong-format[0]@35  {code} (decode, canal-json, apply 0)"
    assert shown[2].startswith("  message: ") and shown[-1].startswith('  value:   {"schema"')
    assert main(["dead-letters", "list", str(cfg), "--code", "NO_SUCH_CODE", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    exported = tmp_path / "failed.txt"
    export = ["dead-letters", "export", str(cfg), "--values", "-K", "\\t", "-o", str(exported)]
    assert main(export) == 0
    assert len(exported.read_text().splitlines()) == 40
    assert main(["decode", "--format", "debezium-json", "-K", "\\t", str(exported)]) == 0
    assert "40 records: 40 decoded into 40 events, 0 skipped, 0 dead letters" in (
        capsys.readouterr().err
    )
    assert main(["dead-letters", "export", "--warehouse", str(tmp_path / "wh")]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["offset"] for r in rows] == list(range(40))
    assert {r["code"] for r in rows} == {code} and rows[0]["raw_value"].startswith('{"schema"')

    _replay_after_the_fix(cfg, w, tmp_path, capsys)

    limited, _ = _debezium_read_as_canal(
        broker, tmp_path / "limited", "cli.wrong-format-2", "apply: {dead_letter_limit: 0.5}\n"
    )
    assert main(["run", str(limited), "--once"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith(
        "cdcflow: [DEAD_LETTER_LIMIT] source mysql: 40 of 40 records of micro-batch 0 are dead "
        f"letters (most {code}), over apply.dead_letter_limit 0.5. They are committed"
    )
    from cdcflow.sinks.warehouse import DeltaWarehouse

    wh = DeltaWarehouse(str(tmp_path / "limited" / "wh"))
    letters = wh.open(wh.system_path("dead_letters")).to_pyarrow_table()
    assert letters.num_rows == 40  # committed before the run stopped


def _replay_after_the_fix(cfg: Path, w, tmp_path: Path, capsys) -> None:
    """``cdcflow dead-letters replay`` after the source's format is corrected: a replay
    killed between its tables and its completion is finished by the next one, every
    record is applied once, and the mirrors equal the source (issue 19, item 4)."""
    from cdcflow.commands.replay import replay
    from cdcflow.config import load_config
    from cdcflow.errors import CdcflowError
    from cdcflow.sinks.warehouse import DeltaWarehouse
    from cdcflow_testkit.workload import compare_with_mirror

    assert main(["dead-letters", "replay", str(cfg)]) == 1  # says what it does; --yes does it
    assert "Add --yes to do it" in capsys.readouterr().out
    cfg.write_text(cfg.read_text().replace("format: canal-json", "format: debezium-json"))
    config = load_config(cfg)
    fences = 0

    def killed_before_the_completion() -> None:
        nonlocal fences
        fences += 1
        if fences == 2:  # BatchApplier: 1 before the first commit, 2 before the completion
            raise CdcflowError("killed")

    with pytest.raises(CdcflowError, match="killed"):
        replay(config, fence=killed_before_the_completion)
    assert main(["dead-letters", "replay", str(cfg), "--yes"]) == 0
    out = capsys.readouterr().out
    assert (
        out
        == "cli.mysql: replay 1: 40 dead letters -> 40 events; 40 applied" + out[out.index(" (") :]
    )
    wh = DeltaWarehouse(str(tmp_path / "wh"))
    for spec in w.tables:
        expected = w.expected_rows(spec.name)
        assert (
            compare_with_mirror(expected, wh.read(f"shop.public.{spec.name}"), spec.key_columns)
            == []
        )
    changelog = wh.open(wh.system_path("changelog")).to_pyarrow_table(columns=["offset"])
    assert sorted(changelog["offset"].to_pylist()) == list(range(40))  # each record once
    assert main(["dead-letters", "replay", str(cfg), "--yes"]) == 0
    assert capsys.readouterr().out == "cli.mysql: no dead letter to replay\n"


@pytest.mark.parametrize(
    ("table_rule", "key"),
    [
        ('{match: "*", type_overrides: {a: "decimal(99,200)"}}', "tables[0]: type_overrides.a:"),
        ('{match: "*", filter: "' + "NOT " * 5000 + 'a"}', "tables[0]: filter: cannot parse"),
    ],
)
def test_validate_refuses_bad_shaping_in_one_line(tmp_path, capsys, table_rule, key):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "warehouse: w\ncheckpoint: c\nkafka: {bootstrap_servers: 'x:1'}\n"
        f"sources: [{{format: debezium-json, topics: [a]}}]\ntables: [{table_rule}]\n"
    )
    assert main(["validate", str(cfg), "--no-brokers"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"cdcflow: [BAD_CONFIG] {key}")
