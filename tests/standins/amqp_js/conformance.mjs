// The Service Bus conformance scenarios, run by the unmodified @azure/service-bus SDK (a second AMQP 1.0 client:
// rhea, not pyamqp) against the embedded broker's AMQP endpoint. Driven by tests/standins/amqp_js/test_js_sdk.py:
//   node conformance.mjs --list            the scenarios, one JSON object {name, session} a line
//   node conformance.mjs                   runs them all at once, each on its own queue `js-<name>`; one JSON line a
//                                          scenario: {scenario, ok, error?}
// Connection string in SB_CONNECTION (the emulator's form). Error codes are the SDK's ServiceBusError codes
// (@azure/service-bus serviceBusError.ts, wellKnownMessageCodesToServiceBusCodes).
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const { ServiceBusClient, isServiceBusError } = require("@azure/service-bus");

const WAIT_MS = 5000;

function check(condition, what) {
  if (!condition) throw new Error(`expected ${what}`);
}

function equal(actual, expected, what) {
  const a = JSON.stringify(actual);
  const e = JSON.stringify(expected);
  if (a !== e) throw new Error(`${what}: expected ${e}, got ${a}`);
}

async function expectCode(promise, code, what) {
  try {
    await promise;
  } catch (err) {
    if (isServiceBusError(err) && err.code === code) return err;
    throw new Error(`${what}: expected ServiceBusError ${code}, got ${err && err.name} ${err && err.code}: ${err && err.message}`);
  }
  throw new Error(`${what}: expected ServiceBusError ${code}, got success`);
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function receiveAll(receiver, count, what) {
  const got = [];
  const deadline = Date.now() + WAIT_MS * 2;
  while (got.length < count && Date.now() < deadline) {
    got.push(...(await receiver.receiveMessages(count - got.length, { maxWaitTimeInMs: WAIT_MS })));
  }
  equal(got.length, count, `${what}: messages received`);
  return got;
}

async function nothingLeft(receiver, what) {
  const rest = await receiver.receiveMessages(1, { maxWaitTimeInMs: 500 });
  equal(rest.length, 0, `${what}: messages left`);
}

// Each scenario: (client, queue) => Promise<void>; throws on a difference.
const SCENARIOS = {
  async send_receive_complete(client, q) {
    const sender = client.createSender(q);
    await sender.sendMessages({
      body: "hello",
      messageId: "m-1",
      subject: "greeting",
      contentType: "text/plain",
      correlationId: "c-1",
      applicationProperties: { kind: "test", n: 7 },
    });
    const receiver = client.createReceiver(q, { receiveMode: "peekLock", maxAutoLockRenewalDurationInMs: 0 });
    const [msg] = await receiveAll(receiver, 1, "receive");
    equal(msg.body, "hello", "body");
    equal([msg.messageId, msg.subject, msg.contentType, msg.correlationId], ["m-1", "greeting", "text/plain", "c-1"], "properties");
    equal(msg.applicationProperties, { kind: "test", n: 7 }, "application properties");
    equal(msg.deliveryCount, 0, "delivery count of a first delivery");
    check(msg.sequenceNumber !== undefined && Number(msg.sequenceNumber) >= 1, "a sequence number");
    check(msg.lockToken && /^[0-9a-f-]{36}$/.test(msg.lockToken), "a lock token (a GUID)");
    check(msg.lockedUntilUtc instanceof Date && msg.lockedUntilUtc.getTime() > Date.now(), "locked-until in the future");
    check(msg.enqueuedTimeUtc instanceof Date, "an enqueued time");
    await receiver.completeMessage(msg);
    await nothingLeft(receiver, "after complete");
  },

  async batch_send_in_order(client, q) {
    const sender = client.createSender(q);
    const batch = await sender.createMessageBatch();
    check(batch.maxSizeInBytes > 0 && batch.maxSizeInBytes <= 256 * 1024, `the link's max message size (${batch.maxSizeInBytes})`);
    for (const n of [1, 2, 3]) check(batch.tryAddMessage({ body: `b${n}`, messageId: `b-${n}` }), `message ${n} fits`);
    await sender.sendMessages(batch);
    const receiver = client.createReceiver(q, { receiveMode: "receiveAndDelete" });
    const got = await receiveAll(receiver, 3, "batch");
    equal(got.map((m) => m.body), ["b1", "b2", "b3"], "bodies in order");
  },

  async abandon_counts_a_delivery(client, q) {
    await client.createSender(q).sendMessages({ body: "again", messageId: "a-1" });
    const receiver = client.createReceiver(q, { maxAutoLockRenewalDurationInMs: 0 });
    const [first] = await receiveAll(receiver, 1, "first");
    await receiver.abandonMessage(first, { reason: "try-again" });
    const [second] = await receiveAll(receiver, 1, "redelivery");
    equal(second.messageId, "a-1", "the same message");
    equal(second.deliveryCount, 1, "delivery count after abandon");
    equal(second.applicationProperties && second.applicationProperties.reason, "try-again", "property modified on abandon");
    await receiver.completeMessage(second);
  },

  async defer_and_receive_deferred(client, q) {
    await client.createSender(q).sendMessages({ body: "later", messageId: "d-1" });
    const receiver = client.createReceiver(q, { maxAutoLockRenewalDurationInMs: 0 });
    const [msg] = await receiveAll(receiver, 1, "receive");
    const seq = msg.sequenceNumber;
    await receiver.deferMessage(msg);
    await nothingLeft(receiver, "after defer");
    const [deferred] = await receiver.receiveDeferredMessages(seq);
    check(deferred !== undefined, "the deferred message by its sequence number");
    equal(deferred.body, "later", "deferred body");
    equal(deferred.state, "deferred", "state");
    await receiver.completeMessage(deferred);
    // Service Bus refuses to lock a sequence number that is no longer deferred (com.microsoft:message-not-found).
    await expectCode(receiver.receiveDeferredMessages(seq), "MessageNotFound", "the deferred message after complete");
  },

  async dead_letter_with_reason(client, q) {
    await client.createSender(q).sendMessages({ body: "bad", messageId: "x-1" });
    const receiver = client.createReceiver(q, { maxAutoLockRenewalDurationInMs: 0 });
    const [msg] = await receiveAll(receiver, 1, "receive");
    await receiver.deadLetterMessage(msg, { deadLetterReason: "BadField", deadLetterErrorDescription: "field 'x' is bad" });
    await nothingLeft(receiver, "after dead-letter");
    const dlq = client.createReceiver(q, { subQueueType: "deadLetter", receiveMode: "receiveAndDelete" });
    const [dead] = await receiveAll(dlq, 1, "dead letter");
    equal([dead.messageId, dead.body], ["x-1", "bad"], "the dead-lettered message");
    equal([dead.deadLetterReason, dead.deadLetterErrorDescription], ["BadField", "field 'x' is bad"], "reason and description");
    equal(dead.deadLetterSource, undefined, "no dead-letter source on a queue's own DLQ");
  },

  async receive_and_delete(client, q) {
    await client.createSender(q).sendMessages({ body: "once", messageId: "r-1" });
    const receiver = client.createReceiver(q, { receiveMode: "receiveAndDelete" });
    const [msg] = await receiveAll(receiver, 1, "receive");
    equal(msg.body, "once", "body");
    equal(msg.lockToken, undefined, "no lock token in receive-and-delete");
    await nothingLeft(receiver, "after receive-and-delete");
  },

  async peek_does_not_lock(client, q) {
    const sender = client.createSender(q);
    await sender.sendMessages([{ body: "p1", messageId: "p-1" }, { body: "p2", messageId: "p-2" }]);
    const receiver = client.createReceiver(q);
    const peeked = await receiver.peekMessages(10);
    equal(peeked.map((m) => m.body), ["p1", "p2"], "peeked bodies");
    equal(peeked.map((m) => m.lockToken), [undefined, undefined], "no lock tokens on peek");
    const again = await receiver.peekMessages(10, { fromSequenceNumber: peeked[1].sequenceNumber });
    equal(again.map((m) => m.body), ["p2"], "peek from a sequence number");
    const drained = await receiveAll(client.createReceiver(q, { receiveMode: "receiveAndDelete" }), 2, "still there");
    equal(drained.map((m) => m.body), ["p1", "p2"], "peek left them");
  },

  async duplicate_detection(client, q) {
    const sender = client.createSender(q);
    await sender.sendMessages({ body: "one", messageId: "dup-1" });
    await sender.sendMessages({ body: "two", messageId: "dup-1" });
    const receiver = client.createReceiver(q, { receiveMode: "receiveAndDelete" });
    const [msg] = await receiveAll(receiver, 1, "first copy");
    equal(msg.body, "one", "the first copy wins");
    await nothingLeft(receiver, "the duplicate");
  },

  async scheduled_and_cancelled(client, q) {
    const sender = client.createSender(q);
    const [far] = await sender.scheduleMessages({ body: "far", messageId: "s-far" }, new Date(Date.now() + 3600_000));
    const [near] = await sender.scheduleMessages({ body: "near", messageId: "s-near" }, new Date(Date.now() + 1500));
    check(Number(far) >= 1 && Number(near) >= 1, "sequence numbers of scheduled messages");
    const receiver = client.createReceiver(q, { receiveMode: "receiveAndDelete" });
    const peeked = await receiver.peekMessages(10);
    equal(peeked.map((m) => [m.body, m.state]), [["far", "scheduled"], ["near", "scheduled"]], "scheduled messages on peek");
    await sender.cancelScheduledMessages(far);
    const [msg] = await receiveAll(receiver, 1, "the near one, when due");
    equal(msg.body, "near", "due message");
    check(msg.scheduledEnqueueTimeUtc instanceof Date, "its scheduled enqueue time");
    equal((await receiver.peekMessages(10)).length, 0, "the cancelled one is gone");
  },

  async renew_message_lock(client, q) {
    await client.createSender(q).sendMessages({ body: "hold", messageId: "l-1" });
    const receiver = client.createReceiver(q, { maxAutoLockRenewalDurationInMs: 0 });
    const [msg] = await receiveAll(receiver, 1, "receive");
    const before = msg.lockedUntilUtc.getTime();
    await sleep(300);
    const after = await receiver.renewMessageLock(msg);
    check(after.getTime() > before, `a later lock expiry (${before} -> ${after.getTime()})`);
    await receiver.completeMessage(msg);
  },

  async message_lock_expiry(client, q) {
    await client.createSender(q).sendMessages({ body: "slow", messageId: "e-1" });
    const receiver = client.createReceiver(q, { maxAutoLockRenewalDurationInMs: 0 });
    const [msg] = await receiveAll(receiver, 1, "receive");
    await sleep(msg.lockedUntilUtc.getTime() - Date.now() + 500);
    await expectCode(receiver.completeMessage(msg), "MessageLockLost", "complete after the lock expired");
    const [again] = await receiveAll(receiver, 1, "redelivery after expiry");
    equal(again.deliveryCount, 1, "delivery count after a lock expiry");
    await receiver.completeMessage(again);
  },

  async size_limit(client, q) {
    const sender = client.createSender(q);
    await sender.sendMessages({ body: Buffer.alloc(200 * 1024, 1), messageId: "big-ok" });
    await expectCode(sender.sendMessages({ body: Buffer.alloc(300 * 1024, 1), messageId: "big-no" }), "MessageSizeExceeded", "a 300 KiB message");
    const receiver = client.createReceiver(q, { receiveMode: "receiveAndDelete" });
    const got = await receiveAll(receiver, 1, "the one that fits");
    equal(got[0].messageId, "big-ok", "only the message within the limit");
  },

  async entity_not_found(client) {
    await expectCode(client.createSender("no-such-queue").sendMessages({ body: "x" }), "MessagingEntityNotFound", "send to an unknown queue");
  },

  async session_fifo_and_state(client, q) {
    const sender = client.createSender(q);
    await sender.sendMessages([1, 2, 3, 4, 5].map((n) => ({ body: `s${n}`, messageId: `f-${n}`, sessionId: "fifo" })));
    const receiver = await client.acceptSession(q, "fifo", { maxAutoLockRenewalDurationInMs: 0 });
    equal(receiver.sessionId, "fifo", "session id");
    check(receiver.sessionLockedUntilUtc instanceof Date && receiver.sessionLockedUntilUtc.getTime() > Date.now(), "a session lock expiry");
    const got = await receiveAll(receiver, 5, "session messages");
    equal(got.map((m) => m.body), ["s1", "s2", "s3", "s4", "s5"], "FIFO within the session");
    equal(got.map((m) => m.sessionId), Array(5).fill("fifo"), "session id on each message");
    for (const m of got) await receiver.completeMessage(m);
    equal(await receiver.getSessionState(), null, "no state at first");
    await receiver.setSessionState("step-2");
    equal(String(await receiver.getSessionState()), "step-2", "state read back");
    const before = receiver.sessionLockedUntilUtc.getTime();
    await sleep(300);
    const renewed = await receiver.renewSessionLock();
    check(renewed.getTime() > before, "a later session lock expiry after renewal");
    await receiver.close();
  },

  async session_exclusive_lock(client, q) {
    await client.createSender(q).sendMessages({ body: "mine", sessionId: "held" });
    const first = await client.acceptSession(q, "held", { maxAutoLockRenewalDurationInMs: 0 });
    await expectCode(client.acceptSession(q, "held", { maxAutoLockRenewalDurationInMs: 0 }), "SessionCannotBeLocked", "a second lock");
    await first.close();
  },

  async next_available_session(client, q) {
    await client.createSender(q).sendMessages({ body: "for-whoever", messageId: "n-1", sessionId: "any-one" });
    const receiver = await client.acceptNextSession(q, { maxAutoLockRenewalDurationInMs: 0 });
    equal(receiver.sessionId, "any-one", "the session that has messages");
    const [msg] = await receiveAll(receiver, 1, "its message");
    await receiver.completeMessage(msg);
    await receiver.close();
    await expectCode(
      client.acceptNextSession(q, { maxAutoLockRenewalDurationInMs: 0 }),
      "ServiceTimeout",
      "next available session when none has messages",
    );
  },

  async session_lock_expiry(client, q) {
    await client.createSender(q).sendMessages({ body: "late", messageId: "sx-1", sessionId: "expiring" });
    const receiver = await client.acceptSession(q, "expiring", { maxAutoLockRenewalDurationInMs: 0 });
    const [msg] = await receiveAll(receiver, 1, "receive");
    await sleep(receiver.sessionLockedUntilUtc.getTime() - Date.now() + 500);
    await expectCode(receiver.completeMessage(msg), "SessionLockLost", "complete after the session lock expired");
    await receiver.close();
    const again = await client.acceptSession(q, "expiring", { maxAutoLockRenewalDurationInMs: 0 });
    const [redelivered] = await receiveAll(again, 1, "the session's message, again");
    equal(redelivered.deliveryCount, 1, "delivery count after the session lock expired");
    await again.completeMessage(redelivered);
    await again.close();
  },

  async interop_left_for_python(client, q) {
    // Left on the queue for test_js_sdk.py to read with azure-servicebus (over AMQP) and the embedded client.
    await client.createSender(q).sendMessages({
      body: Buffer.from("from-js"),
      messageId: "js-1",
      subject: "interop",
      applicationProperties: { origin: "javascript", count: 3 },
    });
  },
};

const SESSION_SCENARIOS = new Set(["session_fifo_and_state", "session_exclusive_lock", "next_available_session", "session_lock_expiry"]);

async function run() {
  const connection = process.env.SB_CONNECTION;
  if (!connection) throw new Error("SB_CONNECTION is not set");
  const only = process.env.SB_SCENARIOS ? new Set(process.env.SB_SCENARIOS.split(",")) : null;
  const client = new ServiceBusClient(connection, { retryOptions: { maxRetries: 0, timeoutInMs: 4000 } });
  const names = Object.keys(SCENARIOS).filter((name) => !only || only.has(name));
  await Promise.all(
    names.map(async (name) => {
      const result = { scenario: name, ok: true };
      try {
        await SCENARIOS[name](client, `js-${name.replaceAll("_", "-")}`);
      } catch (err) {
        result.ok = false;
        result.error = String((err && err.stack) || err).slice(0, 2000);
      }
      process.stdout.write(JSON.stringify(result) + "\n");
    }),
  );
  await client.close();
}

if (process.argv.includes("--list")) {
  for (const name of Object.keys(SCENARIOS)) {
    process.stdout.write(JSON.stringify({ name, queue: `js-${name.replaceAll("_", "-")}`, session: SESSION_SCENARIOS.has(name) }) + "\n");
  }
} else {
  run().then(
    () => process.exit(0),
    (err) => {
      process.stderr.write(String((err && err.stack) || err) + "\n");
      process.exit(2);
    },
  );
}
