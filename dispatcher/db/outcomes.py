"""Safe forms of job outcomes, applied once, where outcomes enter the database.

Whatever a handler returns, raises or a target answers, the repository stores it through one of
two functions here (`storable_result` for a result, `storable_text` for error texts, reasons and
response excerpts), so no value can make a write fail, and a batched write (many jobs'
completions in one statement) never fails for one job's sake. What each value becomes is the
table in docs/outcomes.md:

- text: NUL (which PostgreSQL text and jsonb refuse) and lone surrogates (not UTF-8) are written
  as the visible escape `\\u0000`, `\\udc80`; text beyond its limit is cut, with a marker saying
  how long it was;
- numbers: an int with more digits than Python's int-to-text limit (4,300) is stored as text
  (its first and last digits and its length); NaN and the infinities as the text JSON would need
  ("NaN", "Infinity", "-Infinity");
- containers: dicts (keys as text, the way `json.dumps` writes them), lists and tuples are kept,
  at most MAX_DEPTH (254) levels deep; a cycle, a deeper level, and any other value (a set,
  bytes, an object) that orjson cannot write either become a bounded `repr` excerpt;
- size: a result whose JSON would pass MAX_RESULT_CHARS is stored as a bounded `repr` excerpt.

Each function returns its input unchanged (the same object) when it is storable as given, so the
common case (a small dict of plain values) costs a walk over it and no copy.
"""

from __future__ import annotations

import math
import re
import reprlib
import sys
from typing import Any

import asyncpg
import orjson

from dispatcher.core import jsoncodec

MAX_TEXT_CHARS = 64 * 1024  # one string inside a result
MAX_RESULT_CHARS = 256 * 1024  # a whole result's JSON, roughly (the intake body limit's default)
# Nesting levels kept: orjson's own limit, so a result orjson writes needs no depth check (a
# list of 1,000 records has 2,001 brackets; counting them sent such results to the walk, 3 ms).
MAX_DEPTH = 254
REPR_CHARS = 500  # a `repr` excerpt standing in for a value that cannot be stored as JSON
ERROR_CHARS = 2000  # an error text (the job's last_error)
EXCERPT_CHARS = 500  # a response excerpt in the attempt history
REASON_CHARS = 200  # a failure's reason code

# What PostgreSQL text (and jsonb strings) cannot hold: NUL, and surrogates (not valid UTF-8).
_UNSTORABLE_CHARS = re.compile("[\x00\ud800-\udfff]")
_INT_DIGITS = sys.get_int_max_str_digits() or 0  # 0: the interpreter sets no limit
_INT_BOUND = 10**_INT_DIGITS if _INT_DIGITS else None
_FLOAT_TEXT = {math.inf: "Infinity", -math.inf: "-Infinity"}


