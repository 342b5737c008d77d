"""The layer the formats share: one idea a module, no format's vocabulary.

* :mod:`.zones` -- the ``timestamp_zone`` option and zone text in messages.
* :mod:`.mysql_types` -- MySQL column-type text (``"int(11) unsigned"``) and JDBC codes.
* :mod:`.exact_json` -- JSON whose numbers stay exact.
* :mod:`.values` -- the wording of a value that does not fit its column.
* :mod:`.fields` -- reading envelope fields: ``MISSING_FIELD`` / ``BAD_FIELD``.
"""
