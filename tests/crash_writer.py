"""A writer process for the crash tests: commits batch after batch until killed.

Usage: python crash_writer.py STORE KEYS
Every batch b rewrites all KEYS keys with state {"batch": b} in one commit and
prints "BEGIN b" before and "DONE b" after it.
"""

from __future__ import annotations

import sys

from deltawheel.executor.session import build_spark
from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.rows import KeyRow, interval_of
from deltawheel.statestore.rowtable.store import RowStore
from deltawheel.statestore.session.sparkenv import SparkSettings

N = 4


def main() -> None:
    layout, nkeys = StoreLayout(sys.argv[1]), int(sys.argv[2])
    spark = build_spark(SparkSettings(app_name="crash-writer"))
    store = RowStore(spark, layout, writer="crash")
    seqs = {iv: 1 for iv in range(N)}
    store.fence("crash", seqs)
    codec = get_codec("json")
    b = 0
    while True:
        b += 1
        rows = [KeyRow(computation="crash", key=f"k{i}", interval=interval_of(f"k{i}", N),
                       state=codec.encode({"batch": b}))
                for i in range(nkeys)]
        print(f"BEGIN {b}", flush=True)
        store.commit("crash", rows, sequencers=seqs, num_intervals=N)
        print(f"DONE {b}", flush=True)


if __name__ == "__main__":
    main()
