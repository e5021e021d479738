#!/usr/bin/env python3
"""Reads TensorBoard event files with the Python protobuf runtime (Debian python3-protobuf) and
the schema megatron/training/tensorboard/tensorboard_event.proto compiled by protoc --python_out.
Checks the TFRecord framing (masked CRC-32C of length and data, CRC computed here) and prints
one line per event: step wall_time tag=value ... (or file_version).

Usage: read_events.py EVENT_FILE [--expect-scalars 'tag@step=value;...']
       read_events.py EVENT_FILE --tags      (prints "TAGS:" then the sorted distinct tags, one a line,
                                             each as "<tag>\t<number of points>\t<steps, comma-separated>")
Exit status 1 on a framing/CRC error or when an expected scalar is missing.
"""
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_DIR = os.path.join(HERE, "..", "..", "..", "megatron", "training", "tensorboard")


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    return c ^ 0xFFFFFFFF


def masked(c):
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def load_schema():
    out = tempfile.mkdtemp()
    subprocess.check_call(["protoc", "--python_out", out, "-I", PROTO_DIR, "tensorboard_event.proto"])
    sys.path.insert(0, out)
    import tensorboard_event_pb2  # noqa: E402
    return tensorboard_event_pb2


def read(path, pb):
    raw = open(path, "rb").read()
    i, events = 0, []
    while i < len(raw):
        (n,) = struct.unpack("<Q", raw[i:i + 8])
        (lc,) = struct.unpack("<I", raw[i + 8:i + 12])
        assert lc == masked(crc32c(raw[i:i + 8])), "bad length crc at %d" % i
        data = raw[i + 12:i + 12 + n]
        (dc,) = struct.unpack("<I", raw[i + 12 + n:i + 16 + n])
        assert dc == masked(crc32c(data)), "bad data crc at %d" % i
        ev = pb.Event()
        ev.ParseFromString(data)
        events.append(ev)
        i += 16 + n
    return events


def main():
    pb = load_schema()
    events = read(sys.argv[1], pb)
    seen = {}
    for ev in events:
        if ev.WhichOneof("what") == "file_version":
            print("file_version", ev.file_version, "wall_time %.3f" % ev.wall_time)
        else:
            vals = " ".join("%s=%r" % (v.tag, v.simple_value) for v in ev.summary.value)
            print("step", ev.step, "wall_time %.3f" % ev.wall_time, vals)
            for v in ev.summary.value:
                seen["%s@%d" % (v.tag, ev.step)] = v.simple_value
    assert events and events[0].file_version == "brain.Event:2", "first event must be file_version"
    if len(sys.argv) > 2 and sys.argv[2] == "--tags":
        steps = {}
        for ev in events:
            if ev.WhichOneof("what") != "file_version":
                for v in ev.summary.value:
                    steps.setdefault(v.tag, []).append(ev.step)
        print("TAGS:")
        for tag in sorted(steps):
            print("%s\t%d\t%s" % (tag, len(steps[tag]), ",".join(str(x) for x in steps[tag])))
    if len(sys.argv) > 3 and sys.argv[2] == "--expect-scalars":
        for item in sys.argv[3].split(";"):
            key, val = item.split("=")
            assert key in seen, "missing scalar " + key
            assert abs(seen[key] - float(val)) <= 1e-6 * max(1.0, abs(float(val))), (key, seen[key], val)
    print("read_events: %d events OK" % len(events))


if __name__ == "__main__":
    main()
