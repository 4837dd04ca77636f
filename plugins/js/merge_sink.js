// A foreachBatch sink that upserts each batch into Delta tables through the host's
// `delta-merge` capability: `plugins/merge_sink` in JavaScript, with the same config, errors and
// log lines. The sink decides *what* to merge (it drops rows whose status is one of
// `drop_statuses`); the host does the MERGE natively and exactly once per batch.
//
// Config: `{ "tables": ["orders"], "status_column": "status", "drop_statuses": ["cancelled"] }`.
// Every table named must be granted in the pipeline file:
//
//   [sink.capabilities.delta_merge.orders]
//   path = "tables/orders"
//   keys = ["order_id"]
//   when_matched_update = "s.occurred_at > t.occurred_at"
//
// weir-plugin.js and weir-merge.js are plugin-sdk/js/, staged beside this file by build.sh.

import { Output, Sink, exportSink, invalidConfig, logInfo, maskFrom } from './weir-plugin.js';
import { merge } from './weir-merge.js';

class MergeSink extends Sink {
  static required = ['tables'];
  static optional = { status_column: 'status', drop_statuses: [] };
  static configTypes = { tables: ['string'], status_column: 'string', drop_statuses: ['string'] };

  constructor(config, schema) {
    super();
    if (config.tables.length === 0) {
      throw invalidConfig('merge_sink: `tables` must name at least one granted table');
    }
    if (config.drop_statuses.length > 0 && schema.index(config.status_column) < 0) {
      throw invalidConfig(`merge_sink: status_column \`${config.status_column}\` is not a column of the input`);
    }
    this.tables = config.tables;
    this.statusColumn = config.status_column;
    this.drop = new Set(config.drop_statuses);
  }

  writeBatch(batch, info) {
    let rows = null;
    if (this.drop.size > 0) {
      // A row is kept unless its status is one to drop (a null status is kept).
      const status = batch.column(this.statusColumn);
      const strings = status.type === 'utf8' ? status.raw : null;
      rows = Output.keep(
        maskFrom(batch.numRows, (r) => strings === null || !status.isValid(r) || !this.drop.has(strings.text(r))),
      );
    }
    for (const table of this.tables) {
      const result = merge(table, batch, rows);
      logInfo(
        `merge_sink: batch ${info.batchId} into ${table}: ${result.updated} updated, ${result.inserted} inserted${
          result.skipped ? ' (already merged)' : ''
        }`,
      );
    }
  }
}

export const writer = exportSink(MergeSink);
