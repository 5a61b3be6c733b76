#!/usr/bin/env node
'use strict';
// Creates a stream and a table over it, inserts readings and pull-queries the table through
// the router until the inserts are visible; prints one JSON line with what it saw.
//
//   node smoke.js --server 127.0.0.1:8088 [--name orders] [--token T] [--ca ca.pem --cert c.pem --key k.pem]
//
// Exit code 0 when the table holds exactly what was inserted, 1 otherwise (details on stderr).

const { MillpondClient } = require('./millpond');

function options(argv) {
  const out = { server: '127.0.0.1:8088', name: `node_${process.pid}` };
  for (let i = 0; i < argv.length; i += 2) {
    const flag = argv[i].replace(/^--/, '');
    if (!(flag in { server: 1, name: 1, token: 1, ca: 1, cert: 1, key: 1 }) || i + 1 >= argv.length) {
      throw new Error(`unknown or incomplete option ${argv[i]}`);
    }
    out[flag] = argv[i + 1];
  }
  return out;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function main() {
  const opts = options(process.argv.slice(2));
  const client = new MillpondClient(opts.server, opts);
  const stream = opts.name;
  const table = `${opts.name}_totals`;
  const readings = [['pump-1', 3], ['pump-2', 5], ['pump-1', 4], ['pump-3', -2], ['pump-2', 10]];
  const expected = {};
  for (const [id, amount] of readings) {
    const t = expected[id] || { n: 0, total: 0 };
    expected[id] = { n: t.n + 1, total: t.total + amount };
  }
  try {
    const [created] = await client.execute(
      `CREATE STREAM ${stream} (id VARCHAR KEY, amount INT) WITH (kafka_topic='${stream}', partitions=2, value_format='JSON');`);
    await client.execute(
      `CREATE TABLE ${table} AS SELECT id, COUNT(*) AS n, SUM(amount) AS total FROM ${stream} GROUP BY id EMIT CHANGES;`,
      { 'auto.offset.reset': 'earliest' });
    const inserted = [];
    for (const [id, amount] of readings) {
      const [result] = await client.execute(`INSERT INTO ${stream} (id, amount) VALUES ('${id}', ${amount});`);
      inserted.push({ partition: result.partition, offset: result.offset.toString() });
    }
    // The tasks may still be starting: ask until the table holds every insert (the client's
    // consistency token makes each answer at least as new as the last).
    const deadline = Date.now() + 120000;
    let seen = {};
    let lastError = null;
    while (Date.now() < deadline) {
      try {
        const [result] = await client.execute(`SELECT id, n, total FROM ${table};`);
        seen = Object.fromEntries(result.rows.map(([id, n, total]) => [id, { n: Number(n), total: Number(total) }]));
        if (JSON.stringify(sorted(seen)) === JSON.stringify(sorted(expected))) break;
      } catch (error) {
        lastError = `${error.code}: ${error.details}`;
      }
      await sleep(250);
    }
    const [lookup] = await client.execute(`SELECT * FROM ${table} WHERE id = 'pump-2';`);
    const ok = JSON.stringify(sorted(seen)) === JSON.stringify(sorted(expected));
    console.log(JSON.stringify({
      created: created.message,
      inserted,
      table: sorted(seen),
      lookup: { columns: lookup.columns, rows: lookup.rows.map((r) => r.map(String)) },
      consistency_token: client.consistencyToken !== '',
      ok,
    }));
    if (!ok) {
      console.error(`table ${table} never matched the inserts: saw ${JSON.stringify(seen)}; last error ${lastError}`);
      process.exitCode = 1;
    }
  } finally {
    client.close();
  }
}

function sorted(object) {
  return Object.fromEntries(Object.entries(object).sort(([a], [b]) => a.localeCompare(b)));
}

main().catch((error) => {
  console.error(error.details ? `${error.code} ${error.details}` : error.stack || String(error));
  process.exit(1);
});
