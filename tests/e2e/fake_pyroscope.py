#!/usr/bin/env python3
"""A loopback stand-in for Grafana Pyroscope's HTTP ingest and push endpoints, for the fleet agent's end-to-end test.

Run:
    python3 fake_pyroscope.py --port 0 --out-dir DIR --port-file F [--host 127.0.0.1] [--response-delay-ms MS]

It listens on HOST:PORT (port 0 = any free one), writes the chosen port to F once listening (atomically: F never
holds a partial number), and serves:

    POST /ingest?name=<app>{k=v,...}&from=<unix s>&until=<unix s>&format=pprof[&spyName=...]
         (also at /pyroscope/ingest)
         body = the pprof Profile (gzipped or not), Content-Type anything but multipart; answered 200 "ok"
    POST /push.v1.PusherService/Push   (also at /pyroscope/push.v1.PusherService/Push)
         Pyroscope's push API, Connect unary protocol: Content-Type application/proto (anything else: 415),
         Content-Encoding gzip (of the whole body) or none/identity; body = a protobuf
             PushRequest      { repeated RawProfileSeries series = 1; }
             RawProfileSeries { repeated LabelPair labels = 1; repeated RawSample samples = 2; }
             LabelPair        { string name = 1; string value = 2; }
             RawSample        { bytes raw_profile = 1; string ID = 2; }
         raw_profile = a pprof Profile (gzipped or not). Answered 200 with an empty body, Content-Type
         application/proto; a validation error is answered 400 in Connect's style: Content-Type application/json,
         {"code": "invalid_argument", "message": "..."}.
    GET  /ready     200 "ready"
Anything else is answered 404 "not found". A request body (raw, and for a push also gunzipped) larger than
MAX_BODY_BYTES is answered 413.

Each accepted profile is saved as DIR/NNNNNN.body (the exact bytes of the profile: an ingest's body, a push's
raw_profile as sent) and DIR/NNNNNN.json (written last, so a reader that sees the .json also sees the whole .body);
a push carrying several profiles (RawSamples, over one or more series) saves one pair per profile, numbered
consecutively:
    {"seq": 1, "api": "ingest", "method": "POST", "path": "/ingest", "query": {"name": ..., "from": ..., ...},
     "headers": {...}, "content_type": ..., "body_bytes": N, "service_name": "app", "labels": {"k": "v"},
     "from": 1700000000, "until": 1700000015, "sample_types": [["samples", "count"], ["cpu", "nanoseconds"]],
     "profile_name": "process_cpu", "received_unix_s": 1700000016.2, "request_seq": 1, "request_uploads": 1}
    seq              per saved profile, from 1
    api              "ingest" or "push" (the route it came through)
    path             the request's path; query: the parsed query string ({} for a push)
    body_bytes       the length of the .body
    service_name     the ingest name's app part / the push series' service_name label
    labels           the series labels other than service_name: for an ingest those in the name's braces, for a push
                     the series labels without __name__, __delta__, service_name and pyroscope_spy
    push_labels      (push only) every label of the series, {name: value}
    from, until      Unix seconds: the ingest's from/until; for a push, the pprof's time_nanos and
                     time_nanos + duration_nanos rounded to the nearest second, until at least from + 1 (the rule
                     the agent's ingest from/until follow, so tests read both routes alike; Pyroscope itself keeps
                     the nanoseconds)
    profile_name     the series' __name__: for an ingest what Pyroscope would derive (pyroscope_profile_name), for a
                     push its __name__ label, which must equal that (so a push makes the series an ingest would)
    request_seq      per accepted request, shared by both routes (every accepted ingest or push counts once)
    request_uploads  how many profiles that request carried (1 for an ingest)

Validation follows what real Pyroscope rejects with a 4xx (so a request this receiver accepts, Pyroscope accepts):
  ingest: the name parses as Pyroscope's labelset parser does (service name [A-Za-z0-9_./-]+; label names
    [A-Za-z_][A-Za-z0-9_]*, none starting with "__", none repeated, none "service_name"; values valid UTF-8 without
    ',', '{' or '}', at most MAX_LABEL_VALUE_BYTES), from/until are integers, format is pprof, the body is not
    multipart.
  push: the body (gunzipped) decodes as a PushRequest with at least one series; per series: every label name matches
    [A-Za-z_][A-Za-z0-9_]* and appears once; __name__ present and a metric name ([a-zA-Z_:][a-zA-Z0-9_:]*);
    service_name present and a valid service name (as above); __delta__ present and "false"; pyroscope_spy present
    and "rvbpfd"; no other name starts with "__"; values valid UTF-8, non-empty, at most MAX_LABEL_VALUE_BYTES, no
    control bytes; at most MAX_LABEL_NAMES label names; at least one sample. Per sample: __name__ equals
    pyroscope_profile_name of its sample types, and pprof time_nanos > 0 and duration_nanos >= 0.
  both: each profile is a pprof that decodes, with sample types, none containing '-'.
A rejected request (400; for a push also 415, or 413 for a gunzipped body too large) saves nothing (not even a
push's valid series), is counted in DIR/rejected.count and logged as one JSON line {"api", "path", "error"} in
DIR/rejected.log. (The 413 for a raw body too large is answered before the path is looked at, and not counted.)

Other files in DIR: ingest_requests.count and push_requests.count (accepted requests per route).

Outage control: while the file DIR/REFUSE exists every ingest and push is answered 503 (no Retry-After) and counted
in DIR/refused.count; nothing is saved. Remove the file and requests are accepted again.
Old Pyroscope: while the file DIR/NO_PUSH exists the push route is answered 404 "not found" (what Pyroscope before
1.0 answers, having no push API) and counted in DIR/push_not_found.count, before any other check (REFUSE included);
ingest is unaffected.

Importable: parse_name, parse_push_request, validate_push, pprof_sample_types, pprof_times, pyroscope_profile_name,
load_uploads, read_count, start.
Standard library only. Not named test_*.py on purpose: ctest runs those as e2e tests.
"""

