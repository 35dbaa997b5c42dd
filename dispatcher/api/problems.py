"""RFC 9457 problem details: every API error is `application/problem+json` with a `detail`."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

CONTENT_TYPE = "application/problem+json"

TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    413: "Payload Too Large",
    415: "Unsupported Media Type",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def problem(
    status: int, detail: str, *, headers: dict[str, str] | None = None, **extra: Any
) -> web.Response:
    body = {
        "type": "about:blank",
        "title": TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
        **extra,
    }
    return web.Response(
        status=status, text=json.dumps(body), content_type=CONTENT_TYPE, headers=headers
    )


class Problem(Exception):
    """Raise inside a handler to answer with a problem document."""

    def __init__(self, status: int, detail: str, **extra: Any):
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.extra = extra

    def response(self) -> web.Response:
        return problem(self.status, self.detail, **self.extra)
