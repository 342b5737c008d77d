"""cdcflow's test kit: everything the tests, the benchmarks and the demo need that a user
of :mod:`cdcflow` does not.

Imports go one way: the kit uses the product, never the reverse (``tests/test_layout.py``
checks it, and that the product's wheel holds none of this).

* :mod:`cdcflow_testkit.encoders` -- one encoder per format: workload changes as each
  replication tool publishes them;
* :mod:`cdcflow_testkit.workload` -- the in-memory source database and the mirror comparator;
* :mod:`cdcflow_testkit.golden`, :mod:`cdcflow_testkit.delivery`, :mod:`cdcflow_testkit.faults`
  -- golden files, Kafka delivery faults, the SIGKILL harness;
* :mod:`cdcflow_testkit.services` -- real services on 127.0.0.1 with free ports, each a
  :class:`~cdcflow_testkit.services.process.ManagedProcess`;
* :mod:`cdcflow_testkit.demo` -- ``cdcflow-demo`` (``make demo``).
"""
