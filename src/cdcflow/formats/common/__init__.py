"""The layer the formats share: one idea a module, no format's vocabulary.

* :mod:`.zones` -- the ``timestamp_zone`` option and zone text in messages.
* :mod:`.mysql_types` -- MySQL column-type text (``"int(11) unsigned"``) and JDBC codes.
* :mod:`.mysql_values` -- MySQL values printed as text: zero dates, offsets, booleans,
  unsigned, BIT, ENUM/SET (one reading for Canal, DRS, Qlik, DTS).
* :mod:`.exact_json` -- JSON whose numbers stay exact.
* :mod:`.json_object` -- a message value that must be one JSON object.
* :mod:`.values` -- values that do not fit their column (one wording), integer text.
* :mod:`.fields` -- reading envelope fields: ``MISSING_FIELD`` / ``BAD_FIELD``.
* :mod:`.keys` -- a source table's configured key columns, and the key of an event.
"""
