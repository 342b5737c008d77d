"""Debezium change events: ``debezium-json`` and ``debezium-avro``.

One idea a module, in Debezium's words:

* :mod:`.options` -- the options (``DebeziumJsonOptions``);
* :mod:`.envelope` -- the change event ``Envelope``: ``op`` codes, transaction ``status``,
  primary-key-change headers;
* :mod:`.connect_types` -- Kafka Connect schemas and logical types -> logical types and
  value converters;
* :mod:`.numbers` -- integer envelope fields and the exact re-parse signal;
* :mod:`.sequence` -- the per-connector source sequence (LSN, binlog file/pos, SCN...);
* :mod:`.json_decoder` -- ``DebeziumJsonDecoder`` (``debezium-json``);
* :mod:`.avro_decoder` -- ``DebeziumAvroDecoder`` (``debezium-avro``, through a schema
  registry);
* :mod:`.columnar` -- a window of ``debezium-json`` records at a time, through the
  decoder's public interface.

Nothing here is imported until asked for: importing the package imports no module.

Debezium JSON change events (format identifier ``debezium-json``).

Implements the message format of Debezium's relational connectors (PostgreSQL, MySQL and
MariaDB, Oracle, SQL Server, Db2) as serialized by Kafka Connect's ``JsonConverter``,
with (``schemas.enable=true``) or without the ``{"schema": ..., "payload": ...}`` wrapper.

Source documents: Tencent Cloud TDMQ for CKafka, "PostgreSQL Data Subscription"
(``https://www.tencentcloud.com/document/product/597/64333``) and the Debezium
reference documentation (``connectors/postgresql.adoc``, ``mysql.adoc``, ``oracle.adoc``,
``sqlserver.adoc``: "Data change events", "Transaction metadata", "Data type mappings").
``docs/formats/debezium-json.md`` lists what is and is not supported.

One Kafka record decodes to exactly one event:

* a change event (``op`` ``c``/``u``/``d``/``r``) -> INSERT / UPDATE / DELETE / SNAPSHOT;
* ``op`` ``t`` -> TRUNCATE (no key), ``op`` ``m`` -> MESSAGE (prefix/content in ``meta``);
* a transaction metadata record (``status`` BEGIN/END) -> BEGIN / COMMIT;
* a schema change record (``ddl``/``tableChanges``) -> DDL;
* a heartbeat record (only ``ts_ms``) -> HEARTBEAT.

Sequence rule (``ChangeEvent.seq``): per connector, see :mod:`.sequence`.

Exact numbers: values are parsed with orjson, which reads every JSON number with a
fraction (and every integer beyond 64 bits) as a float. Whenever such a float lands
somewhere exactness matters -- a decimal column, an integer column, a sequence field,
an out-of-int64 integer in a schemaless image -- the record is parsed again with the
standard library (``parse_float=Decimal``) and decoded from the exact number text.
"""
