#!/usr/bin/env python3
"""Read a Delta table with independent implementations and print its rows.

    read_delta.py duckdb TABLE_DIR     DuckDB's delta extension (delta_scan)
    read_delta.py deltalake TABLE_DIR  the deltalake package (its DataFusion reader)

Rows are printed as CSV sorted by every column, so that outputs compare as text.
The DuckDB extension comes from the `duckdb-extension-delta` package and is
loaded from the file the package installs (no download).
"""
import csv
import glob
import os
import sys


def rows_duckdb(table):
    import duckdb
    import duckdb_extension_delta

    pattern = os.path.join(
        os.path.dirname(duckdb_extension_delta.__file__), "extensions", "v*", "delta.duckdb_extension"
    )
    extension = glob.glob(pattern)
    if not extension:
        sys.exit(f"no delta extension file under {pattern}")
    con = duckdb.connect()
    con.execute(f"LOAD '{extension[0]}'")
    result = con.execute(f"SELECT * FROM delta_scan('{table}')")
    names = [d[0] for d in result.description]
    return names, result.fetchall()


def rows_deltalake(table):
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    dt = DeltaTable(table)
    data = pa.table(QueryBuilder().register("t", dt).execute("SELECT * FROM t").read_all())
    return data.column_names, [tuple(r.values()) for r in data.to_pylist()]


def show(value):
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"  # as Cirro's CSV writes them
    return str(value)


def main():
    reader, table = sys.argv[1], sys.argv[2]
    names, rows = {"duckdb": rows_duckdb, "deltalake": rows_deltalake}[reader](table)
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(names)
    for row in sorted([show(v) for v in r] for r in rows):
        out.writerow(row)


if __name__ == "__main__":
    main()
