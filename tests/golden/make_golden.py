#!/usr/bin/env python3
"""Regenerates Weir's golden files from real Apache Spark (Structured Streaming).

Run it with a Python that has pyspark 4.3.0 (the version ``shared/bench`` measures; any other is
refused) and numpy (see README.md in this folder):

    ~/.cache/weir/spark-venv/bin/python tests/golden/make_golden.py

What it does, in this order:

1. Generates the input with the bookshop-orders generator (``gen_orders.py`` of the shared bench
   folder, seeded, so the bytes are always the same) into ``input/`` beside this script, and the
   generator's manifest into ``input.manifest.json``; and the customers dimension the join cases
   read as a static table (``input_customers/customers.json``, made by this script, seeded: see
   ``generate_customers``); and the clicks stream the stream-stream join cases read beside the
   orders (``input_clicks/clicks-NNNNN.json``, made from ``input/`` by ``benches/gen_clicks.py``,
   seeded: see ``generate_clicks``). ``--reuse-input`` keeps the committed input (and the
   customers and the clicks, if present).
2. Copies ``input/`` (and ``input_clicks/``) to a scratch folder and sets the modification time of
   the i-th file (in name order) to ``MTIME_BASE + i``: git keeps no mtimes, and Spark's file source
   reads oldest first, so the Rust test does exactly the same before it runs Weir (clicks file i
   with orders file i: one file of each per micro-batch).
3. Runs every case on Spark (``local[2]``, 2 shuffle partitions, UTC, ``maxFilesPerTrigger=1``,
   ``trigger(availableNow=True)``, PERMISSIVE JSON with an explicit schema), capturing each
   micro-batch's output through ``foreachBatch`` and each batch's watermark from the progress.
4. Writes, per case, into ``<case>/``:

   * ``pipeline.toml``: the same query for Weir (paths are overridden by the Rust test);
   * ``expected.csv``: the result. Append: every row emitted. Update: the last row emitted per key
     (what an upserting sink would hold). Complete: the last batch's full result;
   * ``batches.csv``: ``batch_id`` + the rows each micro-batch emitted (complete mode: the full
     result of each batch);
   * ``progress.csv``: per batch, the input rows and the watermark (``eventTime.watermark``).

   Rows are sorted as text. Timestamps are ISO-8601 UTC, ``YYYY-MM-DDTHH:MM:SS[.fff[fff]]Z`` (no
   fraction when it is zero, else milliseconds, or microseconds if the value has any); decimals in
   plain form with their scale (``123.40``); null is an empty field.
   After each case it records in ``hashes.json`` the case's output mode and keys, the pyspark and
   Java versions, the SHA-256 of the input it read (and of each static table it joined and each
   other stream it read) and of each file above. ``tests/tests/golden.rs``
   checks those hashes and that ``expected.csv`` is what ``batches.csv`` implies, so a golden
   file edited by hand fails the tests: this script is their only writer.
5. Checks the documented refusals (e.g. a distinct aggregation on a stream) still happen, and writes
   ``spark.json`` (versions and settings used).

Nothing is installed by this script.
"""
import argparse
import datetime as dt
import decimal
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DEFAULT_GEN = os.path.join(os.path.dirname(REPO), "shared", "bench", "gen_orders.py")

# The generator's own base; the Rust test uses the same (tests/tests/golden.rs).
MTIME_BASE = 1_700_000_000

SCHEMA_DDL = ("order_id BIGINT, customer_id BIGINT, status STRING, amount DECIMAL(12,2), "
              "occurred_at TIMESTAMP, session_id STRING")

# The input: 6,000 lines in 12 files of 5 minutes of arrival each (one hour of event time), so a
# 10-minute watermark closes several 5-minute windows; 2,000 customers so that session windows
# per customer hold one to a few orders; more malformed and too-late lines than the defaults.
GEN_ARGS = [
    "--rows", "6000", "--files", "12", "--seed", "20240301", "--slot-seconds", "300",
    "--customers", "2000", "--malformed-frac", "0.01", "--too-late-frac", "0.02",
]

# The only pyspark the goldens come from: the one shared/bench measures (RESULTS.md), so that the
# answers Weir is held to and the engine it is timed against are the same Spark.
PYSPARK_VERSION = "4.3.0"

# Written after every case; checked by tests/tests/golden.rs (`golden_files_are_make_goldens`).
HASHES = os.path.join(HERE, "hashes.json")
# The files of a case whose hashes are recorded: every file write_case writes.
CASE_FILES = ["batches.csv", "expected.csv", "pipeline.toml", "progress.csv"]

WATERMARK = "10 minutes"

