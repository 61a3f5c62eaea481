'use strict';
// Drives the official RocketMQ Node.js client (rocketmq-client-nodejs, unmodified, installed by
// `npm ci` from this folder's package-lock.json) against a broker's RocketMQ endpoint, for
// tests/client/test_rocketmq_node.py. Prints one JSON document on its last line.
//
//   node driver.js ENDPOINT COMMAND JSON_ARGS
//
// Commands (their arguments are the JSON object's fields):
//   send {topic, count}                         NORMAL messages, one at a time
//   receive {topic, group, expected, filter, seconds, invisibleMs}
//                                               a SimpleConsumer acknowledging what it gets
//   fifo-send {topic, groups, perGroup}         FIFO messages of groups g0.., interleaved
//   fifo-receive {topic, group, expected}       a SimpleConsumer: every receive and ack, in order
//   delay-send {topic, delaysS, recall}         DELAY messages; those whose index is in `recall`
//                                               are recalled at once
//   recall {topic, handle}                      RecallMessage with a handle sent earlier
//   transactions {topic, stayS}                 commit, rollback and two orphans a checker settles
//   push {topic, group, expected, failEvery, quietS}
//                                               a PushConsumer: every delivery
//   produce-consume {topic, group, seconds, readyFile, readyDelivered, stopFile, progressFile}
//                                               a producer and a PushConsumer at once, for
//                                               `seconds` once `readyFile` is written: at start,
//                                               or once `readyDelivered` receipted messages came;
//                                               ends early once `stopFile` exists; writes the
//                                               count of receipts to `progressFile` after each
//   bench {topic, latencyTopic, group, messages, inFlight}
//                                               bench/rocketmq.py's figures of this client
//
// Times are milliseconds since the epoch. The client's own log goes to stderr (warnings and
// errors only; everything with DRIVER_DEBUG set), not to its default file under the home directory.

const fs = require('node:fs');
const {
  Producer,
  SimpleConsumer,
  PushConsumer,
  ConsumeResult,
} = require('rocketmq-client-nodejs');
const { TransactionResolution } = require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb');

const verbose = Boolean(process.env.DRIVER_DEBUG);
const logger = {
  info(...args) { if (verbose) console.error('INFO', ...args); },
  debug(...args) { if (verbose) console.error('DEBUG', ...args); },
  warn(...args) { console.error('WARN', ...args); },
  error(...args) { console.error('ERROR', ...args); },
};

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

// A PushConsumer's shutdown() waits for its receives in flight, each held by the endpoint for up to
// the long-polling timeout its settings name (20 s). What a run reports is settled before it shuts
// down, so the driver waits this long at most and exits: the endpoint forgets a client that stops
// calling after three missed heartbeats, and what it had received and not acknowledged is redelivered.
const PUSH_SHUTDOWN_WAIT_MS = 2000;

async function shutdownPush(consumer) {
  await Promise.race([ consumer.shutdown(), sleep(PUSH_SHUTDOWN_WAIT_MS) ]);
}

// With DRIVER_TLS set, every client connects with TLS (sslEnabled), trusting what grpc-js trusts
// by default: Node's roots, or the file GRPC_DEFAULT_SSL_ROOTS_FILE_PATH names.
const sslEnabled = Boolean(process.env.DRIVER_TLS);

function options(endpoint, extra) {
  return { endpoints: endpoint, namespace: '', logger, requestTimeout: 10000, sslEnabled, ...extra };
}

function message(topic, i) {
  return {
    topic,
    body: Buffer.from(`body-${i}`),
    tag: [ 'a', 'b', 'c' ][i % 3],
    keys: [ `key-${i}` ],
    properties: new Map([[ 'seq', String(i) ]]),
  };
}

function described(m) {
  return {
    id: m.messageId,
    body: m.body.toString(),
    tag: m.tag || null,
    keys: [ ...m.keys ].sort(),
    group: m.messageGroup || null,
    properties: Object.fromEntries(m.properties),
    attempt: m.deliveryAttempt,
    at: Date.now(),
  };
}

function failure(err) {
  return { name: err.name, code: err.code ?? null, message: String(err.message).slice(0, 500) };
}

