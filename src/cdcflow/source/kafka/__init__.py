"""Kafka as a Spark streaming source, in rooms (import from them, not from here):

- :mod:`~cdcflow.source.kafka.options`: the source's options, parsed and validated
  (:func:`~cdcflow.source.kafka.options.parse_options`; the option table is there);
- :mod:`~cdcflow.source.kafka.schema`: the columns of Spark's Kafka source, as Spark and
  Arrow schemas;
- :mod:`~cdcflow.source.kafka.planning`: offset planning -- where a read starts
  (``DATA_LOSS``), the fair split of ``maxOffsetsPerTrigger``, ranges packed into tasks;
- :mod:`~cdcflow.source.kafka.client`: the confluent-kafka client's configuration and
  error policy (which errors are a transient broker outage);
- :mod:`~cdcflow.source.kafka.reader`: the executor side, reading one topic-partition's
  offset range;
- :mod:`~cdcflow.source.kafka.datasource`: Spark's Python ``DataSource`` and
  ``DataSourceStreamReader`` (``cdcflow_kafka``), and :func:`read_stream`, which picks
  Spark's JVM ``kafka`` source where its connector is on the classpath;
- :mod:`~cdcflow.source.kafka.admin`: the calls of the operator commands outside a query
  (partitions, watermarks, log ends, a range of records).
"""
