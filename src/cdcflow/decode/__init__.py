"""The decode stage: Kafka record batches -> decoded event batches (formats in
:mod:`cdcflow.formats`, batches in :mod:`cdcflow.decode.batches`)."""