import argparse
import gzip
import http.server
import io
import json
import os
import re
import signal
import sys
import threading
import time
import urllib.parse
import zlib

# The same minimal protobuf reader the e2e tests decode profiles with (this file lives next to it).
from pprof_decode import _fields  # noqa: E402

MAX_LABEL_VALUE_BYTES = 2048
MAX_BODY_BYTES = 64 << 20
MAX_LABEL_NAMES = 30  # per series (Pyroscope's default max_label_names_per_series)

INGEST_PATHS = ("/ingest", "/pyroscope/ingest")
PUSH_PATHS = ("/push.v1.PusherService/Push", "/pyroscope/push.v1.PusherService/Push")
PUSH_SPY = "rvbpfd"  # the pyroscope_spy label a push must carry (what the ingest route's spyName=rvbpfd becomes)
# Labels Pyroscope sets itself on an ingest; a saved push's "labels" leaves them out, as an ingest's does.
PUSH_RESERVED_LABELS = ("__name__", "__delta__", "service_name", "pyroscope_spy")


# --- What Pyroscope checks --------------------------------------------------------------------------------------

def _service_name_ok(name):
    return name != "" and all(c.isascii() and (c.isalnum() or c in "_./-") for c in name)


def _label_name_ok(name):
    return (name != "" and name.isascii() and (name[0].isalpha() or name[0] == "_")
            and all(c.isalnum() or c == "_" for c in name))


_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _metric_name_ok(name):
    return _METRIC_NAME.fullmatch(name) is not None


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


def _maybe_gunzip(data):
    """A profile's bytes, gunzipped if gzipped. Raises ValueError on a bad gzip stream."""
    if data[:2] != b"\x1f\x8b":
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as e:
        raise ValueError("bad gzip: %s" % e)


def pprof_sample_types(data):
    """[(type, unit), ...] of a pprof Profile (gzipped or not). Raises ValueError if it does not decode."""
    data = _maybe_gunzip(data)
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


