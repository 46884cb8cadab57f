#!/usr/bin/env python3
"""A DuckDB session driven line by line: each input line is one SQL statement;
each reply is one line of JSON, {"ok": true, "rows": [[...], ...]} or
{"ok": false, "error": "..."}. Values are strings as Cirro's CSV writes them
(NULL as null, true/false). Used by the differential test."""
import json
import sys

import duckdb


def show(value):
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def main():
    con = duckdb.connect()
    for line in sys.stdin:
        sql = line.strip()
        if not sql:
            continue
        try:
            result = con.execute(sql)
            rows = result.fetchall() if result.description else []
            reply = {"ok": True, "rows": [[show(v) for v in row] for row in rows]}
        except Exception as e:  # reported to the test, which fails on it
            reply = {"ok": False, "error": str(e)}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
