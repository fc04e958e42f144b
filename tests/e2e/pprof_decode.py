"""Minimal pprof decoder for the end-to-end tests (Python 3 standard library only).

decode(data) takes a pprof Profile message, gzipped or not, and returns a dict:
    {"sample_types": [(type, unit), ...], "period_type": (type, unit), "period": int,
     "time_nanos": int, "duration_nanos": int, "comments": [str, ...],
     "samples": [{"stack": [function names, leaf first], "lines": [(name, file, line), ...],
                  "values": [int, ...], "labels": {key: str or int}}, ...]}
Only the fields rvbpfd writes are decoded (profile.proto: sample_type 1, sample 2, location 4, function 5,
string_table 6, time_nanos 9, duration_nanos 10, period_type 11, period 12, comment 13). A malformed message raises
ValueError: a test that decodes every pprof it received fails on a half-written one.
"""
import gzip


def _varint(data, pos):
    result, shift = 0, 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _fields(data):
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 2:
            length, pos = _varint(data, pos)
            value, pos = data[pos:pos + length], pos + length
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise ValueError("unsupported wire type %d" % wire)
        if pos > len(data):
            raise ValueError("truncated field %d" % number)
        yield number, wire, value


def _signed(v):
    return v - (1 << 64) if v >= 1 << 63 else v


def _repeated_ints(wire, value):
    """A repeated integer field: packed (wire 2) or one element (wire 0)."""
    if wire == 0:
        return [value]
    out, pos = [], 0
    while pos < len(value):
        v, pos = _varint(value, pos)
        out.append(v)
    return out


def _value_type(msg):
    t = u = 0
    for n, w, v in _fields(msg):
        if n == 1 and w == 0:
            t = v
        elif n == 2 and w == 0:
            u = v
    return t, u


def decode(data):
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise ValueError("bad gzip: %s" % e)
    strings, raw_types, raw_samples, locations, functions = [], [], [], {}, {}
    prof = {"time_nanos": 0, "duration_nanos": 0, "period": 0, "period_type": (0, 0), "comments": []}
    for number, wire, value in _fields(data):
        if number == 1 and wire == 2:
            raw_types.append(_value_type(value))
        elif number == 2 and wire == 2:
            loc_ids, values, labels = [], [], []
            for n, w, v in _fields(value):
                if n == 1:
                    loc_ids += _repeated_ints(w, v)
                elif n == 2:
                    values += [_signed(x) for x in _repeated_ints(w, v)]
                elif n == 3 and w == 2:
                    key = s = num = 0
                    for n2, w2, v2 in _fields(v):
                        if n2 == 1 and w2 == 0:
                            key = v2
                        elif n2 == 2 and w2 == 0:
                            s = v2
                        elif n2 == 3 and w2 == 0:
                            num = _signed(v2)
                    labels.append((key, s, num))
            raw_samples.append((loc_ids, values, labels))
        elif number == 4 and wire == 2:
            lid, lines = 0, []
            for n, w, v in _fields(value):
                if n == 1 and w == 0:
                    lid = v
                elif n == 4 and w == 2:
                    fid = line = 0
                    for n2, w2, v2 in _fields(v):
                        if n2 == 1 and w2 == 0:
                            fid = v2
                        elif n2 == 2 and w2 == 0:
                            line = _signed(v2)
                    lines.append((fid, line))
            if lid == 0:
                raise ValueError("location with id 0")
            locations[lid] = lines
        elif number == 5 and wire == 2:
            fid, name, filename = 0, 0, 0
            for n, w, v in _fields(value):
                if n == 1 and w == 0:
                    fid = v
                elif n == 2 and w == 0:
                    name = v
                elif n == 4 and w == 0:
                    filename = v
            if fid == 0:
                raise ValueError("function with id 0")
            functions[fid] = (name, filename)
        elif number == 6 and wire == 2:
            strings.append(value.decode("utf-8", "replace"))
        elif number == 9 and wire == 0:
            prof["time_nanos"] = _signed(value)
        elif number == 10 and wire == 0:
            prof["duration_nanos"] = _signed(value)
        elif number == 11 and wire == 2:
            prof["period_type"] = _value_type(value)
        elif number == 12 and wire == 0:
            prof["period"] = _signed(value)
        elif number == 13:
            prof["comments"] += _repeated_ints(wire, value)
    if not strings or strings[0] != "":
        raise ValueError("string_table missing or string_table[0] is not empty")

    def s(i):
        if i >= len(strings):
            raise ValueError("string index %d past the table (%d)" % (i, len(strings)))
        return strings[i]

    prof["sample_types"] = [(s(t), s(u)) for t, u in raw_types]
    prof["period_type"] = (s(prof["period_type"][0]), s(prof["period_type"][1]))
    prof["comments"] = [s(i) for i in prof["comments"]]
    samples = []
    for loc_ids, values, labels in raw_samples:
        if len(values) != len(raw_types):
            raise ValueError("sample has %d values for %d sample types" % (len(values), len(raw_types)))
        stack, lines = [], []
        for lid in loc_ids:
            if lid not in locations:
                raise ValueError("sample names unknown location %d" % lid)
            # A location's lines are innermost first (inlined frames); rvbpfd writes one line per location.
            for fid, line in locations[lid]:
                if fid not in functions:
                    raise ValueError("location %d names unknown function %d" % (lid, fid))
                name, filename = functions[fid]
                stack.append(s(name))
                lines.append((s(name), s(filename), line))
        samples.append({"stack": stack, "lines": lines, "values": values,
                        "labels": {s(k): (s(v) if v else n) for k, v, n in labels}})
    prof["samples"] = samples
    return prof


def total(prof, index=0):
    """Sum of one value column over all samples."""
    return sum(smp["values"][index] for smp in prof["samples"])


def function_names(prof):
    return {name for smp in prof["samples"] for name in smp["stack"]}
