"""``cdcflow report``: one self-contained HTML page of what a warehouse's ``_cdcflow``
tables say about its pipelines, to look at in a browser (no network needed: plotly.js is
inlined once, the rest is plain HTML and CSS).

What the page shows, and where each part comes from:

- plots over commit wall-clock time (local time of the machine making the report), one
  line per source (``<pipeline>.<source>``):

  - events per second of each micro-batch: ``_cdcflow/batches.events`` of the apply over
    the seconds since the source's previous apply committed (``committed_at_ms``); the
    source's first apply has no rate;
  - the source lag: ``_cdcflow/progress.lag_ms`` (commit time minus the newest source
    time of the batch);
  - the records behind the log end: ``_cdcflow/progress.records_behind`` (null, or no
    such column in warehouses before it, is left out);
  - dead letters per micro-batch, stacked by code, one row of bars per source:
    ``_cdcflow/dead_letters`` by ``batch_id`` and ``code``, matched to its source through
    the ``(batch_id, topic)`` of ``_cdcflow/batches``;

- what :func:`cdcflow.commands.status.status` reads: per table its rows, Delta version, last change
  and whether it is stopped; dead letters by code; who holds the lease.

Read-only like ``cdcflow status``: it takes no lease and writes only the HTML file, so it
can run beside the pipeline.
"""

from __future__ import annotations

import contextlib
import html
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeGuard

import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.commands.status import Status, status
from cdcflow.commands.verify import last_verifications
from cdcflow.errors import ConfigError
from cdcflow.runtime.progress import human_duration
from cdcflow.sinks.system_tables import (
    BATCHES,
    BATCHES_SCHEMA,
    DEAD_LETTER_SCHEMA,
    DEAD_LETTERS,
    PROGRESS,
    PROGRESS_SCHEMA,
)
from cdcflow.sinks.warehouse import DeltaWarehouse

__all__ = ["DEFAULT_MAX_BATCHES", "ReportSummary", "write_report"]

#: newest micro-batches per source that the plots keep (the page says when it left some
#: out): bounds the page's size and the browser's work for long-lived warehouses
DEFAULT_MAX_BATCHES = 5_000

#: one colour per source (the same in every plot) and per dead-letter code
_SOURCE_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
_CODE_COLOURS = ["#d62728", "#ff9896", "#bcbd22", "#7f7f7f", "#c49c94", "#f7b6d2", "#dbdb8d"]

#: height of a plot (px); the dead letters' grows by a row of bars per source
_HEIGHT = 340

#: plotly.js's configuration of every plot: a short mode bar, no link out
_CONFIG = {
    "displaylogo": False,
    "responsive": True,
    "modeBarButtonsToRemove": ["select2d", "lasso2d", "zoomIn2d", "zoomOut2d", "autoScale2d"],
}

#: the plots' div ids, in page order
PLOT_IDS = ("plot-events-per-second", "plot-lag", "plot-records-behind", "plot-dead-letters")


@dataclass(frozen=True)
class ReportSummary:
    """What :func:`write_report` wrote."""

    path: Path  # the HTML file
    batches: int  # micro-batches (applies) plotted, all sources together
    sources: int  # sources plotted
    tables: int  # target tables listed
    bytes: int  # size of the HTML file


@dataclass
class _Batch:
    """One apply of one source: what the plots need of it."""

    batch_id: int
    committed_at_ms: int
    events: int | None = None
    lag_ms: int | None = None
    records_behind: int | None = None
    events_per_s: float | None = None
    seconds_since_previous: float | None = None


@dataclass
class _Source:
    name: str
    batches: list[_Batch] = field(default_factory=list)
    left_out: int = 0  # older batches beyond max_batches
    # code -> batch_id -> dead letters; batch_id -> commit time of those without a batch row
    dead_letters: dict[str, dict[int, int]] = field(default_factory=dict)
    dead_letter_times: dict[int, int] = field(default_factory=dict)


