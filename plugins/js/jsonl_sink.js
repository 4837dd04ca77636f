// A foreachBatch sink appending rows to a JSON-lines file, exactly once per batch id:
// `plugins/jsonl_sink` in JavaScript, with the same file format and protocol, so either plugin
// can take over the other's files.
//
// Config: `{ "path": "/out/orders.jsonl" }`, inside a folder the pipeline grants
// (`capabilities = { dirs = [ { host = "out", guest = "/out", writable = true } ] }`).
//
// Protocol: a sidecar `<path>.batches` holds "<last batch id> <data length>\n". writeBatch(N)
// skips N if N <= last; otherwise truncates the data file to the recorded length (dropping what
// an interrupted attempt appended), appends the rows, syncs, and replaces the sidecar atomically
// (write `<path>.batches.tmp`, sync, rename). A replayed batch is therefore never written twice.
//
// Rows: one object per row, keys in schema order, nulls omitted; timestamps RFC 3339 UTC with
// `Z` (3 or 6 fractional digits when needed), dates YYYY-MM-DD, decimals exact at their scale.
//
// weir-plugin.js and weir-files.js are plugin-sdk/js/, staged beside this file by build.mjs.

import { Strings, bit, decimalAt, fatal, invalidConfig, isValid, log, parseConfig, retryable } from './weir-plugin.js';
import { File, describe, errorCode } from './weir-files.js';

const encoder = new TextEncoder();

function ioError(what, path, e) {
  const message = `jsonl_sink: ${what} ${path}: ${describe(e)}`;
  const code = errorCode(e);
  return code === 'no-entry' || code === 'access' || code === 'not-permitted' ? fatal(message) : retryable(message);
}

const pad = (n, width) => String(n).padStart(width, '0');

function timestamp(micros) {
  const secs = micros / 1_000_000n - (micros % 1_000_000n < 0n ? 1n : 0n);
  const frac = Number(micros - secs * 1_000_000n);
  const text = new Date(Number(secs) * 1000).toISOString().slice(0, 19);
  if (frac === 0) return `"${text}Z"`;
  if (frac % 1000 === 0) return `"${text}.${pad(frac / 1000, 3)}Z"`;
  return `"${text}.${pad(frac, 6)}Z"`;
}

const date = (days) => `"${new Date(days * 86_400_000).toISOString().slice(0, 10)}"`;

function decimal(unscaled, scale) {
  if (scale <= 0) return String(unscaled * 10n ** BigInt(-scale));
  const negative = unscaled < 0n;
  const digits = String(negative ? -unscaled : unscaled).padStart(scale + 1, '0');
  return `${negative ? '-' : ''}${digits.slice(0, -scale)}.${digits.slice(-scale)}`;
}

function float(x) {
  if (Number.isNaN(x)) return '"NaN"';
  if (!Number.isFinite(x)) return x > 0 ? '"Infinity"' : '"-Infinity"';
  // As Rust's `{:?}` (the Rust plugin): a float keeps its `.0`, exponents have no `+`.
  if (Number.isInteger(x) && Math.abs(x) < 1e16) return `${x}.0`;
  return String(x).replace('e+', 'e');
}

/** A function from row to the value's JSON text, for one column. */
function formatter(col) {
  const { tag, val } = col.values;
  switch (tag) {
    case 'utf8': {
      const strings = new Strings(val);
      return (i) => JSON.stringify(strings.text(i));
    }
    case 'int32':
    case 'int64':
      return (i) => String(val[i]);
    case 'float64':
      return (i) => float(val[i]);
    case 'decimal128': {
      const scale = col.dataType.val.scale;
      return (i) => decimal(decimalAt(val, i), scale);
    }
    case 'timestamp-micros':
      return (i) => timestamp(val[i]);
    case 'date32':
      return (i) => date(val[i]);
    case 'boolean':
      return (i) => (bit(val, i) ? 'true' : 'false');
    default:
      throw fatal(`jsonl_sink: column \`${col.name}\` has values of an unknown layout \`${tag}\``);
  }
}

class JsonlSink {
  constructor(config) {
    const { path } = parseConfig(config, { required: ['path'] });
    const slash = typeof path === 'string' ? path.lastIndexOf('/') : -1;
    if (typeof path !== 'string' || path.endsWith('/') || slash < 0) {
      throw invalidConfig(`jsonl_sink: path \`${path}\` does not name a file in a granted folder`);
    }
    const folder = path.slice(0, slash) || '/';
    if (!File.folderExists(folder)) {
      throw invalidConfig(`jsonl_sink: directory ${folder} of path \`${path}\` is not accessible (is it granted?)`);
    }
    this.path = path;
    this.sidecar = `${path}.batches`;
  }

  writeBatch(info, batch) {
    const id = info.batchId;
    const progress = this.readProgress();
    if (progress !== null && id <= progress.last) {
      log(`jsonl_sink: batch ${id} is already in ${this.path} (last written: ${progress.last}), skipping`);
      return;
    }
    const length = progress?.length ?? 0n;
    let file;
    try {
      file = File.open(this.path, { create: true });
    } catch (e) {
      throw ioError('cannot open', this.path, e);
    }
    let end;
    try {
      const actual = file.size();
      if (actual < length) {
        throw fatal(
          `jsonl_sink: ${this.path} has ${actual} bytes but ${this.sidecar} records ${length}: the file was changed outside the sink`,
        );
      }
      if (actual > length) {
        log(`jsonl_sink: dropping ${actual - length} bytes of an interrupted write from ${this.path}`, 'warn');
        file.setSize(length);
      }
      end = file.writeAt(encoder.encode(lines(batch)), length);
      file.sync();
    } catch (e) {
      throw e?.kind ? e : ioError('cannot write', this.path, e);
    } finally {
      file.close();
    }
    this.writeProgress(id, end);
  }

  readProgress() {
    let bytes;
    try {
      bytes = File.readAll(this.sidecar);
    } catch (e) {
      throw ioError('cannot read', this.sidecar, e);
    }
    if (bytes === null) return null;
    const text = new TextDecoder().decode(bytes);
    const m = /^(\d+) (\d+)\n?$/.exec(text);
    if (!m) {
      throw fatal(`jsonl_sink: ${this.sidecar} is not \`<batch id> <length>\`: ${JSON.stringify(text)}`);
    }
    return { last: BigInt(m[1]), length: BigInt(m[2]) };
  }

  writeProgress(id, length) {
    const tmp = `${this.sidecar}.tmp`;
    try {
      const file = File.open(tmp, { create: true, truncate: true });
      try {
        file.writeAt(encoder.encode(`${id} ${length}\n`), 0n);
        file.sync();
      } finally {
        file.close();
      }
      File.rename(tmp, this.sidecar);
    } catch (e) {
      throw ioError('cannot write', tmp, e);
    }
  }
}

/** The batch as JSON lines. */
function lines(batch) {
  const rows = batch.numRows();
  const columns = batch.schema().map((_, i) => batch.column(i));
  const keys = columns.map((c) => `${JSON.stringify(c.name)}:`);
  const formats = columns.map(formatter);
  const valid = columns.map((c) => c.validity);
  const out = [];
  for (let row = 0; row < rows; row++) {
    const cells = [];
    for (let c = 0; c < columns.length; c++) {
      if (isValid(valid[c], row)) {
        cells.push(keys[c] + formats[c](row));
      }
    }
    out.push(`{${cells.join(',')}}\n`);
  }
  return out.join('');
}

let sink;

export const writer = {
  open(config, _inputSchema) {
    sink = new JsonlSink(config);
  },
  writeBatch(info, input) {
    sink.writeBatch(info, input);
  },
};
