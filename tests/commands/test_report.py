"""``cdcflow.commands.report``: the HTML report of a real (small) warehouse, its ``_cdcflow`` tables
written with delta-rs (``tests/report_warehouse.py``) and read back; the plots' points are
read from the figures' JSON the page embeds. A real browser draws it in
``tests/e2e/test_report_browser.py``."""

from __future__ import annotations

import json
import os
import re
import stat
from datetime import datetime

import pytest
from tests.report_warehouse import (
    T0_MS,
    SourcePlan,
    build_empty_warehouse,
    build_warehouse,
    default_sources,
)

from cdcflow.commands.report import PLOT_IDS, write_report
from cdcflow.errors import ConfigError

EVENTS, LAG, BEHIND, DEAD = PLOT_IDS


def figures(page: str) -> dict[str, tuple[list[dict], dict]]:
    """``{div id: (data, layout)}`` of every ``Plotly.newPlot`` call in ``page``."""
    out = {}
    decoder = json.JSONDecoder()
    for m in re.finditer(r'Plotly\.newPlot\(\s*"([^"]+)",\s*', page):
        data, end = decoder.raw_decode(page, m.end())
        layout, _ = decoder.raw_decode(page, page.index("{", end))
        out[m.group(1)] = (data, layout)
    return out


def traces(figure: tuple[list[dict], dict]) -> dict[str, dict]:
    """Traces by name (the dead letters': ``code@y-axis``)."""
    data, _ = figure
    return {
        t["name"] if t["type"] == "scatter" else f"{t['name']}@{t.get('yaxis', 'y')}": t
        for t in data
    }


def local(ms: int) -> str:
    """A commit time as the page's JSON holds it."""
    return datetime.fromtimestamp(ms / 1000).isoformat()


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    built = build_warehouse(
        root / "wh",
        tables={"shop.public.orders": 3, "shop.public.order_lines": 5},
        stopped={"shop.public.order_lines": 'column "qty" became <int> & then <text>'},
    )
    summary = write_report(str(built.root), root / "out" / "report.html", now_ms=T0_MS + 60_000)
    return built, summary, summary.path.read_text(encoding="utf-8")


def test_summary_names_the_file_and_counts(report):
    built, summary, page = report
    assert summary.path.is_file()
    assert summary.bytes == summary.path.stat().st_size == len(page.encode())
    assert summary.batches == sum(len(s.events) for s in built.sources) == 11
    assert summary.sources == 2
    assert summary.tables == 2
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(summary.path.stat().st_mode) == 0o666 & ~umask  # not mkstemp's 0600
    assert [p.name for p in summary.path.parent.iterdir()] == ["report.html"]  # no temp left
    # plotly.js itself is the bulk of the page: once, not once per plot
    assert 4_000_000 < summary.bytes < 6_000_000


def test_page_is_self_contained_with_plotly_inlined_once(report):
    _, _, page = report
    assert page.startswith("<!DOCTYPE html>")
    assert not re.search(r"<script[^>]*\bsrc=", page), "a script loaded from elsewhere"
    assert not re.search(r"<(link|iframe|img)[^>]*\b(href|src)=\W*https?:", page)
    assert len(re.findall(r"\* plotly\.js v\d", page)) == 1
    assert page.index("* plotly.js v") < page.index("Plotly.newPlot(")
    assert set(figures(page)) == set(PLOT_IDS)


def test_events_per_second_skip_each_source_first_batch(report):
    built, _, page = report
    by_name = traces(figures(page)[EVENTS])
    assert set(by_name) == {"shop.pg", "shop.mysql"}
    for source in built.sources:
        trace = by_name[source.name]
        assert len(trace["x"]) == len(trace["y"]) == built.rate_points(source)
        commits = built.commits(source)
        assert trace["x"] == [local(ms) for ms in commits[1:]]
        expected = [e / (source.every_ms / 1000) for e in source.events[1:]]
        assert trace["y"] == pytest.approx(expected)
    # the dead-letters-only batch of shop.mysql has a rate of 0 events/s
    assert by_name["shop.mysql"]["y"][1] == 0


def test_lag_and_records_behind_per_source(report):
    built, _, page = report
    plots = figures(page)
    lag, behind = traces(plots[LAG]), traces(plots[BEHIND])
    for source in built.sources:
        with_events = [i for i, e in enumerate(source.events) if e]
        assert len(lag[source.name]["x"]) == built.progress_points(source)
        assert lag[source.name]["y"] == [800 + 100 * i for i in with_events]  # ms (< 2 s)
        assert len(behind[source.name]["y"]) == built.behind_points(source)
        assert behind[source.name]["y"] == [
            1_000 * (len(source.events) - i) for i in with_events[1:]
        ]
    assert plots[LAG][1]["yaxis"]["title"]["text"] == "lag (ms)"
    assert "commit time" in plots[EVENTS][1]["xaxis"]["title"]["text"]


def test_dead_letters_stacked_by_code_at_their_batch(report):
    built, _, page = report
    data, layout = figures(page)[DEAD]
    assert layout["barmode"] == "stack"
    mysql = built.sources[1]
    commits = built.commits(mysql)
    bars = {t["name"]: t for t in data}
    assert set(bars) == {"BAD_JSON", "MISSING_FIELD"}  # shop.pg has none: one row only
    assert bars["BAD_JSON"]["x"] == [local(commits[1]), local(commits[2])]
    assert bars["BAD_JSON"]["y"] == [3, 2]
    assert bars["MISSING_FIELD"]["x"] == [local(commits[2])]
    assert bars["MISSING_FIELD"]["y"] == [4]
    assert all(t["type"] == "bar" for t in data)


