// MERGE (upsert by key) into the Delta tables a pipeline grants a sink of world `merge-sink`
// (`[sink.capabilities.delta_merge.<table>]`: path, keys, condition, dedup). The host merges
// natively and exactly once per table and batch: a replayed batch comes back `skipped`.
//
// Only a plugin built for world `merge-sink` may import this module: it imports
// `weir:plugin/delta-merge`, which componentize-js refuses in any other world.
//
//   import { merge } from './weir-merge.js';
//   const { updated, inserted, skipped } = merge('orders', batch, Output.keep(mask));

import { Batch, Output, PluginError, outputToWit } from './weir-plugin.js';
import { merge as hostMerge } from 'weir:plugin/delta-merge@0.1.0';

/**
 * Merges `batch` (the Batch this call was handed) into the granted table `table`; with `rows`
 * (an Output: Output.keep(...), Output.edit()..., Output.ipc(...)), the batch as changed by it.
 * At most once per table per batch. Returns `{ skipped, updated, inserted }` (counts as BigInt);
 * an error of the host (a table not granted, a failed commit) is thrown as a PluginError.
 */
export function merge(table, batch, rows = null) {
  const host = batch instanceof Batch ? batch.host : batch;
  const edit = rows == null ? undefined : rows instanceof Output ? rows.toWit() : outputToWit(rows, 'merge rows');
  let result;
  try {
    result = hostMerge(table, host, edit);
  } catch (e) {
    const p = e?.payload;
    if (p && typeof p === 'object' && typeof p.kind === 'string') {
      throw new PluginError(p.kind, p.message, p.row);
    }
    throw e;
  }
  return { skipped: result.skipped, updated: result.updated, inserted: result.inserted };
}
