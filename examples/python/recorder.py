"""Records a camera's encoded stream (a vramring packet ring) to an Annex-B
`.h264` file, the Python twin of `examples/recorder.rs`.

    cargo run --release --example packet_producer -- --socket /tmp/cam1.packets.sock --fps 30
    python3 examples/python/recorder.py --socket /tmp/cam1.packets.sock --output cam1.h264

A lossless reader by default: the publisher waits for it (and evicts it if
it stalls past the lease), so the file holds every access unit from the
first keyframe on. `--no-lossless` records what it can keep up with,
resuming at the next keyframe after an overrun. Ends when the publisher
goes, after `--idle` seconds without a packet, or Ctrl-C. Exit status 0,
2 when no publisher is there, 1 on other errors.
"""

import argparse
import json
import sys

import vramring


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--no-lossless", action="store_true")
    ap.add_argument("--idle", type=float, default=5.0, help="stop after this many seconds without a packet")
    a = ap.parse_args()
    try:
        sub = vramring.PacketSubscriber(a.socket, name="py-recorder", lossless=not a.no_lossless)
    except (vramring.IoError, vramring.Timeout) as e:
        print(f"recorder: no packet publisher at {a.socket}: {e}", file=sys.stderr)
        return 2
    packets = nbytes = overruns = 0
    end = "producer gone"
    with sub, open(a.output, "wb") as out:
        while True:
            try:
                p = sub.next(a.idle)
            except vramring.ProducerGone:
                break
            except vramring.Timeout:
                end = "idle"
                break
            except vramring.PacketOverrun as e:
                overruns += 1
                print(f"recorder: {e}", file=sys.stderr)
                continue
            except KeyboardInterrupt:
                end = "interrupted"
                break
            out.write(p.data)
            packets += 1
            nbytes += len(p.data)
    print(json.dumps(dict(event="final", role="recorder", packets=packets, bytes=nbytes, overruns=overruns, end=end)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
