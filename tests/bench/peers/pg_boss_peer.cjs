// pg-boss (v10) side of the peer benchmark (tests/bench/peers/run.py drives it).
// Resolved through NODE_PATH from the throw-away install the runner makes; never installed here.
//
//   node pg_boss_peer.cjs <command> '<json arguments>'
//
// setup                      start() (installs the schema) and createQueue("noop")
// bulk    {n, run_at}        insert() in chunks of 10,000 (run_at: epoch seconds, optional)
// single  {n, clients}       one send() per job from `clients` concurrent callers
// paced   {rate, seconds}    one send() per job at a steady rate, data {t: enqueue time}
// work    {out, ...settings} `workers` calls of work() with batchSize; until SIGTERM; then
//                            write every job's handler start time and its data `t` to `out`
// The enqueue commands print one JSON line: {n, elapsed_s}.
"use strict";

const fs = require("fs");
const { performance } = require("perf_hooks");
const PgBoss = require("pg-boss");

const QUEUE = "noop";
const wall = () => (performance.timeOrigin + performance.now()) / 1000;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// A client only: no maintenance, no cron, no migration (the `setup` command did that).
async function client(dsn, max) {
  const boss = new PgBoss({ connectionString: dsn, max, supervise: false, schedule: false,
                            migrate: false });
  boss.on("error", (err) => console.error(err));
  await boss.start();
  return boss;
}

async function setup(a) {
  const boss = new PgBoss({ connectionString: a.dsn, max: 2 });
  boss.on("error", (err) => console.error(err));
  await boss.start();
  await boss.createQueue(QUEUE);
  await boss.stop({ graceful: false, wait: true });
  return {};
}

async function bulk(a) {
  const boss = await client(a.dsn, 2);
  try {
    const startAfter = a.run_at ? new Date(a.run_at * 1000) : undefined;
    const t0 = wall();
    for (let start = 0; start < a.n; start += 10000) {
      const jobs = [];
      for (let i = start; i < Math.min(a.n, start + 10000); i++) {
        jobs.push({ name: QUEUE, data: { t: a.run_at || null }, startAfter });
      }
      await boss.insert(jobs);
    }
    return { n: a.n, elapsed_s: wall() - t0, finished_at: wall() };
  } finally {
    await boss.stop({ graceful: false, wait: true });
  }
}

async function single(a) {
  const boss = await client(a.dsn, a.clients);
  try {
    let next = 0;
    const caller = async () => {
      while (next < a.n) {
        next++;
        await boss.send(QUEUE, { t: null });
      }
    };
    await boss.send(QUEUE, { t: null });
    const t0 = wall();
    await Promise.all(Array.from({ length: a.clients }, caller));
    return { n: next, elapsed_s: wall() - t0 };
  } finally {
    await boss.stop({ graceful: false, wait: true });
  }
}

async function paced(a) {
  const boss = await client(a.dsn, 8);
  try {
    const n = Math.round(a.rate * a.seconds);
    const pending = [];
    const t0 = wall();
    for (let i = 0; i < n; i++) {
      const wait = t0 + i / a.rate - wall();
      if (wait > 0.001) await sleep(wait * 1000);
      pending.push(boss.send(QUEUE, { t: wall() }));
    }
    await Promise.all(pending);
    const elapsed = wall() - t0;
    return { n, elapsed_s: elapsed, rate: n / elapsed };
  } finally {
    await boss.stop({ graceful: false, wait: true });
  }
}

async function work(a) {
  const starts = [];
  const refs = [];
  const boss = new PgBoss({ connectionString: a.dsn, max: a.max_pool_size, migrate: false });
  boss.on("error", (err) => console.error(err));
  await boss.start();
  const options = { batchSize: a.batch_size, pollingIntervalSeconds: a.polling_interval_s };
  for (let w = 0; w < a.workers; w++) {
    await boss.work(QUEUE, options, async (jobs) => {
      const now = wall();
      for (const job of jobs) {
        starts.push(now);
        refs.push(job.data && job.data.t != null ? job.data.t : null);
      }
    });
  }
  process.on("SIGTERM", () => {
    fs.writeFileSync(a.out, JSON.stringify({ starts, refs }));
    process.exit(0);
  });
  console.log("READY");
  await new Promise(() => {});
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
