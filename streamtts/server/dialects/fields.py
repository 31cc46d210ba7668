"""Reading a compatibility protocol's JSON objects with type checks.

Every way a field can be wrong is a :class:`~streamtts.protocol.ProtocolError` with a native
code (``invalid_json``, ``invalid_message``, ``missing_field``, ``invalid_field``) naming the
field, which each dialect renders in its own vocabulary. Unknown fields are not looked at
(forward compatibility, as on the native protocol).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import orjson

from streamtts.protocol import MAX_CONTEXT_ID_BYTES, ErrorCode, ProtocolError


def load_object(frame: str | bytes) -> dict[str, Any]:
    """One JSON text frame that must be an object."""
    try:
        data = orjson.loads(frame)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(ErrorCode.INVALID_JSON, f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProtocolError(ErrorCode.INVALID_MESSAGE, "a message must be a JSON object")
    return data


class Fields:
    """The fields of one JSON object; ``context`` is named in the errors raised."""

    def __init__(
        self, data: Mapping[str, Any], context: str | None = None, prefix: str = ""
    ) -> None:
        self._data = data
        self.context = context
        self._prefix = prefix

    def __contains__(self, name: str) -> bool:
        return self._data.get(name) is not None

    def raw(self, name: str) -> Any:
        return self._data.get(name)

    def _name(self, name: str) -> str:
        return f"{self._prefix}{name}"

    def _invalid(self, name: str, what: str) -> ProtocolError:
        return ProtocolError(
            ErrorCode.INVALID_FIELD, f"'{self._name(name)}' must be {what}", self.context
        )

    def missing(self, name: str) -> ProtocolError:
        return ProtocolError(
            ErrorCode.MISSING_FIELD, f"missing field '{self._name(name)}'", self.context
        )

    def string(self, name: str) -> str | None:
        value = self._data.get(name)
        if value is not None and not isinstance(value, str):
            raise self._invalid(name, "a string")
        return value

    def required_string(self, name: str) -> str:
        value = self.string(name)
        if value is None:
            raise self.missing(name)
        return value

    def boolean(self, name: str, default: bool = False) -> bool:
        value = self._data.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._invalid(name, "true or false")
        return value

    def integer(self, name: str, minimum: int, maximum: int) -> int | None:
        value = self._data.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._invalid(name, "an integer")
        if not minimum <= value <= maximum:
            raise self._invalid(name, f"between {minimum} and {maximum}")
        return value

    def number(self, name: str) -> float | None:
        value = self._data.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._invalid(name, "a number")
        if not math.isfinite(value):
            raise self._invalid(name, "a finite number")
        return float(value)

    def object(self, name: str) -> Fields | None:
        value = self._data.get(name)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self._invalid(name, "an object")
        return Fields(value, self.context, f"{self._name(name)}.")

    def context_id(self, name: str) -> str:
        """A required context id: a non-empty string of at most 255 UTF-8 bytes."""
        value = self._data.get(name)
        if value is None:
            raise ProtocolError(ErrorCode.MISSING_FIELD, f"missing field '{name}'")
        if not isinstance(value, str) or not value:
            raise ProtocolError(ErrorCode.INVALID_FIELD, f"'{name}' must be a non-empty string")
        if len(value.encode()) > MAX_CONTEXT_ID_BYTES:
            raise ProtocolError(
                ErrorCode.INVALID_FIELD, f"'{name}' must be at most {MAX_CONTEXT_ID_BYTES} bytes"
            )
        return value
