#!/usr/bin/env node
/*
 * The Cosmos DB protocol server of the contract tests: @vercel/cosmosdb-server (package.json) with two changes,
 * both for tests only. Started by tests/support/cosmos_server.py; same options as the package's own cli.js
 * (--host, --port, --no-ssl) and the same "Ready to accept ... connections at host:port" line.
 *
 * 1. A point read of a missing document answers 404, as Cosmos DB does. Cosmos DB answers
 *    `GET /dbs/{db}/colls/{coll}/docs/{id}` for an id that is not in that partition with 404 Not Found
 *    (https://learn.microsoft.com/rest/api/cosmos-db/get-a-document#status-codes ; 404 is "the resource no
 *    longer exists", https://learn.microsoft.com/rest/api/cosmos-db/http-status-codes-for-cosmosdb), and the
 *    SDK raises CosmosResourceNotFoundError. @vercel/cosmosdb-server 1.0.1 (lib/handler/read-document.js) reads
 *    the missing document as `undefined`, dereferences it to compare partition keys, and its request handler
 *    turns the TypeError into a 500. Only the point read has this quirk: replace, delete and patch of a missing
 *    document, and a read in a missing container, already answer 404. The quirk is fixed here, in the harness,
 *    so that the product treats 404 as missing and every other status as an error (a 500 is the SDK
 *    retry policy's business, never "missing").
 *
 * 2. A fault hook and a request log, so that a test can make the server answer a real error and see which
 *    requests the client sent. Control routes, all under /_orderflow_test/ (never a Cosmos DB path):
 *      POST   /_orderflow_test/faults    {"method": "GET", "path": "/dbs/d/colls/c/docs/x", "status": 500,
 *                                        "times": 1}   (times: how many requests; omitted = until cleared)
 *      DELETE /_orderflow_test/faults    clear every fault
 *      GET    /_orderflow_test/requests  [{"method", "path", "query"}] of every Cosmos request since the last clear
 *      DELETE /_orderflow_test/requests  clear the log
 */
"use strict";

const path = require("path");

const LIB = path.join(path.dirname(require.resolve("@vercel/cosmosdb-server/package.json")), "lib");
const CONTROL_PREFIX = "/_orderflow_test/";
const MAX_LOG = 10000;

// routes.js reads each handler's `default` export once, when it is first loaded, so the read-document handler is
// replaced before the server (and with it routes.js) is required.
const readDocument = require(path.join(LIB, "handler", "read-document"));
const partitionHeader = require(path.join(LIB, "utils", "get-partition-from-header"));
const originalReadDocument = readDocument.default;

function notFound(res) {
  // Cosmos DB's answer to a point read of a missing item: 404, substatus 0, code NotFound.
  res.statusCode = 404;
  res.setHeader("x-ms-substatus", "0");
  return { code: "NotFound", message: "Entity with the specified id does not exist in the system." };
}

function isCrossPartition(req) {
  return String(req.headers["x-ms-documentdb-query-enablecrosspartition"] || "").toLowerCase() === "true";
}

readDocument.default = (account, req, res, params) => {
  // The same lookup as read-document.js's partitioned branch; the cross-partition branch already answers 404.
  const collection = account.database(params.dbId).collection(params.collId);
  if (collection.read() && !isCrossPartition(req)) {
    let partition;
    try {
      partition = partitionHeader.parsePartitionKey(partitionHeader.default(req), params.docId);
    } catch (err) {
      partition = undefined; // a malformed or absent header: leave the answer to the original handler
    }
    if (partition !== undefined && !collection.document(params.docId, partition).read()) {
      return notFound(res);
    }
  }
  return originalReadDocument(account, req, res, params);
};

const { createHttpServer, createHttpsServer } = require(LIB);

let faults = [];
let log = [];

function send(res, status, body) {
  res.statusCode = status;
  res.setHeader("content-type", "application/json");
  res.setHeader("connection", "close");
  res.end(body === undefined ? "" : JSON.stringify(body));
}

function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    req.on("data", chunk => chunks.push(chunk));
    req.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
    req.on("error", reject);
  });
}

async function control(req, res, route) {
  if (route === "faults" && req.method === "POST") {
    const fault = JSON.parse(await readBody(req));
    if (typeof fault.method !== "string" || typeof fault.path !== "string" || !Number.isInteger(fault.status)) {
      send(res, 400, { message: "a fault needs method, path and status" });
      return;
    }
    faults.push({ ...fault, method: fault.method.toUpperCase(), hits: 0 });
    send(res, 204);
  } else if (route === "faults" && req.method === "DELETE") {
    faults = [];
    send(res, 204);
  } else if (route === "requests" && req.method === "GET") {
    send(res, 200, log);
  } else if (route === "requests" && req.method === "DELETE") {
    log = [];
    send(res, 204);
  } else {
    send(res, 404, { message: `no control route ${req.method} ${route}` });
  }
}

function takeFault(method, pathname) {
  const fault = faults.find(f => f.method === method && f.path === pathname);
  if (fault === undefined) return undefined;
  fault.hits += 1;
  if (fault.times !== undefined && fault.hits >= fault.times) faults = faults.filter(f => f !== fault);
  return fault;
}

function requestPath(req) {
  const raw = new URL(req.url, "https://localhost").pathname;
  let decoded;
  try {
    decoded = decodeURIComponent(raw);
  } catch (err) {
    decoded = raw; // not percent-encoded UTF-8: logged and matched as sent
  }
  return decoded.replace(/\/+$/, "");
}

function withTestHooks(server) {
  const [inner] = server.listeners("request");
  server.removeAllListeners("request");
  server.on("request", (req, res) => {
    const pathname = requestPath(req);
    if (pathname.startsWith(CONTROL_PREFIX)) {
      control(req, res, pathname.slice(CONTROL_PREFIX.length)).catch(err => send(res, 500, { message: String(err) }));
      return;
    }
    const query = String(req.headers["x-ms-documentdb-isquery"] || "").toLowerCase() === "true";
    log.push({ method: req.method, path: pathname, query });
    if (log.length > MAX_LOG) log = log.slice(-MAX_LOG);
    const fault = takeFault(req.method, pathname);
    if (fault !== undefined) {
      req.resume(); // discard any body
      res.setHeader("x-ms-activity-id", "00000000-0000-0000-0000-000000000000");
      res.setHeader("x-ms-request-charge", "0");
      send(res, fault.status, { code: fault.code || "InjectedFault", message: "fault injected by the test harness" });
      return;
    }
    inner(req, res);
  });
  return server;
}

const args = { host: undefined, port: 0, ssl: true };
const argv = process.argv.slice(2);
while (argv.length) {
  const key = argv.shift();
  if (key === "--host") args.host = argv.shift();
  else if (key === "--port" || key === "-p") args.port = parseInt(argv.shift(), 10);
  else if (key === "--no-ssl") args.ssl = false;
  else {
    process.stderr.write(`unknown option ${key}\n`);
    process.exit(2);
  }
}

const server = withTestHooks(args.ssl ? createHttpsServer() : createHttpServer());
server.listen(args.port, args.host, () => {
  const { port } = server.address();
  process.stdout.write(`Ready to accept HTTP${args.ssl ? "S" : ""} connections at ${args.host || "localhost"}:${port}\n`);
});