# The static side of the stream-static join cases: a customers dimension, JSON lines in
# `input_customers/` (a folder beside `input/`, so the orders input and its hashes are untouched),
# read by Spark with `spark.read.schema(CUSTOMERS_SCHEMA).json(folder)` (PERMISSIVE) and by Weir as
# a `[[table]]` of kind `files`. Made by `generate_customers` from CUSTOMERS_SEED: the same bytes on
# every run. The orders reference customer ids 1..2040 (`--customers 2000`, +2 %); the dimension
# holds 1..CUSTOMERS_IDS, so the orders of 1501..2040 have no customer.
CUSTOMERS_DIR = os.path.join(HERE, "input_customers")
CUSTOMERS_FILE = "customers.json"
CUSTOMERS_SCHEMA = "customer_id BIGINT, name STRING, country STRING, tier STRING"
CUSTOMERS_SEED = 20240302
CUSTOMERS_IDS = 1500
# Ids with a second row (a join emits two rows for each of their orders); all occur in the orders.
CUSTOMERS_DUPLICATES = [7, 777, 1234]
COUNTRIES = ["DE", "FR", "GB", "US", "NL", "ES", "IT", "PL", "SE", "JP"]
TIERS = ["bronze", "silver", "gold", "platinum"]
# Lines after customer `id` (key) that are not plain customers: null keys, missing fields, text that
# needs CSV quoting, and malformed lines. Spark (PERMISSIVE, explicit schema) reads the truncated and
# the garbage line as all-null rows, and the id given as a JSON string as a row whose customer_id is
# null (a string is no BIGINT): none of them matches an order (a null key never does), so an inner,
# left, left semi or left anti join with the stream on the left shows none of them; Weir drops them.
CUSTOMERS_SPECIAL = {
    12: ['{"customer_id":null,"name":"Nobody","country":"ZZ","tier":"none"}'],
    42: ['{"name":"No id at all","country":"ZZ","tier":"none"}'],
    300: ['{"customer_id":1501,"name":"Truncated'],          # malformed: cut off; 1501 is in the orders
    900: ['#### not json ####'],                                 # malformed
    1100: ['{"customer_id":"1502","name":"Id as text","country":"DE","tier":"gold"}'],  # 1502: orders
}


def customer_line(cid, rng, second=False):
    """One customer as a JSON line, from `rng` (random.Random: the same draws on every Python)."""
    country = COUNTRIES[int(rng.random() * len(COUNTRIES))]
    tier = TIERS[int(rng.random() * len(TIERS))]
    name = f"Customer {cid:06d}" + (" (second row)" if second else "")
    fields = {"customer_id": cid, "name": name, "country": country, "tier": tier}
    # A few customers (all with orders) whose fields test the reading and the CSV.
    if cid == 101:
        fields["name"] = 'Doe, "Jo" & Co'          # a comma and quotes: quoted in the CSV
    elif cid == 103:
        fields["name"] = "Zoë Müller"                # not ASCII
    elif cid == 104:
        del fields["country"]                        # a missing field: null
    elif cid == 105:
        fields["tier"] = None                        # an explicit null
    return json.dumps(fields, ensure_ascii=False, separators=(",", ":"))


def generate_customers(folder):
    """Writes the customers dimension (see CUSTOMERS_*) into `folder`."""
    import random
    rng = random.Random(CUSTOMERS_SEED)
    lines = []
    for cid in range(1, CUSTOMERS_IDS + 1):
        lines.append(customer_line(cid, rng))
        if cid in CUSTOMERS_DUPLICATES:
            lines.append(customer_line(cid, rng, second=True))
        lines.extend(CUSTOMERS_SPECIAL.get(cid, []))
    if os.path.exists(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)
    with open(os.path.join(folder, CUSTOMERS_FILE), "w", encoding="utf-8", newline="\n") as fh:
        fh.write("\n".join(lines) + "\n")


def customers_summary():
    return {
        "path": os.path.basename(CUSTOMERS_DIR), "files": [CUSTOMERS_FILE], "schema": CUSTOMERS_SCHEMA,
        "seed": CUSTOMERS_SEED, "customer_ids": [1, CUSTOMERS_IDS],
        "duplicate_ids": CUSTOMERS_DUPLICATES,
        "special_lines": {str(k): v for k, v in CUSTOMERS_SPECIAL.items()},
    }


def read_customers(spark):
    """The static side, as the guide reads it (Spark lists and reads it again every micro-batch)."""
    return spark.read.schema(CUSTOMERS_SCHEMA).option("mode", "PERMISSIVE").json(CUSTOMERS_DIR)


# The second stream of the stream-stream join cases: clicks, JSON lines in `input_clicks/` (a folder
# beside `input/`, so the orders input and its hashes are untouched), `clicks-NNNNN.json` file i
# arriving with `orders-NNNNN.json` file i (the same mtime: one file of each per micro-batch), made
# from `input/` by the repository's clicks generator (`benches/gen_clicks.py`, seeded: the same bytes
# on every run; counts in `input_clicks.manifest.json`). The time bound is the join's 10 minutes, so
# about two thirds of the clicks of a session with an order fall inside it; 5-minute slots as the
# orders'. Read by Spark as a second `readStream` (PERMISSIVE, `maxFilesPerTrigger` 1) and by Weir as
# a second `[[source]]`.
STREAMS_DIRS = {"clicks": os.path.join(HERE, "input_clicks")}
CLICKS_DIR = STREAMS_DIRS["clicks"]
CLICKS_SCHEMA = "click_id BIGINT, session_id STRING, clicked_at TIMESTAMP, url STRING"
CLICKS_SCHEMA_COLUMNS = [c.split()[0] for c in CLICKS_SCHEMA.split(", ")]
GEN_CLICKS = os.path.join(REPO, "benches", "gen_clicks.py")
GEN_CLICKS_ARGS = [
    "--seed", "20240303", "--bound-s", "600", "--start", "2024-03-01T00:00:00", "--slot-seconds", "300",
    "--too-late-frac", "0.02",
]
# The guide's stream-stream join (attribution of orders to the clicks before them), its bound
# scaled from 1 hour to 10 minutes so that state is evicted within the input's hour: the same text
# is Spark's join condition (after the session equality) and Weir's `[join] condition`.
ATTRIBUTION_CONDITION = "orders.occurred_at BETWEEN clicks.clicked_at AND clicks.clicked_at + INTERVAL 10 MINUTES"