def test_tables_and_dead_letters_by_code(report):
    built, _, page = report
    tables = page[page.index('id="tables"') :]
    orders = tables[tables.index("shop.public.orders") :].split("</tr>", 1)[0]
    assert re.findall(r"<td class='num'>([^<]*)</td>", orders) == ["3", "1"]  # rows, version
    assert "taking changes" in orders
    lines = tables[tables.index("shop.public.order_lines") :].split("</tr>", 1)[0]
    assert re.findall(r"<td class='num'>([^<]*)</td>", lines) == ["5", "1"]
    assert "stopped" in lines
    letters = page[page.index('id="dead-letters"') :]
    assert "Dead letters by code (9)" in letters
    assert re.search(r"<td>BAD_JSON</td><td class='num'>5</td>", letters)
    assert re.search(r"<td>MISSING_FIELD</td><td class='num'>4</td>", letters)
    assert "/wh</dd>" in page and "2026-01-15" in page  # header: warehouse, made at


def test_warehouse_strings_are_escaped(tmp_path):
    hostile = "shop.<script>alert(1)</script>&co"
    sources = [SourcePlan(hostile, "x.cdc", [10, 20, 30], dead_letters={1: {"BAD_JSON": 1}})]
    build_warehouse(
        tmp_path / "wh",
        sources,
        tables={"shop.public.orders": 2},
        stopped={"shop.public.orders": "<img src=x onerror=alert(2)> dropped"},
    )
    page = write_report(str(tmp_path / "wh"), tmp_path / "r.html").path.read_text()
    assert "<script>alert(1)" not in page
    assert "<img src=x" not in page
    assert "shop.&lt;script&gt;alert(1)&lt;/script&gt;&amp;co" in page  # sources table
    assert "&lt;img src=x onerror=alert(2)&gt; dropped" in page  # the table's stop reason
    # plotly draws names as its own pseudo-HTML: escaped there too (and shown as typed)
    names = {t["name"] for t in figures(page)[LAG][0]}
    assert names == {"shop.&lt;script&gt;alert(1)&lt;/script&gt;&amp;co"}


def test_warehouse_before_records_behind(tmp_path):
    built = build_warehouse(tmp_path / "wh", records_behind=False)
    page = write_report(str(built.root), tmp_path / "r.html").path.read_text()
    plots = figures(page)
    assert set(plots) == {EVENTS, LAG, DEAD}
    assert "Not recorded: no micro-batch has a records_behind value." in page
    assert len(traces(plots[LAG])["shop.pg"]["y"]) == 6


def test_no_batches_yet(tmp_path):
    build_empty_warehouse(tmp_path / "wh", tables={"shop.public.orders": 2})
    summary = write_report(str(tmp_path / "wh"), tmp_path / "r.html")
    page = summary.path.read_text()
    assert (summary.batches, summary.sources, summary.tables) == (0, 0, 1)
    assert "No micro-batch has been applied yet" in page
    assert "Plotly.newPlot" not in page and "plotly.js v" not in page
    assert "shop.public.orders" in page and "No dead letters" in page
    assert page.rstrip().endswith("</html>")
    assert summary.bytes < 20_000


def test_not_a_warehouse(tmp_path):
    (tmp_path / "wh").mkdir()
    with pytest.raises(ConfigError, match="holds no cdcflow tables") as err:
        write_report(str(tmp_path / "wh"), tmp_path / "r.html")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "r.html").exists()


def test_one_pipeline_only(tmp_path):
    other = SourcePlan("billing.pg", "billing.cdc", [5, 6, 7], dead_letters={2: {"BAD_VALUE": 2}})
    build_warehouse(tmp_path / "wh", [*default_sources(), other])
    summary = write_report(str(tmp_path / "wh"), tmp_path / "r.html", pipeline_id="billing")
    plots = figures(summary.path.read_text())
    assert (summary.sources, summary.batches) == (1, 3)
    assert set(traces(plots[LAG])) == {"billing.pg"}
    assert {t["name"] for t in plots[DEAD][0]} == {"BAD_VALUE"}  # not shop.mysql's


def test_newest_batches_only(tmp_path):
    build_warehouse(tmp_path / "wh")
    summary = write_report(str(tmp_path / "wh"), tmp_path / "r.html", max_batches=3)
    page = summary.path.read_text()
    plots = figures(page)
    assert summary.batches == 6
    assert len(traces(plots[LAG])["shop.pg"]["y"]) == 3
    rates = traces(plots[EVENTS])["shop.pg"]["y"]  # the oldest kept has its predecessor's
    assert rates == pytest.approx([e / 1.5 for e in default_sources()[0].events[-3:]])
    assert "(3 older left out)" in page
    # shop.mysql's dead letters of batches 1 and 2 are before its newest three
    assert {t["name"] for t in plots[DEAD][0]} == {"BAD_JSON", "MISSING_FIELD"}
    assert [len(t["x"]) for t in plots[DEAD][0]] == [1, 1]


def test_output_that_cannot_be_written(tmp_path):
    build_empty_warehouse(tmp_path / "wh", tables={"shop.public.orders": 2})
    (tmp_path / "taken").write_text("a file where the output's folder should be")
    output = tmp_path / "taken" / "out" / "r.html"
    with pytest.raises(ConfigError, match="cannot write the report to ") as err:
        write_report(str(tmp_path / "wh"), output)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"[BAD_CONFIG] cannot write the report to {output}: ")
    assert "cdcflow report -o FILE" in message  # the fix
    assert (tmp_path / "taken").read_text().startswith("a file")  # left as it was