def _checked_sample_types(profile):
    """The sample types of a profile either route carries, checked as Pyroscope checks them: not empty, decodes, has
    sample types, none containing '-'. Raises ValueError."""
    if not profile:
        raise ValueError("empty profile")
    sample_types = pprof_sample_types(profile)
    if not sample_types:
        raise ValueError("pprof has no sample types")
    if any("-" in t for t, _ in sample_types):
        raise ValueError("sample type contains '-'")
    return sample_types


def pprof_times(data):
    """(time_nanos, duration_nanos) of a pprof Profile (gzipped or not): fields 9 and 10 as signed int64, 0 when
    absent. Raises ValueError if it does not decode."""
    data = _maybe_gunzip(data)
    time_nanos = duration_nanos = 0
    for number, wire, value in _fields(data):
        if number == 9 and wire == 0:
            time_nanos = value
        elif number == 10 and wire == 0:
            duration_nanos = value

    def signed(v):
        return v - (1 << 64) if v >= 1 << 63 else v
    return signed(time_nanos), signed(duration_nanos)


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


# --- The push API ------------------------------------------------------------------------------------------------

def _gunzip_limited(data, limit):
    """data gunzipped, at most limit bytes. Raises ValueError if it does not gunzip, OverflowError if it is longer."""
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
            out = f.read(limit + 1)
    except (OSError, EOFError, zlib.error) as e:
        raise ValueError("bad gzip: %s" % e)
    if len(out) > limit:
        raise OverflowError("gunzipped body longer than %d bytes" % limit)
    return out


def _submessages(data, what):
    """{field number: [value, ...]} of a message whose every known field is length-delimited (strings, bytes,
    messages); unknown fields are skipped, as protobuf does. Raises ValueError on a wrong wire type."""
    out = {}
    for number, wire, value in _fields(data):
        if number in (1, 2):
            if wire != 2:
                raise ValueError("%s: field %d has wire type %d, not length-delimited" % (what, number, wire))
            out.setdefault(number, []).append(value)
    return out


def parse_push_request(body):
    """Decodes a PushRequest (not gzipped) into [{"labels": [(name, value), ...], "samples": [raw_profile, ...]},
    ...], one per series, label names and values as bytes (unchecked). Raises ValueError if it does not decode."""
    series = []
    for number, wire, value in _fields(body):
        if number != 1:
            continue
        if wire != 2:
            raise ValueError("PushRequest.series has wire type %d" % wire)
        fields = _submessages(value, "RawProfileSeries")
        labels = []
        for pair in fields.get(1, []):
            f = _submessages(pair, "LabelPair")
            # A repeated scalar field: the last one wins (proto3).
            labels.append((f.get(1, [b""])[-1], f.get(2, [b""])[-1]))
        samples = [_submessages(raw, "RawSample").get(1, [b""])[-1] for raw in fields.get(2, [])]
        series.append({"labels": labels, "samples": samples})
    return series


def _check_push_labels(pairs):
    """{name: value} of a push series' labels, checked as Pyroscope's distributor does. Raises ValueError."""
    if len(pairs) > MAX_LABEL_NAMES:
        raise ValueError("%d labels, more than %d" % (len(pairs), MAX_LABEL_NAMES))
    labels = {}
    for raw_name, raw_value in pairs:
        try:
            name = raw_name.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("label name %r is not valid UTF-8" % raw_name)
        if not _label_name_ok(name):
            raise ValueError("invalid label name %r" % name)
        if name in labels:
            raise ValueError("duplicate label name %r" % name)
        if name.startswith("__") and name not in ("__name__", "__delta__"):
            raise ValueError("label name %r starts with '__'" % name)
        try:
            value = raw_value.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("label %r: value is not valid UTF-8" % name)
        if value == "":
            raise ValueError("label %r: empty value" % name)
        if len(raw_value) > MAX_LABEL_VALUE_BYTES:
            raise ValueError("label %r: value longer than %d bytes" % (name, MAX_LABEL_VALUE_BYTES))
        if any(b < 0x20 or b == 0x7F for b in raw_value):
            raise ValueError("label %r: value %r contains a control byte" % (name, value))
        labels[name] = value
    for name in PUSH_RESERVED_LABELS:
        if name not in labels:
            raise ValueError("label %s missing" % name)
    if not _metric_name_ok(labels["__name__"]):
        raise ValueError("__name__ %r is not a valid metric name" % labels["__name__"])
    if not _service_name_ok(labels["service_name"]):
        raise ValueError("invalid service name %r" % labels["service_name"])
    if labels["__delta__"] != "false":
        raise ValueError("__delta__ is %r, not \"false\"" % labels["__delta__"])
    if labels["pyroscope_spy"] != PUSH_SPY:
        raise ValueError("pyroscope_spy is %r, not %r" % (labels["pyroscope_spy"], PUSH_SPY))
    return labels