def generate_clicks(input_dir, folder):
    """Writes the clicks stream (see CLICKS_*) made from the orders in `input_dir` into `folder`, and
    the generator's manifest beside it."""
    if not os.path.isfile(GEN_CLICKS):
        sys.exit(f"gen_clicks.py not found at {GEN_CLICKS}")
    scratch = tempfile.mkdtemp(prefix="weir-golden-clicks-")
    try:
        out = os.path.join(scratch, "clicks")
        subprocess.run([sys.executable, GEN_CLICKS, "--orders", input_dir, *GEN_CLICKS_ARGS, "--out", out],
                       check=True, stdout=subprocess.DEVNULL)
        with open(out + ".manifest.json") as fh:
            manifest = json.load(fh)
        manifest.pop("seconds", None)  # wall time: would make the file differ on every run
        if os.path.exists(folder):
            shutil.rmtree(folder)
        shutil.copytree(out, folder)
        with open(folder + ".manifest.json", "w", encoding="utf-8", newline="\n") as fh:
            json.dump(manifest, fh, indent=1)
            fh.write("\n")
    finally:
        shutil.rmtree(scratch)


def clicks_summary():
    return {
        "path": os.path.basename(CLICKS_DIR), "schema": CLICKS_SCHEMA,
        "files": sorted(n for n in os.listdir(CLICKS_DIR) if n.endswith(".json")),
        "generator": os.path.relpath(GEN_CLICKS, REPO), "gen_clicks_args": GEN_CLICKS_ARGS,
        "mtime": "file i as input/ file i: MTIME_BASE + i",
    }


def read_stream(spark, schema, data_dir):
    return (spark.readStream.schema(schema).option("mode", "PERMISSIVE")
            .option("maxFilesPerTrigger", 1).json(data_dir))

# The SQL transform case: the same statement text runs on Spark (over a temporary view named
# `input`) and on Weir (`[[transform]] sql`).
SQL_TRANSFORM = (
    "SELECT order_id, upper(status) AS status, amount * 2 AS doubled, "
    "CASE WHEN amount >= 100 THEN 'large' WHEN amount >= 20 THEN 'medium' ELSE 'small' END AS size, "
    "coalesce(session_id, 'none') AS session, concat_ws('-', status, CAST(customer_id AS STRING)) AS tag, "
    "amount - 0.1 * 3 AS exact, hour(occurred_at) AS hour, nullif(status, 'completed') AS open_status "
    "FROM input WHERE amount > 50 AND status <> 'cancelled'"
)
# Expressions inside and around aggregates: the same entries in Spark's SQL and Weir's [aggregate].
EXPR_GROUP = "lower(status) AS status"
EXPR_SELECT = ["sum(amount * 0.9) AS net", "count(*) FILTER (WHERE amount > 100) AS big",
               "count_if(session_id IS NULL) AS anonymous", "round(sum(amount) / count(*), 2) AS mean"]
EXPR_COLUMNS = ["status", "net", "big", "anonymous", "mean"]
SQL_COLUMNS = ["order_id", "status", "doubled", "size", "session", "tag", "exact", "hour", "open_status"]
ORDER_COLUMNS = ["order_id", "customer_id", "status", "amount", "occurred_at", "session_id"]


# ---------------------------------------------------------------------------------------------
# The cases. Each: Spark query builder, output mode, output columns, key columns (update mode),
# and the Weir sections that express the same query.
# ---------------------------------------------------------------------------------------------

