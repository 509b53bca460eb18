"""Bring the loopback interface up (what ``ip link set lo up`` does), for a fresh network
namespace on a machine without iproute2: `make interop` runs the interop tests under
``unshare -n``, where ``lo`` starts down and 127.0.0.1 cannot be reached."""

import fcntl
import socket
import struct

SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1

with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    flags = struct.unpack("16sh", fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sh", b"lo", 0)))[1]
    fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | IFF_UP))