async function withProducer(endpoint, topics, work, checker) {
  const producer = new Producer(options(endpoint, { topics, checker }));
  await producer.startup();
  try {
    return await work(producer);
  } finally {
    await producer.shutdown();
  }
}

async function send(endpoint, { topic, count }) {
  return withProducer(endpoint, [ topic ], async producer => {
    const sent = [];
    for (let i = 0; i < count; i++) {
      const r = await producer.send(message(topic, i));
      sent.push({ i, id: r.messageId, queue: r.messageQueue.queueId, broker: r.messageQueue.broker.name });
    }
    let unknownTopic = null;
    try {
      await producer.send(message(`${topic}-missing`, 0));
    } catch (err) {
      unknownTopic = failure(err);
    }
    return { sent, unknown_topic: unknownTopic };
  });
}

async function simpleConsumer(endpoint, topic, group, filter = '*', awaitMs = 2000) {
  const consumer = new SimpleConsumer(options(endpoint, {
    consumerGroup: group,
    subscriptions: new Map([[ topic, filter ]]),
    awaitDuration: awaitMs,
  }));
  await consumer.startup();
  return consumer;
}

async function receive(endpoint, { topic, group, expected, filter = '*', seconds = 60, invisibleMs = 15000 }) {
  const consumer = await simpleConsumer(endpoint, topic, group, filter);
  try {
    const got = [];
    const deadline = Date.now() + seconds * 1000;
    let idle = 0;
    // until `expected` came and then three receives in a row came back empty
    while (Date.now() < deadline && !(got.length >= expected && idle >= 3)) {
      const batch = await consumer.receive(32, invisibleMs);
      idle = batch.length ? 0 : idle + 1;
      for (const m of batch) {
        got.push(described(m));
        await consumer.ack(m);
      }
    }
    return { received: got };
  } finally {
    await consumer.shutdown();
  }
}

async function fifoSend(endpoint, { topic, groups, perGroup }) {
  return withProducer(endpoint, [ topic ], async producer => {
    const sent = [];
    for (let n = 0; n < perGroup; n++) {
      for (let g = 0; g < groups; g++) {
        const r = await producer.send({
          topic,
          body: Buffer.from(`g${g}-${n}`),
          messageGroup: `g${g}`,
          properties: new Map([[ 'seq', String(n) ]]),
        });
        sent.push({ group: `g${g}`, seq: n, id: r.messageId });
      }
    }
    return { sent };
  });
}

async function fifoReceive(endpoint, { topic, group, expected }) {
  const consumer = await simpleConsumer(endpoint, topic, group);
  try {
    const events = [];
    let acked = 0;
    const deadline = Date.now() + 90000;
    while (acked < expected && Date.now() < deadline) {
      for (const m of await consumer.receive(32, 15000)) {
        const seen = { group: m.messageGroup, body: m.body.toString(), attempt: m.deliveryAttempt };
        events.push({ event: 'receive', ...seen });
        await consumer.ack(m);
        acked++;
        events.push({ event: 'ack', ...seen });
      }
    }
    return { events };
  } finally {
    await consumer.shutdown();
  }
}

async function delaySend(endpoint, { topic, delaysS, recall = [] }) {
  return withProducer(endpoint, [ topic ], async producer => {
    const sent = [];
    for (const [ i, delay ] of delaysS.entries()) {
      const at = Date.now() + delay * 1000;
      const r = await producer.send({
        topic,
        body: Buffer.from(`delayed-${i}`),
        keys: [ `dk-${i}` ],
        deliveryTimestamp: new Date(at),
      });
      sent.push({ i, id: r.messageId, at, handle: r.recallHandle });
    }
    const recalled = {};
    for (const i of recall) {
      try {
        recalled[i] = { id: (await producer.recallMessage(topic, sent[i].handle)).messageId };
      } catch (err) {
        recalled[i] = failure(err);
      }
    }
    return { sent, recalled };
  });
}

async function recallOne(endpoint, { topic, handle }) {
  return withProducer(endpoint, [ topic ], async producer => {
    try {
      return { id: (await producer.recallMessage(topic, handle)).messageId };
    } catch (err) {
      return failure(err);
    }
  });
}

