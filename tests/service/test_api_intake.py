"""POST /v1/jobs on a real loopback server with the real intake and PostgreSQL: strict validation,
idempotent acceptance, bearer auth, problem documents, the OpenAPI description and health."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from tests.harness import stored_job
from tests.service.intake_app import TARGET, Api, http_job, problem, serve_api

# run as a RabbitMQ daemon leaves the database: ready jobs get the outbox rows looked at here
pytestmark = pytest.mark.usefixtures("relay_transport")


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


# acceptance -------------------------------------------------------------------------------------
async def test_accepts_a_due_job_with_202_location_and_one_outbox_row(api: Api) -> None:
    r = await api.post_job("grant-1", http_job(tenant="property-17"))
    assert r.status == 202, await r.text()
    body = await r.json()
    assert r.headers["Location"] == f"/v1/jobs/{body['id']}"
    assert "Idempotent-Replayed" not in r.headers
    assert body["key"] == "grant-1"
    assert body["state"] == "ready"
    assert datetime.fromisoformat(body["due_at"]) <= datetime.now(UTC)

    # the intent and its outbox row were written together
    outbox = await api.repo.pool.fetch("SELECT job_id, queue, tenant FROM dispatcher.outbox")
    assert [tuple(o) for o in outbox] == [(body["id"], "default", "property-17")]
    stored = await stored_job(api.repo.pool, body["id"])
    assert stored is not None
    assert stored["payload"] == {"grant": 1}
    # the target was normalized by the HTTP effect's validator
    assert stored["target"] == {
        "url": TARGET["url"],
        "method": "POST",
        "headers": {},
        "timeout_s": 30.0,
    }
    assert api.wakes == ["ready"]  # workers were told there is new ready work


async def test_location_leads_to_the_status_resource(api: Api) -> None:
    r = await api.post_job("grant-2", http_job())
    status = await api.client.get(r.headers["Location"])
    assert status.status == 200
    view = await status.json()
    assert (view["id"], view["key"], view["state"], view["attempt"]) == (
        (await r.json())["id"],
        "grant-2",
        "ready",
        0,
    )


async def test_a_future_job_is_scheduled_without_an_outbox_row(api: Api) -> None:
    due = datetime(2031, 5, 31, tzinfo=UTC)
    r = await api.post_job("grant-3", http_job(due_at="2031-05-31T02:00:00+02:00"))
    assert r.status == 202, await r.text()
    body = await r.json()
    assert body["state"] == "scheduled"
    assert datetime.fromisoformat(body["due_at"]) == due
    assert await api.count("outbox") == 0


async def test_every_optional_field_is_stored(api: Api) -> None:
    r = await api.post_job(
        "report-1",
        {
            "handler": "report",
            "payload": {"month": "2026-05"},
            "queue": "bulk",
            "tenant": "t-9",
            "due_at": "2031-01-01T00:00:00Z",
            "max_attempts": 4,
            "max_retry_age_s": 120,
        },
    )
    assert r.status == 202, await r.text()
    row = await stored_job(api.repo.pool, (await r.json())["id"])
    assert row is not None
    assert (
        row["handler"],
        row["queue"],
        row["tenant"],
        row["max_attempts"],
        row["max_retry_age_s"],
        row["target"],
    ) == ("report", "bulk", "t-9", 4, 120, None)


async def test_queue_defaults_fill_omitted_limits(api: Api) -> None:
    r = await api.post_job("bulk-1", http_job(queue="bulk"))
    row = await stored_job(api.repo.pool, (await r.json())["id"])
    assert row is not None
    assert (row["max_attempts"], row["max_retry_age_s"]) == (3, 600)


async def test_a_due_at_slightly_in_the_past_runs_now(api: Api) -> None:
    recent = datetime.now(UTC) - timedelta(seconds=60)
    r = await api.post_job("late-1", http_job(due_at=rfc3339(recent)))
    assert r.status == 202, await r.text()
    assert (await r.json())["state"] == "ready"
    assert await api.count("outbox") == 1


# validation: every error is a problem that says what to fix, and nothing is stored -------------
INVALID_BODIES: list[tuple[str, Any, str]] = [
    ("unknown field", http_job(urgency=5), "urgency: Extra inputs are not permitted"),
    ("unknown field in camel case", http_job(dueAt="2031-01-01T00:00:00Z"), "dueAt"),
    ("handler missing", {"target": TARGET}, "handler: Field required"),
    ("handler wrong type", http_job(handler=7), "handler: Input should be a valid string"),
    (
        "max_attempts as string",
        http_job(max_attempts="5"),
        "max_attempts: Input should be a valid integer",
    ),
    (
        "max_attempts as bool",
        http_job(max_attempts=True),
        "max_attempts: Input should be a valid integer",
    ),
    (
        "max_attempts zero",
        http_job(max_attempts=0),
        "max_attempts: Input should be greater than or equal to 1",
    ),
    ("max_retry_age_s negative", http_job(max_retry_age_s=-1), "max_retry_age_s"),
    ("tenant wrong type", http_job(tenant=17), "tenant: Input should be a valid string"),
    (
        "due_at without offset",
        http_job(due_at="2031-05-31T00:00:00"),
        "due_at: must be an RFC 3339 timestamp with offset",
    ),
    ("due_at date only", http_job(due_at="2031-05-31"), "due_at: must be an RFC 3339"),
    ("due_at words", http_job(due_at="tomorrow"), "due_at: must be an RFC 3339"),
    ("due_at epoch number", http_job(due_at=1900000000), "due_at: must be an RFC 3339"),
    ("due_at impossible day", http_job(due_at="2031-02-30T00:00:00Z"), "due_at:"),
    ("payload is a list", http_job(payload=[1, 2]), "payload: Input should be a valid dictionary"),
    (
        "payload is a string",
        http_job(payload="grant"),
        "payload: Input should be a valid dictionary",
    ),
    ("payload is null", http_job(payload=None), "payload: Input should be a valid dictionary"),
    ("body is a list", [http_job()], "body must be a JSON object"),
    (
        "unknown handler",
        http_job(handler="fax"),
        "handler: unknown handler 'fax'; known: http, report",
    ),
    (
        "unknown queue",
        http_job(queue="vip"),
        "queue: unknown queue 'vip'; configured: bulk, default",
    ),
    ("http without target", {"handler": "http"}, 'target: required for handler "http"'),
    (
        "target on a python handler",
        {"handler": "report", "target": TARGET},
        'only handler "http" takes a target',
    ),
    ("plain http target", http_job(target={"url": "http://hooks.example.com/"}), "use https"),
    ("loopback target", http_job(target={"url": "https://127.0.0.1/hook"}), "loopback"),
    ("metadata target", http_job(target={"url": "https://169.254.169.254/latest"}), "metadata"),
    (
        "target unknown key",
        http_job(target={**TARGET, "verb": "POST"}),
        "target has unknown keys ['verb']",
    ),
    (
        "target GET",
        http_job(target={**TARGET, "method": "GET"}),
        "target.method 'GET' is not allowed",
    ),
    (
        "target overrides Idempotency-Key",
        http_job(target={**TARGET, "headers": {"Idempotency-Key": "x"}}),
        "cannot be overridden",
    ),
    (
        "due_at long past",
        http_job(due_at="2020-01-01T00:00:00Z"),
        "more than 300 s in the past; omit due_at to run now",
    ),
]


@pytest.mark.parametrize(
    ("body", "detail"),
    [(b, d) for _, b, d in INVALID_BODIES],
    ids=[name for name, _, _ in INVALID_BODIES],
)
async def test_invalid_request_is_422_naming_the_field(api: Api, body: Any, detail: str) -> None:
    doc = await problem(await api.post_job("bad-1", body), 422)
    assert detail in doc["detail"]
    assert await api.count() == 0
    assert api.wakes == []


async def test_field_errors_are_listed_one_by_one(api: Api) -> None:
    doc = await problem(
        await api.post_job("bad-2", {"handler": "http", "colour": "red", "max_attempts": "many"}),
        422,
    )
    fields = {e["field"] for e in doc["errors"]}
    assert fields == {"colour", "max_attempts"}
    assert "colour" in doc["detail"] and "max_attempts" in doc["detail"]


async def test_past_tolerance_is_configurable(pool: asyncpg.Pool) -> None:
    async with serve_api(pool, due_at_past_tolerance_s=0) as api:
        recent = rfc3339(datetime.now(UTC) - timedelta(seconds=60))
        doc = await problem(await api.post_job("late-2", http_job(due_at=recent)), 422)
        assert "more than 0 s in the past" in doc["detail"]


@pytest.mark.parametrize(
    ("raw", "detail"),
    [
        (b'{"handler": ', "body is not valid JSON"),
        (b"", "body is not valid JSON"),
        (b'"just a string"', "body must be a JSON object"),
        (
            b'{"handler": "report", "payload": {"n": 1' + b"0" * 5000 + b"}}",
            "body holds an integer of more than 4300 digits, which the daemon cannot read",
        ),
    ],
    ids=["truncated", "empty", "string", "integer-past-4300-digits"],
)
async def test_a_body_that_is_not_a_json_object(api: Api, raw: bytes, detail: str) -> None:
    r = await api.client.post(
        "/v1/jobs",
        data=raw,
        headers={"Idempotency-Key": "raw-1", "Content-Type": "application/json"},
    )
    doc = await problem(r, 422 if "JSON object" in detail else 400)
    assert detail in doc["detail"]
    assert await api.count() == 0


@pytest.mark.parametrize(
    "key",
    [None, "", "x" * 256, "caf\u00e9", "tab\there"],
    ids=["missing", "empty", "256-chars", "non-ascii", "tab"],
)
async def test_idempotency_key_is_required_and_checked(api: Api, key: str | None) -> None:
    doc = await problem(await api.post_job(key, http_job()), 400)
    assert "Idempotency-Key" in doc["detail"]
    assert "1 to 255 printable ASCII" in doc["detail"]
    assert await api.count() == 0


@pytest.mark.parametrize("key", ["k", "x" * 255, "tenant 17/run:2026-05-31T02:00Z#unit~9"])
async def test_keys_of_1_to_255_printable_characters_are_accepted(api: Api, key: str) -> None:
    r = await api.post_job(key, http_job())
    assert r.status == 202, await r.text()
    assert (await r.json())["key"] == key


# body size --------------------------------------------------------------------------------------
async def test_default_body_limit_is_256_kib(api: Api) -> None:
    filler = 256 * 1024
    doc = await problem(await api.post_job("big-1", http_job(payload={"x": "y" * filler})), 413)
    assert f"limit of {256 * 1024} bytes" in doc["detail"]
    assert "body_limit_bytes" in doc["detail"]
    r = await api.post_job("big-2", http_job(payload={"x": "y" * (filler - 1024)}))
    assert r.status == 202, await r.text()
    assert await api.count() == 1


async def test_body_limit_is_configurable(pool: asyncpg.Pool) -> None:
    async with serve_api(pool, body_limit_bytes=2048) as api:
        doc = await problem(await api.post_job("big-3", http_job(payload={"x": "y" * 4096})), 413)
        assert "limit of 2048 bytes" in doc["detail"]
        r = await api.post_job("small-1", http_job(payload={"x": "y" * 1024}))
        assert r.status == 202, await r.text()


# idempotency ------------------------------------------------------------------------------------
async def test_same_key_and_same_request_returns_the_same_job(api: Api) -> None:
    body = http_job(payload={"a": 1, "b": [1, 2]}, due_at="2031-05-31T00:00:00Z")
    first = await api.post_job("same-1", body)
    second = await api.post_job("same-1", body)
    # the same request written differently: other key order, other offset for the same instant
    third = await api.post_job(
        "same-1",
        {
            "due_at": "2031-05-31T02:00:00+02:00",
            "payload": {"b": [1, 2], "a": 1},
            "target": TARGET,
            "handler": "http",
        },
    )
    ids = {(await r.json())["id"] for r in (first, second, third)}
    assert [r.status for r in (first, second, third)] == [202, 202, 202]
    assert len(ids) == 1
    assert second.headers["Location"] == first.headers["Location"]
    assert second.headers["Idempotent-Replayed"] == "true"
    assert third.headers["Idempotent-Replayed"] == "true"
    assert await api.count() == 1
    assert api.wakes == ["scheduled"]  # the creation woke the dispatcher; the replays did not


async def test_replay_of_a_due_job_adds_no_outbox_row_and_no_wake(api: Api) -> None:
    for _ in range(3):
        assert (await api.post_job("due-1", http_job())).status == 202
    assert (await api.count(), await api.count("outbox")) == (1, 1)
    assert api.wakes == ["ready"]


async def test_50_concurrent_posts_with_one_key_make_exactly_one_job(api: Api) -> None:
    body = http_job(payload={"grant": 42})
    responses = await asyncio.gather(*(api.post_job("grant-42", body) for _ in range(50)))
    assert [r.status for r in responses] == [202] * 50
    ids = {(await r.json())["id"] for r in responses}
    assert len(ids) == 1
    created = [r for r in responses if "Idempotent-Replayed" not in r.headers]
    assert len(created) == 1
    assert (await api.count(), await api.count("outbox")) == (1, 1)


async def test_same_key_with_a_different_request_is_409(api: Api) -> None:
    first = await api.post_job("order-7", http_job(payload={"amount": 10}))
    job_id = (await first.json())["id"]
    for changed in (
        http_job(payload={"amount": 11}),
        http_job(payload={"amount": 10}, due_at="2031-01-01T00:00:00Z"),
        http_job(payload={"amount": 10}, queue="bulk"),
        http_job(payload={"amount": 10}, target={"url": "https://other.example/"}),
    ):
        doc = await problem(await api.post_job("order-7", changed), 409)
        assert "'order-7'" in doc["detail"]
        assert f"job {job_id}" in doc["detail"]
        assert "resend the original body or use a new key" in doc["detail"]
        assert doc["job_id"] == job_id
    stored = await stored_job(api.repo.pool, job_id)
    assert stored is not None and stored["payload"] == {"amount": 10}
    assert await api.count() == 1


async def test_concurrent_posts_with_one_key_and_different_bodies(api: Api) -> None:
    bodies = [http_job(payload={"variant": i % 2}) for i in range(20)]
    responses = await asyncio.gather(*(api.post_job("split-1", b) for b in bodies))
    statuses = sorted(r.status for r in responses)
    assert set(statuses) == {202, 409}
    stored = await stored_job(api.repo.pool, key="split-1")
    assert stored is not None
    winner = stored["payload"]["variant"]
    for body, r in zip(bodies, responses, strict=True):
        assert r.status == (202 if body["payload"]["variant"] == winner else 409)
    assert await api.count() == 1


# authentication ---------------------------------------------------------------------------------
TOKENS = ["tok-alpha-5b1e0c", "tok-beta-77c2aa"]


@pytest.fixture
async def secured(pool: asyncpg.Pool) -> AsyncIterator[Api]:
    async with serve_api(pool, api_tokens=TOKENS) as served:
        yield served


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        "Bearer tok-alpha",
        "Bearer tok-alpha-5b1e0cX",
        "Basic tok-alpha-5b1e0c",
        "tok-alpha-5b1e0c",
        "Bearer t\u00f6k",
    ],
    ids=[
        "none",
        "empty",
        "scheme-only",
        "blank-token",
        "prefix",
        "longer",
        "basic",
        "no-scheme",
        "non-ascii",
    ],
)
async def test_missing_or_wrong_token_is_401_with_www_authenticate(
    secured: Api, authorization: str | None
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    for r in (
        await secured.post_job("auth-1", http_job(), headers=headers),
        await secured.client.get("/v1/jobs", headers=headers),
        await secured.client.post("/v1/jobs/batch", json={"jobs": []}, headers=headers),
    ):
        doc = await problem(r, 401)
        assert r.headers["WWW-Authenticate"].startswith("Bearer")
        assert "Authorization: Bearer <token>" in doc["detail"]
    assert await secured.count() == 0


@pytest.mark.parametrize("token", TOKENS)
async def test_any_configured_token_is_accepted(secured: Api, token: str) -> None:
    for scheme in ("Bearer", "bearer"):
        r = await secured.post_job(
            f"auth-{token}-{scheme}", http_job(), headers={"Authorization": f"{scheme} {token}"}
        )
        assert r.status == 202, await r.text()


async def test_health_metrics_and_description_need_no_token(secured: Api) -> None:
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
        r = await secured.client.get(path)
        assert r.status == 200, path


async def test_tokens_file_is_honoured(pool: asyncpg.Pool, tmp_path: Any) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("tok-from-file-1\n")
    async with serve_api(pool, api_tokens_file=str(tokens)) as api:
        await problem(await api.post_job("f-1", http_job()), 401)
        r = await api.post_job(
            "f-1", http_job(), headers={"Authorization": "Bearer tok-from-file-1"}
        )
        assert r.status == 202


# every error is a problem -----------------------------------------------------------------------
async def test_unknown_route_and_wrong_method_are_problems(api: Api) -> None:
    doc = await problem(await api.client.get("/v2/jobs"), 404)
    assert "/openapi.json" in doc["detail"]
    r = await api.client.delete("/v1/jobs")
    doc = await problem(r, 405)
    assert "DELETE is not allowed on /v1/jobs" in doc["detail"]
    assert "POST" in r.headers["Allow"]


# description and health -------------------------------------------------------------------------
async def test_openapi_describes_the_api(api: Api) -> None:
    r = await api.client.get("/openapi.json")
    assert r.status == 200
    doc = await r.json()
    assert doc["openapi"].startswith("3.")
    for path in (
        "/v1/jobs",
        "/v1/jobs/batch",
        "/v1/jobs/{id}",
        "/v1/jobs/{id}/retry",
        "/v1/jobs/{id}/cancel",
        "/healthz",
        "/readyz",
    ):
        assert path in doc["paths"], path
    post = doc["paths"]["/v1/jobs"]["post"]
    assert {p["name"] for p in post["parameters"]} == {"Idempotency-Key", "traceparent"}
    assert {"202", "400", "401", "409", "413", "422"} <= set(post["responses"])
    schemas = doc["components"]["schemas"]
    assert schemas["JobRequest"]["additionalProperties"] is False
    assert "handler" in schemas["JobRequest"]["required"]
    assert set(schemas["JobRequest"]["properties"]) >= {
        "handler",
        "target",
        "payload",
        "queue",
        "tenant",
        "due_at",
        "max_attempts",
        "max_retry_age_s",
    }
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


async def test_healthz_and_readyz(api: Api) -> None:
    r = await api.client.get("/healthz")
    assert (r.status, await r.json()) == (200, {"status": "alive"})
    r = await api.client.get("/readyz")
    assert (r.status, await r.json()) == (200, {"ready": True, "reason": "ok"})
    api.ready.append((False, "draining"))
    r = await api.client.get("/readyz")
    assert (r.status, await r.json()) == (503, {"ready": False, "reason": "draining"})