def cases(F):
    """name -> case dict. `F` is pyspark.sql.functions."""

    def windowed(df, window_expr, group, aggs):
        """aggs: [(name, column)]; output: window_start, window_end, *group, *names."""
        return (df.withWatermark("occurred_at", WATERMARK)
                .groupBy(window_expr.alias("window"), *group)
                .agg(*[c.alias(n) for n, c in aggs])
                .select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"),
                        *group, *[n for n, _ in aggs]))

    revenue_aggs = lambda: [("revenue", F.sum("amount")), ("orders", F.count(F.lit(1)))]  # noqa: E731
    revenue_cols = ["window_start", "window_end", "status", "revenue", "orders"]
    revenue_select = '["sum(amount) AS revenue", "count(*) AS orders"]'
    tumbling = '{ column = "occurred_at", size = "5 minutes" }'

    def revenue(df):
        return windowed(df, F.window("occurred_at", "5 minutes"), ["status"], revenue_aggs())

    def sliding(df):
        return windowed(df, F.window("occurred_at", "10 minutes", "5 minutes"), ["status"], revenue_aggs())

    def session(df):
        aggs = [("orders", F.count(F.lit(1))), ("revenue", F.sum("amount"))]
        return windowed(df, F.session_window("occurred_at", "5 minutes"), ["customer_id"], aggs)

    def dedup(df):
        return df.withWatermark("occurred_at", WATERMARK).dropDuplicates(["order_id"])

    def dedup_within(df):
        return df.withWatermark("occurred_at", WATERMARK).dropDuplicatesWithinWatermark(["order_id"])

    status_aggs = lambda: [  # noqa: E731
        F.count(F.lit(1)).alias("orders"), F.count("amount").alias("priced"),
        F.sum("amount").alias("revenue"), F.avg("amount").alias("avg_amount"),
        F.min("amount").alias("min_amount"), F.max("amount").alias("max_amount"),
    ]
    status_cols = ["status", "orders", "priced", "revenue", "avg_amount", "min_amount", "max_amount"]
    status_select = ('["count(*) AS orders", "count(amount) AS priced", "sum(amount) AS revenue", '
                     '"avg(amount) AS avg_amount", "min(amount) AS min_amount", "max(amount) AS max_amount"]')

    def by_status(df):
        return df.groupBy("status").agg(*status_aggs())

    def sql_transform(df):
        df.createOrReplaceTempView("input")
        return df.sparkSession.sql(SQL_TRANSFORM)

    def expressions(df):
        df.createOrReplaceTempView("input")
        return df.sparkSession.sql(f"SELECT {EXPR_GROUP}, {', '.join(EXPR_SELECT)} FROM input "
                                   "GROUP BY lower(status)")

    expr_select = "[" + ", ".join(f'"{e}"' for e in EXPR_SELECT) + "]"

    # Stream-static joins (the guide's `orders.join(customers, "customer_id", "left")`): a using-join
    # gives the `on` column, then the stream's other columns, then the table's.
    def join(how):
        return lambda df: df.join(read_customers(df.sparkSession), "customer_id", how)

    join_cols = ["customer_id"] + [c for c in ORDER_COLUMNS if c != "customer_id"]
    joined_cols = join_cols + ["name", "country", "tier"]

    def join_toml(how):
        return (f'[[table]]\nname = "customers"\nkind = "files"\npath = "../{os.path.basename(CUSTOMERS_DIR)}"\n'
                f'format = "json"\nschema = "{CUSTOMERS_SCHEMA}"\n\n'
                f'[join]\nleft = "orders"\nright = "customers"\ntype = "{how}"\non = ["customer_id"]\n')

    def join_case(how, columns, about):
        return dict(query=join(how), mode="append", columns=columns, keys=None, watermark=False,
                    state_store="memory", tables=["customers"], check_columns=True,
                    about=f'orders.join(spark.read.schema(...).json(customers), "customer_id", "{how}"), '
                          f"the static side re-read every micro-batch; {about}append",
                    weir=join_toml(how))

    # Stream-stream joins (the guide's ad attribution): both streams with a watermark, the clicks on
    # the left; the result is Weir's shape: the `on` column (for a full join the one side's that is
    # not null), then the clicks' other columns, then the orders'; a left semi join only the clicks'.
    click_cols = ["session_id", "click_id", "clicked_at", "url"]
    attribution_cols = click_cols + [c for c in ORDER_COLUMNS if c != "session_id"]
    spark_how = {"inner": "inner", "left": "left_outer", "full": "full_outer", "left_semi": "left_semi"}

    def attribution(how):
        def query(orders, streams):
            clicks = streams["clicks"].withWatermark("clicked_at", WATERMARK).alias("clicks")
            orders = orders.withWatermark("occurred_at", WATERMARK).alias("orders")
            joined = clicks.join(orders, F.expr(f"clicks.session_id = orders.session_id AND {ATTRIBUTION_CONDITION}"),
                                 spark_how[how])
            session = (F.coalesce(F.col("clicks.session_id"), F.col("orders.session_id")) if how == "full"
                       else F.col("clicks.session_id"))
            others = [F.col(f"clicks.{c}") for c in click_cols[1:]]
            if how != "left_semi":
                others += [F.col(f"orders.{c}") for c in attribution_cols[len(click_cols):]]
            return joined.select(session.alias("session_id"), *others)
        return query

    # Spark's schemas declare no `_corrupt_record`: a malformed line is a row of what could be
    # read (nulls for the rest). Weir's permissive sources add the column, one on each side, so
    # each input keeps its declared columns before the join (a name on both sides is refused).
    def attribution_toml(how):
        keep = (f'[[transform]]\nname = "clicks_columns"\ninput = "clicks"\n'
                f'sql = "SELECT {", ".join(c for c in CLICKS_SCHEMA_COLUMNS)} FROM input"\n\n'
                f'[[transform]]\nname = "orders_columns"\ninput = "orders"\n'
                f'sql = "SELECT {", ".join(ORDER_COLUMNS)} FROM input"\n\n')
        return (keep + f'[join]\nleft = "clicks"\nright = "orders"\ntype = "{how}"\non = ["session_id"]\n'
                f'condition = "{ATTRIBUTION_CONDITION}"\n')

    def attribution_case(how, columns, state_store, about):
        return dict(query=attribution(how), mode="append", columns=columns, keys=None, watermark=True,
                    state_store=state_store, streams=["clicks"], check_columns=True,
                    about=f'clicks.withWatermark("clicked_at", "{WATERMARK}").join(orders.withWatermark('
                          f'"occurred_at", "{WATERMARK}"), clicks.session_id = orders.session_id AND {ATTRIBUTION_CONDITION}, '
                          f'"{spark_how[how]}"), one file of each stream per micro-batch; {about}append',
                    weir=attribution_toml(how))

    wm_toml = f'[watermark]\ncolumn = "occurred_at"\ndelay = "{WATERMARK}"\n'
    return {
        "revenue_append": dict(
            query=revenue, mode="append", columns=revenue_cols, keys=None, watermark=True,
            state_store="rocksdb",
            about="withWatermark(occurred_at, 10 min) -> groupBy(window(occurred_at, 5 min), status) "
                  "-> sum(amount) AS revenue, count(*) AS orders; append",
            weir=wm_toml + f'\n[aggregate]\nwindow = {tumbling}\ngroup_by = ["status"]\nselect = {revenue_select}\n'),
        "revenue_update": dict(
            query=revenue, mode="update", columns=revenue_cols,
            keys=["window_start", "window_end", "status"], watermark=True, state_store="memory",
            about="as revenue_append, in update mode",
            weir=wm_toml + f'\n[aggregate]\nwindow = {tumbling}\ngroup_by = ["status"]\nselect = {revenue_select}\n'),
        "revenue_complete": dict(
            query=revenue, mode="complete", columns=revenue_cols, keys=None, watermark=True,
            state_store="memory",
            about="as revenue_append, in complete mode (nothing is late, nothing evicted)",
            weir=wm_toml + f'\n[aggregate]\nwindow = {tumbling}\ngroup_by = ["status"]\nselect = {revenue_select}\n'),
        "sliding": dict(
            query=sliding, mode="append", columns=revenue_cols, keys=None, watermark=True,
            state_store="memory",
            about="withWatermark -> groupBy(window(occurred_at, 10 min, 5 min), status) -> sum, count; append",
            weir=wm_toml + '\n[aggregate]\nwindow = { column = "occurred_at", size = "10 minutes", '
                           f'slide = "5 minutes" }}\ngroup_by = ["status"]\nselect = {revenue_select}\n'),
        "session": dict(
            query=session, mode="append",
            columns=["window_start", "window_end", "customer_id", "orders", "revenue"], keys=None,
            watermark=True, state_store="memory",
            about="withWatermark -> groupBy(session_window(occurred_at, 5 min), customer_id) "
                  "-> count(*) AS orders, sum(amount) AS revenue; append",
            weir=wm_toml + '\n[aggregate]\nwindow = { column = "occurred_at", gap = "5 minutes" }\n'
                           'group_by = ["customer_id"]\nselect = ["count(*) AS orders", "sum(amount) AS revenue"]\n'),
        "dedup": dict(
            query=dedup, mode="append", columns=ORDER_COLUMNS, keys=None, watermark=True,
            state_store="rocksdb",
            about="withWatermark -> dropDuplicates([order_id]); append",
            weir=wm_toml + '\n[deduplicate]\nkeys = ["order_id"]\nwithin_watermark = false\n'),
        "dedup_within_watermark": dict(
            query=dedup_within, mode="append", columns=ORDER_COLUMNS, keys=None, watermark=True,
            state_store="memory",
            about="withWatermark -> dropDuplicatesWithinWatermark([order_id]); append",
            weir=wm_toml + '\n[deduplicate]\nkeys = ["order_id"]\nwithin_watermark = true\n'),
        "status_expressions": dict(
            query=expressions, mode="complete", columns=EXPR_COLUMNS, keys=None, watermark=False,
            state_store="memory",
            about="spark.sql GROUP BY lower(status) with sum(amount * 0.9), count(*) FILTER (WHERE ...), "
                  "count_if(...), round(sum(amount) / count(*), 2); complete",
            weir=f'[aggregate]\ngroup_by = ["{EXPR_GROUP}"]\nselect = {expr_select}\n'),
        "sql_transform": dict(
            query=sql_transform, mode="append", columns=SQL_COLUMNS, keys=None, watermark=False,
            state_store="memory",
            about="spark.sql over the stream as a view `input`: projections, CASE, casts, decimal "
                  "arithmetic, string and date functions, coalesce/nullif, a filter; append",
            weir=f'[[transform]]\nname = "enrich"\nsql = """{SQL_TRANSFORM}"""\n'),
        "status_complete": dict(
            query=by_status, mode="complete", columns=status_cols, keys=None, watermark=False,
            state_store="memory",
            about="groupBy(status) -> count(*), count(amount), sum, avg, min, max of amount; "
                  "no watermark, complete",
            weir=f'[aggregate]\ngroup_by = ["status"]\nselect = {status_select}\n'),
        "status_update": dict(
            query=by_status, mode="update", columns=status_cols, keys=["status"], watermark=False,
            state_store="memory",
            about="as status_complete, in update mode",
            weir=f'[aggregate]\ngroup_by = ["status"]\nselect = {status_select}\n'),
        "join_customers_left": join_case("left", joined_cols, "the guide's enrichment; "),
        "join_customers_inner": join_case("inner", joined_cols, ""),
        "join_customers_left_semi": join_case("left_semi", join_cols, "the orders that have a customer, once; "),
        "join_customers_left_anti": join_case("left_anti", join_cols, "the orders without a customer; "),
        "attribution_inner": attribution_case("inner", attribution_cols, "rocksdb", "the guide's attribution; "),
        "attribution_left": attribution_case(
            "left", attribution_cols, "memory", "a click without an order once its state is evicted; "),
        "attribution_full": attribution_case(
            "full", attribution_cols, "rocksdb", "the unmatched of both sides once evicted; "),
        "attribution_left_semi": attribution_case(
            "left_semi", click_cols, "memory", "each click with an order once, the clicks' columns only; "),
    }


