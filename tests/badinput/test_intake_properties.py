"""Property tests of the accept path (POST /v1/jobs and /v1/jobs/batch) on the in-process app
built as the daemon builds it, on real PostgreSQL.

For any body and headers: the answer is 202 or a 4xx `application/problem+json`, never a 5xx;
an accepted job reads back exactly as sent (and a replay returns the same job); a refused request
leaves the jobs and outbox tables as they were.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from decimal import Decimal
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from tests.service.intake_app import PROBLEM_JSON, Api

# run as a RabbitMQ daemon leaves the database: ready jobs get the outbox rows looked at here
pytestmark = pytest.mark.usefixtures("relay_transport")

SETTINGS = settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# JSON as Python's json module reads it: including NaN, Infinity and lone surrogates ("\ud800")
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["\x00", "a\x00b", "\ud800", "é", ""])
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=10,
)
objects = st.dictionaries(st.text(max_size=8), json_values, max_size=4)
# JSON every database can store: finite numbers, no NUL, no unpaired surrogates
storable_text = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12
)
storable_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | storable_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(storable_text, inner, max_size=3),
    max_leaves=10,
)
storable_objects = st.dictionaries(storable_text, storable_values, max_size=4)
timestamps = st.sampled_from(
    [
        "2031-05-31T02:00:00Z",
        "2031-05-31T02:00:00.123456789+02:00",
        "2100-01-01T00:00:00Z",
        "9999-12-31T23:59:59Z",
        "9999-12-31T23:59:59-14:00",
        "0001-01-01T00:00:00+14:00",
        "2020-01-01T00:00:00Z",
        "2031-02-30T00:00:00Z",
        "2031-05-31T02:00:00",
        "2031-05-31",
        "2031-05-31T25:00:00Z",
        "2031-05-31t02:00:00z",
        "2031-05-31 02:00:00+00:00",
    ]
)
urls = st.sampled_from(
    [
        "https://hooks.example.com/grants",
        "http://hooks.example.com/x",
        "https://127.0.0.1/",
        "https://169.254.169.254/latest",
        "ftp://example.com/",
        "not a url",
        "https://[::1",
        "https://example.com:99999/",
        "https://\x00.example.com/",
        "https://example.com/\ud800",
        "https://user:pw@example.com/",
        "https://例え.jp/",
        "",
    ]
)
targets = st.fixed_dictionaries(
    {},
    optional={
        "url": urls | json_values,
        "method": st.sampled_from(["POST", "put", "GET", "DELETE", ""]) | json_values,
        "headers": st.dictionaries(
            st.text(max_size=8), st.text(max_size=8) | json_values, max_size=3
        )
        | json_values,
        "timeout_s": st.sampled_from([1, 0.5, 900, 901, 0, -1]) | json_values,
        "extra": json_values,
    },
)
fields = [
    "handler",
    "target",
    "payload",
    "queue",
    "tenant",
    "due_at",
    "max_attempts",
    "max_retry_age_s",
    "idempotency_key",
    "surprise",
]
# anything at all in the shape of a job
job_bodies = st.fixed_dictionaries(
    {},
    optional={
        "handler": st.sampled_from(["http", "report", "unknown", ""])
        | st.text(max_size=70)
        | json_values,
        "target": targets | json_values,
        "payload": objects | json_values,
        "queue": st.sampled_from(["default", "bulk", "missing"])
        | st.text(max_size=70)
        | json_values,
        "tenant": st.text(max_size=20) | st.text(min_size=250, max_size=260) | json_values,
        "due_at": timestamps | json_values,
        "max_attempts": st.integers(-2, 1002) | json_values,
        "max_retry_age_s": st.integers(-2, 10**10) | json_values,
        "idempotency_key": st.text(max_size=10),
        "surprise": json_values,
    },
)
# a job the schema accepts (hostile only in its free-form values: payload, tenant, headers)
valid_jobs = st.fixed_dictionaries(
    {"handler": st.just("report")},
    optional={
        "payload": storable_objects | storable_objects | objects,
        "queue": st.sampled_from(["default", "bulk"]),
        "tenant": storable_text | st.text(max_size=20),
        "due_at": timestamps,
        "max_attempts": st.integers(1, 1000),
        "max_retry_age_s": st.integers(0, 315_360_000),
    },
) | st.fixed_dictionaries(
    {
        "handler": st.just("http"),
        "target": st.fixed_dictionaries(
            {"url": st.just("https://hooks.example.com/grants") | urls},
            optional={
                "method": st.sampled_from(["POST", "PUT", "PATCH"]),
                "headers": st.dictionaries(
                    st.from_regex(r"\AX-[A-Za-z]{1,8}\Z"), st.text(max_size=12), max_size=3
                ),
                "timeout_s": st.floats(0.001, 900),
            },
        ),
    },
    optional={"payload": storable_objects | objects, "tenant": storable_text},
)
# a valid job with one or two fields replaced by anything
mutated_jobs = st.tuples(
    valid_jobs, st.dictionaries(st.sampled_from(fields), json_values, min_size=1, max_size=2)
).map(lambda pair: {**pair[0], **pair[1]})
any_job = st.one_of(valid_jobs, valid_jobs, mutated_jobs, job_bodies)


def encoded(value: Any) -> bytes:
    """JSON text as Python writes it (NaN, Infinity and lone surrogates included)."""
    return json.dumps(value).encode("utf-8", "surrogatepass")


bodies = st.one_of(
    any_job.map(encoded), any_job.map(encoded), json_values.map(encoded), st.binary(max_size=64)
)
# what a client can put in a header at all: visible ASCII, space, tab and Latin-1 obs-text
header_text = st.text(
    st.characters(codec="latin-1", categories=["L", "N", "P", "S", "Zs"]) | st.just("\t"),
    max_size=300,
)
valid_keys = st.from_regex(r"\A[ -~]{8,60}\Z")
keys = st.one_of(
    valid_keys,
    valid_keys,
    valid_keys,
    st.sampled_from(["k-1", "k-2"]),
    st.none(),
    header_text,
    st.just("k" * 256),
)
content_types = st.sampled_from(["application/json", "text/plain", "", None])


async def table_sizes(api: Api) -> tuple[int, int]:
    row = await api.repo.pool.fetchrow(
        "SELECT (SELECT count(*) FROM dispatcher.jobs), (SELECT count(*) FROM dispatcher.outbox)"
    )
    return row[0], row[1]


async def post(
    api: Api, path: str, body: bytes, key: str | None, content_type: str | None
) -> tuple[int, str, Any, dict[str, str]]:
    headers = {}
    if key is not None:
        headers["Idempotency-Key"] = key
    if content_type is not None:
        headers["Content-Type"] = content_type
    async with api.client.post(path, data=body, headers=headers) as r:
        text = await r.text()
        document = json.loads(text) if text else None
        return r.status, r.content_type, document, dict(r.headers)


def assert_problem(status: int, content_type: str, document: Any) -> None:
    assert 400 <= status < 500, (status, document)
    assert content_type == PROBLEM_JSON, (status, content_type, document)
    assert document["status"] == status and document["title"], document
    assert isinstance(document["detail"], str) and document["detail"], document


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text} overflows a double")
    return value


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def is_strict_json(body: bytes) -> bool:
    """RFC 8259 JSON: no NaN or Infinity, no number beyond a double's range."""
    try:
        json.loads(body, parse_constant=_no_constants, parse_float=_finite)
    except ValueError:
        return False
    return True