async function transactions(endpoint, { topic, stayS }) {
  const checks = [];
  const checker = {
    async check(view) {
      const body = view.body.toString();
      checks.push({ id: view.messageId, body, at: Date.now() });
      return body === 'orphan-commit' ? TransactionResolution.COMMIT : TransactionResolution.ROLLBACK;
    },
  };
  return withProducer(endpoint, [ topic ], async producer => {
    const out = { sent_at: Date.now() };
    for (const body of [ 'commit', 'rollback', 'orphan-commit', 'orphan-rollback' ]) {
      const tx = producer.beginTransaction();
      const r = await producer.send({ topic, body: Buffer.from(body), keys: [ `tk-${body}` ] }, tx);
      out[body] = { id: r.messageId, transaction: r.transactionId };
      if (body === 'commit') await tx.commit();
      if (body === 'rollback') await tx.rollback();
    }
    // the orphans are settled by the checker, over the producer's Telemetry stream
    const deadline = Date.now() + stayS * 1000;
    while (Date.now() < deadline && checks.length < 2) await sleep(100);
    out.checks = checks;
    return out;
  }, checker);
}

async function push(endpoint, { topic, group, expected, failEvery = 0, quietS = 3 }) {
  const deliveries = [];
  const consumer = new PushConsumer(options(endpoint, {
    consumerGroup: group,
    subscriptions: new Map([[ topic, '*' ]]),
    messageListener: {
      async consume(view) {
        deliveries.push(described(view));
        const seq = Number(view.properties.get('seq') ?? '1');
        return failEvery && seq % failEvery === 0 ? ConsumeResult.FAILURE : ConsumeResult.SUCCESS;
      },
    },
  }));
  await consumer.startup();
  try {
    const deadline = Date.now() + 120000;
    while (Date.now() < deadline) {
      await sleep(200);
      const ids = new Set(deliveries.map(d => d.id));
      const last = deliveries.length ? deliveries[deliveries.length - 1].at : null;
      if (ids.size >= expected && last !== null && Date.now() - last >= quietS * 1000) break;
    }
    return { deliveries };
  } finally {
    await shutdownPush(consumer);
  }
}

async function produceConsume(endpoint, { topic, group, seconds, readyFile, readyDelivered = 0, stopFile = null, progressFile = null }) {
  const delivered = [];
  const consumer = new PushConsumer(options(endpoint, {
    consumerGroup: group,
    subscriptions: new Map([[ topic, '*' ]]),
    messageListener: {
      async consume(view) {
        delivered.push([ view.messageId, view.body.toString(), view.deliveryAttempt, Date.now() ]);
        return ConsumeResult.SUCCESS;
      },
    },
  }));
  await consumer.startup();
  const producer = new Producer(options(endpoint, { topics: [ topic ] }));
  await producer.startup();
  const receipts = [];
  const failures = [];
  const started = Date.now();
  let t0 = null; // once ready: the run's clock
  const deliveredIds = () => new Set(delivered.map(d => d[0]));
  try {
    if (!readyDelivered) {
      fs.writeFileSync(readyFile, 'ready\n');
      t0 = Date.now();
    }
    const running = () => t0 === null || (Date.now() - t0 < seconds * 1000 && !(stopFile && fs.existsSync(stopFile)));
    for (let i = 0; running(); i++) {
      if (t0 === null && Date.now() - started > 60000) throw new Error('no messages flowed in 60 s');
      try {
        const r = await producer.send(message(topic, i));
        // at: seconds since ready (null before)
        const now = Date.now();
        receipts.push({ i, id: r.messageId, at: t0 === null ? null : (now - t0) / 1000, epochMs: now });
        if (progressFile) fs.writeFileSync(progressFile, `${receipts.length}\n`);
      } catch (err) {
        failures.push(`${((Date.now() - started) / 1000).toFixed(1)}s ${failure(err).message.slice(0, 200)}`);
        await sleep(200);
      }
      if (t0 === null) {
        const ids = deliveredIds();
        if (receipts.filter(r => ids.has(r.id)).length >= readyDelivered) {
          fs.writeFileSync(readyFile, 'ready\n');
          t0 = Date.now();
        }
      }
    }
    const deadline = Date.now() + 60000;
    for (;;) {
      const ids = deliveredIds();
      if (Date.now() >= deadline || receipts.every(r => ids.has(r.id))) break;
      await sleep(200);
    }
    await sleep(2000); // redeliveries of what was acknowledged just before the end
    return { receipts, deliveries: delivered, send_failures: failures };
  } finally {
    await producer.shutdown();
    await shutdownPush(consumer);
  }
}

