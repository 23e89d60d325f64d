#!/usr/bin/env python3
"""Writes the committed seed corpus under fuzz/corpus/<target>/.

Seeds are the byte fixtures of core/tests/wire_*.rs (a ConnectX-4 Lx CNP
capture, hand-laid mlx5 WQEs, headers) plus a few whole RoCEv2 frames built
here with an independent ICRC (zlib's CRC-32 over the masked pseudo packet,
stored little-endian). Run from anywhere: python3 fuzz/gen_corpus.py
"""
import os
import struct
import zlib

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(bytes(data))


def ip_checksum(h):
    s = 0
    for i in range(0, len(h), 2):
        s += (h[i] << 8) | (h[i + 1] if i + 1 < len(h) else 0)
        s = (s & 0xFFFF) + (s >> 16)
    return (~s) & 0xFFFF


def icrc(ip_packet):
    """ICRC of an IPv4 RoCEv2 packet (IP header .. pad), IBTA Annex A17."""
    m = bytearray(ip_packet[:40])
    for i in (1, 8, 10, 11, 26, 27, 32):
        m[i] = 0xFF
    crc = zlib.crc32(b"\xff" * 8 + bytes(m) + ip_packet[40:])
    return struct.pack("<I", crc)


def frame(transport):
    """Ethernet + IPv4 + UDP(4791) around BTH.. payload, with checksums."""
    udp_len = 8 + len(transport) + 4
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0x68, 20 + udp_len, 1, 0x4000,
                               64, 17, 0, bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])))
    ip[10:12] = struct.pack("!H", ip_checksum(ip))
    udp = struct.pack("!HHHH", 0xC001, 4791, udp_len, 0)
    pkt = bytes(ip) + udp + transport
    eth = bytes([2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00])
    return eth + pkt + icrc(pkt)


def bth(opcode, pad, qpn, psn, ack=False):
    return struct.pack("!BBHII", opcode, pad << 4, 0xFFFF, qpn, (0x80000000 if ack else 0) | psn)


CX4_CNP = bytes.fromhex(
    "e41d2dab2bc27cfe90643b32080045c2003c718c400040119161"
    "0a0011010a00120100001 2b700280000".replace(" ", "")
    + "8100ffff4000011800000000" + "00" * 16 + "82fd002a")

WQE_WRITE_IMM = bytes.fromhex(
    "00004209" "00012303" "00000008" "deadbeef"
    "00007f0012345000" "00abcdef" "00000000"
    "00001000" "00112233" "0000555500001000") + bytes(16)
WQE_INLINE = bytes.fromhex(
    "00000108" "00000703" "00000000" "00000000"
    "0000000000008000" "00000005" "00000000"
    "80000008" "000000000000002a" "00000000") + bytes(16)
WQE_SEND = bytes.fromhex(
    "0000ff0b" "00000103" "00000082" "00000007"
    "00000064" "00000001" "0000000000001000"
    "00000064" "00000001" "0000000000002000") + bytes(16)

CALL_HEADER = b"RCCH" + bytes([1, 4, 8, 3]) + bytes(range(1, 9)) \
    + struct.pack("!QII", 1000000, 3, 0xDEADBEEF)

put("mlx5_wqe", "write_imm", WQE_WRITE_IMM)
put("mlx5_wqe", "inline", WQE_INLINE)
put("mlx5_wqe", "send_imm", WQE_SEND)

put("bth", "write_first", bytes.fromhex("0660ffff80abcdef80fffffe"))
put("bth", "cnp", CX4_CNP[42:54])

put("ext_headers", "reth", bytes.fromhex("01020304050607080a0b0c0d00001000"))
put("ext_headers", "aeth_nak", bytes.fromhex("60123456"))
put("ext_headers", "aeth_ack", bytes.fromhex("1f000005"))

put("ip_udp", "cx4_cnp", CX4_CNP)

write_only_imm = (bth(0x0B, 3, 0x11, 100, ack=True)
                  + struct.pack("!QII", 0x1000, 0x42, 5) + struct.pack("!I", 9) + b"hello\0\0\0")
write_middle = bth(0x07, 0, 0x11, 101) + bytes(range(64))
ack = bth(0x11, 0, 0x22, 0xFFFFFF) + bytes.fromhex("1f000003")
put("roce_packet", "cx4_cnp", CX4_CNP)
put("roce_packet", "write_only_imm", frame(write_only_imm))
put("roce_packet", "write_middle", frame(write_middle))
put("roce_packet", "ack", frame(ack))
put("ip_udp", "write_only_imm", frame(write_only_imm))

put("call_header", "reduce_f32", CALL_HEADER)
put("call_header", "allreduce", b"RCCH" + bytes([1, 0, 0, 0]) + bytes(8) + struct.pack("!QII", 5, 0, 0))

put("segment", "small", struct.pack("<IBIB", 10000, 4, 0xFFFFFE, 1) + bytes(16))
put("segment", "zero", bytes(24))
put("segment", "psns", bytes(range(0, 96)))

put("post", "nccl", struct.pack("<QQQBHBQQQ", 9, 2, 1000, 8, 32768, 2, 0x100000, 4 << 20, 64) + b"\x01" + bytes(4))
put("post", "zero", bytes(64))
put("post", "pattern", bytes((i * 37) & 0xFF for i in range(80)))
