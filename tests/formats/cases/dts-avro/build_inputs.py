"""Builds the ``*.input.b64`` files of the dts-avro golden cases.

No public sample of a binary DTS Avro record exists, so every input here is a record
constructed for this project from the published schema (``dts_avro_schema/*.avsc``, from
aliyun/aliyun-dts-subscribe-demo) and written with fastavro's schemaless writer, exactly
as DTS frames its Kafka values. The records below are the readable source of those files;
run ``python tests/formats/cases/dts-avro/build_inputs.py`` to rebuild them.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import fastavro

from cdcflow.formats.dts_avro import record_schema

NS = "com.alibaba.dts.formats.avro."
HERE = Path(__file__).parent


# --------------------------------------------------------------------------- value helpers


def integer(text: str, precision: int = 19) -> tuple[str, dict[str, Any]]:
    return (NS + "Integer", {"precision": precision, "value": text})


def char(text: str, charset: str = "utf8mb4") -> tuple[str, dict[str, Any]]:
    codec = {"utf8mb4": "utf-8", "gbk": "gbk", "latin1": "cp1252"}.get(charset, "utf-8")
    return (NS + "Character", {"charset": charset, "value": text.encode(codec)})


def raw_char(data: bytes, charset: str) -> tuple[str, dict[str, Any]]:
    return (NS + "Character", {"charset": charset, "value": data})


def dec(text: str, precision: int, scale: int) -> tuple[str, dict[str, Any]]:
    return (NS + "Decimal", {"value": text, "precision": precision, "scale": scale})


def flt(value: float) -> tuple[str, dict[str, Any]]:
    return (NS + "Float", {"value": value, "precision": 0, "scale": 0})


def ts(seconds: int, micros: int) -> tuple[str, dict[str, Any]]:
    return (NS + "Timestamp", {"timestamp": seconds, "millis": micros})


def dtm(year=None, month=None, day=None, hour=None, minute=None, second=None, millis=None):
    return (
        NS + "DateTime",
        {
            "year": year,
            "month": month,
            "day": day,
            "hour": hour,
            "minute": minute,
            "second": second,
            "millis": millis,
        },
    )


def tstz(parts: tuple[str, dict[str, Any]], zone: str) -> tuple[str, dict[str, Any]]:
    return (NS + "TimestampWithTimeZone", {"value": parts[1], "timezone": zone})


def binobj(data: bytes, kind: str = "BLOB") -> tuple[str, dict[str, Any]]:
    return (NS + "BinaryObject", {"type": kind, "value": data})


def textobj(text: str, kind: str) -> tuple[str, dict[str, Any]]:
    return (NS + "TextObject", {"type": kind, "value": text})


def wkb(data: bytes) -> tuple[str, dict[str, Any]]:
    return (NS + "BinaryGeometry", {"type": "POINT", "value": data})


def wkt(text: str) -> tuple[str, dict[str, Any]]:
    return (NS + "TextGeometry", {"type": "POINT", "value": text})


NULL = (NS + "EmptyObject", "NULL")
NONE = (NS + "EmptyObject", "NONE")


def record(
    operation: str,
    *,
    id: int,
    ts_s: int = 1718000000,
    object_name: str | None = None,
    fields: Any = None,
    before: Any = None,
    after: Any = None,
    txid: str = "",
    tags: dict[str, str] | None = None,
    source_type: str = "MySQL",
    position: str | None = None,
    born_ms: int = 0,
) -> dict[str, Any]:
    return {
        "version": 1,
        "id": id,
        "sourceTimestamp": ts_s,
        "sourcePosition": position if position is not None else f"{1000 + id}@3",
        "safeSourcePosition": "",
        "sourceTxid": txid,
        "source": {"sourceType": source_type, "version": "8.0.36"},
        "operation": operation,
        "objectName": object_name,
        "processTimestamps": None,
        "tags": tags or {},
        "fields": fields,
        "beforeImages": before,
        "afterImages": after,
        "bornTimestamp": born_ms,
    }


def fields(*pairs: tuple[str, int]) -> list[dict[str, Any]]:
    return [{"name": n, "dataTypeNumber": t} for n, t in pairs]


def encode(rec: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, record_schema(), rec)
    return buf.getvalue()


# --------------------------------------------------------------------------- cases

PK = {"pk_uk_info": '{"PRIMARY":["id"]}'}
ORDERS = fields(("id", 8), ("name", 253), ("price", 246), ("updated_at", 17))


def case_mysql_row_changes() -> list[bytes]:
    ins = record(
        "INSERT",
        id=101,
        object_name="shop.orders",
        fields=ORDERS,
        txid="9001",
        tags=PK,
        born_ms=1718000000123,
        after=[integer("1"), char("scooter"), dec("12.5", 10, 2), ts(1718000000, 123456)],
    )
    upd = record(
        "UPDATE",
        id=102,
        object_name="shop.orders",
        fields=ORDERS,
        txid="9002",
        tags=PK,
        before=[integer("1"), char("scooter"), dec("12.50", 10, 2), ts(1718000000, 123456)],
        after=[integer("1"), char("scooter 2"), dec("13.75", 10, 2), ts(1718000060, 0)],
    )
    dele = record(
        "DELETE",
        id=103,
        object_name="shop.orders",
        fields=ORDERS,
        txid="9003",
        tags=PK,
        before=[integer("1"), char("scooter 2"), dec("13.75", 10, 2), ts(1718000060, 0)],
    )
    return [encode(ins), encode(upd), encode(dele)]


ALL = fields(
    ("id", 8),
    ("big_unsigned", 8),
    ("title", 253),
    ("title_gbk", 253),
    ("code_bin", 254),
    ("amount", 246),
    ("ratio", 5),
    ("created", 7),
    ("birthday", 10),
    ("shipped", 12),
    ("duration", 11),
    ("model_year", 13),
    ("zero_date", 12),
    ("local_tz", 12),
    ("named_tz", 12),
    ("location_wkb", 255),
    ("location_wkt", 255),
    ("photo", 252),
    ("doc", 245),
    ("status", 247),
    ("nullable", 15),
    ("not_logged", 252),
    ("plain_null", 3),
    ("null_datetime", 12),
    ("num_unscaled", 246),
)


def case_all_value_types() -> list[bytes]:
    rec = record(
        "INSERT",
        id=201,
        object_name="shop.everything",
        fields=ALL,
        tags=PK,
        after=[
            integer("7"),
            integer("18446744073709551615", 20),
            char("héllo wörld"),
            char("中文", "gbk"),
            raw_char(b"\x00\xffab", "binary"),
            dec("-0.001", 12, 3),
            flt(0.1),
            ts(1700000000, 5),
            dtm(2020, 2, 29),
            dtm(2024, 5, 6, 7, 8, 9, 123000),
            dtm(hour=23, minute=59, second=58, millis=1),
            dtm(2024),
            dtm(0, 0, 0, 0, 0, 0, 0),
            tstz(dtm(2024, 1, 1, 8, 0, 0, 0), "+08:00"),
            tstz(dtm(2024, 7, 1, 12, 30, 0, 250000), "Europe/Berlin"),
            wkb(b"\x01\x01\x00\x00\x00" + bytes(16)),
            wkt("POINT(1 2)"),
            binobj(b"\x89PNG"),
            textobj('{"a": [1, 2]}', "JSON"),
            textobj("paid", "ENUM"),
            NULL,
            NONE,
            None,
            None,
            dec("123.4500", 0, 0),
        ],
    )
    return [encode(rec)]


def case_transaction_markers() -> list[bytes]:
    begin = record("BEGIN", id=301, txid="777")
    ins = record(
        "INSERT",
        id=302,
        object_name="shop.orders",
        fields=ORDERS,
        txid="777",
        tags=PK,
        after=[integer("2"), char("kite"), dec("3.00", 10, 2), NULL],
    )
    commit = record("COMMIT", id=303, txid="777")
    heartbeat = record("HEARTBEAT", id=304, ts_s=1718000005)
    checkpoint = record("CHECKPOINT", id=305, ts_s=1718000006)
    return [encode(r) for r in (begin, ins, commit, heartbeat, checkpoint)]


def case_ddl() -> list[bytes]:
    alter = record(
        "DDL",
        id=401,
        object_name="shop.orders",
        after="ALTER TABLE `orders` ADD COLUMN `note` varchar(64) NULL",
    )
    create_db = record("DDL", id=402, object_name="shop", after="CREATE DATABASE shop")
    truncate = record("DDL", id=403, object_name="shop.orders", after="truncate table orders")
    no_text = record("DDL", id=404, object_name="shop.orders")
    return [encode(r) for r in (alter, create_db, truncate, no_text)]


def case_postgres_names() -> list[bytes]:
    flds = fields(("id", 20), ("label", 1043))
    ins = record(
        "INSERT",
        id=501,
        object_name="sales.public.order\\u002Eitems",
        fields=flds,
        source_type="PostgreSQL",
        tags={"pk_uk_info": '{"PRIMARY":["id"]}'},
        after=[integer("5"), char("a.b")],
    )
    init = record(
        "INIT",
        id=502,
        object_name="sales.public.order\\u002Eitems",
        fields=flds,
        source_type="PostgreSQL",
        tags={"pk_uk_info": '{"PRIMARY":["id"]}'},
        after=[integer("6"), char("full load")],
    )
    return [encode(ins), encode(init)]


def case_keys() -> list[bytes]:
    flds = fields(("email", 253), ("name", 253))
    unique = record(
        "INSERT",
        id=601,
        object_name="crm.users",
        fields=flds,
        tags={"pk_uk_info": '{"uk_email":["email"]}'},
        after=[char("a@example.com"), char("Ann")],
    )
    none = record(
        "INSERT",
        id=602,
        object_name="crm.notes",
        fields=flds,
        after=[char("b@example.com"), char("Bob")],
    )
    configured = record(
        "INSERT",
        id=603,
        object_name="crm.contacts",
        fields=flds,
        after=[char("c@example.com"), char("Cy")],
    )
    key_absent = record(
        "UPDATE",
        id=604,
        object_name="crm.users",
        fields=flds,
        tags={"pk_uk_info": '{"PRIMARY":["email"]}'},
        before=[char("a@example.com"), char("Ann")],
        after=[NONE, char("Anne")],
    )
    bad_tag = record(
        "INSERT",
        id=605,
        object_name="crm.users",
        fields=flds,
        tags={"pk_uk_info": "PRIMARY=email"},
        after=[char("d@example.com"), char("Di")],
    )
    return [encode(r) for r in (unique, none, configured, key_absent, bad_tag)]


def case_unsupported_operations() -> list[bytes]:
    ops = ["ROLLBACK", "ABORT", "COMMAND", "FILL", "FINISH", "CONTROL", "RDB", "NOOP"]
    return [encode(record(op, id=700 + i)) for i, op in enumerate(ops)]


def case_malformed() -> list[bytes]:
    good = encode(
        record(
            "INSERT",
            id=801,
            object_name="shop.orders",
            fields=ORDERS,
            tags=PK,
            after=[integer("1"), char("x"), dec("1.00", 10, 2), NULL],
        )
    )
    misaligned = record(
        "INSERT",
        id=802,
        object_name="shop.orders",
        fields=ORDERS,
        tags=PK,
        after=[integer("1"), char("x")],
    )
    no_after = record("INSERT", id=803, object_name="shop.orders", fields=ORDERS, tags=PK)
    bad_charset = record(
        "INSERT",
        id=804,
        object_name="shop.orders",
        fields=ORDERS,
        tags=PK,
        after=[integer("1"), char("x", "klingon"), dec("1.00", 10, 2), NULL],
    )
    bad_decimal = record(
        "INSERT",
        id=805,
        object_name="shop.orders",
        fields=ORDERS,
        tags=PK,
        after=[integer("1"), char("x"), dec("1,00", 10, 2), NULL],
    )
    bad_integer = record(
        "INSERT",
        id=806,
        object_name="shop.orders",
        fields=ORDERS,
        tags=PK,
        after=[integer("one"), char("x"), dec("1.00", 10, 2), NULL],
    )
    bad_date = record(
        "INSERT",
        id=807,
        object_name="shop.orders",
        fields=fields(("d", 10)),
        tags={"pk_uk_info": '{"PRIMARY":["d"]}'},
        after=[dtm(2023, 2, 30)],
    )
    fields_string = record(
        "INSERT",
        id=808,
        object_name="shop.orders",
        fields="id,name",
        tags=PK,
        after=[integer("1"), char("x")],
    )
    no_object = record(
        "INSERT",
        id=809,
        fields=ORDERS,
        tags=PK,
        after=[integer("1"), char("x"), dec("1.00", 10, 2), NULL],
    )
    too_deep = record(
        "INSERT",
        id=810,
        object_name="a.b.c.d",
        fields=ORDERS,
        tags=PK,
        after=[integer("1"), char("x"), dec("1.00", 10, 2), NULL],
    )
    return [
        good,
        good[: len(good) // 2],  # truncated
        good + b"\x00",  # trailing byte
        b"\x00\x01garbage",
        encode(misaligned),
        encode(no_after),
        encode(bad_charset),
        encode(bad_decimal),
        encode(bad_integer),
        encode(bad_date),
        encode(fields_string),
        encode(no_object),
        encode(too_deep),
    ]


VALUES = fields(
    ("id", 8),
    ("d", 10),
    ("dt", 12),
    ("ts", 7),
    ("flag", 1),
    ("u_int", 3),
    ("u_big", 8),
)


def case_mysql_values() -> list[bytes]:
    """MySQL zero dates as DateTime parts, the zero TIMESTAMP (epoch 0), a TINYINT(1) and
    unsigned integers at their maximum."""

    def ins(id_: int, values: list[Any]) -> bytes:
        rec = record(
            "INSERT",
            id=400 + id_,
            object_name="shop.values_t",
            fields=VALUES,
            tags=PK,
            after=[integer(str(id_)), *values],
        )
        return encode(rec)

    return [
        ins(
            1,
            [
                dtm(0, 0, 0),
                dtm(0, 0, 0, 0, 0, 0, 0),
                ts(0, 0),
                integer("1", 3),
                integer("4294967295", 10),
                integer("18446744073709551615", 20),
            ],
        ),
        ins(
            2,
            [
                dtm(2020, 0, 0),
                dtm(2020, 1, 0, 10, 0, 0, 0),
                ts(1706666400, 500000),
                integer("0", 3),
                integer("0", 10),
                integer("9223372036854775807", 20),
            ],
        ),
        ins(
            3,
            [
                dtm(2020, 13, 1),
                dtm(2024, 1, 31, 10, 0, 0, 123456),
                ts(1706666400, 0),
                integer("2", 3),
                integer("1", 10),
                integer("1", 20),
            ],
        ),
    ]


CASES = {
    "mysql-row-changes": case_mysql_row_changes,
    "mysql-values": case_mysql_values,
    "all-value-types": case_all_value_types,
    "transaction-markers": case_transaction_markers,
    "ddl": case_ddl,
    "postgres-names": case_postgres_names,
    "keys": case_keys,
    "unsupported-operations": case_unsupported_operations,
    "malformed": case_malformed,
}


def main() -> None:
    for name, build in CASES.items():
        lines = [base64.b64encode(v).decode() for v in build()]
        (HERE / f"{name}.input.b64").write_text("".join(x + "\n" for x in lines))


if __name__ == "__main__":
    main()
