"""Reading requests and writing answers: the JSON body (bounded in time, strict about what is
JSON), a body as a request model, path and query values, and JSON answers."""

from __future__ import annotations

import asyncio
import json
import math
import sys
from datetime import datetime
from typing import Any, TypeVar

from aiohttp import web
from multidict import MultiMapping
from pydantic import BaseModel, ValidationError

from dispatcher.api.keys import BODY_TIMEOUT
from dispatcher.api.problems import Problem
from dispatcher.api.schemas import describe, is_ascii_number, summary
from dispatcher.core import jsoncodec, rfc3339

M = TypeVar("M", bound=BaseModel)


def json_response(data: Any, **kwargs: Any) -> web.Response:
    """A JSON answer, written by the fast encoder."""
    return web.json_response(data, dumps=jsoncodec.dumps, **kwargs)


def dated_response(data: Any, **kwargs: Any) -> web.Response:
    """A JSON answer that holds datetimes (the schedule views): written as RFC 3339."""
    return web.json_response(data, dumps=_dumps, **kwargs)


def _dumps(value: Any) -> str:
    return json.dumps(value, default=_plain)


def _plain(value: Any) -> str:
    return rfc3339.format(value) if isinstance(value, datetime) else str(value)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON; send numbers as finite values")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text[:20]} is out of range")
    return value


async def read_json(request: web.Request) -> Any:
    return (await read_json_and_escapes(request))[0]


async def read_json_and_escapes(request: web.Request) -> tuple[Any, bool]:
    """The parsed body, and whether its text has `\\u` escapes (see `storable_json`)."""
    # aiohttp has no server-side read timeout: bound the body so a client trickling bytes
    # (slow-loris) cannot hold a handler for ever.
    try:
        async with asyncio.timeout(request.app[BODY_TIMEOUT]):
            body = await request.read()
    except TimeoutError:
        raise Problem(408, f"body not received within {request.app[BODY_TIMEOUT]:g} s") from None
    try:
        text = body.decode("utf-8")
        data = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
        return data, "\\u" in text
    except UnicodeDecodeError:
        raise Problem(400, "body is not valid UTF-8; send JSON encoded as UTF-8") from None
    except json.JSONDecodeError as exc:
        raise Problem(
            400, f"body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        raise Problem(400, "body nests JSON too deeply") from None
    except ValueError as exc:
        if jsoncodec.is_long_integer_error(exc):  # Python's limit: read nowhere else either
            raise Problem(
                400,
                f"body holds an integer of more than {sys.int_info.default_max_str_digits} "
                "digits, which the daemon cannot read; send such a value as a string",
            ) from None
        raise Problem(400, f"body is not valid JSON: {exc}") from None


def parse_body(model: type[M], data: Any, shape: str = "") -> M:
    """`data` as `model`, or a 422 problem naming each bad field (`shape`: what to send)."""
    if not isinstance(data, dict):
        raise Problem(
            422, f"body must be a JSON object: {shape}" if shape else "body must be a JSON object"
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = describe(exc)
        raise Problem(422, summary(errors), errors=errors) from None


def job_id(request: web.Request) -> int:
    raw = request.match_info["id"]
    if not is_ascii_number(raw, max_digits=18):
        raise Problem(404, f"no job {raw!r}: job ids are positive integers")
    return int(raw)


def page_limit(q: MultiMapping[str]) -> int:
    """A listing's `limit` parameter: 1 to 1000, 100 when absent."""
    raw = q.get("limit", "100")
    if not is_ascii_number(raw, max_digits=4) or not 1 <= int(raw) <= 1000:
        raise Problem(422, "limit: an integer from 1 to 1000")
    return int(raw)
