#!/usr/bin/env python3
"""Readiness probe for the engines started by scripts/engines.sh.

    engines_probe.py kafka HOST:PORT          Kafka: ApiVersions + Metadata
    engines_probe.py cql   HOST:PORT [QUERY]  CQL v4: STARTUP + QUERY

Exits 0 only when the server gave a valid answer to a real request, and then
prints a one-line summary (or, for `cql` with a QUERY, the result rows) on
stdout; otherwise exits 1 with the reason on stderr.

Why a hand-written client: a bare TCP connect is not readiness (Kafka binds
its listeners before the broker has caught up with the metadata log;
Cassandra accepts native connections before it serves queries), and CI must
not need kcat, cqlsh or a driver. Standard library only, Python >= 3.7.
"""

import socket
import struct
import sys
import uuid

TIMEOUT_S = 5.0
CLIENT_ID = b"hindsight-engines-probe"


class ProbeError(Exception):
    pass


def split_addr(addr):
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ProbeError("expected HOST:PORT, got %r" % addr)
    return host, int(port)


def recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ProbeError("connection closed by server after %d of %d bytes" % (len(buf), n))
        buf += chunk
    return bytes(buf)


class Reader:
    """Big-endian cursor over a response body."""

    def __init__(self, data):
        self.data = data
        self.pos = 0

    def take(self, n):
        if n < 0 or self.pos + n > len(self.data):
            raise ProbeError("truncated response (need %d bytes at %d of %d)" % (n, self.pos, len(self.data)))
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt):
        size = struct.calcsize(fmt)
        return struct.unpack(">" + fmt, self.take(size))

    def i8(self):
        return self.unpack("b")[0]

    def i16(self):
        return self.unpack("h")[0]

    def u16(self):
        return self.unpack("H")[0]

    def i32(self):
        return self.unpack("i")[0]

    def uvarint(self):
        shift = value = 0
        while True:
            b = self.take(1)[0]
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise ProbeError("bad varint")

    # Kafka strings
    def k_string(self):
        n = self.i16()
        return None if n < 0 else self.take(n).decode("utf-8")

    def k_compact_string(self):
        n = self.uvarint()
        return None if n == 0 else self.take(n - 1).decode("utf-8")

    # CQL [string]: u16 length + UTF-8
    def cql_string(self):
        return self.take(self.u16()).decode("utf-8")

    def k_skip_tags(self):
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self.take(self.uvarint())


# --------------------------------------------------------------------------
# Kafka wire protocol
# --------------------------------------------------------------------------

API_METADATA = 3
API_VERSIONS = 18


def kafka_call(sock, api_key, version, corr, body, flexible):
    header = struct.pack(">hhih", api_key, version, corr, len(CLIENT_ID)) + CLIENT_ID
    if flexible:
        header += b"\x00"  # request header v2: empty tagged fields
    msg = header + body
    sock.sendall(struct.pack(">i", len(msg)) + msg)
    size = struct.unpack(">i", recv_exact(sock, 4))[0]
    if size < 4 or size > 64 * 1024 * 1024:
        raise ProbeError("implausible Kafka response size %d" % size)
    r = Reader(recv_exact(sock, size))
    got = r.i32()
    if got != corr:
        raise ProbeError("correlation id %d, expected %d" % (got, corr))
    if flexible and api_key != API_VERSIONS:
        r.k_skip_tags()  # response header v1
    return r


def probe_kafka(addr):
    host, port = split_addr(addr)
    with socket.create_connection((host, port), timeout=TIMEOUT_S) as sock:
        sock.settimeout(TIMEOUT_S)
        # ApiVersions v0 is understood by every broker (clients send it first
        # to negotiate), and tells which Metadata versions this one speaks.
        r = kafka_call(sock, API_VERSIONS, 0, 1, b"", flexible=False)
        err = r.i16()
        if err != 0:
            raise ProbeError("ApiVersions error code %d" % err)
        ranges = {}
        for _ in range(r.i32()):
            key, lo, hi = r.unpack("hhh")
            ranges[key] = (lo, hi)
        if API_METADATA not in ranges:
            raise ProbeError("broker does not offer Metadata")
        lo, hi = ranges[API_METADATA]
        forced = None
        if len(sys.argv) > 3 and sys.argv[3].startswith("--metadata-version="):
            forced = int(sys.argv[3].split("=", 1)[1])
        candidates = [forced] if forced is not None else [12, 11, 8, 7, 6, 5, 4]
        version = next((v for v in candidates if lo <= v <= hi), None)
        if version is None:
            raise ProbeError("no Metadata version in common (broker %d..%d)" % (lo, hi))

        flexible = version >= 9
        if flexible:
            # topics: null compact array (= all topics); allow_auto_topic_creation;
            # [v9-v10: include_cluster_authorized_operations];
            # include_topic_authorized_operations; tagged fields.
            body = b"\x00\x00" + (b"\x00" if version <= 10 else b"") + b"\x00\x00"
        else:
            body = struct.pack(">i", -1) + b"\x00"  # null topics, no auto-create
            if version >= 8:
                body += b"\x00\x00"
        r = kafka_call(sock, API_METADATA, version, 2, body, flexible)
        r.i32()  # throttle_time_ms (v3+)
        brokers = []
        if flexible:
            n = r.uvarint() - 1
            for _ in range(max(n, 0)):
                node = r.i32()
                bhost = r.k_compact_string()
                bport = r.i32()
                r.k_compact_string()  # rack
                r.k_skip_tags()
                brokers.append((node, bhost, bport))
            cluster_id = r.k_compact_string()
        else:
            for _ in range(r.i32()):
                node = r.i32()
                bhost = r.k_string()
                bport = r.i32()
                r.k_string()  # rack
                brokers.append((node, bhost, bport))
            cluster_id = r.k_string()
        controller = r.i32()
    if not brokers:
        raise ProbeError("Metadata v%d answered with no live broker (still starting?)" % version)
    print("kafka %s: Metadata v%d ok, cluster_id=%s, controller=%d, brokers=%s" % (
        addr, version, cluster_id, controller,
        ",".join("%d@%s:%d" % b for b in brokers)))