# ---------------------------------------------------------------------------------------------
# Formatting: one canonical text form per value, shared with the Rust test.
# ---------------------------------------------------------------------------------------------

EPOCH = dt.datetime(1970, 1, 1)


def fmt_micros(us):
    """Epoch microseconds -> 'YYYY-MM-DDTHH:MM:SS[.fff[fff]]Z': no fraction when it is zero, else
    milliseconds, or microseconds when the value has any."""
    t = EPOCH + dt.timedelta(microseconds=us)
    text = t.strftime("%Y-%m-%dT%H:%M:%S")
    if t.microsecond % 1000:
        text += f".{t.microsecond:06d}"
    elif t.microsecond:
        text += f".{t.microsecond // 1000:03d}"
    return text + "Z"


def fmt_value(v):
    if v is None:
        return ""
    if isinstance(v, decimal.Decimal):
        return format(v, "f")
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, str)):
        s = str(v)
        if any(c in s for c in ',"\n\r'):
            return '"' + s.replace('"', '""') + '"'
        return s
    raise TypeError(f"unexpected value {v!r} ({type(v).__name__})")


def write_csv(path, header, lines):
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(",".join(header) + "\n")
        for line in lines:
            fh.write(line + "\n")


# ---------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gen-orders", default=DEFAULT_GEN, help=f"path of gen_orders.py (default {DEFAULT_GEN})")
    p.add_argument("--reuse-input", action="store_true", help="keep the committed input/ instead of regenerating it")
    p.add_argument("--cases", default=None, help="comma-separated subset of the cases (default: all)")
    p.add_argument("--work", default=None, help="scratch folder (default: a new temporary folder, removed at the end)")
    return p.parse_args(argv)


