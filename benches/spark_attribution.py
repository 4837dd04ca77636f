#!/usr/bin/env python3
"""Spark's side of the attribution benchmark: the guide's stream-stream join of clicks and orders.

  clicks = readStream json (explicit schema) of --clicks -> withWatermark(clicked_at, --watermark)
  orders = readStream json (explicit schema) of --input  -> withWatermark(occurred_at, --watermark)
  clicks.join(orders, clicks.session_id = orders.session_id
                      AND orders.occurred_at BETWEEN clicks.clicked_at AND clicks.clicked_at + --bound,
              "inner")
  -> session_id, click_id, clicked_at, url, order_id, customer_id, status, amount, occurred_at
     (Weir's column order; the two session_id columns would make the Parquet sink refuse the schema)
  -> append -> Parquet sink (or --sink noop)

Run like ``shared/bench/spark_revenue.py`` (the same flags where they mean the same, so that
``measure.py`` and ``weir-bench`` drive both alike): ``trigger(availableNow=True)``, master
``local[2]``, 2 shuffle partitions, ``maxFilesPerTrigger`` 1 on each source (clicks file i and orders
file i have the same mtime, as gen_orders.py and benches/gen_clicks.py set them, so every
micro-batch reads one file of each), RocksDB state by default, the checkpoint under --work (wiped
first unless --keep-checkpoint).

Inputs: ``gen_orders.py --out ORDERS`` and ``benches/gen_clicks.py --orders ORDERS --out CLICKS
--bound-s 3600`` (the bound the clicks were drawn for should be --bound).

Outputs (directory --results, created):
  <tag>.progress.jsonl   compact per-batch progress (one JSON object a line: input rows per source,
                         watermark, the join's state rows numRowsTotal / updated / removed /
                         dropped by watermark, memory)
  <tag>.timing.json      phase timings and totals (as spark_revenue.py's)
  <tag>.csv              the result's (click_id, order_id) pairs, sorted (read back from the
                         Parquet sink; not with --no-result or --sink noop)
The full StreamingQueryProgress JSON of every batch goes to <work>/progress_full.jsonl.
"""
import argparse
import json
import os
import shutil
import sys
import time

T_PROC0 = time.time()

import pyspark  # noqa: E402
from pyspark.sql import SparkSession, functions as F, types as T  # noqa: E402

T_IMPORTED = time.time()

