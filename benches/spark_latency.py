#!/usr/bin/env python3
"""Spark's side of ``weir-bench latency``: Kafka -> Spark -> Kafka, the same two queries.

``weir-bench latency --engine spark`` starts this script against its mock cluster and measures
it exactly as it measures ``weir run``: the latency of an output record is its Kafka timestamp
(set when the sink produced it) minus the ``ts`` of the newest event it includes.

Spark reads Kafka through its connector ``spark-sql-kafka-0-10``, which pyspark's wheel does not
carry and which comes from Maven Central, which this machine cannot reach. So the source and
the sink here are pyspark 4's Python streaming data sources, talking Kafka with confluent-kafka
(librdkafka, from PyPI), shaped like Spark's own connector:

* the source plans a micro-batch from the partitions' high watermarks (``latestOffset``), one
  task per partition reads its offset range, and a consumer per partition is kept in the Python
  worker between batches (Spark's connector pools its consumers the same way). A task returns
  Arrow record batches, the fastest way into Spark a Python source has.
* the sink produces each row's ``value`` from the tasks, as Spark's Kafka sink does, taking
  them as Arrow record batches, and flushes before the task ends (at least once, as Spark's
  Kafka sink). A Python data sink takes append mode only, so the update-mode count writes
  through ``foreach`` with the same producer.

The queries are Spark's forms of Weir's: ``stateless`` lowercases ``key`` (Weir runs its Wasm
transform ``normalize_status``), ``count`` is ``groupBy(key).agg(count(*) AS n, max(ts) AS ts)``
in update mode. The trigger is Spark's default (the next micro-batch starts when the last ends),
or ``--trigger realtime`` to try Spark's real-time mode (it refuses a Python source: the error
is printed).
"""
import argparse
import os
import sys

from pyspark.sql import SparkSession, functions as F
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    DataSourceStreamArrowWriter,
    InputPartition,
    WriterCommitMessage,
)

SCHEMA = "id BIGINT, key STRING, ts BIGINT, amount DOUBLE"


def _clients():
    """The Kafka clients of this Python worker, kept between tasks (the worker is reused)."""
    return sys.modules[__name__].__dict__.setdefault("_weir_kafka_clients", {})


class KafkaRange(InputPartition):
    def __init__(self, topic, partition, start, end):
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


class KafkaReader(DataSourceStreamReader):
    def __init__(self, options):
        self.bootstrap = options["bootstrap"]
        self.topic = options["topic"]
        self.partitions_n = int(options["partitions"])
        self.admin = None

    def __getstate__(self):
        # The tasks get the reader pickled; a client is not picklable and not theirs.
        return {**self.__dict__, "admin": None}

    def _watermarks(self, which):
        from confluent_kafka import Consumer, TopicPartition

        if self.admin is None:
            self.admin = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "spark-latency-driver",
                                   "enable.auto.commit": False})
        return {str(p): self.admin.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[which]
                for p in range(self.partitions_n)}

    def initialOffset(self):
        return self._watermarks(0)

    def latestOffset(self, start=None, limit=None):
        return self._watermarks(1)

    def partitions(self, start, end):
        return [KafkaRange(self.topic, int(p), start[p], end[p]) for p in sorted(end) if end[p] > start.get(p, 0)]

    def read(self, partition):
        import pyarrow as pa
        from confluent_kafka import Consumer, TopicPartition

        clients = _clients()
        key = ("consumer", partition.topic, partition.partition)
        consumer = clients.get(key)
        if consumer is None:
            consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "spark-latency",
                                 "enable.auto.commit": False, "fetch.wait.max.ms": 5})
            clients[key] = consumer
        consumer.assign([TopicPartition(partition.topic, partition.partition, partition.start)])
        values, stamps = [], []
        next_offset = partition.start
        while next_offset < partition.end:
            for m in consumer.consume(num_messages=min(10_000, partition.end - next_offset), timeout=1.0):
                if m.error():
                    raise RuntimeError(f"reading {partition.topic}-{partition.partition}: {m.error()}")
                if m.offset() >= partition.end:
                    continue
                values.append(m.value().decode())
                stamps.append(m.timestamp()[1])
                next_offset = m.offset() + 1
        yield pa.RecordBatch.from_arrays([pa.array(values, pa.string()), pa.array(stamps, pa.int64())],
                                         names=["value", "timestamp"])

    def commit(self, end):
        pass


