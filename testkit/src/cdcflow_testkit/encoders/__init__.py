"""Encoders: the test kit's writers of every format, ``identifier -> module:Class``.

Each encoder turns a :class:`SourceChange` of the workload into the Kafka messages the
real replication tool publishes (``decode(encode(change)) == change`` is what the format
tests check). They are test code: the product (:mod:`cdcflow`) only decodes.
"""

from __future__ import annotations

from cdcflow.formats import load_entry
from cdcflow_testkit.encoders.base import Encoder, Message, SourceChange

__all__ = ["ENCODERS", "Encoder", "Message", "SourceChange", "encoder_for"]

#: identifier -> "module:EncoderClass" (used by the demo and test workload generator)
ENCODERS: dict[str, str] = {
    "debezium-json": "cdcflow_testkit.encoders.debezium_json:DebeziumJsonEncoder",
    "dataworks-json": "cdcflow_testkit.encoders.dataworks_json:DataWorksJsonEncoder",
    "qlik-json": "cdcflow_testkit.encoders.qlik_json:QlikJsonEncoder",
    "dts-avro": "cdcflow_testkit.encoders.dts_avro:DtsAvroEncoder",
    "shareplex-json": "cdcflow_testkit.encoders.shareplex_json:SharePlexJsonEncoder",
    "canal-json": "cdcflow_testkit.encoders.canal_json:CanalJsonEncoder",
    "drs-json": "cdcflow_testkit.encoders.drs_json:DrsJsonEncoder",
    "drs-json-c": "cdcflow_testkit.encoders.drs_json:DrsJsonCEncoder",
    "drs-avro": "cdcflow_testkit.encoders.drs_avro:DrsAvroEncoder",
    "maxwell-json": "cdcflow_testkit.encoders.maxwell_json:MaxwellJsonEncoder",
    "ogg-json": "cdcflow_testkit.encoders.ogg_json:OggJsonEncoder",
    "aws-dms-json": "cdcflow_testkit.encoders.aws_dms_json:AwsDmsJsonEncoder",
    "auto": "cdcflow_testkit.encoders.auto:AutoEncoder",
}


def encoder_for(name: str) -> Encoder:
    """An encoder instance for format ``name``.

    Raises:
        ConfigError: unknown format name.
    """
    return load_entry(ENCODERS, name, "encoder")()