ORDER_SCHEMA = T.StructType([
    T.StructField("order_id", T.LongType()),
    T.StructField("customer_id", T.LongType()),
    T.StructField("status", T.StringType()),
    T.StructField("amount", T.DecimalType(12, 2)),
    T.StructField("occurred_at", T.TimestampType()),
    T.StructField("session_id", T.StringType()),
])
CLICK_SCHEMA = T.StructType([
    T.StructField("click_id", T.LongType()),
    T.StructField("session_id", T.StringType()),
    T.StructField("clicked_at", T.TimestampType()),
    T.StructField("url", T.StringType()),
])
# Spark's names for Weir's join types.
HOW = {"inner": "inner", "left": "left_outer", "full": "full_outer", "left_semi": "left_semi"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", required=True, help="directory of orders-*.json files (gen_orders.py)")
    p.add_argument("--clicks", required=True, help="directory of clicks-*.json files (benches/gen_clicks.py)")
    p.add_argument("--work", required=True, help="scratch dir: checkpoint/, out/, progress_full.jsonl")
    p.add_argument("--results", required=True, help="directory for the small result files")
    p.add_argument("--tag", default="attribution", help="file name prefix in --results")
    p.add_argument("--max-files-per-trigger", type=int, default=1, help="per source")
    p.add_argument("--shuffle-partitions", type=int, default=2)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--driver-memory", default="4g")
    p.add_argument("--state-store", choices=["hdfs", "rocksdb"], default="rocksdb")
    p.add_argument("--watermark", default="30 minutes", help="the delay of both watermarks")
    p.add_argument("--bound", default="1 hour", help="orders.occurred_at BETWEEN clicked_at AND clicked_at + bound")
    p.add_argument("--how", choices=sorted(HOW), default="inner", help="the join type (the guide's: inner)")
    p.add_argument("--sink", choices=["parquet", "noop"], default="parquet")
    p.add_argument("--keep-checkpoint", action="store_true", help="do not wipe --work (restart test)")
    p.add_argument("--no-result", action="store_true", help="skip reading back the sink (pure timing)")
    return p.parse_args(argv)


def build_session(a):
    b = (SparkSession.builder.master(a.master).appName("anchor-attribution")
         .config("spark.driver.memory", a.driver_memory)
         .config("spark.sql.shuffle.partitions", str(a.shuffle_partitions))
         .config("spark.sql.session.timeZone", "UTC")
         # The inner join's inferred `session_id IS NOT NULL` would be pushed into the JSON reader,
         # and numInputRows would then leave out the clicks without a session: off, so that
         # input_rows counts every row read, as Weir's and make_golden.py's do.
         .config("spark.sql.json.filterPushdown.enabled", "false")
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.streaming.numRecentProgressUpdates", "100000")
         .config("spark.driver.extraJavaOptions", "-Duser.timezone=UTC")
         .config("spark.executor.extraJavaOptions", "-Duser.timezone=UTC"))
    if a.state_store == "rocksdb":
        b = b.config("spark.sql.streaming.stateStore.providerClass",
                     "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def compact(p):
    """Small per-batch record out of a StreamingQueryProgress dict."""
    ops = p.get("stateOperators") or []
    d = p.get("durationMs") or {}
    return {
        "batchId": p["batchId"],
        "numInputRows": p["numInputRows"],
        "sourceInputRows": [s.get("numInputRows") for s in p.get("sources") or []],
        "processedRowsPerSecond": round(p.get("processedRowsPerSecond") or 0.0, 1),
        "triggerExecutionMs": d.get("triggerExecution"),
        "addBatchMs": d.get("addBatch"),
        "watermark": (p.get("eventTime") or {}).get("watermark"),
        "eventTimeMax": (p.get("eventTime") or {}).get("max"),
        "state": [{k: o.get(k) for k in ("operatorName", "numRowsTotal", "numRowsUpdated", "numRowsRemoved",
                                        "numRowsDroppedByWatermark", "memoryUsedBytes")} for o in ops],
        "sinkOutputRows": (p.get("sink") or {}).get("numOutputRows"),
    }


def attribution(spark, a):
    def read(schema, path):
        return spark.readStream.schema(schema).option("maxFilesPerTrigger", a.max_files_per_trigger).json(path)

    clicks = read(CLICK_SCHEMA, a.clicks).withWatermark("clicked_at", a.watermark).alias("clicks")
    orders = read(ORDER_SCHEMA, a.input).withWatermark("occurred_at", a.watermark).alias("orders")
    joined = clicks.join(orders, F.expr(
        "clicks.session_id = orders.session_id AND "
        f"orders.occurred_at BETWEEN clicks.clicked_at AND clicks.clicked_at + INTERVAL {a.bound}"), HOW[a.how])
    session = (F.coalesce(F.col("clicks.session_id"), F.col("orders.session_id")) if a.how == "full"
               else F.col("clicks.session_id"))
    cols = [F.col(f"clicks.{c}") for c in ("click_id", "clicked_at", "url")]
    if a.how != "left_semi":
        cols += [F.col(f"orders.{c}") for c in ("order_id", "customer_id", "status", "amount", "occurred_at")]
    return joined.select(session.alias("session_id"), *cols)


def main(argv=None):
    a = parse_args(argv)
    tag = a.tag
    os.makedirs(a.results, exist_ok=True)
    timing = {"query": "attribution", "how": a.how, "tag": tag, "pyspark": pyspark.__version__, "master": a.master,
              "shuffle_partitions": a.shuffle_partitions, "max_files_per_trigger": a.max_files_per_trigger,
              "driver_memory": a.driver_memory, "state_store": a.state_store, "watermark": a.watermark,
              "bound": a.bound, "sink": a.sink, "import_s": round(T_IMPORTED - T_PROC0, 3)}
    t = time.time()
    spark = build_session(a)
    timing["session_s"] = round(time.time() - t, 3)
    timing["jvm_java_version"] = spark.sparkContext._jvm.java.lang.System.getProperty("java.version")

    if not a.keep_checkpoint and os.path.exists(a.work):
        shutil.rmtree(a.work)
    os.makedirs(a.work, exist_ok=True)
    ckpt = os.path.join(a.work, "checkpoint")
    out = os.path.join(a.work, "out")
    timing["input_files"] = len([f for f in os.listdir(a.input) if f.endswith(".json")])
    timing["clicks_files"] = len([f for f in os.listdir(a.clicks) if f.endswith(".json")])

    df = attribution(spark, a)
    if a.sink == "parquet":
        writer = df.writeStream.format("parquet").option("path", out)
    else:
        writer = df.writeStream.format("noop")
    writer = (writer.outputMode("append").option("checkpointLocation", ckpt).trigger(availableNow=True)
              .queryName("anchor_attribution"))
    t = time.time()
    q = writer.start()
    q.awaitTermination()
    stream_s = time.time() - t
    exc = q.exception()
    progress = [json.loads(p.json) if hasattr(p, "json") else p for p in q.recentProgress]
    timing["stream_s"] = round(stream_s, 3)
    if exc is not None:
        timing["exception"] = str(exc)[:2000]

    with open(os.path.join(a.work, "progress_full.jsonl"), "a") as fh:
        for p in progress:
            fh.write(json.dumps(p) + "\n")
    comp = [compact(p) for p in progress]
    with open(os.path.join(a.results, f"{tag}.progress.jsonl"), "w") as fh:
        for c in comp:
            fh.write(json.dumps(c) + "\n")
    rows = sum(c["numInputRows"] for c in comp)
    counted = [c["sinkOutputRows"] for c in comp if c["sinkOutputRows"] is not None and c["sinkOutputRows"] >= 0]
    trig_ms = sum(c["triggerExecutionMs"] or 0 for c in comp)
    data_batches = [c for c in comp if c["numInputRows"] > 0]
    prs = sorted(c["processedRowsPerSecond"] for c in data_batches)
    timing.update({
        "batches": len(comp),
        "data_batches": len(data_batches),
        "no_data_batches": len(comp) - len(data_batches),
        "input_rows": rows,
        "input_rows_per_source": [sum(c["sourceInputRows"][i] or 0 for c in comp)
                                  for i in range(len(comp[0]["sourceInputRows"]))] if comp else None,
        "rows_per_s_wall": round(rows / stream_s, 1) if stream_s else None,
        "sum_trigger_execution_s": round(trig_ms / 1000, 3),
        "rows_per_s_spark_overall": round(rows / (trig_ms / 1000), 1) if trig_ms else None,
        "spark_processedRowsPerSecond_median": prs[len(prs) // 2] if prs else None,
        "spark_processedRowsPerSecond_min": prs[0] if prs else None,
        "spark_processedRowsPerSecond_max": prs[-1] if prs else None,
        "final_watermark": comp[-1]["watermark"] if comp else None,
        "state_rows_final": [s["numRowsTotal"] for s in comp[-1]["state"]] if comp else None,
        "state_rows_max": max((s["numRowsTotal"] or 0 for c in comp for s in c["state"]), default=None),
        "state_memory_max_bytes": max((s["memoryUsedBytes"] or 0 for c in comp for s in c["state"]), default=None),
        "dropped_by_watermark_sum": sum((s["numRowsDroppedByWatermark"] or 0) for c in comp for s in c["state"]),
        # Spark's file sink reports -1 (unknown): then null; the rows are in result_rows (read back)
        # or in the Parquet footers of <work>/out.
        "sink_output_rows_sum": sum(counted) if counted else None,
    })

    if not a.no_result and a.sink == "parquet" and exc is None:
        t = time.time()
        res = spark.read.parquet(out)  # honours _spark_metadata (exactly-once file sink log)
        order_col = F.col("order_id") if "order_id" in res.columns else F.lit(None).cast("bigint")
        got = (res.select("click_id", order_col.alias("order_id"))
               .orderBy(F.col("click_id").asc_nulls_first(), F.col("order_id").asc_nulls_first()).collect())
        with open(os.path.join(a.results, f"{tag}.csv"), "w", encoding="utf-8", newline="\n") as fh:
            fh.write("click_id,order_id\n")
            for r in got:
                fh.write(f"{'' if r.click_id is None else r.click_id},{'' if r.order_id is None else r.order_id}\n")
        timing["result_rows"] = len(got)
        timing["result_distinct_clicks"] = len({r.click_id for r in got})
        timing["readback_s"] = round(time.time() - t, 3)

    t = time.time()
    spark.stop()
    timing["stop_s"] = round(time.time() - t, 3)
    timing["total_in_python_s"] = round(time.time() - T_PROC0, 3)
    with open(os.path.join(a.results, f"{tag}.timing.json"), "w") as fh:
        json.dump(timing, fh, indent=1)
    print(json.dumps(timing))
    if exc is not None:
        sys.exit(1)


if __name__ == "__main__":
    main()