class KafkaWriter(DataSourceStreamArrowWriter):
    def __init__(self, options):
        self.bootstrap = options["bootstrap"]
        self.topic = options["topic"]

    def write(self, iterator):
        from confluent_kafka import Producer

        clients = _clients()
        producer = clients.get("producer")
        if producer is None:
            producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 0,
                                 "queue.buffering.max.messages": 1_000_000})
            clients["producer"] = producer
        for batch in iterator:
            for value in batch.column("value").to_pylist():
                while True:
                    try:
                        producer.produce(self.topic, value=value)
                        break
                    except BufferError:
                        producer.poll(0.01)
            producer.poll(0)
        if producer.flush(30) != 0:
            raise RuntimeError(f"{self.topic}: records left unsent after 30 s")
        return WriterCommitMessage()


class ForeachKafka:
    """The same producing as ``KafkaWriter``, as a ``foreach`` sink (real-time mode allows it)."""

    def __init__(self, bootstrap, topic):
        self.bootstrap, self.topic, self.producer = bootstrap, topic, None

    def open(self, partition_id, epoch_id):
        from confluent_kafka import Producer

        clients = _clients()
        self.producer = clients.get("producer")
        if self.producer is None:
            self.producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 0,
                                      "queue.buffering.max.messages": 1_000_000})
            clients["producer"] = self.producer
        return True

    def process(self, row):
        while True:
            try:
                self.producer.produce(self.topic, value=row.value)
                break
            except BufferError:
                self.producer.poll(0.01)
        self.producer.poll(0)

    def close(self, error):
        if self.producer is not None and self.producer.flush(30) != 0:
            raise RuntimeError(f"{self.topic}: records left unsent after 30 s")


class WeirKafka(DataSource):
    @classmethod
    def name(cls):
        return "weir_kafka"

    def schema(self):
        return "value STRING, timestamp BIGINT"

    def streamReader(self, schema):
        return KafkaReader(self.options)

    def streamWriter(self, schema, overwrite):
        return KafkaWriter(self.options)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--partitions", type=int, required=True, help="partitions of the input topic")
    p.add_argument("--query", choices=["stateless", "count"], required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--trigger", choices=["default", "realtime"], default="default")
    p.add_argument("--interval", default="10 seconds", help="the real-time trigger's checkpoint interval")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--shuffle-partitions", type=int, default=2)
    a = p.parse_args()
    # The Python workers are this Python, with confluent-kafka and pyarrow.
    os.environ["PYSPARK_PYTHON"] = sys.executable

    spark = (SparkSession.builder.master(a.master).appName(f"latency-{a.query}")
             .config("spark.sql.shuffle.partitions", str(a.shuffle_partitions))
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(WeirKafka)

    events = (spark.readStream.format("weir_kafka").option("bootstrap", a.bootstrap)
              .option("topic", "events").option("partitions", str(a.partitions)).load()
              .select(F.from_json("value", SCHEMA).alias("e")).select("e.*"))
    if a.query == "stateless":
        out, mode = events.withColumn("key", F.lower("key")), "append"
    else:
        out, mode = events.groupBy("key").agg(F.count(F.lit(1)).alias("n"), F.max("ts").alias("ts")), "update"
    writer = (out.select(F.to_json(F.struct(*out.columns)).alias("value")).writeStream
              .option("checkpointLocation", a.checkpoint).outputMode(mode))
    if a.trigger == "realtime":
        # Real-time mode takes no Python data sink (foreach is on its allowlist) and needs update
        # mode, which for a stateless query writes what append would.
        writer = writer.outputMode("update").foreach(ForeachKafka(a.bootstrap, "out")).trigger(realTime=a.interval)
    elif mode == "update":
        # A Python data sink takes append only; foreach takes update.
        writer = writer.foreach(ForeachKafka(a.bootstrap, "out"))
    else:
        writer = writer.format("weir_kafka").option("bootstrap", a.bootstrap).option("topic", "out")
    query = writer.start()
    print("spark-latency: started", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main()