def write_report(
    warehouse: str,
    output: str | Path,
    pipeline_id: str | None = None,
    *,
    storage_options: Mapping[str, str] | None = None,
    max_batches: int = DEFAULT_MAX_BATCHES,
    now_ms: int | None = None,
) -> ReportSummary:
    """Write the HTML report of ``warehouse`` to ``output`` (replaced whole, atomically).

    Args:
        warehouse: the warehouse folder or URI (its ``_cdcflow`` tables are read with
            delta-rs).
        output: the HTML file to write; its folder is created if missing.
        pipeline_id: only this pipeline's sources (``<pipeline_id>.<source>``) in the
            plots, and its lease (``None``: every pipeline in the warehouse). The tables
            and the dead letters by code are the whole warehouse's, as ``cdcflow status``
            lists them.
        storage_options: delta-rs's storage options of a warehouse on an object store.
        max_batches: newest micro-batches per source to plot (older ones are left out and
            the page says how many).
        now_ms: the time the report is made, ms since the epoch (default: the wall clock).

    Returns:
        A :class:`ReportSummary`: the file, the micro-batches and sources plotted, the
        tables listed and the file's size in bytes.

    Raises:
        ConfigError: ``warehouse`` holds no cdcflow tables (a wrong folder), or
            ``output`` cannot be written (its folder cannot be created, is not a folder,
            or refuses the write): one line naming the path and the OS error.
        StorageError: a table cannot be read.
    """
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    # raises ConfigError for a wrong folder
    st = status(warehouse, pipeline_id, storage_options=storage_options)
    wh = DeltaWarehouse(warehouse, storage_options=storage_options)
    sources = _read_sources(wh, pipeline_id, max_batches)
    page = _page(st, sources, now_ms, _verified(wh, pipeline_id))
    path = Path(output)
    # beside the file, then renamed over it: a browser never sees half a page; opened
    # plainly (not mkstemp, whose 0600 would hide the report from a web server)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise ConfigError(
            f"cannot write the report to {path}: {exc.strerror or exc}"
            f"{f' ({exc.filename})' if exc.filename else ''}; give an output file in a "
            "folder that can be created and written (cdcflow report -o FILE)"
        ) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return ReportSummary(
        path=path,
        batches=sum(len(s.batches) for s in sources),
        sources=len(sources),
        tables=len(st.tables),
        bytes=path.stat().st_size,
    )


# ---------------------------------------------------------------------------- reading


def _read(wh: DeltaWarehouse, name: str, schema: pa.Schema, columns: Sequence[str]) -> pa.Table:
    """``columns`` of the system table ``name``: empty without the table, and a column the
    table lacks (written by an older cdcflow) as nulls of ``schema``'s type."""
    table = wh.open(wh.system_path(name))
    if table is None:
        return pa.table({c: pa.array([], schema.field(c).type) for c in columns})
    present = {f.name for f in table.schema().fields}
    data = wh.read_system(name, schema, columns=[c for c in columns if c in present])
    for c in columns:
        if c not in present:
            data = data.append_column(c, pa.nulls(data.num_rows, schema.field(c).type))
    return data.select(list(columns))


