"""Drives the official Python client (polymarketdata-sdk), unchanged, against a
live Hindsight seeded here with known data, and checks the values it returns.

Environment: HINDSIGHT_URL (the API's base, without /v1), HINDSIGHT_INGEST_URL
(ingest's base; the API's when unset), HINDSIGHT_INGEST_TOKEN, and
keys HINDSIGHT_KEY_ENTERPRISE, HINDSIGHT_KEY_FREE, HINDSIGHT_KEY_TINY (a plan
of 3 requests per minute). Prints one line per check and a closing
"N passed, M failed" line; exits non-zero on any failure.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections import defaultdict

import httpx
import pydantic
from polymarketdata import PolymarketDataClient
from polymarketdata.errors import (
    AuthenticationError,
    BadRequestError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
)

BASE = os.environ["HINDSIGHT_URL"].rstrip("/")
API = BASE + "/v1"
INGEST = os.environ.get("HINDSIGHT_INGEST_URL", BASE).rstrip("/")
INGEST_TOKEN = os.environ["HINDSIGHT_INGEST_TOKEN"]
KEY = os.environ["HINDSIGHT_KEY_ENTERPRISE"]
FREE = os.environ["HINDSIGHT_KEY_FREE"]
TINY = os.environ["HINDSIGHT_KEY_TINY"]

DAY = 1_756_684_800  # 2025-09-01T00:00:00Z
HOURS = 6
FILLERS = 150

results: list[tuple[str, bool]] = []


def check(name):
    def run(fn):
        try:
            fn()
            results.append((name, True))
            print(f"ok    {name}")
        except Exception:  # noqa: BLE001 - report every failure and go on
            results.append((name, False))
            print(f"FAIL  {name}")
            traceback.print_exc()
        return fn

    return run


def iso(secs: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(secs))


def price(i: int) -> float:
    return ((i * 7919) % 1000) / 1000.0


# ---- seed known data through ingest ------------------------------------------
lines = [
    {"kind": "series", "id": "s-pol", "slug": "politics", "title": "Politics", "tags": ["politics"], "updated_at": "2025-08-02T00:00:00Z"},
    {"kind": "series", "id": "s-cry", "slug": "crypto", "title": "Crypto", "tags": ["crypto"], "updated_at": "2025-08-03T00:00:00Z"},
    {"kind": "event", "id": "e-elec", "slug": "election", "series_id": "s-pol", "title": "Election", "tags": ["politics"], "updated_at": "2025-08-02T00:00:00Z"},
    {"kind": "event", "id": "e-btc", "slug": "bitcoin", "series_id": "s-cry", "title": "Bitcoin", "tags": ["crypto"], "updated_at": "2025-08-03T00:00:00Z"},
    {"kind": "market", "id": "m-bin", "slug": "will-it-happen", "event_id": "e-elec", "question": "Will it happen?",
     "description": "A binary market.", "status": "open", "start_date": "2025-08-10T00:00:00Z",
     "tokens": [{"id": "t-yes", "label": "Yes"}, {"id": "t-no", "label": "No"}], "updated_at": "2025-08-20T00:00:00Z"},
    {"kind": "market", "id": "m-multi", "slug": "who-wins", "event_id": "e-elec", "question": "Who wins?", "status": "closed",
     "closed_at": "2025-09-02T00:00:00Z", "resolved_token_id": "t-b",
     "tokens": [{"id": "t-a", "label": "Alice"}, {"id": "t-b", "label": "Bob"}, {"id": "t-c", "label": "Carol"}],
     "updated_at": "2025-08-21T00:00:00Z"},
]
for i in range(FILLERS):
    lines.append({"kind": "market", "id": f"f{i:03}", "slug": f"filler-{i:03}", "event_id": "e-btc",
                  "question": f"Filler market {i}?", "status": "open",
                  "tokens": [{"id": f"f{i:03}-y", "label": "Yes"}], "updated_at": iso(DAY - 86_400 + i)})
ticks: dict[str, list[tuple[int, float]]] = defaultdict(list)
for k in range(HOURS * 120):  # every 30 s for HOURS hours
    t = DAY + k * 30
    p = price(k)
    for token, value in (("t-yes", p), ("t-no", round(1 - p, 6))):
        ticks[token].append((t, value))
        lines.append({"kind": "price", "market_id": "m-bin", "token_id": token, "ts": t, "p": value})
    for j, token in enumerate(("t-a", "t-b", "t-c")):
        value = [0.2, 0.5, 0.3][j]
        ticks[token].append((t, value))
        lines.append({"kind": "price", "market_id": "m-multi", "token_id": token, "ts": t, "p": value})
books: dict[str, list[tuple[int, list, list]]] = defaultdict(list)
for k in range(HOURS * 6):  # every 10 min
    t = DAY + k * 600 + 17
    bid = round(0.30 + (k % 10) / 100, 2)
    for token in ("t-yes", "t-no"):
        snapshot = (t, [[bid, 100.0 + k], [round(bid - 0.01, 2), 5.0]], [[round(bid + 0.02, 2), 50.0]])
        books[token].append(snapshot)
        lines.append({"kind": "book", "market_id": "m-bin", "token_id": token, "ts": t, "bids": snapshot[1], "asks": snapshot[2]})
metrics: list[tuple[int, float, float, float]] = []
for k in range(HOURS * 12):  # every 5 min
    t = DAY + k * 300
    sample = (t, 1000.0 + k * 10, 500.0 + (k % 7), 0.01 * (1 + k % 3))
    metrics.append(sample)
    lines.append({"kind": "metrics", "market_id": "m-bin", "ts": t, "volume": sample[1], "liquidity": sample[2], "spread": sample[3]})

body = "\n".join(json.dumps(line) for line in lines)
r = httpx.post(INGEST + "/ingest/v1/events", content=body, headers={"Authorization": f"Bearer {INGEST_TOKEN}"}, timeout=60)
assert r.status_code == 200 and r.json()["rejected_count"] == 0, r.text
print(f"seeded {r.json()['accepted']} events")


def expected_avg(points, width):
    sums = defaultdict(lambda: [0.0, 0])
    for t, v in points:
        b = sums[t // width * width]
        b[0] += v
        b[1] += 1
    return [(iso(b), s / n) for b, (s, n) in sorted(sums.items())]


def expected_last(snaps, width):
    last = {}
    for t, bids, asks in snaps:
        last[t // width * width] = (bids, asks)
    return [(iso(b), v) for b, v in sorted(last.items())]


client = PolymarketDataClient(api_key=KEY, base_url=API, max_retries=0)
START, END = DAY, DAY + HOURS * 3600

# Wait until everything is projected: the bucket of each market's last
# line. A market's events share one log partition, folded in order, but on
# Kafka the partitions are projected apart: m-multi's last price says
# nothing of m-bin, whose last line is its last metrics sample.
deadline = time.time() + 60
while True:
    try:
        last_price = client.history.get_token_prices("t-c", start_ts=END - 60, end_ts=END, resolution="1m")
        last_metrics = client.history.get_market_metrics("m-bin", start_ts=END - 300, end_ts=END, resolution="5m")
        markets = client.discovery.list_markets(limit=1000)
        if len(last_price.data) == 1 and len(last_metrics.data) == 1 and len(markets.data) == FILLERS + 2:
            break
    except NotFoundError:
        pass
    assert time.time() < deadline, "seeded data never became visible"
    time.sleep(0.1)


def close(a: float, b: float) -> bool:
    return abs(a - b) < 1e-9


# ---- utility -------------------------------------------------------------------
@check("health")
def _():
    h = client.utility.health()
    assert h.status == "ok" and h.timestamp and h.meta.request_id


@check("usage (SPEC.md wins: max_history_days is an integer, reset_at null on unlimited plans)")
def _():
    # The client declares max_history_days a string and reset_at an integer;
    # SPEC.md §2.7 says integer and "null on unlimited plans". Hindsight
    # follows SPEC, so the client's model rejects exactly those fields.
    try:
        client.utility.usage()
        raise AssertionError("the client accepted a SPEC-shaped usage response")
    except pydantic.ValidationError as e:
        fields = sorted(".".join(map(str, err["loc"])) for err in e.errors())
        assert fields == ["limits.max_history_days", "reset_at"], fields
    raw = httpx.get(API + "/usage", headers={"X-API-Key": KEY}).json()
    assert raw["plan"] == "enterprise" and raw["reset_at"] is None
    assert raw["limits"]["granularity_allowed"] == "tick" and raw["limits"]["data_points"]["books"] is True
    free = httpx.get(API + "/usage", headers={"X-API-Key": FREE})
    u = free.json()
    assert u["plan"] == "free" and u["limits"]["requests_per_minute"] == 60
    assert u["limits"]["max_history_days"] == 30 and u["limits"]["granularity_allowed"] == "1h"
    assert u["limits"]["data_points"] == {"metrics": True, "prices": True, "books": False, "trades": False}
    assert int(free.headers["x-ratelimit-remaining"]) == u["limits"]["requests_remaining"]
    assert isinstance(u["reset_at"], int)


# ---- discovery -----------------------------------------------------------------
@check("list_series / search / tags filter")
def _():
    page = client.discovery.list_series()
    assert [s.id for s in page.data] == ["s-cry", "s-pol"], "updated_at desc"
    assert page.metadata.count == 2 and page.metadata.next_cursor is None
    assert [s.slug for s in client.discovery.list_series(search="CRYP").data] == ["crypto"]
    assert [s.id for s in client.discovery.list_series(tags=["politics"]).data] == ["s-pol"]


@check("list_events by series_id and series_slug")
def _():
    assert [e.id for e in client.discovery.list_events(series_id="s-pol").data] == ["e-elec"]
    events = client.discovery.list_events(series_slug="crypto").data
    assert [e.id for e in events] == ["e-btc"] and events[0].tags == ["crypto"]


@check("list_markets by event, search, sort and order")
def _():
    page = client.discovery.list_markets(event_id="e-elec")
    assert [m.id for m in page.data] == ["m-multi", "m-bin"]
    assert [t.label for t in page.data[0].tokens] == ["Alice", "Bob", "Carol"]
    found = client.discovery.list_markets(search="WILL IT")
    assert [m.id for m in found.data] == ["m-bin"]
    asc = client.discovery.list_markets(event_slug="bitcoin", sort="updated_at", order="asc", limit=3)
    assert [m.id for m in asc.data] == ["f000", "f001", "f002"] and asc.metadata.next_cursor


@check("get_market by id and by slug")
def _():
    for key in ("m-multi", "who-wins"):
        m = client.discovery.get_market(key).market
        assert m.id == "m-multi" and m.slug == "who-wins" and m.status == "closed"
        assert m.resolved_token_id == "t-b" and m.resolved_token_label == "Bob"
        assert m.closed_at == "2025-09-02T00:00:00Z"
        assert [(t.id, t.label) for t in m.tokens] == [("t-a", "Alice"), ("t-b", "Bob"), ("t-c", "Carol")]
    assert client.discovery.get_market("m-bin").market.description == "A binary market."


@check("list_tags")
def _():
    tags = client.discovery.list_tags()
    assert tags.count == 2 and tags.data == ["crypto", "politics"]


@check("iter_markets / iter_series / iter_events across several pages")
def _():
    ids = [m.id for m in client.discovery.iter_markets(page_size=40)]
    assert len(ids) == FILLERS + 2 and len(set(ids)) == len(ids), len(ids)
    assert [m.id for m in client.discovery.iter_markets(event_slug="bitcoin", page_size=7, max_items=20)] == \
        [f"f{i:03}" for i in range(FILLERS - 1, FILLERS - 21, -1)]
    assert [s.id for s in client.discovery.iter_series(page_size=1)] == ["s-cry", "s-pol"]
    assert [e.id for e in client.discovery.iter_events(page_size=1)] == ["e-btc", "e-elec"]


# ---- history -------------------------------------------------------------------
@check("get_token_prices: 1h averages, chronological")
def _():
    r = client.history.get_token_prices("t-yes", start_ts=START, end_ts=END, resolution="1h")
    assert (r.market_id, r.token_id, r.token_label, r.resolution) == ("m-bin", "t-yes", "Yes", "1h")
    want = expected_avg(ticks["t-yes"], 3600)
    assert [p.t for p in r.data] == [t for t, _ in want]
    assert all(close(p.p, v) for p, (_, v) in zip(r.data, want))
    assert r.metadata.count == HOURS and r.metadata.next_cursor is None


@check("iter_token_prices: 1m across pages")
def _():
    points = list(client.history.iter_token_prices("t-no", start_ts=iso(START), end_ts=iso(END), resolution="1m", page_size=100))
    want = expected_avg(ticks["t-no"], 60)
    assert len(points) == len(want) == HOURS * 60
    assert all(p.t == t and close(p.p, v) for p, (t, v) in zip(points, want))


@check("get_market_prices: tokens label map and data keyed by label")
def _():
    r = client.history.get_market_prices("who-wins", start_ts=START, end_ts=END, resolution="6h")
    assert r.market_id == "m-multi" and r.tokens == {"Alice": "t-a", "Bob": "t-b", "Carol": "t-c"}
    assert {k: [round(p.p, 9) for p in v] for k, v in r.data.items()} == {"Alice": [0.2], "Bob": [0.5], "Carol": [0.3]}


@check("iter_market_prices_pages: every token, several pages")
def _():
    got = defaultdict(list)
    pages = 0
    for page in client.history.iter_market_prices_pages("m-bin", start_ts=START, end_ts=END, resolution="10m", page_size=10):
        pages += 1
        for label, points in page.data.items():
            got[label].extend((p.t, p.p) for p in points)
    assert pages >= 7, pages
    for label, token in (("Yes", "t-yes"), ("No", "t-no")):
        want = expected_avg(ticks[token], 600)
        assert [t for t, _ in got[label]] == [t for t, _ in want]
        assert all(close(a, b) for (_, a), (_, b) in zip(got[label], want))


@check("get_token_books / iter_token_books: last snapshot per bucket")
def _():
    r = client.history.get_token_books("t-yes", start_ts=START, end_ts=END, resolution="1h")
    want = expected_last(books["t-yes"], 3600)
    assert [(b.t, b.bids, b.asks) for b in r.data] == [(t, bids, asks) for t, (bids, asks) in want]
    all_points = list(client.history.iter_token_books("t-yes", start_ts=START, end_ts=END, resolution="10m", page_size=5))
    assert [b.t for b in all_points] == [t for t, _ in expected_last(books["t-yes"], 600)]


@check("get_market_books / iter_market_books_pages")
def _():
    r = client.history.get_market_books("m-bin", start_ts=START, end_ts=END, resolution="6h")
    assert r.tokens == {"Yes": "t-yes", "No": "t-no"}
    (t, (bids, asks)), = expected_last(books["t-no"], 21_600)
    assert [(b.t, b.bids, b.asks) for b in r.data["No"]] == [(t, bids, asks)]
    labels = set()
    count = 0
    for page in client.history.iter_market_books_pages("m-bin", start_ts=START, end_ts=END, resolution="1h", page_size=4):
        labels |= set(page.data)
        count += sum(len(v) for v in page.data.values())
    assert labels == {"Yes", "No"} and count == 2 * HOURS


@check("get_market_metrics / iter_market_metrics: averages")
def _():
    r = client.history.get_market_metrics("m-bin", start_ts=START, end_ts=END, resolution="1h")
    for field, i in (("volume", 1), ("liquidity", 2), ("spread", 3)):
        want = expected_avg([(m[0], m[i]) for m in metrics], 3600)
        assert all(close(getattr(p, field), v) and p.t == t for p, (t, v) in zip(r.data, want)), field
    assert len(list(client.history.iter_market_metrics("m-bin", start_ts=START, end_ts=END, resolution="5m", page_size=25))) == HOURS * 12


# ---- error classes -----------------------------------------------------------------
@check("401 AuthenticationError")
def _():
    bad = PolymarketDataClient(api_key="hsk_wrong", base_url=API, max_retries=0)
    try:
        bad.utility.health()
        raise AssertionError("no error")
    except AuthenticationError as e:
        assert e.status_code == 401 and "Invalid or expired API key" in str(e)


@check("403 PermissionDeniedError")
def _():
    free = PolymarketDataClient(api_key=FREE, base_url=API, max_retries=0)
    try:
        free.history.get_token_books("t-yes", start_ts=int(time.time()) - 86_400, end_ts=int(time.time()), resolution="1h")
        raise AssertionError("no error")
    except PermissionDeniedError as e:
        assert e.status_code == 403 and "does not allow historical order books" in str(e)


@check("404 NotFoundError")
def _():
    try:
        client.discovery.get_market("no-such-market")
        raise AssertionError("no error")
    except NotFoundError as e:
        assert e.status_code == 404


@check("400 BadRequestError")
def _():
    try:
        client.history.get_token_prices("t-yes", start_ts=START, end_ts=END, resolution="1h", cursor="forged")
        raise AssertionError("no error")
    except BadRequestError as e:
        assert e.status_code == 400 and "Invalid pagination cursor" in str(e)


@check("429 RateLimitError")
def _():
    tiny = PolymarketDataClient(api_key=TINY, base_url=API, max_retries=0)
    if time.time() % 60 > 55:
        time.sleep(61 - time.time() % 60)
    for _ in range(3):
        tiny.utility.health()
    try:
        tiny.utility.health()
        raise AssertionError("no error")
    except RateLimitError as e:
        assert e.status_code == 429 and "rate limit exceeded" in str(e)
        assert 1 <= int(e.headers["retry-after"]) <= 60


passed = sum(ok for _, ok in results)
failed = len(results) - passed
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
