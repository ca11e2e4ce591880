// A worker in another language on dbq's row contract (node-postgres, from npm), for
// tests/test_row_contract.py: `send` producers and `read` consumers, logging each step as
// tests/queue_worker.py does (P sent, G delivered, A acked, N nacked, L lease lost).
//   node row_worker.cjs send URL SCHEMA QUEUE LOG COUNT BATCH PREFIX
//   node row_worker.cjs read URL SCHEMA QUEUE LOG MODE BATCH STOPFILE NACK_EVERY
"use strict";
const fs = require("fs");
const { Client } = require("pg");

const [role, url, schema, queue, log, ...rest] = process.argv.slice(2);
const ident = (s) => '"' + s.replace(/"/g, '""') + '"';
const routine = (verb) => `${ident(schema)}.${ident(queue + "_" + verb)}`;
const out = fs.openSync(log, "a");
const note = (kind, bodies) => fs.writeSync(out, bodies.map((b) => `${kind} ${b}\n`).join(""));

async function send(db, count, batch, prefix) {
  for (let n = 0; n < count; n += batch) {
    let names = [];
    for (let i = n; i < Math.min(n + batch, count); i++) names.push(`${prefix}-${i}`);
    while (names.length > 0) {
      let rows = [];
      try {
        ({ rows } = await db.query(`SELECT msg_id FROM ${routine("send_batch")}($1::bytea[], $2::jsonb[])`, [
          names.map((name) => Buffer.from(name)),
          names.map((name) => JSON.stringify({ from: "node", name })),
        ]));
      } catch (e) {
        if (e.code !== "53400") throw e; // the ring took none: send them all again
      }
      note("P", names.filter((_, i) => rows[i] && rows[i].msg_id !== null));
      names = names.filter((_, i) => !(rows[i] && rows[i].msg_id !== null)); // the full ring did not take these
      if (names.length > 0) await new Promise((resolve) => setTimeout(resolve, 5));
    }
  }
}

async function read(db, mode, batch, stopFile, nackEvery) {
  const visibility = mode === "leased" ? 30000 : 0;
  for (;;) {
    const { rows } = await db.query(
      `SELECT msg_id, lease, attempts, headers, body FROM ${routine("read")}($1, $2, $3)`,
      [batch, visibility, 200],
    );
    if (rows.length === 0) {
      if (fs.existsSync(stopFile)) return;
      continue;
    }
    const bodies = rows.map((r) => r.body.toString());
    rows.forEach((r, i) => {
      if (r.headers.name !== bodies[i]) throw new Error(`headers ${JSON.stringify(r.headers)} for ${bodies[i]}`);
    });
    note("G", bodies);
    if (mode !== "leased") continue;
    for (let i = 0; i < rows.length; i++) {
      const r = rows[i];
      const number = Number(bodies[i].split("-").pop());
      if (r.attempts === 1 && number % nackEvery === 0) {
        await db.query(`SELECT ${routine("nack")}($1, $2, 0, 'node worker nacks')`, [r.msg_id, r.lease]);
        note("N", [bodies[i]]);
        continue;
      }
      const { rows: acked } = await db.query(`SELECT ${routine("ack")}($1, $2) AS ok`, [r.msg_id, r.lease]);
      note(acked[0].ok === 1 ? "A" : "L", [bodies[i]]);
    }
  }
}

(async () => {
  const db = new Client({ connectionString: url });
  await db.connect();
  try {
    if (role === "send") await send(db, Number(rest[0]), Number(rest[1]), rest[2]);
    else if (role === "read") await read(db, rest[0], Number(rest[1]), rest[2], Number(rest[3]));
    else throw new Error(`unknown role ${role}: send or read`);
  } finally {
    await db.end();
  }
})().catch((e) => {
  console.error(e.stack || String(e));
  process.exit(1);
});
