#!/usr/bin/env python3
"""Hand-built frames at a router's node port (issue 10), as a peer that is not a router of
the cluster. Prints one line; exits 0 when the router refused as it must.

  node_port_attack.py plain HOST PORT SRC_IP SRC_QPN DEST_IP DEST_QPN RKEY ADDR
      No TLS: a hello as "node1", a connect with a forged source (SRC_IP/SRC_QPN: the
      victim's real peer), then a SEND, a WRITE of 0x66 bytes at RKEY/ADDR and a READ.
      Passes when the router closes the connection without answering any of it.
  node_port_attack.py tls HOST PORT CA CERT KEY HELLO SRC_IP DEST_IP DEST_QPN EXPECT
      TLS with a certificate of the cluster's CA; a hello naming HELLO, then a connect from
      SRC_IP. EXPECT "closed": the router must close the link; "eacces": it must answer
      the connect with EACCES (the source is a pod of another node).
"""
import os
import re
import socket
import ssl
import struct
import sys

# wire::kMagic and wire::kVersion, read from core's protocol/node_wire.h so that the frames stay
# current.
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../core/include/freeflow/protocol/node_wire.h")) as f:
    _codec = f.read()
MAGIC = int(re.search(r"kMagic = (0x[0-9a-fA-F]+);", _codec).group(1), 16)
VERSION = int(re.search(r"kVersion = ([0-9]+);", _codec).group(1))
HELLO, CONNECT, CONNECT_REPLY, RECORD = 1, 2, 3, 4
REC_SEND, REC_WRITE, REC_READ = 2, 4, 5
FIRST, LAST = 1, 2
IBV_WR_RDMA_WRITE, IBV_WR_SEND, IBV_WR_RDMA_READ = 0, 2, 4
EACCES = 13


def ip(text):
    return struct.unpack("!I", socket.inet_aton(text))[0]


def frame(kind, body, chan=1):
    return struct.pack("<IHHII", len(body), kind, 0, chan, 0) + body


def hello(node):
    return frame(HELLO, struct.pack("<II64s", MAGIC, VERSION, node.encode()))


def connect(src_ip, src_qpn, dest_ip, dest_qpn):
    # wire::Connect: src_ip, src_qpn, qp_type, dest_ip, dest_qpn, flags, token (relay: 0, 0)
    return frame(CONNECT, struct.pack("<6IQ", ip(src_ip), src_qpn, 2, ip(dest_ip), dest_qpn, 0, 0))


def record(kind, flags, opcode, rkey, addr, length, data=b""):
    req = struct.pack("<QQQIIIBBBB", addr, 0, 0, rkey, 1, length, opcode, 1, 7, 0)
    payload = req + data
    total = (32 + len(payload) + 63) & ~63
    head = struct.pack("<IBBHIIIIII", total, kind, flags, 0, length, 0, 0, 0, len(payload), 0)
    return frame(RECORD, head + payload)


def read_until_closed(sock, seconds=5.0):
    """Bytes the router sent before closing; None when it kept the connection open."""
    sock.settimeout(seconds)
    got = b""
    try:
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                return got
            got += chunk
    except (ConnectionResetError, ssl.SSLError, ssl.SSLEOFError):
        return got
    except socket.timeout:
        return None


def plain(host, port, src_ip, src_qpn, dest_ip, dest_qpn, rkey, addr):
    s = socket.create_connection((host, int(port)), timeout=5)
    rkey, addr = int(rkey), int(addr)
    data = b"\x66" * 256
    s.sendall(hello("node1") + connect(src_ip, int(src_qpn), dest_ip, int(dest_qpn)) +
              record(REC_SEND, FIRST | LAST, IBV_WR_SEND, 0, 0, 16, b"\x66" * 16) +
              record(REC_WRITE, FIRST | LAST, IBV_WR_RDMA_WRITE, rkey, addr, len(data), data) +
              record(REC_READ, FIRST | LAST, IBV_WR_RDMA_READ, rkey, addr, 256))
    got = read_until_closed(s)
    if got is None:
        print("FAIL plaintext frames: the router kept the connection open")
        return 1
    if len(got) >= 16 and struct.unpack("<IHHII", got[:16])[1] == CONNECT_REPLY:
        print("FAIL plaintext frames: the router answered the connect")
        return 1
    print(f"PASS plaintext frames refused (connection closed after {len(got)} bytes of TLS alert)")
    return 0


def tls(host, port, ca, cert, key, node, src_ip, dest_ip, dest_qpn, expect):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False  # this client attacks whichever router answers
    ctx.load_verify_locations(ca)
    ctx.load_cert_chain(cert, key)
    raw = socket.create_connection((host, int(port)), timeout=5)
    s = ctx.wrap_socket(raw)
    s.sendall(hello(node) + connect(src_ip, 0x1234, dest_ip, int(dest_qpn)))
    s.settimeout(5)
    got = b""
    try:
        while len(got) < 16 + 16:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
    except (ConnectionResetError, ssl.SSLError, socket.timeout):
        pass
    if len(got) >= 32 and struct.unpack("<IHHII", got[:16])[1] == CONNECT_REPLY:
        status = struct.unpack("<i", got[16:20])[0]
        ok = expect == "eacces" and status == EACCES
        print(f"{'PASS' if ok else 'FAIL'} hello {node}: connect answered with status {status}")
        return 0 if ok else 1
    ok = expect == "closed"
    print(f"{'PASS' if ok else 'FAIL'} hello {node}: the router closed the link")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) == 10 and sys.argv[1] == "plain":
        sys.exit(plain(*sys.argv[2:]))
    if len(sys.argv) == 12 and sys.argv[1] == "tls":
        sys.exit(tls(*sys.argv[2:]))
    print(__doc__, file=sys.stderr)
    sys.exit(2)
