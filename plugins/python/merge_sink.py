"""A foreachBatch sink that upserts each batch into Delta tables through the host's
`delta-merge` capability: `plugins/merge_sink` in Python (world `merge-sink`), with the same
config, log lines and errors. The sink decides *what* to merge (it drops the rows whose status
is one of `drop_statuses`); the host does the MERGE natively and exactly once per batch.

Config: `{ "tables": ["orders"], "status_column": "status", "drop_statuses": ["cancelled"] }`.
Every table named must be granted in the pipeline file:

    [sink.capabilities.delta_merge.orders]
    path = "tables/orders"
    keys = ["order_id"]
    when_matched_update = "s.occurred_at > t.occurred_at"
"""

from __future__ import annotations

import weir_plugin as weir


class MergeSink(weir.Sink):
    required = ("tables",)
    optional = {"status_column": "status", "drop_statuses": []}
    config_types = {"tables": [str], "status_column": str, "drop_statuses": [str]}

    def __init__(self, config: dict, schema: weir.Schema) -> None:
        self.tables = config["tables"]
        self.status_column = config["status_column"]
        self.drop = {s.encode() for s in config["drop_statuses"]}
        if not self.tables:
            raise weir.invalid_config("merge_sink: `tables` must name at least one granted table")
        if self.drop and schema.index(self.status_column) is None:
            raise weir.invalid_config(f"merge_sink: status_column `{self.status_column}` is not a column of the input")

    def write_batch(self, batch: weir.Batch, info: weir.BatchInfo) -> None:
        rows = None
        if self.drop:
            status = batch.column(self.status_column)
            n, drop = batch.num_rows, self.drop
            if status.type == "utf8":
                # Kept: a null status, or one not to drop (compared bytewise, as in Rust).
                kept = weir.pack_bits([s not in drop for s in status.raw], n)
                if status.validity is not None:
                    kept = weir.or_bits(kept, weir.not_bits(status.validity, n))
            else:
                kept = weir.not_bits(bytes((n + 7) // 8), n)  # no string to match: keep all
            rows = weir.Output.keep(kept)
        for table in self.tables:
            result = weir.delta_merge.merge(table, batch, rows)
            weir.log_info(
                f"merge_sink: batch {info.batch_id} into {table}: {result.updated} updated, "
                f"{result.inserted} inserted{' (already merged)' if result.skipped else ''}"
            )


Writer = weir.export_sink(MergeSink)
