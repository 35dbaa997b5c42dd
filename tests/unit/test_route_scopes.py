"""The API is one table (dispatcher.api.routes.ROUTES): the router, the scope table and the
OpenAPI document are all read from it, so a route cannot exist without its scope and its
description. These tests hold that: every route the aiohttp application serves is a row, every
row is served, the document describes exactly the rows, and states each row's scope. A route
without a scope entry would need `operate` (fail closed)."""

from __future__ import annotations

from typing import Any

from dispatcher.api.app import PUBLIC_PATHS, create_app
from dispatcher.api.openapi import openapi_document
from dispatcher.api.routes import ROUTES
from dispatcher.api.scopes import ROUTE_SCOPES, required_scope
from dispatcher.config.tokens import SCOPES


def served(*, public: bool = False) -> set[tuple[str, str]]:
    """(method, path) of every route the application serves (HEAD aside: aiohttp adds it to
    each GET); the public ones too with `public`."""
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
        if route.method != "HEAD" and (public or path not in PUBLIC_PATHS):
            routes.add((route.method, path))
    return routes


def test_the_router_serves_exactly_the_rows_of_the_table() -> None:
    rows = [(route.method, route.path) for route in ROUTES]
    assert len(rows) == len(set(rows)), "a (method, path) twice in ROUTES"
    assert served(public=True) == set(rows)


def test_the_openapi_document_describes_exactly_the_rows_of_the_table() -> None:
    document = openapi_document()
    described = {
        (method.upper(), path)
        for path, operations in document["paths"].items()
        for method in operations
    }
    assert described == {(route.method, route.path) for route in ROUTES}
    schemas = document["components"]["schemas"]
    for route in ROUTES:
        operation = document["paths"][route.path][route.method.lower()]
        assert operation["summary"] == route.summary
        if isinstance(route.request, type):  # a request model: a named component schema
            assert route.request.__name__ in schemas, route.path
        assert (route.request is None) == ("requestBody" not in operation), route.path
        assert any(code.startswith("2") for code in operation["responses"]), route.path


def test_every_row_names_a_scope_or_is_public() -> None:
    for route in ROUTES:
        assert route.scope in (*SCOPES, None), (route.method, route.path)
        assert (route.scope is None) == (route.path in PUBLIC_PATHS), route.path


def test_every_route_has_a_scope_and_every_scope_a_route() -> None:
    routes = served()
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