class _Repr(reprlib.Repr):
    """`repr` bounded in every dimension: excerpts of a container's first items, a few levels."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 4
        self.maxdict = self.maxlist = self.maxtuple = self.maxset = 20
        self.maxfrozenset = self.maxdeque = self.maxarray = 20
        self.maxstring = self.maxother = self.maxlong = REPR_CHARS


_REPR = _Repr()


# SQLSTATE classes that refuse a statement for the values it carries: data exceptions (22:
# invalid text, numeric out of range), integrity constraints (23), program limits (54: a value
# too large). Anything else (a deadlock, a timeout, an undefined column) is not one job's fault.
_DATA_ERROR_CLASSES = ("22", "23", "54")


def is_data_error(exc: BaseException) -> bool:
    """Whether `exc` refused a write for the values it carries, so that the same write without
    one job's values may succeed: the server's data classes, the driver's refusal to encode an
    argument (a ValueError), or an exception raised in Python before anything was sent."""
    if isinstance(exc, asyncpg.InterfaceError):
        return isinstance(exc, ValueError)
    if isinstance(exc, asyncpg.PostgresError):
        return str(exc.sqlstate)[:2] in _DATA_ERROR_CLASSES
    return not isinstance(exc, OSError)  # OSError: no connection (is_unavailable's)


def storable_text(text: str | None, limit: int) -> str | None:
    """`text` as text PostgreSQL stores: NUL and lone surrogates escaped, cut to `limit`
    characters with a marker that says how long it was. The same object when nothing needed
    changing."""
    if text is None:
        return None
    if type(text) is not str:  # a str subclass, or anything else passed by mistake
        text = str.__str__(text) if isinstance(text, str) else _excerpt(text)
    length = len(text)
    safe = text[:limit] if length > limit else text
    if not (safe.isascii() and "\x00" not in safe) and _UNSTORABLE_CHARS.search(safe):
        safe = _UNSTORABLE_CHARS.sub(_escape, safe)
    if length > limit or len(safe) > limit:  # an escape is six characters for one
        total = length if length > limit else len(safe)
        safe = safe[:limit] + f"… [cut: {total} characters in all]"
    return safe


def storable_result(value: Any) -> Any:
    """`value` as a JSON value jsonb stores, in a safe form where it cannot be stored as given
    (the module's docstring says which). The same object when nothing needed changing."""
    if value is None or type(value) is bool:  # most handlers return None
        return value
    walk = _Walk()
    try:
        return walk.value(value, 0)
    except _TooLarge:
        why = f"[result too large to store: over {MAX_RESULT_CHARS} characters of JSON] "
    except RecursionError:  # the walk began on a deep stack already
        why = "[result nested too deep to store] "
    return storable_text(why + _excerpt(value), MAX_TEXT_CHARS)


def result_json(value: Any) -> str | None:
    """`storable_result(value)` as JSON text (None stays None: SQL NULL, no result).

    Most results are small and plain: orjson writes them in well under a microsecond, and when
    its output shows none of what the safe form changes, it is the answer, with no walk in
    Python (a walk costs about 5 µs for a three-key dict, 0.6 ms for a list of 1,000 ints).
    Each test is conservative: NUL is written `\\u0000`; NaN and the infinities come out as
    `null` (so any `null` takes the walk); orjson refuses surrogates, ints past 64 bits, keys
    that are not text, sets, bytes, other objects, cycles and nesting past MAX_DEPTH (its own
    limit); no string can pass MAX_TEXT_CHARS in a text shorter than that."""
    if value is None:
        return None
    if isinstance(value, str | list | tuple | dict) and len(value) > MAX_TEXT_CHARS:
        return jsoncodec.dumps(storable_result(value))  # too long for the fast path: no copy
    try:
        text = orjson.dumps(value)
    except (TypeError, ValueError):  # orjson.JSONEncodeError is a TypeError
        pass
    else:
        if len(text) <= MAX_TEXT_CHARS and b"\\u0000" not in text and b"null" not in text:
            return text.decode()
    return jsoncodec.dumps(storable_result(value))


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def _excerpt(value: Any) -> str:
    """A bounded `repr` of `value`, or its type's name when even that fails."""
    if isinstance(value, bytes | bytearray):  # reprlib would repr them whole first
        cut = "…" if len(value) > REPR_CHARS else ""
        return repr(bytes(value[:REPR_CHARS])) + cut
    if isinstance(value, memoryview):
        return f"<memoryview of {value.nbytes} bytes>"
    try:
        text = _REPR.repr(value)
    except Exception as exc:  # a __repr__ that raises, an int past the digit limit inside
        return f"<{type(value).__name__} object: repr failed ({type(exc).__name__})>"
    if len(text) > REPR_CHARS:
        text = text[:REPR_CHARS] + "…"
    return text


def _int_text(n: int) -> str:
    """An int too long for decimal text (Python refuses str() past 4,300 digits), as text: its
    first and last ten digits and its length, each computed without converting it whole."""
    magnitude = abs(n)
    digits = int(magnitude.bit_length() * math.log10(2)) + 1
    if magnitude < 10 ** (digits - 1):  # the estimate can be one too many
        digits -= 1
    head = magnitude // 10 ** (digits - 10)
    tail = magnitude % 10**10
    sign = "-" if n < 0 else ""
    return f"{sign}{head}…{tail:010d} (an integer of {digits} digits, stored as text)"


class _TooLarge(Exception):
    """The result's JSON passed MAX_RESULT_CHARS (raised mid-walk: nothing more is copied)."""


class _Walk:
    """One walk over a result: the safe form of each value, the containers on the current path
    (for cycles) and the characters of JSON so far (for the size limit)."""

    __slots__ = ("chars", "path")

    def __init__(self) -> None:
        self.chars = 0
        self.path: set[int] = set()

    def value(self, value: Any, depth: int) -> Any:
        kind = type(value)
        if kind is str:
            self._add(len(value) + 2)
            return storable_text(value, MAX_TEXT_CHARS)
        if value is None or kind is bool:
            self._add(5)
            return value
        if kind is int:
            return self._int(value)
        if kind is float:
            self._add(24)
            return value if math.isfinite(value) else _FLOAT_TEXT.get(value, "NaN")
        if kind is dict or kind is list or kind is tuple:
            return self._container(value, depth)
        return self._other(value, depth)

    def _int(self, value: int) -> Any:
        if _INT_BOUND is not None and not -_INT_BOUND < value < _INT_BOUND:
            self._add(80)
            return _int_text(value)
        self._add(value.bit_length() // 3 + 2)
        return value

    def _container(self, value: Any, depth: int) -> Any:
        if depth >= MAX_DEPTH:
            return self._text(f"[nested deeper than {MAX_DEPTH} levels] " + _excerpt(value))
        key = id(value)
        if key in self.path:
            return self._text(f"[cycle: this {type(value).__name__} contains itself]")
        self.path.add(key)
        try:
            if isinstance(value, dict):
                return self._dict(value, depth)
            self._add(2)
            items = [self.value(item, depth + 1) for item in value]
            if type(value) is list and all(a is b for a, b in zip(items, value, strict=True)):
                return value
            return items
        finally:
            self.path.discard(key)

    def _dict(self, value: dict[Any, Any], depth: int) -> dict[str, Any]:
        self._add(2)
        out: dict[str, Any] = {}
        same = type(value) is dict
        for key, item in value.items():
            safe_key = self._key(key)
            safe_item = self.value(item, depth + 1)
            same = same and safe_key is key and safe_item is item
            out[safe_key] = safe_item
        return value if same else out

    def _key(self, key: Any) -> str:
        """A key as `json.dumps` writes it (numbers, true, false, null as text); other kinds of
        keys as their `repr` excerpt."""
        if type(key) is str:
            self._add(len(key) + 3)
            return storable_text(key, MAX_TEXT_CHARS)  # type: ignore[return-value]
        if key is True or key is False or key is None:
            text = {True: "true", False: "false", None: "null"}[key]
        elif type(key) is int:
            text = str(self._int(key))
        elif type(key) is float:
            text = repr(key) if math.isfinite(key) else _FLOAT_TEXT.get(key, "NaN")
        else:
            text = _excerpt(key)
        self._add(len(text) + 3)
        return storable_text(text, MAX_TEXT_CHARS)  # type: ignore[return-value]

    def _other(self, value: Any, depth: int) -> Any:
        """A value of another type: what orjson writes for it (datetimes, UUIDs, dataclasses,
        enums, subclasses of str, int, float, dict, list), made safe in turn; anything orjson
        refuses (sets, bytes, other objects, a cycle inside a dataclass) as a `repr` excerpt."""
        if isinstance(value, str):  # subclasses (str enums): their plain value, as orjson
            return self.value(str.__str__(value), depth)
        if isinstance(value, int):  # bool cannot be subclassed; IntEnum and the like
            return self._int(int.__int__(value))
        if isinstance(value, float):
            return self.value(float.__float__(value), depth)
        if isinstance(value, dict | list | tuple):  # subclasses (Delivered is a dict)
            return self._container(value, depth)
        try:
            plain = orjson.loads(orjson.dumps(value))
        except (TypeError, ValueError, RecursionError):
            return self._text(_excerpt(value))
        return self.value(plain, depth)

    def _text(self, text: str) -> str:
        self._add(len(text) + 2)
        return storable_text(text, MAX_TEXT_CHARS)  # type: ignore[return-value]

    def _add(self, chars: int) -> None:
        self.chars += chars
        if self.chars > MAX_RESULT_CHARS:
            raise _TooLarge