def validate_push(body):
    """Checks a PushRequest (not gzipped) as described above; returns [{"labels": {name: value}, "samples":
    [{"raw_profile": bytes, "sample_types": [(type, unit), ...], "time_nanos": int, "duration_nanos": int}, ...]},
    ...], one per series. Raises ValueError naming the first problem (its series and sample)."""
    out = []
    series = parse_push_request(body)
    if not series:
        raise ValueError("the push carries no series")
    for i, s in enumerate(series):
        try:
            labels = _check_push_labels(s["labels"])
            if not s["samples"]:
                raise ValueError("no samples")
        except ValueError as e:
            raise ValueError("series %d: %s" % (i, e))
        samples = []
        for j, raw in enumerate(s["samples"]):
            try:
                sample_types = _checked_sample_types(raw)
                want = pyroscope_profile_name(sample_types)
                if labels["__name__"] != want:
                    raise ValueError("__name__ is %r, but sample types %s make the profile %r" %
                                     (labels["__name__"], sample_types, want))
                time_nanos, duration_nanos = pprof_times(raw)
                if time_nanos <= 0:
                    raise ValueError("pprof time_nanos is %d, not > 0" % time_nanos)
                if duration_nanos < 0:
                    raise ValueError("pprof duration_nanos is %d, negative" % duration_nanos)
            except ValueError as e:
                raise ValueError("series %d (%s) sample %d: %s" % (i, labels.get("service_name"), j, e))
            samples.append({"raw_profile": raw, "sample_types": sample_types, "time_nanos": time_nanos,
                            "duration_nanos": duration_nanos})
        out.append({"labels": labels, "samples": samples})
    return out


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
        self.seq = 0  # per saved profile
        self.request_seq = 0  # per accepted request, both routes

    def bump(self, name):
        with self.lock:
            n = read_count(self.out_dir, name) + 1
            _write_atomic(os.path.join(self.out_dir, name + ".count"), b"%d\n" % n)

    def reject(self, api, path, error):
        """Counts a rejected request and logs it to DIR/rejected.log."""
        self.bump("rejected")
        with self.lock:
            with open(os.path.join(self.out_dir, "rejected.log"), "a") as f:
                f.write(json.dumps({"api": api, "path": path, "error": str(error)}) + "\n")

    def save(self, api, profiles):
        """Saves one accepted request's profiles, [(meta, body), ...], numbered consecutively, and counts the request
        in DIR/<api>_requests.count."""
        with self.lock:
            self.request_seq += 1
            request_seq = self.request_seq
            first = self.seq + 1
            self.seq += len(profiles)
        for i, (meta, body) in enumerate(profiles):
            meta.update({"seq": first + i, "api": api, "request_seq": request_seq, "request_uploads": len(profiles)})
            base = os.path.join(self.out_dir, "%06d" % (first + i))
            _write_atomic(base + ".body", body)
            _write_atomic(base + ".json", json.dumps(meta, indent=1, sort_keys=True).encode())
        self.bump(api + "_requests")


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-pyroscope"
    # Buffered responses (flushed once per request by BaseHTTPRequestHandler): status line, headers and body leave in
    # one segment, as a real server's do. Unbuffered, the body trailed the headers by Nagle's 40 ms on a kept-alive
    # connection, and every upload cost the agent an extra wakeup that a real backend does not.
    wbufsize = -1

    def log_message(self, fmt, *args):  # quiet: the test prints what matters
        pass

    def _send(self, status, content_type, data, extra_headers=()):
        if self.server.response_delay_s > 0:
            time.sleep(self.server.response_delay_s)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for k, v in extra_headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _answer(self, status, text, extra_headers=()):
        self._send(status, "text/plain; charset=utf-8", (text + "\n").encode(), extra_headers)

    def _connect_error(self, status, code, message):
        """An error the way a Connect unary handler answers it."""
        self._send(status, "application/json", json.dumps({"code": code, "message": message}).encode())

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
        if split.path in INGEST_PATHS:
            self._ingest(split, body)
        elif split.path in PUSH_PATHS:
            self._push(split, body)
        else:
            self._answer(404, "not found")

    def _ingest(self, split, body):
        srv = self.server
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
            sample_types = _checked_sample_types(body)
        except ValueError as e:
            srv.reject("ingest", self.path, e)
            self._answer(400, "fake-pyroscope: %s" % e)
            return
        meta = {
            "method": "POST", "path": split.path, "query": query,
            "headers": {k: v for k, v in self.headers.items()}, "content_type": content_type,
            "body_bytes": len(body), "service_name": service, "labels": labels, "from": start, "until": end,
            "sample_types": [list(st) for st in sample_types],
            "profile_name": pyroscope_profile_name(sample_types), "received_unix_s": time.time(),
        }
        srv.save("ingest", [(meta, body)])
        self._answer(200, "ok")

    def _push(self, split, body):
        srv = self.server
        if os.path.exists(os.path.join(srv.out_dir, "NO_PUSH")):
            srv.bump("push_not_found")
            self._answer(404, "not found")
            return
        if os.path.exists(os.path.join(srv.out_dir, "REFUSE")):
            srv.bump("refused")
            self._answer(503, "fake-pyroscope: refusing pushes (REFUSE file present)")
            return
        content_type = self.headers.get("Content-Type", "")
        if content_type.strip().lower() != "application/proto":
            srv.reject("push", self.path, "Content-Type %r, not application/proto" % content_type)
            self._answer(415, "fake-pyroscope: Content-Type %r, not application/proto" % content_type,
                         [("Accept-Post", "application/proto")])
            return
        encoding = self.headers.get("Content-Encoding", "").strip().lower()
        try:
            if encoding == "gzip":
                body = _gunzip_limited(body, MAX_BODY_BYTES)
            elif encoding not in ("", "identity"):
                raise ValueError("Content-Encoding %r, not gzip or identity" % encoding)
            series = validate_push(body)
        except OverflowError as e:
            srv.reject("push", self.path, e)
            self._answer(413, "request body too large")
            self.close_connection = True
            return
        except ValueError as e:
            srv.reject("push", self.path, e)
            self._connect_error(400, "invalid_argument", "fake-pyroscope: %s" % e)
            return
        now = time.time()
        headers = {k: v for k, v in self.headers.items()}
        profiles = []
        for s in series:
            labels = s["labels"]
            for smp in s["samples"]:
                t, d = smp["time_nanos"], smp["duration_nanos"]
                start_s = (t + 500_000_000) // 10**9
                until_s = max((t + d + 500_000_000) // 10**9, start_s + 1)
                meta = {
                    "method": "POST", "path": split.path, "query": {}, "headers": headers,
                    "content_type": content_type, "body_bytes": len(smp["raw_profile"]),
                    "service_name": labels["service_name"],
                    "labels": {k: v for k, v in labels.items() if k not in PUSH_RESERVED_LABELS},
                    "push_labels": dict(labels), "from": start_s, "until": until_s,
                    "sample_types": [list(st) for st in smp["sample_types"]], "profile_name": labels["__name__"],
                    "received_unix_s": now,
                }
                profiles.append((meta, smp["raw_profile"]))
        srv.save("push", profiles)
        self._send(200, "application/proto", b"")


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
