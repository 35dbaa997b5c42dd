"""The restore's rewrite of a dumped index on pg_trgm's operator class (dispatcher.db.backup):
a dump of the dispatcher schema does not carry the extension, so the index is made only where
pg_trgm is, or can be, installed, in whatever schema it is there; every other line passes as
it is. The restore itself, with pg_trgm, runs in tests/e2e/test_backup.py and test_embedded.py."""

from __future__ import annotations

from dispatcher.db.backup import portable

INDEX = (
    b"CREATE INDEX jobs_last_error_trgm ON dispatcher.job_state USING gin"
    b" (last_error public.gin_trgm_ops) WHERE (last_error IS NOT NULL);\n"
)


def test_other_lines_pass_unchanged() -> None:
    for line in (
        b"CREATE INDEX jobs_key_prefix_id ON dispatcher.intents USING btree"
        b" (key text_pattern_ops) INCLUDE (id);\n",
        b"COPY dispatcher.intents (id, key) FROM stdin;\n",
        b"1\tgin_trgm_ops in a payload\n",
        b"",
    ):
        assert portable(line) == line


def test_the_trigram_index_is_made_only_where_pg_trgm_is() -> None:
    rewritten = portable(INDEX).decode()
    assert rewritten.startswith("DO $restore$") and rewritten.endswith("$restore$;\n")
    assert "CREATE EXTENSION pg_trgm" in rewritten and "EXCEPTION WHEN OTHERS" in rewritten
    # the statement itself, with the dump's schema swapped for the extension's at restore time
    assert "$index$CREATE INDEX jobs_last_error_trgm ON dispatcher.job_state" in rewritten
    assert "$from$public.gin_trgm_ops$from$" in rewritten
    assert "IF ext IS NOT NULL THEN" in rewritten
