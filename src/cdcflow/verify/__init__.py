"""``cdcflow verify``: a mirror against its live source database.

- :mod:`~cdcflow.verify.databases`: the source database, read-only, in one snapshot;
- :mod:`~cdcflow.verify.canonical`: one text per value, alike in SQL and in DuckDB;
- :mod:`~cdcflow.verify.sides`: the source table and the mirror, answering checksums,
  cuts and rows of key ranges;
- :mod:`~cdcflow.verify.ranges`: the bisection of differing ranges down to rows;
- :mod:`~cdcflow.verify.verifier`: the tables planned through the pipeline's routing, the
  wait for the pipeline, the rechecks, the outcome, and a resumed run's tables;
- :mod:`~cdcflow.verify.images`: a source row in the mirror's types (``--repair``);
- :mod:`~cdcflow.verify.repair`: the differing keys written again from the source
  through the pipeline's apply, exactly once, and checked.

The command itself (output, the ``_cdcflow/verifications`` record, ``--resume``'s
progress, the lease of ``--repair``, exit code) is :mod:`cdcflow.commands.verify`. Decision 71 (docs/decisions) explains the choices.
"""