def generate_input(gen, input_dir):
    if not os.path.isfile(gen):
        sys.exit(f"gen_orders.py not found at {gen}: pass --gen-orders")
    scratch = tempfile.mkdtemp(prefix="weir-golden-gen-")
    try:
        out = os.path.join(scratch, "orders")
        subprocess.run([sys.executable, gen, *GEN_ARGS, "--out", out,
                        "--customers-out", os.path.join(scratch, "customers.json")],
                       check=True, stdout=subprocess.DEVNULL)
        with open(out + ".manifest.json") as fh:
            manifest = json.load(fh)
        manifest.pop("seconds", None)  # wall time: would make the file differ on every run
        if os.path.exists(input_dir):
            shutil.rmtree(input_dir)
        shutil.copytree(out, input_dir)
        with open(os.path.join(HERE, "input.manifest.json"), "w", encoding="utf-8", newline="\n") as fh:
            json.dump(manifest, fh, indent=1)
            fh.write("\n")
    finally:
        shutil.rmtree(scratch)


def stage_input(input_dir, dest):
    """Copies the input files and sets mtime = MTIME_BASE + index in name order (as the Rust test)."""
    os.makedirs(dest)
    names = sorted(n for n in os.listdir(input_dir) if n.endswith(".json"))
    for i, name in enumerate(names):
        target = os.path.join(dest, name)
        shutil.copyfile(os.path.join(input_dir, name), target)
        os.utime(target, (MTIME_BASE + i, MTIME_BASE + i))
    return names


