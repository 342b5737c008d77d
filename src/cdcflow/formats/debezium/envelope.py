"""Debezium's change event ``Envelope``: the ``op`` codes, the transaction metadata
``status`` values, the headers of a primary-key change, and the check that a value schema
is an Envelope (``before``, ``after``, ``source``, ``op``)."""

from __future__ import annotations

from typing import Any

from cdcflow.errors import Code, DecodeError
from cdcflow.model import Op

# Debezium ``Envelope.Operation`` codes (payload field ``op``).
OP_CREATE = "c"  # insert


OP_UPDATE = "u"  # update


OP_DELETE = "d"  # delete


OP_READ = "r"  # snapshot read: a row of the initial (or incremental) snapshot


OP_TRUNCATE = "t"  # truncate table


OP_MESSAGE = "m"  # logical decoding message (PostgreSQL pg_logical_emit_message)


ROW_OPS: dict[str, Op] = {
    OP_CREATE: Op.INSERT,
    OP_UPDATE: Op.UPDATE,
    OP_DELETE: Op.DELETE,
    OP_READ: Op.SNAPSHOT,
}


# Transaction metadata topic (``provide.transaction.metadata=true``), field ``status``.
STATUS_BEGIN = "BEGIN"  # transaction start


STATUS_END = "END"  # transaction end, with event_count and data_collections


# The fields of every Debezium change event value schema (``Envelope``): the row schema
# twice, the connector's source block and the op code (ts_ms and transaction may follow).
ENVELOPE_FIELDS = ("before", "after", "source", "op")


# Record headers Debezium adds when an update changes the primary key (it then emits
# a delete under the old key and a create under the new one).
HEADER_OLDKEY = "__debezium.oldkey"  # on the create: the row's previous key


HEADER_NEWKEY = "__debezium.newkey"  # on the delete: the row's new key


def envelope_row(schema: dict[str, Any]) -> dict[str, Any]:
    """The row struct schema (its ``after`` field) of a change event's value schema.

    Debezium gives every change event of a table (c/u/d/r and t) the table's ``Envelope``
    schema: a struct with the fields ``before`` and ``after`` (the row schema), ``source``
    and ``op``. A schema of another shape does not describe the payload.

    Raises:
        DecodeError: ``BAD_FIELD`` when ``schema`` is not such a struct.
    """
    fields = schema.get("fields")
    if fields.__class__ is list and schema.get("type") == "struct":
        # one pass, no allocation: this runs for every record with a schema
        row: dict[str, Any] | None = None
        seen = 0
        for f in fields:
            if f.__class__ is dict:
                name = f.get("field")
                if name == "after":
                    row = f
                    seen |= 1
                elif name == "before":
                    seen |= 2
                elif name == "source":
                    seen |= 4
                elif name == "op":
                    seen |= 8
        if seen == 15 and row is not None:  # seen & 1: row is set
            return row
    raise not_an_envelope(schema)


def not_an_envelope(schema: dict[str, Any]) -> DecodeError:
    fields = schema.get("fields")
    names = (
        [f.get("field") for f in fields if f.__class__ is dict] if fields.__class__ is list else []
    )
    if schema.get("type") != "struct":
        shape = f"its type is {schema.get('type')!r}"
    elif not names:
        shape = "it declares no fields"
    else:
        shown = ", ".join(str(n) for n in names[:8]) + (", ..." if len(names) > 8 else "")
        missing = ", ".join(f for f in ENVELOPE_FIELDS if f not in names)
        shape = f"its fields are {shown} (no {missing})"
    return DecodeError(
        f"the value schema is not a Debezium change event Envelope (a struct with the "
        f"fields before, after, source and op): {shape}. A schema that describes the row "
        "itself comes from the ExtractNewRecordState transform, which debezium-json does "
        'not read: remove it from the connector, or publish "schema": null',
        Code.BAD_FIELD,
    )
