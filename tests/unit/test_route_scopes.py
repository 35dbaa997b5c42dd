"""Every API route has an entry in the scope table (dispatcher.api.scopes), every entry is a
route, and the OpenAPI document states the same scope for each operation. A route without an
entry would need `operate` (fail closed): this test says which routes still need a decision."""

from __future__ import annotations

from typing import Any

from dispatcher.api.app import PUBLIC_PATHS, create_app
from dispatcher.api.openapi import openapi_document
from dispatcher.api.scopes import ROUTE_SCOPES, required_scope


def api_routes() -> set[tuple[str, str]]:
    app = create_app(
        repo=None,  # type: ignore[arg-type]
        intake=None,  # type: ignore[arg-type]
        readiness=None,  # type: ignore[arg-type]
        tokens=[],
        body_limit_bytes=1024,
    )
    routes = set()
    for route in app.router.routes():
        path = route.resource.canonical if route.resource else ""
        if route.method != "HEAD" and path not in PUBLIC_PATHS:
            routes.add((route.method, path))
    return routes


def test_every_route_has_a_scope_and_every_scope_a_route() -> None:
    routes = api_routes()
    assert sorted(routes - set(ROUTE_SCOPES)) == [], "routes without an entry in ROUTE_SCOPES"
    assert sorted(set(ROUTE_SCOPES) - routes) == [], "entries of ROUTE_SCOPES with no route"


def test_reads_are_gets_and_everything_else_changes_state() -> None:
    for (method, path), scope in ROUTE_SCOPES.items():
        assert (scope == "read") == (method == "GET"), (method, path, scope)
        if scope == "enqueue":
            assert path in ("/v1/jobs", "/v1/jobs/batch")


def test_a_route_without_an_entry_needs_operate() -> None:
    assert required_scope("POST", "/v1/something/new") == "operate"
    assert required_scope("GET", "/v1/something/new") == "operate"
    assert required_scope("HEAD", "/v1/jobs/{id}") == "read"


def test_the_openapi_document_states_each_operations_scope() -> None:
    documented: dict[tuple[str, str], Any] = {}
    for path, operations in openapi_document()["paths"].items():
        for method, operation in operations.items():
            if path in PUBLIC_PATHS:
                assert operation["security"] == []
                continue
            documented[(method.upper(), path)] = operation["security"]
            assert "403" in operation["responses"], (method, path)
    for key, security in documented.items():
        assert security == [{"bearer": [ROUTE_SCOPES[key]]}], key
