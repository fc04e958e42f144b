#!/usr/bin/env python3
"""A loopback stand-in for Grafana Pyroscope's HTTP ingest endpoint, for the fleet agent's end-to-end test.

Run:
    python3 fake_pyroscope.py --port 0 --out-dir DIR --port-file F [--host 127.0.0.1]

It listens on HOST:PORT (port 0 = any free one), writes the chosen port to F once listening (atomically: F never
holds a partial number), and serves:

    POST /ingest?name=<app>{k=v,...}&from=<unix s>&until=<unix s>&format=pprof[&spyName=...]
         body = the pprof Profile (gzipped or not), Content-Type anything but multipart
    GET  /ready     200 "ready"

Each accepted push is answered 200 and saved as DIR/NNNNNN.body (the exact body bytes) and DIR/NNNNNN.json
(written last, so a reader that sees the .json also sees the whole .body):
    {"seq": 1, "method": "POST", "path": "/ingest", "query": {"name": ..., "from": ..., ...},
     "headers": {...}, "content_type": ..., "body_bytes": N, "service_name": "app", "labels": {"k": "v"},
     "from": 1700000000, "until": 1700000015, "sample_types": [["samples", "count"], ["cpu", "nanoseconds"]],
     "profile_name": "process_cpu", "received_unix_s": 1700000016.2}
profile_name is the __name__ Pyroscope would give the series (see pyroscope_profile_name).

Validation follows what real Pyroscope rejects with a 4xx (so a push this receiver accepts, Pyroscope accepts):
the name parses as Pyroscope's labelset parser does (service name [A-Za-z0-9_./-]+; label names
[A-Za-z_][A-Za-z0-9_]*, none starting with "__", none repeated, none "service_name"; values valid UTF-8 without ','
or '}', at most 2048 bytes), from/until are integers, format is pprof, the body is a pprof that decodes, and no
sample type contains '-'. A rejected push is answered 400 with the reason, counted in DIR/rejected.count and logged
as one JSON line in DIR/rejected.log.

Outage control: while the file DIR/REFUSE exists every push is answered 503 (no Retry-After) and counted in
DIR/refused.count; nothing is saved. Remove the file and pushes are accepted again.

Importable: parse_name, pprof_sample_types, pyroscope_profile_name, load_uploads, read_count, start.
Standard library only. Not named test_*.py on purpose: ctest runs those as e2e tests.
"""

import argparse
import gzip
import http.server
import json
import os
import signal
import sys
import threading
import time
import urllib.parse

# The same minimal protobuf reader the e2e tests decode profiles with (this file lives next to it).
from pprof_decode import _fields  # noqa: E402

MAX_LABEL_VALUE_BYTES = 2048
MAX_BODY_BYTES = 64 << 20


# --- What Pyroscope checks --------------------------------------------------------------------------------------

def _service_name_ok(name):
    return name != "" and all(c.isascii() and (c.isalnum() or c in "_./-") for c in name)


def _label_name_ok(name):
    return (name != "" and name.isascii() and (name[0].isalpha() or name[0] == "_")
            and all(c.isalnum() or c == "_" for c in name))


def parse_name(name):
    """Splits an ingest `name` ("app{k=v,...}") into (service_name, {label: value}) as Pyroscope's labelset parser
    does, with the stricter checks its distributor applies afterwards. Raises ValueError naming the problem."""
    brace = name.find("{")
    service = (name if brace < 0 else name[:brace]).strip()
    if not _service_name_ok(service):
        raise ValueError("invalid service name %r" % service)
    labels = {}
    if brace < 0:
        return service, labels
    rest = name[brace + 1:]
    if not rest.endswith("}"):
        raise ValueError("labels not closed with '}' in %r" % name)
    body = rest[:-1]
    if body == "":
        return service, labels
    for pair in body.split(","):
        if "=" not in pair:
            raise ValueError("label without '=' in %r" % name)
        key, value = pair.split("=", 1)
        key, value = key.strip(), value.strip()
        if not _label_name_ok(key) or key.startswith("__"):
            raise ValueError("invalid label name %r" % key)
        if key in labels or key == "service_name":
            raise ValueError("duplicate label name %r" % key)
        if "}" in value or "{" in value:
            raise ValueError("label %r: value contains a brace" % key)
        if len(value.encode("utf-8", "surrogateescape")) > MAX_LABEL_VALUE_BYTES:
            raise ValueError("label %r: value longer than %d bytes" % (key, MAX_LABEL_VALUE_BYTES))
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("label %r: value is not valid UTF-8" % key)
        labels[key] = value
    return service, labels


def pprof_sample_types(data):
    """[(type, unit), ...] of a pprof Profile (gzipped or not). Raises ValueError if it does not decode."""
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise ValueError("bad gzip: %s" % e)
    raw_types, strings = [], []
    for number, wire, value in _fields(data):
        if number == 1 and wire == 2:
            t = u = 0
            for n, w, v in _fields(value):
                if n == 1 and w == 0:
                    t = v
                elif n == 2 and w == 0:
                    u = v
            raw_types.append((t, u))
        elif number == 6 and wire == 2:
            strings.append(value.decode("utf-8", "replace"))
    if not strings or strings[0] != "":
        raise ValueError("string_table missing or string_table[0] is not empty")
    out = []
    for t, u in raw_types:
        if t >= len(strings) or u >= len(strings):
            raise ValueError("sample type names a string past the table")
        out.append((strings[t], strings[u]))
    return out


