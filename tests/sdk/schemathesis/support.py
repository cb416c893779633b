"""What tests/sdk/run.sh does around schemathesis.

  support.py seed INGEST API DATASET
                                 feeds DATASET (NDJSON) through the ingest
                                 service at INGEST and waits until the API
                                 at API serves all of it
  support.py exports API DATASET
                                 downloads every token's prices and books and
                                 every market's metrics of DATASET from
                                 /v1/export as Parquet (read with pyarrow) and
                                 CSV, and compares each row with the paged
                                 /v1 history routes
  support.py report NDJSON       prints, per operation, the cases schemathesis
                                 ran and the statuses they got (from its
                                 `--report ndjson` events); fails when an
                                 operation never got a 2xx answer, i.e. never
                                 reached its handler's data, or when one whose
                                 parameters the document gives examples for
                                 was not run in the examples phase

Environment: HINDSIGHT_INGEST_TOKEN, HINDSIGHT_KEY_ENTERPRISE.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections import Counter, defaultdict
from urllib.parse import urlsplit

import csv
import io
import httpx


def seed(ingest: str, url: str, dataset: str) -> None:
    with open(dataset, "rb") as f:
        body = f.read()
    lines = [json.loads(line) for line in body.splitlines() if line.strip()]
    r = httpx.post(
        f"{ingest}/ingest/v1/events",
        content=body,
        headers={"Authorization": f"Bearer {os.environ['HINDSIGHT_INGEST_TOKEN']}"},
        timeout=60,
    )
    answer = r.json()
    if r.status_code != 200 or answer["accepted"] != len(lines) or answer["rejected_count"]:
        sys.exit(f"seeding {dataset}: {r.status_code} {r.text}")
    # Projected and in the API's catalog: every market answers, and every
    # token serves as many price and book points as the dataset holds.
    points: dict[tuple[str, str], set[int]] = defaultdict(set)
    markets = [line["id"] for line in lines if line["kind"] == "market"]
    for line in lines:
        if line["kind"] in ("price", "book"):
            points[(line["kind"], line["token_id"])].add(line["ts"] // 60 * 60)
    start, end = min(min(v) for v in points.values()), max(max(v) for v in points.values()) + 60
    headers = {"X-API-Key": os.environ["HINDSIGHT_KEY_ENTERPRISE"]}

    def served() -> bool:
        for market in markets:
            if httpx.get(f"{url}/v1/markets/{market}", headers=headers).status_code != 200:
                return False
        for (kind, token), minutes in points.items():
            route = "prices" if kind == "price" else "books"
            r = httpx.get(
                f"{url}/v1/tokens/{token}/{route}",
                params={"start_ts": start, "end_ts": end, "resolution": "1m", "limit": 200},
                headers=headers,
            )
            if r.status_code != 200 or len(r.json()["data"]) != len(minutes):
                return False
        return True

    # The distributed deployment projects through Kafka into Cassandra.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if served():
            print(f"seeded {len(lines)} events of {dataset}: {len(markets)} markets, "
                  f"{len({t for _, t in points})} tokens, served")
            return
        time.sleep(0.1)
    sys.exit(f"{dataset} was accepted but not served within 60 s")


def pages(url: str, path: str, params: dict, headers: dict) -> list[dict]:
    """Every point of a history route, following `next_cursor`."""
    out, cursor = [], None
    while True:
        query = dict(params, limit=200, **({"cursor": cursor} if cursor else {}))
        r = httpx.get(f"{url}{path}", params=query, headers=headers, timeout=60)
        r.raise_for_status()
        body = r.json()
        out.extend(body["data"])
        cursor = body["metadata"].get("next_cursor")
        if not cursor:
            return out


def exports(url: str, dataset: str) -> None:
    import pyarrow.parquet as pq

    with open(dataset, "rb") as f:
        lines = [json.loads(line) for line in f.read().splitlines() if line.strip()]
    times = [line["ts"] for line in lines if "ts" in line]
    span = {"start_ts": min(times) // 60 * 60, "end_ts": max(times) // 60 * 60 + 60}
    headers = {"X-API-Key": os.environ["HINDSIGHT_KEY_ENTERPRISE"]}
    tokens = sorted({line["token_id"] for line in lines if line["kind"] in ("price", "book")})
    markets = sorted({line["market_id"] for line in lines if line["kind"] == "metrics"})
    checked = Counter()

    def download(kind: str, fmt: str, **series) -> bytes:
        # Trades take no resolution (one given is ignored).
        r = httpx.get(f"{url}/v1/export/{kind}", params=dict(span, resolution="1m", format=fmt, **series),
                      headers=headers, timeout=60)
        if r.status_code != 200:
            sys.exit(f"export {kind} {series}: {r.status_code} {r.text}")
        return r.content

    def millis(iso: str) -> int:
        from datetime import datetime
        return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)

    for token in tokens:
        for kind, fields in (("prices", ["p"]), ("books", ["bids", "asks"])):
            want = pages(url, f"/v1/tokens/{token}/{kind}", dict(span, resolution="1m"), headers)
            want = [(millis(p["t"]), *[p[f] for f in fields]) for p in want]
            table = pq.read_table(io.BytesIO(download(kind, "parquet", token_id=token)),
                                  use_threads=False).to_pylist()
            got = [(int(row["t"].timestamp() * 1000),
                    *[row[f] if kind == "prices" else json.loads(row[f]) for f in fields]) for row in table]
            if got != want:
                sys.exit(f"{kind} of {token}: the Parquet export differs from the pages")
            rows = list(csv.DictReader(io.StringIO(download(kind, "csv", token_id=token).decode())))
            got = [(millis(row["t"]), *[float(row[f]) if kind == "prices" else json.loads(row[f]) for f in fields])
                   for row in rows]
            if got != want:
                sys.exit(f"{kind} of {token}: the CSV export differs from the pages")
            checked[kind] += len(want)
    for market in markets:
        fields = ["volume", "liquidity", "spread"]
        want = pages(url, f"/v1/markets/{market}/metrics", dict(span, resolution="1m"), headers)
        want = [(millis(p["t"]), *[p[f] for f in fields]) for p in want]
        table = pq.read_table(io.BytesIO(download("metrics", "parquet", market_id=market)),
                              use_threads=False).to_pylist()
        got = [(int(row["t"].timestamp() * 1000), *[row[f] for f in fields]) for row in table]
        if got != want:
            sys.exit(f"metrics of {market}: the Parquet export differs from the pages")
        checked["metrics"] += len(want)
    # Candles (with their trades' volume and count) against the candle
    # pages, and trades against the trades pages: Parquet and CSV.
    def cell(text: str, kind):
        return None if text == "" else kind(text)

    candle_fields = ["o", "h", "l", "c", "n", "volume", "trades"]
    candle_kinds = [float, float, float, float, int, float, int]
    for token in tokens:
        want = pages(url, f"/v1/tokens/{token}/candles", dict(span, resolution="1m"), headers)
        want = [(millis(p["t"]), *[p.get(f) for f in candle_fields]) for p in want]
        table = pq.read_table(io.BytesIO(download("candles", "parquet", token_id=token)),
                              use_threads=False).to_pylist()
        got = [(int(row["t"].timestamp() * 1000), *[row[f] for f in candle_fields]) for row in table]
        if got != want:
            sys.exit(f"candles of {token}: the Parquet export differs from the pages")
        rows = list(csv.DictReader(io.StringIO(download("candles", "csv", token_id=token).decode())))
        got = [(millis(row["t"]), *[cell(row[f], k) for f, k in zip(candle_fields, candle_kinds)])
               for row in rows]
        if got != want:
            sys.exit(f"candles of {token}: the CSV export differs from the pages")
        checked["candles"] += len(want)
        checked["candles with trades"] += sum(1 for p in want if p[-1] is not None)
    trade_tokens = sorted({line["token_id"] for line in lines if line["kind"] == "trade"})
    trade_fields = ["price", "size", "side", "trade_id"]
    trade_kinds = [float, float, str, str]
    for token in trade_tokens:
        want = pages(url, f"/v1/tokens/{token}/trades", span, headers)
        want = [(millis(p["t"]), *[p.get(f) for f in trade_fields]) for p in want]
        table = pq.read_table(io.BytesIO(download("trades", "parquet", token_id=token)),
                              use_threads=False).to_pylist()
        got = [(int(row["t"].timestamp() * 1000), *[row[f] for f in trade_fields]) for row in table]
        if got != want:
            sys.exit(f"trades of {token}: the Parquet export differs from the pages")
        rows = list(csv.DictReader(io.StringIO(download("trades", "csv", token_id=token).decode())))
        got = [(millis(row["t"]), *[cell(row[f], k) for f, k in zip(trade_fields, trade_kinds)])
               for row in rows]
        if got != want:
            sys.exit(f"trades of {token}: the CSV export differs from the pages")
        checked["trades"] += len(want)
    if not all(checked[k] for k in ("prices", "books", "metrics", "candles", "candles with trades", "trades")):
        sys.exit(f"the dataset exported nothing to compare: {dict(checked)}")
    print(f"exports equal the pages, row for row (pyarrow {__import__('pyarrow').__version__}): "
          f"{checked['prices']} prices and {checked['books']} books of {len(tokens)} tokens "
          f"(Parquet and CSV), {checked['metrics']} metrics of {len(markets)} markets (Parquet), "
          f"{checked['candles']} candles ({checked['candles with trades']} with trades) and "
          f"{checked['trades']} trades (Parquet and CSV)")
    # Every comparison passed (each failure above exits with its reason).
    # End here, without the interpreter's teardown: pyarrow's thread pools
    # can abort it ("terminate called without an active exception", seen
    # once in CI after this line had printed), which would fail a check
    # that passed.
    sys.stdout.flush()
    os._exit(0)


def report(path: str, spec: str) -> None:
    """Per operation: cases and statuses. `spec` is the OpenAPI document,
    whose paths name the operations (request paths are matched to them)."""
    with open(spec) as f:
        document = json.load(f)
    templates = []
    # Operations with a parameter example, which the examples phase sends.
    exemplified = set()
    for template, item in document["paths"].items():
        pattern = "^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)) + "$"
        for method, op in item.items():
            templates.append((re.compile(pattern), method.upper(), op["operationId"]))
            if any("example" in p for p in op.get("parameters", [])):
                exemplified.add(op["operationId"])
    statuses: dict[str, Counter] = {op: Counter() for _, _, op in templates}
    phases: dict[str, Counter] = {op: Counter() for _, _, op in templates}
    with open(path) as f:
        for line in f:
            event = json.loads(line)
            finished = event.get("ScenarioFinished")
            if not finished:
                continue
            phase = finished.get("phase", "?")
            for interaction in finished["recorder"].get("interactions", {}).values():
                request = interaction["request"]
                route = urlsplit(request["uri"]).path
                op = next((o for p, m, o in templates if m == request["method"] and p.match(route)), None)
                if op is None:
                    continue
                response = interaction.get("response") or {}
                statuses[op][response.get("status_code", "no answer")] += 1
                phases[op][phase] += 1
    print(f"{'operation':<16} {'cases':>6}  by phase / by status")
    unreached = []
    for op in sorted(statuses):
        total = sum(statuses[op].values())
        by_phase = ", ".join(f"{p} {n}" for p, n in sorted(phases[op].items()))
        by_status = ", ".join(f"{s}: {n}" for s, n in sorted(statuses[op].items(), key=str))
        print(f"{op:<16} {total:>6}  {by_phase} / {by_status}")
        if not any(isinstance(s, int) and 200 <= s < 300 for s in statuses[op]):
            unreached.append(op)
    print(f"{len(statuses) - len(unreached)} of {len(statuses)} operations answered 2xx, "
          f"{sum(sum(c.values()) for c in statuses.values())} cases in all")
    unexamined = sorted(op for op in exemplified if not phases[op]["examples"])
    if unreached or unexamined:
        sys.exit(
            f"never answered 2xx (the dataset or schemathesis.toml no longer reach them): {unreached}; "
            f"given examples in the document but not run in the examples phase: {unexamined}"
        )


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"seed": seed, "exports": exports, "report": report}[command](*args)