def build_session():
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master("local[2]").appName("weir-golden")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC")
             # Spark pushes a WHERE into the JSON reader, and numInputRows then counts the rows
             # that passed it; Weir's (and Spark's without pushdown) count every row read.
             .config("spark.sql.json.filterPushdown.enabled", "false")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.streaming.numRecentProgressUpdates", "100000")
             .config("spark.driver.extraJavaOptions", "-Duser.timezone=UTC")
             .config("spark.executor.extraJavaOptions", "-Duser.timezone=UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def stream(spark, data_dir):
    return read_stream(spark, SCHEMA_DDL, data_dir)


def text_rows(F, T, df, columns):
    """Collects `df` as rows of canonical CSV fields (columns in `columns` order)."""
    types = {f.name: f.dataType for f in df.schema.fields}
    exprs = []
    for c in columns:
        if c not in types:
            raise KeyError(f"column {c} not in {list(types)}")
        if isinstance(types[c], T.TimestampType):
            exprs.append(F.unix_micros(F.col(c)).alias(c))
        else:
            exprs.append(F.col(c))
    ts_cols = {c for c in columns if isinstance(types[c], T.TimestampType)}
    rows = []
    for r in df.select(*exprs).collect():
        rows.append(tuple("" if r[c] is None else fmt_micros(r[c]) if c in ts_cols else fmt_value(r[c])
                          for c in columns))
    return rows


def run_case(spark, F, T, name, case, data_dir, stream_dirs, work):
    emitted = {}  # batch id -> list of rows (tuples of canonical fields)

    def capture(batch_df, batch_id):
        emitted[batch_id] = text_rows(F, T, batch_df, case["columns"])

    if case.get("streams"):
        assert case["streams"] == ["clicks"], case["streams"]
        df = case["query"](stream(spark, data_dir),
                           {"clicks": read_stream(spark, CLICKS_SCHEMA, stream_dirs["clicks"])})
    else:
        df = case["query"](stream(spark, data_dir))
    if case.get("check_columns") and df.columns != case["columns"]:
        raise RuntimeError(f"{name}: Spark's columns are {df.columns}, the case says {case['columns']}")
    q = (df.writeStream.foreachBatch(capture).outputMode(case["mode"])
         .option("checkpointLocation", os.path.join(work, name, "checkpoint"))
         .trigger(availableNow=True).queryName(f"golden_{name}").start())
    q.awaitTermination()
    if q.exception() is not None:
        raise RuntimeError(f"{name}: {q.exception()}")
    progress = [json.loads(p.json) if hasattr(p, "json") else p for p in q.recentProgress]
    return emitted, progress


def write_case(name, case, emitted, progress, spark_info):
    out = os.path.join(HERE, name)
    os.makedirs(out, exist_ok=True)
    cols = case["columns"]
    batch_ids = sorted(emitted)
    lines = {b: sorted(",".join(row) for row in emitted[b]) for b in batch_ids}
    if case["mode"] == "append":
        result = sorted(line for b in batch_ids for line in lines[b])
    elif case["mode"] == "complete":
        result = lines[batch_ids[-1]] if batch_ids else []
    else:  # update: the last row emitted per key
        idx = [cols.index(k) for k in case["keys"]]
        latest = {}
        for b in batch_ids:
            for row in emitted[b]:
                latest[tuple(row[i] for i in idx)] = ",".join(row)
        result = sorted(latest.values())
    write_csv(os.path.join(out, "expected.csv"), cols, result)
    write_csv(os.path.join(out, "batches.csv"), ["batch_id", *cols],
              [f"{b},{line}" for b in batch_ids for line in lines[b]])
    prog = []
    for p in progress:
        wm = (p.get("eventTime") or {}).get("watermark")
        if wm is not None:
            # "2024-03-01T00:00:59.775Z" -> canonical form
            t = dt.datetime.strptime(wm, "%Y-%m-%dT%H:%M:%S.%fZ")
            wm = fmt_micros((t - EPOCH) // dt.timedelta(microseconds=1))
        prog.append(f"{p['batchId']},{p['numInputRows']},{wm or ''}")
    write_csv(os.path.join(out, "progress.csv"), ["batch_id", "input_rows", "watermark"], prog)
    with open(os.path.join(out, "pipeline.toml"), "w", encoding="utf-8", newline="\n") as fh:
        fh.write(pipeline_toml(name, case, spark_info))
    return len(result), sum(len(v) for v in emitted.values()), len(progress)


def sha256_file(path):
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def input_hashes(input_dir):
    """{file name: sha256} of the input files, and one digest of them all: the SHA-256 of the
    ``sha256sum`` listing ("<hex>  <name>\\n" per file, in name order), as the Rust test computes it."""
    files = {n: sha256_file(os.path.join(input_dir, n))
             for n in sorted(os.listdir(input_dir)) if n.endswith(".json")}
    listing = "".join(f"{h}  {n}\n" for n, h in files.items())
    return files, hashlib.sha256(listing.encode()).hexdigest()


def record_hashes(name, case, input_dir, versions):
    """Updates ``hashes.json`` for one case just written (other cases' entries are kept)."""
    try:
        with open(HASHES, encoding="utf-8") as fh:
            hashes = json.load(fh)
    except FileNotFoundError:
        hashes = {}
    files, digest = input_hashes(input_dir)
    table_files, table_digest = input_hashes(CUSTOMERS_DIR) if os.path.isdir(CUSTOMERS_DIR) else ({}, None)
    hashes["about"] = ("Written by make_golden.py after each case; tests/tests/golden.rs checks it. "
                       "Never edit the golden files or this one by hand: rerun make_golden.py.")
    hashes["input"] = files
    # The static tables' files, per table (folder `input_<table>/`).
    hashes["tables"] = {"customers": table_files}
    # The other streams' files, per stream (folder `input_<stream>/`, file i staged with input/ file i).
    stream_inputs = {s: input_hashes(d) for s, d in STREAMS_DIRS.items() if os.path.isdir(d)}
    if stream_inputs:
        hashes["streams"] = {s: files_ for s, (files_, _) in stream_inputs.items()}
    cases_ = hashes.setdefault("cases", {})
    cases_[name] = {
        "mode": case["mode"], "keys": case["keys"], **versions, "input": digest,
        "files": {f: sha256_file(os.path.join(HERE, name, f)) for f in CASE_FILES},
    }
    if case.get("tables"):
        assert case["tables"] == ["customers"], case["tables"]
        cases_[name]["tables"] = {"customers": table_digest}
    if case.get("streams"):
        cases_[name]["streams"] = {s: stream_inputs[s][1] for s in case["streams"]}
    hashes["cases"] = dict(sorted(cases_.items()))
    with open(HASHES, "w", encoding="utf-8", newline="\n") as fh:
        json.dump(hashes, fh, indent=1, sort_keys=True)
        fh.write("\n")


def streams_toml(case):
    """The `[[source]]` of each other stream of a case (before the orders'), with its watermark."""
    if not case.get("streams"):
        return ""
    assert case["streams"] == ["clicks"], case["streams"]
    return f"""[[source]]
name = "clicks"
kind = "files"
path = "../{os.path.basename(CLICKS_DIR)}"
format = "json"
schema = "{CLICKS_SCHEMA}"
max_files_per_trigger = 1
on_malformed = "permissive"
watermark = {{ column = "clicked_at", delay = "{WATERMARK}" }}

"""


def pipeline_toml(name, case, spark_info):
    # A case with several streams gives each source its watermark (no top-level [watermark]).
    orders_watermark = (f'watermark = {{ column = "occurred_at", delay = "{WATERMARK}" }}\n'
                        if case.get("streams") else "")
    return f"""# Golden case `{name}`, generated by tests/golden/make_golden.py: edit the script, not this file.
# Spark {spark_info}: {case["about"]}.
# The paths below are relative to this file; tests/tests/golden.rs overrides them with --set.
[query]
name = "golden_{name}"
checkpoint = "../work/{name}/checkpoint"
trigger = "available-now"
output_mode = "{case["mode"]}"
state_store = "{case["state_store"]}"
state_partitions = 2

{streams_toml(case)}[[source]]
name = "orders"
kind = "files"
path = "../input"
format = "json"
schema = "{SCHEMA_DDL}"
max_files_per_trigger = 1
on_malformed = "permissive"
{orders_watermark}
{case["weir"]}
[sink]
kind = "files"
path = "../work/{name}/out"
format = "csv"
"""


def check_refusals(spark, F, data_dir, work):
    """Queries Spark refuses on a stream; the golden tests have no case for them."""
    found = {}
    try:
        q = (stream(spark, data_dir).groupBy("status").agg(F.countDistinct("customer_id").alias("customers"))
             .writeStream.foreachBatch(lambda d, b: None).outputMode("complete")
             .option("checkpointLocation", os.path.join(work, "refused_distinct"))
             .trigger(availableNow=True).start())
        q.awaitTermination()
        found["count_distinct"] = "accepted"
    except Exception as e:  # AnalysisException
        found["count_distinct"] = str(e).splitlines()[0][:300]
    return found


def main(argv=None):
    a = parse_args(argv)
    os.environ["TZ"] = "UTC"
    input_dir = os.path.join(HERE, "input")

    # Both checks before anything is written.
    import pyspark
    from pyspark.sql import functions as F, types as T
    if pyspark.__version__ != PYSPARK_VERSION:
        sys.exit(f"pyspark {pyspark.__version__} found, the goldens come from pyspark {PYSPARK_VERSION} "
                 f"(the version shared/bench measures): pip install 'pyspark=={PYSPARK_VERSION}'")
    all_cases = cases(F)
    chosen = a.cases.split(",") if a.cases else list(all_cases)
    unknown = [c for c in chosen if c not in all_cases]
    if unknown:
        sys.exit(f"unknown cases {unknown}; the cases are {list(all_cases)}")

    if not a.reuse_input:
        generate_input(a.gen_orders, input_dir)
    if not a.reuse_input or not os.path.isdir(CUSTOMERS_DIR):
        generate_customers(CUSTOMERS_DIR)
    if not a.reuse_input or not os.path.isdir(CLICKS_DIR):
        generate_clicks(input_dir, CLICKS_DIR)

    work = a.work or tempfile.mkdtemp(prefix="weir-golden-")
    try:
        data_dir = os.path.join(work, "input")
        if os.path.exists(data_dir):
            shutil.rmtree(data_dir)
        names = stage_input(input_dir, data_dir)
        # The other streams: file i with the mtime of input/ file i (so one of each per batch).
        stream_dirs = {}
        for s, folder in STREAMS_DIRS.items():
            stream_dirs[s] = os.path.join(work, os.path.basename(folder))
            if os.path.exists(stream_dirs[s]):
                shutil.rmtree(stream_dirs[s])
            if len(stage_input(folder, stream_dirs[s])) != len(names):
                sys.exit(f"{folder} must hold as many files as {input_dir}")
        spark = build_session()
        java = spark.sparkContext._jvm.java.lang.System.getProperty("java.version")
        spark_info = f"{pyspark.__version__} (Java {java})"
        summary = {}
        for name in chosen:
            case = all_cases[name]
            emitted, progress = run_case(spark, F, T, name, case, data_dir, stream_dirs, work)
            rows, emitted_rows, batches = write_case(name, case, emitted, progress, spark_info)
            record_hashes(name, case, input_dir, {"pyspark": pyspark.__version__, "java": java})
            summary[name] = {"mode": case["mode"], "expected_rows": rows, "emitted_rows": emitted_rows,
                             "batches": batches}
            print(f"{name}: {case['mode']}, {batches} batches, {emitted_rows} rows emitted, "
                  f"{rows} expected rows", flush=True)
        refusals = check_refusals(spark, F, data_dir, work)
        print(f"refused by Spark: {refusals}", flush=True)
        spark.stop()
        info = {
            "pyspark": pyspark.__version__, "java": java, "python": platform.python_version(),
            "master": "local[2]", "spark.sql.shuffle.partitions": 2, "spark.sql.session.timeZone": "UTC",
            "spark.sql.json.filterPushdown.enabled": False,
            "maxFilesPerTrigger": 1, "trigger": "availableNow", "schema": SCHEMA_DDL, "mode": "PERMISSIVE",
            "gen_orders_args": GEN_ARGS, "input_files": names, "mtime_base": MTIME_BASE,
            "refused_by_spark": refusals,
            "tables": {"customers": customers_summary()},
            "streams": {"clicks": clicks_summary()},
        }
        if not a.cases:
            info["cases"] = summary
            with open(os.path.join(HERE, "spark.json"), "w", encoding="utf-8", newline="\n") as fh:
                json.dump(info, fh, indent=1)
                fh.write("\n")
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