def pyroscope_profile_name(sample_types):
    """The __name__ Pyroscope gives a pprof pushed to /ingest (pkg/og/convert/pprof, metricName): "wall" if a
    sample type is wall, else the first match of cpu -> process_cpu, alloc_/inuse_ -> memory, mutex_, block_,
    goroutines; else the last sample type's name."""
    names = [t for t, _ in sample_types]
    if "wall" in names:
        return "wall"
    for t in names:
        if "cpu" in t:
            return "process_cpu"
        if "alloc_" in t or "inuse_" in t or t in ("space", "objects"):
            return "memory"
        if "mutex_" in t:
            return "mutex"
        if "block_" in t:
            return "block"
        if "goroutines" in t:
            return "goroutines"
    return names[-1] if names else ""


# --- Reading what was saved ---------------------------------------------------------------------------------------

def read_count(out_dir, name):
    """The number in DIR/<name>.count (0 if absent), e.g. read_count(d, "refused")."""
    try:
        with open(os.path.join(out_dir, name + ".count")) as f:
            return int(f.read().strip() or 0)
    except FileNotFoundError:
        return 0


def load_uploads(out_dir):
    """Every saved push, oldest first: the .json dict plus "body" (bytes)."""
    uploads = []
    for entry in sorted(os.listdir(out_dir)):
        if not entry.endswith(".json") or not entry[:-5].isdigit():
            continue
        with open(os.path.join(out_dir, entry)) as f:
            meta = json.load(f)
        with open(os.path.join(out_dir, entry[:-5] + ".body"), "rb") as f:
            meta["body"] = f.read()
        uploads.append(meta)
    return uploads


# --- The server ---------------------------------------------------------------------------------------------------

def _write_atomic(path, data):
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


class _Receiver(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, out_dir, response_delay_s=0.0):
        super().__init__(address, _Handler)
        self.out_dir = out_dir
        self.response_delay_s = response_delay_s  # added before each answer: a backend across a network
        self.lock = threading.Lock()
        self.seq = 0

    def bump(self, name):
        with self.lock:
            n = read_count(self.out_dir, name) + 1
            _write_atomic(os.path.join(self.out_dir, name + ".count"), b"%d\n" % n)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-pyroscope"
    # Buffered responses (flushed once per request by BaseHTTPRequestHandler): status line, headers and body leave in
    # one segment, as a real server's do. Unbuffered, the body trailed the headers by Nagle's 40 ms on a kept-alive
    # connection, and every upload cost the agent an extra wakeup that a real backend does not.
    wbufsize = -1

    def log_message(self, fmt, *args):  # quiet: the test prints what matters
        pass

    def _answer(self, status, text, extra_headers=()):
        if self.server.response_delay_s > 0:
            time.sleep(self.server.response_delay_s)
        data = (text + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        for k, v in extra_headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if urllib.parse.urlsplit(self.path).path == "/ready":
            self._answer(200, "ready")
        else:
            self._answer(404, "not found")

    def do_POST(self):
        srv = self.server
        split = urllib.parse.urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        if length < 0 or length > MAX_BODY_BYTES:
            self._answer(413, "request body too large")
            self.close_connection = True
            return
        body = self.rfile.read(length)
        if split.path not in ("/ingest", "/pyroscope/ingest"):
            self._answer(404, "not found")
            return
        if os.path.exists(os.path.join(srv.out_dir, "REFUSE")):
            srv.bump("refused")
            self._answer(503, "fake-pyroscope: refusing pushes (REFUSE file present)")
            return
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(split.query, keep_blank_values=True,
                                                                        errors="surrogateescape").items()}
        content_type = self.headers.get("Content-Type", "")
        try:
            service, labels = parse_name(query.get("name", ""))
            try:
                start, end = int(query.get("from", "")), int(query.get("until", ""))
            except ValueError:
                raise ValueError("from/until are not Unix seconds: %r %r" % (query.get("from"), query.get("until")))
            if query.get("format") != "pprof":
                raise ValueError("format is %r, not pprof" % query.get("format"))
            if "multipart/form-data" in content_type:
                raise ValueError("multipart body with format=pprof: Pyroscope reads the raw body as the profile")
            if not body:
                raise ValueError("empty body")
            sample_types = pprof_sample_types(body)
            if not sample_types:
                raise ValueError("pprof has no sample types")
            if any("-" in t for t, _ in sample_types):
                raise ValueError("sample type contains '-'")
        except ValueError as e:
            srv.bump("rejected")
            with srv.lock:
                with open(os.path.join(srv.out_dir, "rejected.log"), "a") as f:
                    f.write(json.dumps({"path": self.path, "error": str(e)}) + "\n")
            self._answer(400, "fake-pyroscope: %s" % e)
            return
        with srv.lock:
            srv.seq += 1
            seq = srv.seq
        meta = {
            "seq": seq, "method": "POST", "path": split.path, "query": query,
            "headers": {k: v for k, v in self.headers.items()}, "content_type": content_type,
            "body_bytes": len(body), "service_name": service, "labels": labels, "from": start, "until": end,
            "sample_types": [list(st) for st in sample_types],
            "profile_name": pyroscope_profile_name(sample_types), "received_unix_s": time.time(),
        }
        base = os.path.join(srv.out_dir, "%06d" % seq)
        _write_atomic(base + ".body", body)
        _write_atomic(base + ".json", json.dumps(meta, indent=1, sort_keys=True).encode())
        self._answer(200, "ok")


def start(out_dir, port=0, host="127.0.0.1"):
    """Starts the receiver on a daemon thread; returns the server (server.server_address[1] is the port; call
    server.shutdown() to stop)."""
    os.makedirs(out_dir, exist_ok=True)
    server = _Receiver((host, port), out_dir)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--response-delay-ms", type=float, default=0.0,
                        help="wait this long before each answer (a remote backend's round trip)")
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    server = _Receiver((args.host, args.port), args.out_dir, args.response_delay_ms / 1000.0)
    _write_atomic(args.port_file, b"%d\n" % server.server_address[1])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever()
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
