"""GET /v1/jobs lists summaries: no payload, target, result or progress, and a bounded excerpt of
the last error. The whole job stays one GET /v1/jobs/{id} away."""

from __future__ import annotations

from tests.service.intake_app import Api, http_job

SUMMARY_FIELDS = {
    "id",
    "priority",
    "concurrency_key",
    "key",
    "state",
    "queue",
    "tenant",
    "handler",
    "attempt",
    "due_at",
    "created_at",
    "started_at",
    "finished_at",
    "last_error",
    "dead_reason",
    "run_key",
}


async def test_list_items_are_summaries_with_a_bounded_error(api: Api) -> None:
    r = await api.post_job("summary-1", http_job(payload={"big": "p" * 10_000}, tenant="t1"))
    assert r.status == 202, await r.text()
    job_id = (await r.json())["id"]
    long_error = "E" * 3000
    await api.repo.pool.execute(
        "UPDATE dispatcher.jobs SET state = 'dead', dead_reason = 'max_attempts', "
        "last_error = $2, finished_at = now(), result = '{\"r\": 1}', progress = '{\"p\": 1}' "
        "WHERE id = $1",
        job_id,
        long_error,
    )
    await api.repo.pool.execute("DELETE FROM dispatcher.outbox")

    r = await api.client.get("/v1/jobs?state=dead")
    assert r.status == 200, await r.text()
    (item,) = (await r.json())["items"]
    assert set(item) == SUMMARY_FIELDS
    assert (item["id"], item["key"], item["tenant"], item["handler"]) == (
        job_id,
        "summary-1",
        "t1",
        "http",
    )
    assert (item["priority"], item["concurrency_key"]) == (0, "t1")  # the defaults
    assert item["last_error"] == "E" * 500

    r = await api.client.get(f"/v1/jobs/{job_id}")
    full = await r.json()
    assert full["last_error"] == long_error
    assert full["target_url"] == http_job()["target"]["url"]
    assert (full["result"], full["progress"]) == ({"r": 1}, {"p": 1})