def _read_sources(wh: DeltaWarehouse, pipeline_id: str | None, max_batches: int) -> list[_Source]:
    """Per source, its applies in order with their rate, lag and records behind, and its
    dead letters by code and batch."""
    prefix = None if pipeline_id is None else f"{pipeline_id}."

    def wanted(source: str | None) -> TypeGuard[str]:
        return source is not None and (prefix is None or source.startswith(prefix))

    # aggregated in Arrow first: a long-lived warehouse has a row per apply and partition
    batches = _read(
        wh, BATCHES, BATCHES_SCHEMA, ["source", "batch_id", "topic", "events", "committed_at_ms"]
    )
    batches = batches.filter(
        pc.and_(pc.is_valid(batches["source"]), pc.is_valid(batches["batch_id"]))
    )
    per_apply = (
        batches.filter(pc.is_valid(batches["committed_at_ms"]))
        .group_by(["source", "batch_id"])
        .aggregate([("committed_at_ms", "max"), ("events", "sum")])
    )
    # (batch_id, topic) -> source, to find the source of a dead letter (the table has none)
    links = batches.group_by(["batch_id", "topic", "source"]).aggregate([])
    progress = _read(
        wh,
        PROGRESS,
        PROGRESS_SCHEMA,
        ["source", "batch_id", "events", "committed_at_ms", "lag_ms", "records_behind"],
    ).to_pylist()
    letters = _read(
        wh, DEAD_LETTERS, DEAD_LETTER_SCHEMA, ["batch_id", "topic", "code", "committed_at_ms"]
    )
    letters = letters.group_by(["batch_id", "topic", "code"]).aggregate(
        [([], "count_all"), ("committed_at_ms", "max")]
    )

    # (source, batch_id) -> _Batch: the batches table has every apply (also one of dead
    # letters only, which has no progress row); progress adds lag and records behind
    applies: dict[tuple[str, int], _Batch] = {}
    for row in per_apply.to_pylist():
        if wanted(row["source"]):
            applies[(row["source"], row["batch_id"])] = _Batch(
                row["batch_id"], row["committed_at_ms_max"], events=row["events_sum"] or 0
            )
    source_of: dict[tuple[int, str], str] = {}  # (batch_id, topic) -> source
    topic_source: dict[str, str] = {}  # topic -> the source of its newest batch
    for row in sorted(links.to_pylist(), key=lambda r: r["batch_id"]):
        source_of[(row["batch_id"], row["topic"])] = row["source"]
        topic_source[row["topic"]] = row["source"]
    for row in progress:
        name, batch_id, at = row["source"], row["batch_id"], row["committed_at_ms"]
        if not wanted(name) or batch_id is None:
            continue
        b = applies.get((name, batch_id))
        if b is None:
            if at is None:
                continue
            b = applies[(name, batch_id)] = _Batch(batch_id, at, events=row["events"])
        b.lag_ms, b.records_behind = row["lag_ms"], row["records_behind"]

    by_name: dict[str, _Source] = {}
    for (name, _), b in sorted(applies.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        by_name.setdefault(name, _Source(name)).batches.append(b)
    for s in by_name.values():
        _rates(s.batches)  # before the cut: the oldest batch kept has its predecessor
        if len(s.batches) > max_batches:
            s.left_out = len(s.batches) - max_batches
            s.batches = s.batches[-max_batches:]

    kept = {(name, b.batch_id) for name, s in by_name.items() for b in s.batches}
    for row in letters.to_pylist():
        batch_id, topic, at = row["batch_id"], row["topic"], row["committed_at_ms_max"]
        name = source_of.get((batch_id, topic)) or topic_source.get(topic)
        if not wanted(name) or batch_id is None:
            continue
        if (name, batch_id) not in kept:
            own = by_name.get(name)
            oldest = own.batches[0].batch_id if own is not None and own.batches else None
            if (oldest is not None and batch_id < oldest) or at is None:
                continue  # before the plotted window, or no time to plot it at
            by_name.setdefault(name, _Source(name)).dead_letter_times[batch_id] = at
        codes = by_name[name].dead_letters.setdefault(row["code"] or "(no code)", {})
        codes[batch_id] = codes.get(batch_id, 0) + row["count_all"]
    return [by_name[n] for n in sorted(by_name)]


def _rates(batches: list[_Batch]) -> None:
    """Events per second of each batch: its events over the seconds since the previous
    batch committed (none for the first, nor for a batch committed no later)."""
    for previous, b in zip(batches, batches[1:], strict=False):
        seconds = (b.committed_at_ms - previous.committed_at_ms) / 1000
        if seconds > 0 and b.events is not None:
            b.seconds_since_previous = seconds
            b.events_per_s = b.events / seconds


# ---------------------------------------------------------------------------- plots


def _local(ms: float) -> datetime:
    """A commit time as the naive local datetime plotly draws as it is."""
    return datetime.fromtimestamp(ms / 1000)


def _stamp(ms: int | None) -> str:
    if ms is None:
        return "never"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def _utc_offset() -> str:
    offset = time.strftime("%z")  # +0100
    return f"UTC{offset[:3]}:{offset[3:]}" if len(offset) == 5 else "local time"


def _lag_unit(max_ms: float) -> tuple[float, str]:
    """A divisor of ms and its unit name that keep the lag axis's numbers readable."""
    for limit, divisor, unit in (
        (2_000, 1, "ms"),
        (120_000, 1_000, "s"),
        (7_200_000, 60_000, "min"),
        (172_800_000, 3_600_000, "h"),
    ):
        if max_ms < limit:
            return divisor, unit
    return 86_400_000, "days"


def _layout(go: Any, title: str, y_title: str, x_range: list[datetime], height: int) -> Any:
    return go.Layout(
        title={"text": title, "x": 0.01, "xanchor": "left", "y": 0.98, "yanchor": "top"},
        title_font={"size": 16},
        height=height,
        margin={"l": 64, "r": 16, "t": 72, "b": 48},
        paper_bgcolor="white",
        plot_bgcolor="white",
        font={"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 13},
        hovermode="closest",
        showlegend=True,
        legend=_legend(height),
        xaxis={
            "title": {"text": f"commit time ({_utc_offset()})"},
            "type": "date",
            "range": x_range,
            "gridcolor": "#e8e8e8",
            "linecolor": "#888",
            "showline": True,
        },
        yaxis={
            "title": {"text": y_title},
            "gridcolor": "#e8e8e8",
            "linecolor": "#888",
            "showline": True,
            "rangemode": "tozero",
            "zerolinecolor": "#bbb",
        },
    )


def _legend(height: int) -> dict[str, Any]:
    """The legend of a plot ``height`` px tall: a row under the title, in the figure's
    own coordinates, so plotly widens the top margin to fit it however many lines it wraps
    onto (over the plot area instead, a long legend grows up over the title)."""
    return {
        "orientation": "h",
        "yref": "container",
        "yanchor": "top",
        "y": 1 - 40 / height,
        "xanchor": "left",
        "x": 0,
    }


def _x_range(sources: list[_Source]) -> list[datetime]:
    """One time range for every plot (so they line up on the page), padded a little."""
    times = [b.committed_at_ms for s in sources for b in s.batches]
    times += [t for s in sources for t in s.dead_letter_times.values()]
    lo, hi = min(times), max(times)
    pad = max((hi - lo) * 0.03, 2_000)
    return [_local(lo - pad), _local(hi + pad)]


def _line(go: Any, s: _Source, colour: str, points: list[tuple[_Batch, float]], hover: list[str]):
    return go.Scatter(
        x=[_local(b.committed_at_ms) for b, _ in points],
        y=[y for _, y in points],
        name=html.escape(s.name),
        mode="lines+markers",
        line={"color": colour, "width": 2},
        marker={"color": colour, "size": 6},
        hovertext=hover,
        hoverinfo="text",
    )


def _colours(sources: list[_Source]) -> dict[str, str]:
    """Source name -> its colour in every plot (and its swatch in the sources table)."""
    return {s.name: _SOURCE_COLOURS[i % len(_SOURCE_COLOURS)] for i, s in enumerate(sources)}


def _figures(sources: list[_Source]) -> list[tuple[str, Any | None, str]]:
    """``(div id, figure or None, note)`` of each plot; ``None``: nothing to plot (the
    note says why)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    x_range = _x_range(sources)
    colour = _colours(sources)
    out: list[tuple[str, Any | None, str]] = []

    def line_plot(value, detail, plot_id: str, title: str, y_title: str, caption: str):
        """One line per source of ``value(batch)`` (``None``: no point), ``detail(batch,
        value)`` on hover."""
        traces = []
        for s in sources:
            points = [(b, v) for b in s.batches if (v := value(b)) is not None]
            hover = [
                f"{html.escape(s.name)}<br>micro-batch {b.batch_id} at {_stamp(b.committed_at_ms)}"
                f"<br>{detail(b, v)}"
                for b, v in points
            ]
            if points:
                traces.append(_line(go, s, colour[s.name], points, hover))
        layout = _layout(go, title, y_title, x_range, _HEIGHT)
        out.append((plot_id, go.Figure(traces, layout) if traces else None, caption))

    line_plot(
        lambda b: b.events_per_s,
        lambda b, rate: (
            f"{b.events:,} events in {b.seconds_since_previous:.1f} s: {rate:,.0f} events/s"
        ),
        PLOT_IDS[0],
        "Events per second",
        "events/s",
        "events of a micro-batch over the seconds since the source's previous one "
        "committed (_cdcflow/batches); the first micro-batch has no rate",
    )
    lags = [b.lag_ms for s in sources for b in s.batches if b.lag_ms is not None]
    divisor, unit = _lag_unit(max(lags, default=0))
    line_plot(
        lambda b: None if b.lag_ms is None else b.lag_ms / divisor,
        lambda b, _: f"lag {human_duration(b.lag_ms / 1000)}",
        PLOT_IDS[1],
        "Source lag at commit",
        f"lag ({unit})",
        "commit time minus the newest source time of the micro-batch (_cdcflow/progress.lag_ms)",
    )
    line_plot(
        lambda b: b.records_behind,
        lambda b, behind: f"{behind:,} records behind the log end",
        PLOT_IDS[2],
        "Records behind the log end",
        "records",
        "records between the micro-batch's end offsets and the log ends Spark last "
        "reported (_cdcflow/progress.records_behind; not recorded by warehouses "
        "before the column, nor when Spark had not reported the log ends)",
    )

    # dead letters per micro-batch, stacked by code, one row per source
    with_letters = [s for s in sources if s.dead_letters]
    figure = None
    if with_letters:
        codes = sorted({c for s in with_letters for c in s.dead_letters})
        code_colour = {c: _CODE_COLOURS[i % len(_CODE_COLOURS)] for i, c in enumerate(codes)}
        rows = len(with_letters)
        figure = make_subplots(
            rows=rows,
            cols=1,
            shared_xaxes=True,
            vertical_spacing=min(0.12, 0.3 / rows),
            subplot_titles=[html.escape(s.name) for s in with_letters],
        )
        shown: set[str] = set()
        for row, s in enumerate(with_letters, start=1):
            commit = {b.batch_id: b.committed_at_ms for b in s.batches}
            commit.update(s.dead_letter_times)
            width = _bar_width_ms(sorted(commit.values()))
            for code in sorted(s.dead_letters):
                per_batch = sorted(s.dead_letters[code].items())
                figure.add_trace(
                    go.Bar(
                        x=[_local(commit[b]) for b, _ in per_batch],
                        y=[n for _, n in per_batch],
                        width=[width] * len(per_batch),
                        name=html.escape(code),
                        legendgroup=html.escape(code),
                        showlegend=code not in shown,
                        marker={"color": code_colour[code]},
                        hovertext=[
                            f"{html.escape(s.name)}<br>micro-batch {b} at {_stamp(commit[b])}"
                            f"<br>{n:,} dead letters {html.escape(code)}"
                            for b, n in per_batch
                        ],
                        hoverinfo="text",
                    ),
                    row=row,
                    col=1,
                )
                shown.add(code)
            stacks: dict[int, int] = defaultdict(int)
            for counts in s.dead_letters.values():
                for b, n in counts.items():
                    stacks[b] += n
            if max(stacks.values()) <= 6:  # whole dead letters: no 0.5 ticks
                figure.update_yaxes(tick0=0, dtick=1, row=row, col=1)
        base = _layout(go, "Dead letters per micro-batch", "", x_range, _HEIGHT)
        height = _HEIGHT - 160 + 160 * rows
        figure.update_layout(
            title=base.title,
            height=height,
            margin=base.margin,
            paper_bgcolor="white",
            plot_bgcolor="white",
            font=base.font,
            legend=_legend(height),
            barmode="stack",
            bargap=0.1,
            hovermode="closest",
        )
        axis = {"gridcolor": "#e8e8e8", "linecolor": "#888", "showline": True}
        # stacked bars would put the ticks at their own (odd) times: round ones instead
        figure.update_xaxes(type="date", range=x_range, **_date_ticks(x_range), **axis)
        figure.update_xaxes(title_text=f"commit time ({_utc_offset()})", row=rows, col=1)
        figure.update_yaxes(title_text="dead letters", rangemode="tozero", **axis)
        # the sources' names over their rows, right: the codes' legend is left
        figure.update_annotations(font_size=13, xanchor="right", x=1)
    out.append(
        (
            PLOT_IDS[3],
            figure,
            "dead letters of each micro-batch by code (_cdcflow/dead_letters, matched to "
            "the source by batch and topic in _cdcflow/batches)",
        )
    )
    return out


#: tick spacings of a time axis, ms (plotly's "M1": a month)
_DTICKS: list[int | str] = [
    *(100, 200, 500, 1_000, 2_000, 5_000, 10_000, 15_000, 30_000),
    *(60_000 * m for m in (1, 2, 5, 10, 15, 30)),
    *(3_600_000 * h for h in (1, 2, 3, 6, 12)),
    *(86_400_000 * d for d in (1, 2, 7, 14)),
    *("M1", "M3", "M6", "M12"),
]


def _date_ticks(x_range: list[datetime], most: int = 7) -> dict[str, Any]:
    """Round ticks over ``x_range``: the smallest spacing of :data:`_DTICKS` that gives at
    most ``most`` ticks, from midnight."""
    span_ms = (x_range[1] - x_range[0]).total_seconds() * 1000
    month_ms = 30 * 86_400_000
    for dtick in _DTICKS:
        step = dtick if isinstance(dtick, int) else int(dtick[1:]) * month_ms
        if span_ms / step <= most:
            return {"tickmode": "linear", "tick0": "2000-01-01", "dtick": dtick}
    return {"tickmode": "auto"}


def _bar_width_ms(times: list[int]) -> float:
    """A bar width on a time axis (ms): most of the shortest gap between the source's
    commits, but not thinner than 1/250 of their span (nor than 0.5 s)."""
    gaps = [b - a for a, b in zip(times, times[1:], strict=False) if b > a]
    span = times[-1] - times[0] if times else 0
    if not gaps:
        return 1_000.0
    width = 0.8 * min(gaps)
    width = max(width, min(0.8 * statistics.median(gaps), span / 250), 500.0)
    return float(width)


# ---------------------------------------------------------------------------- page

#: the page's template (package data beside this module), rendered with autoescaping
_TEMPLATE = "report.html.j2"

#: title and reason of a plot with nothing to draw
_NOTHING_TO_PLOT = {
    PLOT_IDS[0]: ("Events per second", "Each source has one micro-batch only: no rate yet."),
    PLOT_IDS[1]: ("Source lag", "No micro-batch carried a source time."),
    PLOT_IDS[2]: (
        "Records behind the log end",
        "Not recorded: no micro-batch has a records_behind value.",
    ),
    PLOT_IDS[3]: ("Dead letters per micro-batch", "No dead letters in the plotted micro-batches."),
}


def _page(
    st: Status, sources: list[_Source], now_ms: int, verified: dict[str, dict[str, str]]
) -> str:
    """The whole HTML page: :data:`_TEMPLATE` rendered (every value escaped but plotly's
    own markup) with what the warehouse says (``verified``: :func:`_verified`)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("cdcflow.commands", "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )
    return env.get_template(_TEMPLATE).render(
        warehouse=st.warehouse,
        pipeline=st.pipeline_id,
        made_at=_stamp(now_ms),
        utc_offset=_utc_offset(),
        lease=st.lease,
        sources=_source_rows(st, sources),
        plots=_plots(sources) if any(s.batches for s in sources) else [],
        tables=[
            {
                "name": t.name,
                "rows": f"{t.rows:,}",
                "version": t.version,
                "last_change": _stamp(t.last_change_ms),
                "stopped": t.stopped,
                "verified": verified.get(t.name),
            }
            for t in st.tables
        ],
        dead_letters_total=sum(st.dead_letters.values()),
        dead_letters=_dead_letter_rows(st),
    )


def _verified(wh: DeltaWarehouse, pipeline_id: str | None) -> dict[str, dict[str, str]]:
    """Per table, its last ``cdcflow verify``: ``{"state": "equal" | "differs" |
    "not compared", "text": ...}`` (tables never verified left out)."""
    out = {}
    for row in last_verifications(wh, pipeline_id):
        when = f"{_stamp(row['started_at_ms'])} ({row['mode']})"
        if row["refused"]:
            state, text = "not compared", f"{when}: {row['refused']}"
        elif row["equal"]:
            state, text = "equal", f"equal {when}"
        else:
            found = ", ".join(
                f"{row[k]:,} {k}" for k in ("missing", "extra", "different") if row[k]
            )
            state, text = "differs", f"differs {when}: {found}"
        out[row["target_table"]] = {"state": state, "text": text}
    return out


def _plots(sources: list[_Source]) -> list[dict[str, Any]]:
    """Per plot its div id, plotly's markup (``None``: nothing to plot, then a title and
    why) and its note; plotly.js is inlined with the first plot drawn only."""
    out = []
    plotlyjs_written = False
    for div_id, figure, note in _figures(sources):
        title, why = _NOTHING_TO_PLOT[div_id]
        markup = None
        if figure is not None:
            markup = figure.to_html(
                full_html=False,
                include_plotlyjs=not plotlyjs_written,
                div_id=div_id,
                config=_CONFIG,
            )
            plotlyjs_written = True
        out.append({"id": div_id, "html": markup, "title": title, "why": why, "note": note})
    return out


def _source_rows(st: Status, sources: list[_Source]) -> list[dict[str, Any]]:
    """The sources table's rows: each source's swatch colour and its cells' text."""

    last_of = {s.name: s for s in st.sources}
    colour = _colours(sources)
    rows = []
    for s in sources:
        last = s.batches[-1] if s.batches else None
        known = last_of.get(s.name)
        lag = next((b.lag_ms for b in reversed(s.batches) if b.lag_ms is not None), None)
        behind = next(
            (b.records_behind for b in reversed(s.batches) if b.records_behind is not None), None
        )
        left_out = f" ({s.left_out:,} older left out)" if s.left_out else ""
        rows.append(
            {
                "name": s.name,
                "colour": colour[s.name],
                "batches": f"{len(s.batches):,}{left_out}",
                "last_batch": "" if last is None else last.batch_id,
                "last_commit": "" if last is None else _stamp(last.committed_at_ms),
                "records": "" if known is None else f"{known.records:,}",
                "lag": "" if lag is None else human_duration(lag / 1000),
                "behind": "" if behind is None else f"{behind:,}",
            }
        )
    return rows


def _dead_letter_rows(st: Status) -> list[dict[str, str]]:
    """The dead letters by code: count and share of the total, as the table shows them."""
    total = sum(st.dead_letters.values())
    return [
        {"code": code, "count": f"{n:,}", "share": f"{100 * n / total:.1f}%"}
        for code, n in st.dead_letters.items()
    ]
