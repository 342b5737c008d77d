"""Secrets in the configuration: references resolved at load, values redacted on display.

A string value of the YAML may hold references, resolved by :func:`resolve_references`
before the configuration is validated, as Kafka Connect's config providers and Flink's
environment substitution do:

=====================  ================================================================
``${env:NAME}``        the environment variable ``NAME`` (an error when it is not set)
``${NAME}``            the same (shorthand)
``${file:PATH}``       the file's text without its trailing newline; a relative ``PATH``
                       is taken from the configuration file's folder (Docker and
                       Kubernetes secrets are mounted as files)
``$${``                a literal ``${``
=====================  ================================================================

Values under secret-looking keys (:func:`is_secret_key`: ``sasl.password``,
``basic.auth.user.info``, ``ssl.key.password``, ``*.secret``, ``*token*``...) are shown
as ``***`` wherever cdcflow displays a configuration: ``repr`` of the models, the Kafka
reader options (:class:`RedactedDict`), logs and error messages. The values themselves
are unchanged: the clients receive them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from cdcflow.errors import ConfigError

__all__ = [
    "MASK",
    "SECRET_KEY_PATTERN",
    "RedactedDict",
    "is_secret_key",
    "redact",
    "resolve_references",
]

MASK = "***"

#: key names whose values are secrets (librdkafka's ``sasl.password``,
#: ``ssl.key.password``, ``sasl.oauthbearer.client.secret``; the schema registry's
#: ``basic.auth.user.info`` and ``bearer.auth.token``; S3's ``aws_secret_access_key``, Azure's
#: ``azure_storage_account_key`` and ``azure_storage_sas_key``, GCS's ``google_service_account_key``;
#: cdcflow's Spark sessions mask the same words: ``runtime/spark.py``)
SECRET_KEY_PATTERN = (
    r"password|passwd|secret|token|credential|jaas|user\.info|api[._-]?key|private[._-]?key"
    r"|access[._-]?key|account[._-]?key|sas[._-]?key|service[._-]?account"
)
_SECRET_KEY = re.compile(SECRET_KEY_PATTERN, re.IGNORECASE)
_REFERENCE = re.compile(r"\$(\$?)\{([^}]*)\}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_K = TypeVar("_K")
_V = TypeVar("_V")


def is_secret_key(key: object) -> bool:
    """Whether a configuration key names a secret (see the module docstring)."""
    return isinstance(key, str) and _SECRET_KEY.search(key) is not None


def redact(value: Any, key: object = None) -> Any:
    """``value`` with every value under a secret-looking key replaced by :data:`MASK`,
    through nested mappings and lists (a copy; ``value`` is not changed)."""
    if key is not None and is_secret_key(key) and value not in (None, ""):
        return MASK
    if isinstance(value, Mapping):
        return {k: redact(v, k) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redact(v) for v in value)
    return value


class RedactedDict(dict[_K, _V]):
    """A ``dict`` whose ``repr`` and ``str`` show secret-looking keys' values as
    :data:`MASK`; the values themselves are kept (for the clients that need them)."""

    def __repr__(self) -> str:
        return repr(redact(dict(self)))

    __str__ = __repr__


def resolve_references(data: Any, base_dir: Path | None = None, where: str = "") -> Any:
    """The parsed YAML with every ``${...}`` reference in its strings resolved.

    Args:
        data: the parsed YAML (mappings, lists, scalars).
        base_dir: the configuration file's folder, for relative ``${file:PATH}``.
        where: the location of ``data`` in the configuration, for errors.

    Returns:
        A copy with the references replaced (``$${`` becomes a literal ``${``).

    Raises:
        ConfigError: one line naming the key, the reference and the fix: an unset
            environment variable, an unreadable file, or an unknown provider. The
            value is never in the message.
    """
    if isinstance(data, Mapping):
        return {
            k: resolve_references(v, base_dir, f"{where}.{k}" if where else str(k))
            for k, v in data.items()
        }
    if isinstance(data, list):
        return [resolve_references(v, base_dir, f"{where}[{i}]") for i, v in enumerate(data)]
    if isinstance(data, str) and "${" in data:
        return _REFERENCE.sub(lambda m: _resolve(m, base_dir, where or "(top level)"), data)
    return data


def _resolve(match: re.Match[str], base_dir: Path | None, where: str) -> str:
    if match.group(1):  # $${...}: a literal ${...}
        return "${" + match.group(2) + "}"
    body = match.group(2).strip()
    provider, _, name = body.partition(":") if ":" in body else ("env", "", body)
    if provider == "env":
        if not _ENV_NAME.fullmatch(name):
            raise ConfigError(
                f"{where}: '${{{body}}}' is not an environment variable reference; write "
                "${env:NAME} or ${NAME} with NAME of letters, digits and _ (or $${ for a "
                "literal ${)"
            )
        value = os.environ.get(name)
        if value is None:
            raise ConfigError(
                f"{where}: environment variable {name} is not set (referenced as "
                f"'${{{body}}}'); export it before running, or write the value itself"
            )
        return value
    if provider == "file":
        path = Path(name).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        try:
            return path.read_text().removesuffix("\n").removesuffix("\r")
        except OSError as exc:
            raise ConfigError(
                f"{where}: cannot read {path} (referenced as '${{{body}}}'): "
                f"{exc.strerror or exc}; check the path and its permissions"
            ) from exc
    raise ConfigError(
        f"{where}: unknown reference '${{{body}}}'; use ${{env:NAME}}, ${{NAME}} or "
        "${file:PATH} (or $${ for a literal ${)"
    )
