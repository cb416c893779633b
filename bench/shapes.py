"""The anchors of `hindsight-bench shapes`: one NDJSON file of price ticks
(the ingest wire format) rolled into one table per resolution by DuckDB or
by ClickHouse (chdb, MergeTree), durably in a fresh directory.

    python bench/shapes.py duckdb|clickhouse FILE DIR

Prints one JSON object: the seconds from opening the database to the
tables being on disk (interpreter start and imports not counted), and what
`hindsight-bench` checks against Hindsight's own buckets: per resolution the
rows and the ticks they hold, and the busiest token's 1h averages.

Each engine keeps what Hindsight keeps, so the bytes compare like for like:
every tick (token, time in Unix milliseconds, `p`), which Hindsight serves at
`resolution=tick`, sorted by token and time as Hindsight's tick table is;
and per resolution a table of buckets holding what Hindsight's price
buckets hold: token, bucket start, sum and count of `p`, and the candle
(open and close with their times, high, low). Hindsight also keeps its
event log; the engines keep nothing of the file but these tables.
"""

import json
import os
import sys
import time

# Hindsight's resolutions (schemas/src/resolution.rs) and their widths in ms.
RESOLUTIONS = [
    ("1m", 60_000),
    ("5m", 300_000),
    ("10m", 600_000),
    ("15m", 900_000),
    ("1h", 3_600_000),
    ("6h", 21_600_000),
    ("1d", 86_400_000),
]

# The busiest token (most ticks; the smallest id on a tie) and its 1h rows.
BUSIEST = "SELECT token_id FROM prices_1d GROUP BY token_id ORDER BY sum(count) DESC, token_id LIMIT 1"


def table(res):
    return f"prices_{res}"


def duckdb_run(path, out):
    import duckdb

    db = os.path.join(out, "bench.duckdb")
    started = time.perf_counter()
    con = duckdb.connect(db)
    con.execute(
        f"""CREATE TABLE ticks AS
            SELECT token_id, CAST(round(ts * 1000) AS BIGINT) AS ms, p
            FROM read_json('{path}', format = 'newline_delimited',
                 columns = {{'kind': 'VARCHAR', 'token_id': 'VARCHAR', 'ts': 'DOUBLE', 'p': 'DOUBLE'}})
            WHERE kind = 'price' ORDER BY token_id, ms"""
    )
    for res, width in RESOLUTIONS:
        con.execute(
            f"""CREATE TABLE {table(res)} AS
                SELECT token_id, ms // {width} * {width} AS bucket, sum(p) AS sum, count(*) AS count,
                       min(ms) AS open_ms, arg_min(p, ms) AS open, max(ms) AS close_ms,
                       arg_max(p, ms) AS close, max(p) AS high, min(p) AS low
                FROM ticks GROUP BY ALL"""
        )
    con.execute("CHECKPOINT")
    secs = time.perf_counter() - started

    def query(sql):
        return con.execute(sql).fetchall()

    return secs, query


def clickhouse_run(path, out):
    from chdb import session

    started = time.perf_counter()
    s = session.Session(os.path.join(out, "chdb"))
    s.query("CREATE DATABASE bench")
    s.query(
        "CREATE TABLE bench.ticks (token_id String, ms Int64, p Float64) ENGINE = MergeTree ORDER BY (token_id, ms)"
    )
    s.query(
        f"""INSERT INTO bench.ticks
            SELECT token_id, toInt64(round(ts * 1000)), p
            FROM file('{path}', 'JSONEachRow', 'kind String, token_id String, ts Float64, p Float64')
            WHERE kind = 'price'"""
    )
    for res, width in RESOLUTIONS:
        s.query(
            f"""CREATE TABLE bench.{table(res)}
                (token_id String, bucket Int64, sum Float64, count UInt64,
                 open_ms Int64, open Float64, close_ms Int64, close Float64, high Float64, low Float64)
                ENGINE = MergeTree ORDER BY (token_id, bucket)"""
        )
        s.query(
            f"""INSERT INTO bench.{table(res)}
                SELECT token_id, intDiv(ms, {width}) * {width} AS bucket, sum(p), count(),
                       min(ms), argMin(p, ms), max(ms), argMax(p, ms), max(p), min(p)
                FROM bench.ticks GROUP BY token_id, bucket"""
        )
    secs = time.perf_counter() - started

    def query(sql):
        s.query("USE bench")
        return json.loads(str(s.query(sql, "JSONCompact")))["data"]

    return secs, query


def main():
    engine, path, out = sys.argv[1:4]
    run = {"duckdb": duckdb_run, "clickhouse": clickhouse_run}[engine]
    secs, query = run(os.path.abspath(path), out)
    rows = {}
    for res, _ in RESOLUTIONS:
        n, ticks = query(f"SELECT count(*), sum(count) FROM {table(res)}")[0]
        rows[res] = [int(n), int(ticks)]
    busiest = query(BUSIEST)[0][0]
    hourly = query(
        f"SELECT bucket, sum / count FROM {table('1h')} WHERE token_id = '{busiest}' ORDER BY bucket"
    )
    print(
        json.dumps(
            {
                "secs": secs,
                "rows": rows,
                "busiest": busiest,
                "hourly": [[int(b), float(p)] for b, p in hourly],
            }
        )
    )


if __name__ == "__main__":
    main()