def as_json_numbers(value: Any) -> Any:
    """The JSON value with every number exact (Decimal), so 1e300 equals 10**300 as in JSON."""
    return json.loads(json.dumps(value), parse_float=Decimal, parse_int=Decimal)


async def assert_stored_as_sent(api: Api, job_id: int, key: str, body: bytes) -> None:
    sent = json.loads(body)
    row = await api.repo.pool.fetchrow(
        "SELECT key, handler, queue, tenant, payload::text AS payload, due_at, max_attempts, "
        "max_retry_age_s, state, (SELECT count(*) FROM dispatcher.outbox WHERE job_id = j.id) "
        "AS outbox FROM dispatcher.jobs j WHERE id = $1",
        job_id,
    )
    assert row is not None
    assert (row["key"], row["handler"]) == (key, sent["handler"])
    assert row["queue"] == (sent.get("queue") or "default")
    assert row["tenant"] == (sent.get("tenant") or "")
    stored_payload = json.loads(row["payload"], parse_float=Decimal, parse_int=Decimal)
    assert stored_payload == as_json_numbers(sent.get("payload", {}))
    if sent.get("due_at") is not None:
        wanted = datetime.fromisoformat(sent["due_at"].upper().replace("Z", "+00:00"))
        assert abs((row["due_at"] - wanted).total_seconds()) < 1e-3
    for field in ("max_attempts", "max_retry_age_s"):
        if sent.get(field) is not None:
            assert row[field] == sent[field]
    assert row["outbox"] == (1 if row["state"] == "ready" else 0)