async function bench(endpoint, { topic, latencyTopic, group, messages, inFlight }) {
  const producer = new Producer(options(endpoint, { topics: [ topic, latencyTopic ] }));
  await producer.startup();
  const body = Buffer.alloc(1024, 'x');
  const one = (t, i) => ({ topic: t, body, keys: [ `k${i}` ] });
  const rate = (n, t0) => Math.round(n / ((performance.now() - t0) / 1000));
  const out = {};
  try {
    await producer.send(one(topic, -1)); // route and connection set up before the clock starts
    let t0 = performance.now();
    for (let i = 0; i < messages; i++) await producer.send(one(topic, i));
    out.sync = rate(messages, t0);
    console.error('bench: sync sends done');
    t0 = performance.now();
    let next = 0;
    const sender = async () => {
      while (next < messages) await producer.send(one(topic, next++));
    };
    await Promise.all(Array.from({ length: inFlight }, sender));
    out.async = rate(messages, t0);
    console.error('bench: sends in flight done');

    const consumer = await simpleConsumer(endpoint, topic, group, '*', 2000);
    let got = 0;
    t0 = performance.now();
    while (got < 2 * messages + 1 && performance.now() - t0 < 600000) {
      const batch = await consumer.receive(32, 60000);
      await Promise.all(batch.map(m => consumer.ack(m)));
      got += batch.length;
    }
    out.receive_ack = rate(got, t0);
    console.error('bench: receive + ack done');
    await consumer.shutdown();

    // seconds from each send (one at a time) to its receipt by a consumer already waiting
    const waiting = await simpleConsumer(endpoint, latencyTopic, group, '*', 20000);
    const seen = [];
    let done = false;
    const errors = [];
    (async () => {
      while (!done) {
        let batch = [];
        try {
          batch = await waiting.receive(32, 60000);
        } catch (err) { // a receive that failed: again (counted in the figures)
          errors.push(failure(err).message);
        }
        for (const m of batch) {
          seen.push((Date.now() - Number(m.properties.get('sent'))) / 1000);
          waiting.ack(m).catch(() => {});
        }
        done = done || seen.length >= messages;
      }
    })();
    await sleep(1000); // the consumer's first receive is waiting
    for (let i = 0; i < messages; i++) {
      await producer.send({ ...one(latencyTopic, i), properties: new Map([[ 'sent', String(Date.now()) ]]) });
    }
    console.error(`bench: latency sends done, ${seen.length} received so far`);
    const deadline = Date.now() + 60000;
    while (seen.length < messages && Date.now() < deadline) await sleep(50);
    done = true;
    out.latency_s = seen;
    out.receive_errors = errors.slice(0, 5);
    return out;
  } finally {
    await producer.shutdown();
  }
}

const COMMANDS = {
  send,
  receive,
  'fifo-send': fifoSend,
  'fifo-receive': fifoReceive,
  'delay-send': delaySend,
  recall: recallOne,
  transactions,
  push,
  'produce-consume': produceConsume,
  bench,
};

async function main() {
  const [ endpoint, command, args ] = process.argv.slice(2);
  const run = COMMANDS[command];
  if (!run) throw new Error(`unknown command ${command}`);
  const out = await run(endpoint, JSON.parse(args || '{}'));
  // to a pipe, stdout is written asynchronously: exit once all of it is out (not at 64 KiB)
  await new Promise(resolve => process.stdout.write(JSON.stringify(out) + '\n', resolve));
}

main().then(() => process.exit(0), err => {
  console.error(err && err.stack ? err.stack : err);
  process.exit(1);
});
