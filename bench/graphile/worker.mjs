// The graphile-worker peer of relaybus-bench: one Node process running
// graphile-worker's runner with the settings of its performance page
// (https://worker.graphile.org/docs/performance), and a task that only counts.
//
// The external-child contract (bench/children.cpp, Role::External):
//   env  BENCH_PG_URL     connection string (unix socket)
//        BENCH_OUT        where to write the key=value counters (ChildOut format)
//        BENCH_RCPT       where to write receipts (48-byte Receipt records)
//        BENCH_CONCURRENCY, BENCH_LOCAL_QUEUE  worker settings
//   stdout "ready\n" once connected; stdin "go <t_warm> <t0> <t1>\n" (CLOCK_MONOTONIC ns).
//   Starts the runner at t_warm, counts completed jobs by the same clock, stops at t1.
import { run, Logger } from "graphile-worker";
import pg from "pg";
import fs from "node:fs";
import readline from "node:readline";

const env = process.env;
const url = env.BENCH_PG_URL;
const concurrency = Number(env.BENCH_CONCURRENCY || 24);
const localQueue = Number(env.BENCH_LOCAL_QUEUE || 500);

// process.hrtime.bigint() is libuv's uv_hrtime: CLOCK_MONOTONIC, the harness's clock.
const mono = () => process.hrtime.bigint();
const realNs = () => BigInt(Date.now()) * 1000000n;

let t0 = 0n, t1 = 0n;
let unitsWindow = 0, unitsSinceT0 = 0, unitsTotal = 0, errors = 0, firstError = "";
// Receipts: int64 event_id, delivery_id, seq, mono_ns, real_ns; int32 key_id; int16 handler, flags.
const REC = 48;
let rcpt = Buffer.alloc(REC * 65536), nrcpt = 0;

function receipt(jobId, now) {
    if ((nrcpt + 1) * REC > rcpt.length) {
        const bigger = Buffer.alloc(rcpt.length * 2);
        rcpt.copy(bigger);
        rcpt = bigger;
    }
    const o = nrcpt++ * REC;
    const id = BigInt(jobId);
    rcpt.writeBigInt64LE(id, o);
    rcpt.writeBigInt64LE(id, o + 8);
    rcpt.writeBigInt64LE(-1n, o + 16);
    rcpt.writeBigInt64LE(now, o + 24);
    rcpt.writeBigInt64LE(realNs(), o + 32);
    rcpt.writeInt32LE(-1, o + 40);
    rcpt.writeInt16LE(0, o + 44);
    rcpt.writeInt16LE(1, o + 46);  // completed (the task resolved)
}

// The task does nothing but count; a unit is a job whose task resolved.
const taskList = {
    bench: async (_payload, helpers) => {
        const now = mono();
        unitsTotal++;
        if (now >= t0) unitsSinceT0++;
        if (now >= t0 && now <= t1) unitsWindow++;
        receipt(helpers.job.id, now);
    },
};

function writeOut() {
    const lines = [
        `units_window=${unitsWindow}`,
        `units_since_t0=${unitsSinceT0}`,
        `units_total=${unitsTotal}`,
        `errors=${errors}`,
        `empty_in_window=0`,
        `calls_window=0`,
        `call_p50_us=nan`,
        `call_p99_us=nan`,
        `first_error=${firstError.replace(/\n/g, " ")}`,
    ];
    fs.writeFileSync(env.BENCH_OUT, lines.join("\n") + "\n");
    fs.writeFileSync(env.BENCH_RCPT, rcpt.subarray(0, nrcpt * REC));
}

const sleepUntil = (t) => new Promise((r) => setTimeout(r, Math.max(0, Number(t - mono()) / 1e6)));

async function main() {
    // Connect once before reporting ready, as the other children do.
    const probe = new pg.Client({ connectionString: url });
    await probe.connect();
    await probe.end();
    process.stdout.write("ready\n");
    const rl = readline.createInterface({ input: process.stdin });
    const line = await new Promise((resolve) => rl.once("line", resolve));
    rl.close();
    const [word, w, a, b] = line.trim().split(/\s+/);
    if (word !== "go") throw new Error("expected go, got: " + line);
    const tWarm = BigInt(w);
    t0 = BigInt(a);
    t1 = BigInt(b);
    await sleepUntil(tWarm);

    const runner = await run({
        preset: {
            worker: {
                connectionString: url,
                concurrentJobs: concurrency,
                maxPoolSize: concurrency + 1,
                localQueue: { size: localQueue },
                completeJobBatchDelay: 0,
                failJobBatchDelay: 0,
                useNodeTime: true,
                preparedStatements: true,
                pollInterval: 2000,
            },
        },
        taskList,
        noHandleSignals: true,
        logger: new Logger(() => () => {}),
    });
    runner.events.on("job:error", ({ error }) => {
        errors++;
        if (!firstError) firstError = String(error && error.message ? error.message : error);
    });
    await sleepUntil(t1);
    // Graceful stop: running tasks finish, batched completions are written, locked jobs are released.
    await runner.stop();
    writeOut();
}

main().then(
    () => process.exit(0),
    (e) => {
        errors++;
        if (!firstError) firstError = String(e && e.stack ? e.stack : e);
        try {
            writeOut();
        } catch {}
        process.exit(1);
    },
);
