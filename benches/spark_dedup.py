#!/usr/bin/env python3
"""Spark's side of deduplication on other keys than ``order_id``.

Runs ``shared/bench/spark_revenue.py --query dedup`` unchanged (its flags, timing, progress and
result files), except that its ``dropDuplicates(["order_id"])`` deduplicates on ``--keys``
instead: for example ``order_id,customer_id`` (a composite key) or ``session_id`` (a string key).

  spark_dedup.py --script SHARED/bench/spark_revenue.py --keys order_id,customer_id \
      -- --query dedup --input ORDERS --work WORK --results RESULTS [...]
"""
import argparse
import runpy
import sys

# The class pyspark 4's classic (non-Connect) sessions return; its method overrides the base's.
from pyspark.sql.classic.dataframe import DataFrame


def main():
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--script", required=True, help="the path of shared/bench/spark_revenue.py")
    p.add_argument("--keys", required=True, help="comma-separated key columns")
    a = p.parse_args(argv[:split])
    keys = [k.strip() for k in a.keys.split(",") if k.strip()]
    drop = DataFrame.dropDuplicates

    def drop_on_keys(self, subset=None):
        if subset != ["order_id"]:
            raise SystemExit(f"spark_dedup.py: expected the script to deduplicate on order_id, not {subset}")
        return drop(self, keys)

    DataFrame.dropDuplicates = drop_on_keys
    sys.argv = [a.script] + argv[split + 1:]
    runpy.run_path(a.script, run_name="__main__")


if __name__ == "__main__":
    main()