@SETTINGS
@given(body=bodies, key=keys, content_type=content_types)
async def test_post_job_answers_202_or_a_4xx_problem_and_stores_exactly_what_it_accepts(
    api: Api, body: bytes, key: str | None, content_type: str | None
) -> None:
    note(f"body={body!r} key={key!r}")
    before = await table_sizes(api)
    status, content_type_out, document, headers = await post(
        api, "/v1/jobs", body, key, content_type
    )
    note(f"-> {status} {document}")
    event(f"POST /v1/jobs -> {status}")
    if status != 202:
        assert_problem(status, content_type_out, document)
        assert await table_sizes(api) == before
        return
    assert key is not None
    key = key.strip(" \t")  # HTTP drops a header value's surrounding whitespace
    assert headers["Location"] == f"/v1/jobs/{document['id']}"
    if headers.get("Idempotent-Replayed") != "true":
        await assert_stored_as_sent(api, document["id"], key, body)
    # a retried POST returns the same job and changes nothing
    after = await table_sizes(api)
    again = await post(api, "/v1/jobs", body, key, content_type)
    assert (again[0], again[2]["id"], again[3].get("Idempotent-Replayed")) == (
        202,
        document["id"],
        "true",
    )
    assert await table_sizes(api) == after


@SETTINGS
@given(
    items=st.lists(
        any_job.map(lambda j: {**j, "idempotency_key": j.get("idempotency_key", "b")})
        | json_values,
        min_size=0,
        max_size=5,
    )
    | json_values
)
async def test_batch_answers_per_item_and_never_a_5xx(api: Api, items: Any) -> None:
    body = encoded({"jobs": items} if isinstance(items, list) else items)
    note(f"body={body!r}")
    before = await table_sizes(api)
    status, content_type, document, _ = await post(
        api, "/v1/jobs/batch", body, None, "application/json"
    )
    note(f"-> {status} {document}")
    if isinstance(items, list) and len(items) >= 1 and is_strict_json(body):
        # a batch is not a transaction: bad items are refused one by one, never the batch
        assert status == 200, (status, document)
    if status != 200:
        assert_problem(status, content_type, document)
        assert await table_sizes(api) == before
        return
    results = document["results"]
    assert [r["index"] for r in results] == list(range(len(items)))
    created = 0
    for item, result in zip(items, results, strict=True):
        assert result["status"] in ("accepted", "existing", "conflict", "rejected"), result
        if result["status"] == "rejected":
            assert isinstance(result["error"], str) and result["error"]
        if result["status"] == "accepted":
            created += 1
            key = item["idempotency_key"].strip(" \t")  # as an Idempotency-Key header's
            await assert_stored_as_sent(api, result["id"], key, encoded(item))
    assert (await table_sizes(api))[0] == before[0] + created


# Bodies that once answered 500 (each one found by the properties above), kept as named cases.
HOSTILE_BODIES = {
    "nan-in-payload": b'{"handler": "report", "payload": {"x": NaN}}',
    "infinity-in-payload": b'{"handler": "report", "payload": {"x": -Infinity}}',
    "number-overflowing-a-double": b'{"handler": "report", "payload": {"x": 1e400}}',
    "nul-in-payload-value": b'{"handler": "report", "payload": {"x": "a\\u0000b"}}',
    "nul-in-payload-key": b'{"handler": "report", "payload": {"\\u0000": 1}}',
    "lone-surrogate-in-payload": b'{"handler": "report", "payload": {"x": "\\ud800"}}',
    "nul-in-tenant": b'{"handler": "report", "tenant": "a\\u0000b"}',
    "nul-in-target-url": b'{"handler": "http", "target": {"url": "https://\\u0000x.example/"}}',
    "lone-surrogate-in-target-url": b'{"handler": "http", "target": {"url": "https://x.example/\\ud800"}}',
    "lone-surrogate-in-target-header": b'{"handler": "http", "target": '
    b'{"url": "https://x.example/", "headers": {"X": "\\ud800"}}}',
    "due-at-after-year-9999-in-utc": b'{"handler": "report", '
    b'"due_at": "9999-12-31T23:59:59-14:00"}',
}


