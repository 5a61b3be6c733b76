'use strict';
// A Millpond client for Node.js. The contracts are the repository's .proto files, loaded at
// run time (no generated code), so this file shows what any language needs: the router's
// address, the RouterService methods, and how a row's typed values read.

const path = require('node:path');
const fs = require('node:fs');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTOS = path.resolve(__dirname, '..', '..', 'protos');

function loadRouterService() {
  const definition = protoLoader.loadSync('millpond/router/v1/router.proto', {
    includeDirs: [PROTOS],
    keepCase: true, // field names exactly as in the .proto (statement_text, consistency_token, ...)
    longs: String, // int64 as decimal text: no precision lost above 2^53
    enums: String,
    defaults: true,
    oneofs: true, // a Value says which of its fields is set in `kind`
  });
  return grpc.loadPackageDefinition(definition).millpond.router.v1.RouterService;
}

// The plain JavaScript value of a millpond.common.v1.Value (null for SQL NULL).
function fromValue(value) {
  switch (value.kind) {
    case 'bool_value':
      return value.bool_value;
    case 'int_value':
      return BigInt(value.int_value);
    case 'double_value':
      return value.double_value;
    case 'string_value':
      return value.string_value;
    case 'bytes_value':
      return Buffer.from(value.bytes_value);
    case 'json_value':
      return JSON.parse(value.json_value);
    default:
      return null;
  }
}

class MillpondClient {
  // server: "host:port" of a router. Options: token (bearer token sent on every call), ca, cert,
  // key (PEM file paths: TLS with the router, and a client certificate for mutual TLS).
  constructor(server, options = {}) {
    const RouterService = loadRouterService();
    let credentials = grpc.credentials.createInsecure();
    if (options.ca) {
      const read = (file) => (file ? fs.readFileSync(file) : null);
      credentials = grpc.credentials.createSsl(read(options.ca), read(options.key), read(options.cert));
    }
    this.stub = new RouterService(server, credentials);
    this.token = options.token || '';
    // The newest consistency token: sent back with every request, so this client reads its
    // own writes and never sees older state than it saw before.
    this.consistencyToken = '';
  }

  metadata() {
    const metadata = new grpc.Metadata();
    if (this.token) metadata.set('authorization', `Bearer ${this.token}`);
    return metadata;
  }

  // Runs ';'-separated statements; resolves to one result per statement:
  // {statement, status, message, columns: [names], rows: [[values]], partition, offset}.
  execute(sql, properties = {}, timeoutMs = 60000) {
    const request = { sql, properties, consistency_token: this.consistencyToken };
    const deadline = new Date(Date.now() + timeoutMs);
    return new Promise((resolve, reject) => {
      this.stub.Execute(request, this.metadata(), { deadline }, (error, response) => {
        if (error) {
          reject(error);
          return;
        }
        const results = response.results.map((r) => {
          if (r.consistency_token) this.consistencyToken = r.consistency_token;
          return {
            statement: r.statement_text,
            status: r.status,
            message: r.message,
            columns: r.columns.map((c) => c.name),
            rows: r.rows.map((row) => row.values.map(fromValue)),
            partition: r.partition,
            offset: BigInt(r.offset),
          };
        });
        resolve(results);
      });
    });
  }

  // Starts a push query (SELECT ... EMIT CHANGES): onRow(values) per row; resolves once the
  // header arrived with {columns, cancel}.
  stream(sql, onRow, properties = {}) {
    const call = this.stub.StreamQuery({ sql, properties }, this.metadata());
    return new Promise((resolve, reject) => {
      call.on('data', (message) => {
        if (message.kind === 'header') {
          resolve({ columns: message.header.columns.map((c) => c.name), cancel: () => call.cancel() });
        } else {
          onRow(message.row.values.map(fromValue));
        }
      });
      call.on('error', (error) => {
        if (error.code !== grpc.status.CANCELLED) reject(error);
      });
    });
  }

  close() {
    this.stub.close();
  }
}

module.exports = { MillpondClient, fromValue, status: grpc.status };
