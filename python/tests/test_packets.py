"""Packet rings: a Python publisher and Python subscribers."""

import numpy as np
import pytest

import vramring


def test_packets_round_trip_with_metadata_and_codec_params(sock):
    with vramring.PacketPublisher(sock, data_bytes=1 << 16, records=64, max_packet=8192, codec=0x34363248) as pub:
        pub.set_codec_params(b"\x00\x00\x00\x01sps-pps")
        with vramring.PacketSubscriber(sock) as sub:
            payloads = [bytes([k]) * (100 + k * 37) for k in range(40)]
            for k, data in enumerate(payloads):
                # Any bytes-like object: bytes, bytearray, memoryview, numpy.
                obj = [data, bytearray(data), memoryview(data), np.frombuffer(data, np.uint8)][k % 4]
                pub.write(obj, pts=k * 3000, key=(k % 10 == 0))
            got = [sub.next(1.0) for _ in payloads]
            assert [bytes(p.data) for p in got] == payloads
            assert [p.pts for p in got] == [k * 3000 for k in range(40)]
            assert [p.is_key for p in got] == [k % 10 == 0 for k in range(40)]
            assert got[0].codec == 0x34363248 and len(got[3]) == len(payloads[3])
            assert sub.codec_params() == b"\x00\x00\x00\x01sps-pps"
            with pytest.raises(vramring.Timeout):
                sub.next(0.05)
            pub.close()
            with pytest.raises(vramring.ProducerGone):
                sub.next(1.0)


def test_packet_reader_that_falls_behind_gets_packet_overrun(sock):
    with vramring.PacketPublisher(sock, data_bytes=1 << 14, records=16, max_packet=4096) as pub:
        with vramring.PacketSubscriber(sock) as sub:
            pub.write(b"k" * 1000, key=True)
            assert sub.next(1.0).is_key  # the reader is positioned after packet 1
            for _ in range(40):
                pub.write(b"d" * 1000)
            with pytest.raises(vramring.PacketOverrun, match="overwritten"):
                sub.next(1.0)
            pub.write(b"K" * 1000, key=True)
            p = sub.next(1.0)
            assert p.is_key and p.skipped > 0


def test_oversized_packet_is_too_large(sock):
    with vramring.PacketPublisher(sock, data_bytes=1 << 14, records=16, max_packet=4096) as pub:
        with pytest.raises(vramring.TooLarge):
            pub.write(b"x" * 5000)
