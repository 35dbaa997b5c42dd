"""The public routes: liveness, readiness, Prometheus metrics and the API's description."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dispatcher.api.bodies import json_response
from dispatcher.api.keys import DESCRIPTION, READINESS
from dispatcher.observability import metrics


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "alive"})


async def readyz(request: web.Request) -> web.Response:
    ready, reason = await request.app[READINESS]()  # type: ignore[operator]
    return json_response({"ready": ready, "reason": reason}, status=200 if ready else 503)


async def metrics_endpoint(request: web.Request) -> web.Response:
    return web.Response(
        body=generate_latest(metrics.REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


async def openapi(request: web.Request) -> web.Response:
    return json_response(request.app[DESCRIPTION]())