# --------------------------------------------------------------------------
# CQL native protocol v4
# --------------------------------------------------------------------------

OP_ERROR, OP_STARTUP, OP_READY, OP_AUTHENTICATE, OP_QUERY, OP_RESULT = 0x00, 0x01, 0x02, 0x03, 0x07, 0x08
CONSISTENCY_ONE = 0x0001


def cql_string(s):
    b = s.encode("utf-8")
    return struct.pack(">H", len(b)) + b


def cql_call(sock, stream, opcode, body):
    sock.sendall(struct.pack(">BBhBi", 0x04, 0, stream, opcode, len(body)) + body)
    version, _flags, got, op, length = struct.unpack(">BBhBi", recv_exact(sock, 9))
    if version != 0x84:
        raise ProbeError("unexpected CQL response version byte 0x%02x" % version)
    if got != stream:
        raise ProbeError("CQL stream id %d, expected %d" % (got, stream))
    if length < 0 or length > 256 * 1024 * 1024:
        raise ProbeError("implausible CQL frame length %d" % length)
    r = Reader(recv_exact(sock, length))
    if op == OP_ERROR:
        code = r.i32()
        raise ProbeError("CQL error 0x%04x: %s" % (code, r.cql_string()))
    return op, r


def read_type(r):
    tid = r.u16()
    if tid == 0x0000:
        return ("custom", r.cql_string())
    if tid in (0x0020, 0x0022):  # list, set
        return (tid, read_type(r))
    if tid == 0x0021:  # map
        return (tid, read_type(r), read_type(r))
    if tid == 0x0030:  # UDT
        r.cql_string()
        r.cql_string()
        fields = []
        for _ in range(r.u16()):
            fields.append((r.cql_string(), read_type(r)))
        return (tid, fields)
    if tid == 0x0031:  # tuple
        return (tid, [read_type(r) for _ in range(r.u16())])
    return (tid,)


def decode_value(typ, raw):
    if raw is None:
        return "null"
    tid = typ[0]
    if tid in (0x0001, 0x000A, 0x000D):  # ascii, text, varchar
        return raw.decode("utf-8", "replace")
    if tid == 0x0004:
        return "true" if raw != b"\x00" else "false"
    if tid in (0x0002, 0x0005, 0x0009, 0x0013, 0x0014, 0x000B) and len(raw) in (1, 2, 4, 8):
        return str(int.from_bytes(raw, "big", signed=True))  # bigint/counter/int/smallint/tinyint/timestamp
    if tid in (0x000C, 0x000F) and len(raw) == 16:
        return str(uuid.UUID(bytes=raw))
    return "0x" + raw.hex()


def probe_cql(addr, query):
    host, port = split_addr(addr)
    with socket.create_connection((host, port), timeout=TIMEOUT_S) as sock:
        sock.settimeout(TIMEOUT_S)
        op, _ = cql_call(sock, 1, OP_STARTUP, struct.pack(">H", 1) + cql_string("CQL_VERSION") + cql_string("3.0.0"))
        if op == OP_AUTHENTICATE:
            raise ProbeError("server wants authentication (not configured for tests)")
        if op != OP_READY:
            raise ProbeError("STARTUP answered with opcode 0x%02x, expected READY" % op)
        q = (query or "SELECT release_version FROM system.local").encode("utf-8")
        body = struct.pack(">i", len(q)) + q + struct.pack(">HB", CONSISTENCY_ONE, 0)
        op, r = cql_call(sock, 2, OP_QUERY, body)
    if op != OP_RESULT:
        raise ProbeError("QUERY answered with opcode 0x%02x, expected RESULT" % op)
    kind = r.i32()
    if kind != 2:  # 1 void, 3 set_keyspace, 5 schema_change
        if query is None:
            raise ProbeError("QUERY result kind %d, expected rows" % kind)
        print("ok (result kind %d)" % kind)
        return
    flags, ncols = r.i32(), r.i32()
    if flags & 0x0002:
        r.take(r.i32())  # paging state
    cols = []
    if not flags & 0x0004:  # no_metadata
        global_spec = flags & 0x0001
        if global_spec:
            r.cql_string()
            r.cql_string()
        for _ in range(ncols):
            if not global_spec:
                r.cql_string()
                r.cql_string()
            cols.append((r.cql_string(), read_type(r)))
    rows = []
    for _ in range(r.i32()):
        row = []
        for i in range(ncols):
            n = r.i32()
            row.append(None if n < 0 else r.take(n))
        rows.append(row)
    if query is None:
        if len(rows) != 1 or rows[0][0] is None:
            raise ProbeError("system.local returned %d rows" % len(rows))
        print("cql %s: release_version=%s" % (addr, rows[0][0].decode("utf-8", "replace")))
        return
    print(" | ".join(name for name, _ in cols))
    for row in rows:
        print(" | ".join(decode_value(cols[i][1], v) for i, v in enumerate(row)))


def main(argv):
    if len(argv) < 3 or argv[1] not in ("kafka", "cql"):
        sys.stderr.write(__doc__)
        return 2
    try:
        if argv[1] == "kafka":
            probe_kafka(argv[2])
        else:
            probe_cql(argv[2], argv[3] if len(argv) > 3 else None)
    except (OSError, ProbeError, struct.error, UnicodeDecodeError) as e:
        sys.stderr.write("%s %s: not ready: %s\n" % (argv[1], argv[2], e))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
