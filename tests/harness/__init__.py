"""Test helpers, the one place for them (docs/testing.md says how to use them):

- `daemons`: the one way to run a daemon (`DaemonProcess`, a child process, started by the
  `spawn`, `daemon` and `module_daemon` fixtures of tests/conftest.py or `daemon_process`;
  `running_daemon` in process where a test needs the object), and `DaemonHandle`, what a test
  holds either way;
- `logs`: a daemon's JSON log as events to wait for (`handle.log.wait_for("dispatcher ready")`);
- `signals`: `job_changes`, a LISTEN woken by every change of the jobs table;
- `targets`: `Target`, a recording loopback HTTP target that signals its requests;
- `waits`: `wait_until` (polling, for states nothing signals) and `free_port`;
- `commands`: the `dispatcher` command and daemons on the embedded database;
- `jobs`: jobs written and read straight in the database.

Everything is real: real PostgreSQL, real HTTP on 127.0.0.1, real processes and signals.
"""

from tests.harness.commands import (
    CLI_TIMEOUT_S,
    Result,
    cli,
    command,
    daemon_on,
    env_for,
    no_server_left,
    postmasters,
    run_cli,
)
from tests.harness.daemons import (
    EMBEDDED_READY_S,
    LOOPBACK_ENV,
    DaemonHandle,
    DaemonProcess,
    InProcessDaemon,
    daemon_process,
    get,
    make_settings,
    post,
    running_daemon,
    terminate,
)
from tests.harness.jobs import enqueue_noop_jobs, stored_job
from tests.harness.logs import LogEvents
from tests.harness.signals import (
    JobChanges,
    job_changes,
    until_job_count,
    until_job_keys,
    until_job_states,
)
from tests.harness.targets import Target, serve_target, starts_above_bucket
from tests.harness.waits import free_port, wait_signalled, wait_until

__all__ = [
    "CLI_TIMEOUT_S",
    "EMBEDDED_READY_S",
    "LOOPBACK_ENV",
    "DaemonHandle",
    "DaemonProcess",
    "InProcessDaemon",
    "JobChanges",
    "LogEvents",
    "Result",
    "Target",
    "cli",
    "command",
    "daemon_on",
    "daemon_process",
    "enqueue_noop_jobs",
    "env_for",
    "free_port",
    "get",
    "job_changes",
    "make_settings",
    "no_server_left",
    "post",
    "postmasters",
    "run_cli",
    "running_daemon",
    "serve_target",
    "starts_above_bucket",
    "stored_job",
    "terminate",
    "until_job_count",
    "until_job_keys",
    "until_job_states",
    "wait_signalled",
    "wait_until",
]
