"""Time zones: the one syntax of the ``timestamp_zone`` option and of zone text in messages.

A zone is written as

* ``UTC``, ``GMT`` or ``Z``;
* an offset from UTC, ``±hh:mm``, ``±hhmm`` or ``±h`` (hours below 24), optionally
  after ``UTC``/``GMT``: ``+08:00``, ``-0230``, ``GMT+8``;
* an IANA name: ``Asia/Shanghai``, ``Europe/Paris``.

Case does not matter for ``UTC``/``GMT``/``Z``; surrounding blanks are ignored.
"""

from __future__ import annotations

import datetime as dt
import re
import zoneinfo
from functools import lru_cache

from cdcflow.errors import ConfigError

__all__ = ["ZONE_SYNTAX", "parse_zone", "zone_option"]

#: how the syntax is named in error messages
ZONE_SYNTAX = "UTC, an offset such as +08:00, or an IANA name such as Asia/Shanghai"

_OFFSET = re.compile(r"(?:GMT|UTC)?\s*([+-])(\d{1,2})(?::?(\d{2}))?", re.IGNORECASE).fullmatch


@lru_cache(maxsize=256)
def parse_zone(text: str) -> dt.tzinfo | None:
    """``"UTC"``, ``"+08:00"``, ``"GMT+8"`` or an IANA name -> tzinfo; ``None`` when
    ``text`` is none of them (for zones read from messages, where that is a bad value)."""
    text = str(text).strip()
    if text.upper() in ("UTC", "GMT", "Z"):
        return dt.UTC
    m = _OFFSET(text)
    if m:
        minutes = int(m.group(2)) * 60 + int(m.group(3) or 0)
        if minutes >= 24 * 60:
            return None
        delta = dt.timedelta(minutes=minutes)
        return dt.timezone(-delta if m.group(1) == "-" else delta)
    try:
        return zoneinfo.ZoneInfo(text)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return None


def zone_option(name: str, option: str = "timestamp_zone") -> dt.tzinfo:
    """The zone an option names (see the module docstring for the syntax).

    Raises:
        ConfigError: not a zone; the message names ``option``.
    """
    zone = parse_zone(name)
    if zone is None:
        raise ConfigError(f"{option}={name!r} is not a time zone: use {ZONE_SYNTAX}")
    return zone
