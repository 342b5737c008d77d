"""Shaping one target's events before they land: type overrides, computed and metadata
columns, the shard column, the row filter and the column selection.

:func:`shape` takes one target's part of a batch (:data:`~cdcflow.event_schema.EVENT_SCHEMA`
rows) and its compiled :class:`~cdcflow.transform.shaping.Shaping`, and gives the events as they
should land, the events the filter leaves out (skipped on purpose, ``ROW_FILTERED``) and
the events it cannot shape (dead letters, ``EXPRESSION_FAILED``, the message naming the
column). The images stay canonical JSON; the values an option reads are typed Arrow
columns for the time of its evaluation (:mod:`cdcflow.transform.expressions`), with the
types the messages declare, the stored table's, or the JSON's own.

In order, per after image (the before image gets steps 1 and 6 only):

1. ``type_overrides``: the value is cast to the override's logical type (Arrow's safe
   cast; ``timestamptz(ZONE)`` reads a naive wall-clock time in ``ZONE``,
   ``timestamp(ZONE)`` gives an instant's wall clock there). Paimon: ``--type_mapping``.
2. ``computed_columns``, in the order written (a later one may read an earlier one), as
   Paimon's ``--computed_column``; a partial image that lacks an input column leaves the
   computed column out too (its stored value stays, as the input's does).
3. ``metadata_columns`` (Paimon's ``--metadata_column``, Flink CDC's ``__table_name__``
   and friends) and the route's ``shard_column``: from the event, not the row.
4. ``filter`` (Flink CDC's ``transform ... filter``) over the after image: an insert it is
   not true for is skipped; an update it is not true for deletes the row (the row left
   the filtered set), unless the before image shows it was never in it (the filter false
   on it: then skipped); a delete whose before image the filter is false for is skipped.
   A NULL read from a before image is not "false": the image may not know the value
   (Debezium's key-only before image under PostgreSQL's REPLICA IDENTITY DEFAULT), so the
   delete is applied (a delete of an absent row changes nothing). An image that lacks a
   column the filter reads (a partial image) passes unchanged.
5. ``columns``: ``include`` or ``exclude`` of the source's columns; key columns, computed,
   metadata and shard columns always land.
6. The ``columns`` declarations follow: overridden types, excluded columns gone, the
   added columns declared with their types; a declaration on an event that leaves
   (skipped or refused) moves to its source table's next event that lands
   (:func:`~cdcflow.transform.router.filter_declared`).

Sources: Paimon's Kafka CDC sync (https://paimon.apache.org/docs/master/cdc-ingestion/kafka-cdc/),
Flink CDC's transform and route (https://nightlies.apache.org/flink/flink-cdc-docs-stable/docs/core-concept/transform/).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from cdcflow.errors import ApplyError
from cdcflow.images import arrow_column, logical_from_arrow
from cdcflow.model import Op, dumps
from cdcflow.transform.expressions import Expression
from cdcflow.transform.router import declared_types, filter_declared, source_names
from cdcflow.transform.shaping import METADATA_FIELDS, Shaping, TypeOverride
from cdcflow.types import arrow_type, infer_type

__all__ = ["Shaped", "shape", "shapes"]

_IMAGE_OPS = frozenset({Op.INSERT.value, Op.UPDATE.value, Op.SNAPSHOT.value})


@dataclass(slots=True)
class Shaped:
    """One target's part after :func:`shape`.

    Attributes:
        rows: the events to apply, shaped (EVENT_SCHEMA, the part's order).
        filtered: the events the filter leaves out (skipped on purpose, ``ROW_FILTERED``).
        refused: events that could not be shaped (dead letters ``EXPRESSION_FAILED``).
        messages: one message per ``refused`` row, naming the column or the filter.
        kept: one boolean per row of the part: whether it is in ``rows`` (``None``:
            every row is).
    """

    rows: pa.Table
    filtered: pa.Table
    refused: pa.Table
    messages: list[str] = field(default_factory=list)
    kept: pa.Array | None = None


def shapes(shaping: Shaping, shard_column: str | None) -> bool:
    """Whether :func:`shape` changes anything for a table with this shaping."""
    return shaping.shapes or shard_column is not None


def _loads(texts: Sequence[str | None]) -> list[dict[str, Any] | None]:
    return [None if t is None else orjson.loads(t) for t in texts]


def _types_of(part: pa.Table, stored: Mapping[str, str]) -> dict[str, str]:
    """Column -> logical type: the stored table's, then what the part declares."""
    return {**stored, **declared_types(part)}


def _typed(name: str, values: list[Any], logical: str | None) -> tuple[pa.Array, list[str | None]]:
    """``values`` (canonical JSON) as an Arrow array of ``logical`` (inferred when
    ``None``), and one error per value that does not fit (``None``: it fits)."""
    if logical is None:
        logical = next((t for t in map(infer_type, values) if t is not None), "string")
    try:
        return arrow_column(name, values, logical), [None] * len(values)
    except ApplyError:
        pass
    out: list[Any] = []
    errors: list[str | None] = []
    for v in values:
        try:
            out.append(arrow_column(name, [v], logical)[0].as_py())
            errors.append(None)
        except ApplyError as exc:
            out.append(None)
            errors.append(exc.message)
    return pa.array(out, arrow_type(logical)), errors


def _override(values: pa.Array, o: TypeOverride) -> pa.Array:
    """``values`` cast to the override's type (raises pyarrow's errors)."""
    target = arrow_type(o.logical)
    if o.zone is not None and pa.types.is_timestamp(values.type):
        if o.logical == "timestamptz" and values.type.tz is None:
            values = pc.assume_timezone(
                values, o.zone, ambiguous="earliest", nonexistent="earliest"
            )
        elif o.logical == "timestamp" and values.type.tz is not None:
            local = pc.local_timestamp(values.cast(pa.timestamp("us", tz=o.zone)))
            return local.cast(target)
    return values.cast(target, safe=True)


def _json_values(values: pa.Array) -> list[Any]:
    """Arrow values in the form :func:`cdcflow.model.dumps` writes canonically."""
    out: list[Any] = values.to_pylist()
    return out


class _Images:
    """The part's after (and before) images as dicts, and typed columns of them."""

    def __init__(self, part: pa.Table, types: dict[str, str]) -> None:
        self.ops = part["op"].to_pylist()
        self.afters = _loads(part["after"].to_pylist())
        self.befores = _loads(part["before"].to_pylist())
        self.types = types
        self.errors: list[str | None] = [None] * part.num_rows

    def fail(self, i: int, message: str) -> None:
        if self.errors[i] is None:
            self.errors[i] = message

    def column(self, images: list[dict[str, Any] | None], name: str, rows: list[int]) -> pa.Array:
        """Column ``name`` of ``images[rows]``, typed; a value that does not fit its type
        fails its row."""
        values = []
        for i in rows:
            image = images[i]
            assert image is not None, "rows index images that are present"
            values.append(image.get(name))
        array, errors = _typed(name, values, self.types.get(name))
        for i, e in zip(rows, errors, strict=True):
            if e is not None:
                self.fail(i, e)
        return array

    def table(
        self, images: list[dict[str, Any] | None], columns: Sequence[str], rows: list[int]
    ) -> pa.Table:
        return pa.table(
            {c: self.column(images, c, rows) for c in columns} or {"_": pa.nulls(len(rows))}
        )


def _with_all(
    images: list[dict[str, Any] | None], columns: Sequence[str], ok: list[bool]
) -> list[int]:
    """The rows whose image holds every one of ``columns`` (and has not failed)."""
    return [
        i
        for i, image in enumerate(images)
        if image is not None and ok[i] and all(c in image for c in columns)
    ]


def _apply_overrides(img: _Images, overrides: Mapping[str, TypeOverride]) -> None:
    for name, o in overrides.items():
        for images in (img.afters, img.befores):
            rows = [i for i, im in enumerate(images) if im is not None and name in im]
            if not rows:
                continue
            values = img.column(images, name, rows)
            try:
                cast = _json_values(_override(values, o))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                cast = []
                for i, v in zip(rows, values, strict=True):
                    try:
                        cast.append(
                            _json_values(_override(pa.array([v.as_py()], values.type), o))[0]
                        )
                    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                        img.fail(
                            i, f"type_overrides.{name}: {v.as_py()!r} is not a {o.logical}: {exc}"
                        )
                        cast.append(None)
            for i, v in zip(rows, cast, strict=True):
                image = images[i]
                assert image is not None, "rows index images that are present"
                image[name] = v
        img.types[name] = o.logical


def _apply_computed(
    img: _Images, computed: Mapping[str, Expression], declared: dict[str, str]
) -> None:
    for name, expr in computed.items():
        ok = [e is None for e in img.errors]
        rows = _with_all(img.afters, expr.columns, ok)
        if not rows:
            continue
        values, errors = expr.evaluate_rows(img.table(img.afters, expr.columns, rows))
        if not pa.types.is_null(values.type):
            logical = logical_from_arrow(values.type)
            img.types[name] = declared[name] = logical
            values = values.cast(arrow_type(logical))
        for i, v, e in zip(rows, _json_values(values), errors, strict=True):
            if e is not None:
                img.fail(i, f"computed column {name!r} ({expr.text}): {e}")
            else:
                after = img.afters[i]
                assert after is not None, "_with_all's rows index images that are present"
                after[name] = v


def _metadata(part: pa.Table, fields: Mapping[str, str]) -> dict[str, list[Any]]:
    """Column -> one value per row, for each metadata column."""
    out = {}
    for name, what in fields.items():
        if what == "source_table":
            out[name] = source_names(part)
        else:
            out[name] = part[what].to_pylist()
    return out


def _apply_filter(img: _Images, expr: Expression, part: pa.Table) -> tuple[list[bool], list[int]]:
    """``(skip, to_delete)``: the rows the filter leaves out, and the updates that become
    deletes of their row (module docstring, step 4)."""
    n = len(img.ops)
    skip = [False] * n

    def verdict(images: list[dict[str, Any] | None]) -> dict[int, bool | None]:
        ok = [e is None for e in img.errors]
        rows = _with_all(images, expr.columns, ok)
        if not rows:
            return {}
        values, errors = expr.evaluate_rows(img.table(images, expr.columns, rows))
        out: dict[int, bool | None] = {}
        for i, v, e in zip(rows, values.to_pylist(), errors, strict=True):
            if e is not None:
                img.fail(i, f"filter ({expr.text}): {e}")
            else:
                out[i] = None if v is None else v is True  # None: unknown (a NULL read)
        return out

    after = verdict(img.afters)
    before = verdict(img.befores)
    to_delete = []
    for i, op in enumerate(img.ops):
        if img.errors[i] is not None:
            continue
        # SQL's WHERE: a row lands only where the filter is true (not NULL). But a
        # before image may hold NULLs it does not know (Debezium's key-only before image
        # under REPLICA IDENTITY DEFAULT): it shows the row out of the set only where the
        # filter is false, and a delete or a leaving update of a row that may be there is
        # applied (a delete of an absent row changes nothing).
        leaves = i in after and after[i] is not True
        if op in (Op.INSERT.value, Op.SNAPSHOT.value):
            skip[i] = leaves
        elif op == Op.UPDATE.value and leaves:
            if before.get(i) is False:
                skip[i] = True
            else:
                to_delete.append(i)
        elif op == Op.DELETE.value:
            skip[i] = before.get(i) is False
    return skip, to_delete


def _declare(
    texts: list[str | None], img: _Images, added: Mapping[str, str], keep: Any
) -> list[str | None]:
    """The ``columns`` declarations rewritten (module docstring, step 6)."""
    out: list[str | None] = []
    for text in texts:
        if text is None:
            out.append(None)
            continue
        declared = {c: img.types.get(c, t) for c, t in orjson.loads(text).items() if keep(c)}
        declared.update(added)
        out.append(orjson.dumps(declared).decode())
    return out


def shape(
    part: pa.Table,
    shaping: Shaping,
    shard_column: str | None = None,
    stored: Mapping[str, str] | None = None,
) -> Shaped:
    """Shape one target's part of a batch (module docstring).

    Args:
        part: EVENT_SCHEMA rows of one target (row changes, truncates, DDL).
        shaping: the target's shaping options, compiled
            (:attr:`cdcflow.apply.options.TableOptions.shaping`: ``columns``,
            ``computed_columns``, ``metadata_columns``, ``type_overrides``, ``filter``).
        shard_column: the route's shard column (``None``: none).
        stored: the stored table's columns as logical types (for values a batch does
            not declare).

    Returns:
        :class:`Shaped`: every row of ``part`` is in exactly one of its three tables.
    """
    n = part.num_rows
    if n == 0 or not shapes(shaping, shard_column):
        return Shaped(part, part.slice(0, 0), part.slice(0, 0))
    img = _Images(part, _types_of(part, stored or {}))
    added: dict[str, str] = {}
    overrides = shaping.overrides
    if overrides:
        _apply_overrides(img, overrides)
        added.update({c: o.logical for c, o in overrides.items()})
    if shaping.computed:
        _apply_computed(img, shaping.computed, added)
    extra = _metadata(part, shaping.metadata)
    if shard_column is not None:
        extra[shard_column] = _metadata(part, {shard_column: "source_table"})[shard_column]
        added[shard_column] = "string"
    for name, what in shaping.metadata.items():
        added[name] = METADATA_FIELDS[what]
    for name, values in extra.items():
        img.types[name] = added[name]
        for i, image in enumerate(img.afters):
            if image is not None:
                image[name] = values[i]
    skip: list[bool] = [False] * n
    to_delete: list[int] = []
    if shaping.filter is not None:
        skip, to_delete = _apply_filter(img, shaping.filter, part)

    keys = part.filter(pc.is_valid(part["key"]))["key"]
    key_columns = set(orjson.loads(keys[0].as_py())) if len(keys) else set()
    selection = shaping.columns

    def keep(column: str) -> bool:
        return (
            selection is None or column in key_columns or column in added or selection.keeps(column)
        )

    ops = list(img.ops)
    key_texts = part["key"].to_pylist()
    old_keys = part["old_key"].to_pylist()
    partial = part["partial"].to_pylist()
    for i in to_delete:
        ops[i] = Op.DELETE.value
        img.befores[i] = img.befores[i] or img.afters[i]
        img.afters[i] = None
        partial[i] = None
        if old_keys[i] is not None:  # a key move out of the set: the old key's row goes
            key_texts[i], old_keys[i] = old_keys[i], None

    def dump(images: list[dict[str, Any] | None]) -> list[str | None]:
        out: list[str | None] = []
        for image in images:
            if image is None:
                out.append(None)
            else:
                if selection is not None:
                    image = {c: v for c, v in image.items() if keep(c)}
                out.append(dumps(image).decode())
        return out

    declarations = _declare(part["columns"].to_pylist(), img, added, keep)
    shaped = part
    for name, values, type_ in (
        ("op", ops, pa.string()),
        ("key", key_texts, pa.string()),
        ("old_key", old_keys, pa.string()),
        ("before", dump(img.befores), pa.string()),
        ("after", dump(img.afters), pa.string()),
        ("partial", partial, pa.bool_()),
        ("columns", declarations, pa.string()),
    ):
        shaped = shaped.set_column(
            shaped.schema.get_field_index(name), name, pa.array(values, type_)
        )
    failed = pa.array([e is not None for e in img.errors])
    skipped = pa.array(skip)
    kept = pc.and_(pc.invert(failed), pc.invert(skipped))
    rows = filter_declared(shaped, kept)  # a row that leaves may declare
    declared = part["columns"].null_count < n
    if (added or declared) and rows.num_rows and rows["columns"].null_count == rows.num_rows:
        # the declarations were on rows that left (filtered, refused): the first row
        # carries them all, or the table is merged without its columns' types
        union = {**img.types, **added}
        union = {c: t for c, t in union.items() if keep(c)}
        first = [orjson.dumps(union).decode()] + [None] * (rows.num_rows - 1)
        rows = rows.set_column(
            rows.schema.get_field_index("columns"), "columns", pa.array(first, pa.string())
        )
    return Shaped(
        rows=rows,
        filtered=part.filter(pc.and_(pc.invert(failed), skipped)),
        refused=part.filter(failed),
        messages=[e for e in img.errors if e is not None],
        kept=kept,
    )