@pytest.mark.parametrize("body", HOSTILE_BODIES.values(), ids=HOSTILE_BODIES.keys())
async def test_hostile_body_is_a_4xx_problem_not_a_500(api: Api, body: bytes) -> None:
    before = await table_sizes(api)
    status, content_type, document, _ = await post(
        api, "/v1/jobs", body, "hostile-1", "application/json"
    )
    assert_problem(status, content_type, document)
    assert await table_sizes(api) == before


@pytest.mark.parametrize("body", HOSTILE_BODIES.values(), ids=HOSTILE_BODIES.keys())
async def test_hostile_batch_item_never_fails_its_neighbours(api: Api, body: bytes) -> None:
    """One bad item in a batch is refused alone (when the body is JSON at all)."""
    good = b'{"handler": "report", "idempotency_key": "neighbour"}'
    bad = body[:-1] + b', "idempotency_key": "hostile-2"}'
    status, content_type, document, _ = await post(
        api, "/v1/jobs/batch", b'{"jobs": [' + good + b", " + bad + b"]}", None, "application/json"
    )
    if not is_strict_json(body):
        assert_problem(status, content_type, document)  # not JSON: the whole body is refused
        assert await table_sizes(api) == (0, 0)
        return
    assert status == 200, document
    assert [r["status"] for r in document["results"]] == ["accepted", "rejected"], document


path_text = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=20)
query_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)


@SETTINGS
@given(
    job_id=path_text | st.sampled_from(["²", "\u0661", "0", "-1", "99999999999999999999", "1e3"]),
    action=st.sampled_from(["", "/retry", "/cancel"]),
    query=st.dictionaries(
        st.sampled_from(["state", "queue", "limit", "cursor", "x"]),
        query_text
        | st.sampled_from(["²", "\u0661", "0", "1001", "-5", "dead", "99999999999999999999"]),
        max_size=4,
    ),
)
async def test_operator_routes_answer_a_4xx_problem_for_any_id_or_query(
    api: Api, job_id: str, action: str, query: dict[str, str]
) -> None:
    before = await table_sizes(api)
    method = "POST" if action else "GET"
    async with api.client.request(method, f"/v1/jobs/{quote(job_id, safe='')}{action}") as r:
        text = await r.text()
        note(f"{method} /v1/jobs/{job_id!r}{action} -> {r.status} {text}")
        if r.status >= 400:
            assert_problem(r.status, r.content_type, json.loads(text))
        assert r.status < 500
    async with api.client.get("/v1/jobs", params=query) as r:
        text = await r.text()
        note(f"GET /v1/jobs {query!r} -> {r.status} {text}")
        if r.status >= 400:
            assert_problem(r.status, r.content_type, json.loads(text))
        assert r.status < 500
    assert await table_sizes(api) == before


# Operator requests that once answered 500 (found by the property above).
OPERATOR_CASES = {
    # '²'.isdigit() is True but int('²') raises ValueError
    "superscript-id-get": ("GET", "/v1/jobs/%C2%B2"),
    "superscript-id-retry": ("POST", "/v1/jobs/%C2%B2/retry"),
    "superscript-id-cancel": ("POST", "/v1/jobs/%C2%B2/cancel"),
    "superscript-limit": ("GET", "/v1/jobs?limit=%C2%B2"),
    "superscript-cursor": ("GET", "/v1/jobs?cursor=%C2%B2"),
    # the cursor is a bigint in SQL
    "cursor-beyond-bigint": ("GET", "/v1/jobs?cursor=9223372036854775808"),
}


@pytest.mark.parametrize(("method", "path"), OPERATOR_CASES.values(), ids=OPERATOR_CASES.keys())
async def test_operator_input_that_once_crashed_is_a_4xx_problem(
    api: Api, method: str, path: str
) -> None:
    async with api.client.request(method, path) as r:
        assert_problem(r.status, r.content_type, await r.json(content_type=None))
