"""The SQL blocks of docs/guides/limits.md, run as written on a migrated database: the override
they set is the one the next claim honours, and the delete takes it away."""

from __future__ import annotations

from dispatcher.db.jobs import JobRepository
from tests.db.test_key_limits import claim, running_by_key, setup
from tests.docs_blocks import ROOT, blocks

PAGE = ROOT / "docs/guides/limits.md"


async def test_the_override_blocks_run_as_written(repo: JobRepository) -> None:
    sql = [b.text for b in blocks(PAGE) if b.language == "sql"]
    assert len(sql) == 2
    set_override, delete_override = sql
    await setup(repo, (None, None, 1), {"acct-7": 10, "acct-8": 10})
    await repo.pool.execute(set_override)
    await repo.pool.execute(set_override)  # a second time: the same override, no error
    await claim(repo, 20)
    assert await running_by_key(repo.pool) == {"acct-7": 5, "acct-8": 1}
    await repo.pool.execute(delete_override)
    assert await repo.pool.fetchval("SELECT count(*) FROM dispatcher.key_limits") == 0
