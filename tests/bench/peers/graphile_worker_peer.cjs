// graphile-worker side of the peer benchmark (tests/bench/peers/run.py drives it).
// Resolved through NODE_PATH from the throw-away install the runner makes; never installed here.
//
//   node graphile_worker_peer.cjs <command> '<json arguments>'
//
// setup                      install the schema (WorkerUtils.migrate)
// bulk    {n, run_at}        addJobs in chunks of 10,000 (run_at: epoch seconds, optional)
// single  {n, clients}       one addJob per job from `clients` concurrent callers
// paced   {rate, seconds}    one addJob per job at a steady rate, payload {t: enqueue time}
// work    {out, ...settings} run a worker until SIGTERM; then write every job's handler start
//                            time and its payload `t` to `out` (JSON)
// The enqueue commands print one JSON line: {n, elapsed_s}.
"use strict";

const fs = require("fs");
const { performance } = require("perf_hooks");
const { Logger, makeWorkerUtils, run } = require("graphile-worker");

const wall = () => (performance.timeOrigin + performance.now()) / 1000;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
// warnings and errors only: a log line per job would be measured as the system's own cost
const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") console.error(`[${level}] ${message}`);
});

async function utils(dsn, poolSize) {
  return makeWorkerUtils({ connectionString: dsn, maxPoolSize: poolSize, logger });
}

async function setup(a) {
  const u = await utils(a.dsn, 2);
  try {
    await u.migrate();
  } finally {
    await u.release();
  }
  return {};
}

async function bulk(a) {
  const u = await utils(a.dsn, 2);
  try {
    const runAt = a.run_at ? new Date(a.run_at * 1000) : undefined;
    const t0 = wall();
    for (let start = 0; start < a.n; start += 10000) {
      const specs = [];
      for (let i = start; i < Math.min(a.n, start + 10000); i++) {
        specs.push({ identifier: "noop", payload: { t: a.run_at || null }, runAt });
      }
      await u.addJobs(specs);
    }
    return { n: a.n, elapsed_s: wall() - t0, finished_at: wall() };
  } finally {
    await u.release();
  }
}

async function single(a) {
  const u = await utils(a.dsn, a.clients);
  try {
    let next = 0;
    const caller = async () => {
      while (next < a.n) {
        next++;
        await u.addJob("noop", { t: null });
      }
    };
    await u.addJob("noop", { t: null }); // opens a connection, prepares
    const t0 = wall();
    await Promise.all(Array.from({ length: a.clients }, caller));
    return { n: next, elapsed_s: wall() - t0 };
  } finally {
    await u.release();
  }
}

async function paced(a) {
  const u = await utils(a.dsn, 8);
  try {
    const n = Math.round(a.rate * a.seconds);
    const pending = [];
    const t0 = wall();
    for (let i = 0; i < n; i++) {
      const wait = t0 + i / a.rate - wall();
      if (wait > 0.001) await sleep(wait * 1000);
      pending.push(u.addJob("noop", { t: wall() }));
    }
    await Promise.all(pending);
    const elapsed = wall() - t0;
    return { n, elapsed_s: elapsed, rate: n / elapsed };
  } finally {
    await u.release();
  }
}

async function work(a) {
  const starts = [];
  const refs = [];
  const runner = await run({
    noHandleSignals: true,
    logger,
    taskList: {
      noop: async (payload) => {
        starts.push(wall());
        refs.push(payload && payload.t != null ? payload.t : null);
      },
    },
    preset: {
      worker: {
        connectionString: a.dsn,
        concurrentJobs: a.concurrency,
        maxPoolSize: a.max_pool_size,
        pollInterval: a.poll_interval_ms,
        localQueue: { size: a.local_queue_size },
        completeJobBatchDelay: a.complete_job_batch_delay_ms,
        failJobBatchDelay: a.fail_job_batch_delay_ms,
      },
    },
  });
  process.on("SIGTERM", () => {
    fs.writeFileSync(a.out, JSON.stringify({ starts, refs }));
    process.exit(0);
  });
  console.log("READY");
  await runner.promise;
}

const commands = { setup, bulk, single, paced, work };
const [command, raw] = process.argv.slice(2);
commands[command](JSON.parse(raw || "{}")).then(
  (result) => {
    if (result) console.log(JSON.stringify(result));
    process.exit(0);
  },
  (err) => {
    console.error(err && err.stack ? err.stack : err);
    process.exit(1);
  },
);
