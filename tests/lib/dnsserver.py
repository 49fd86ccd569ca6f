"""A DNS server for tests, on the host's loopback."""
import socket
import struct
import threading


class Dns:
    """A resolver on the host's loopback (the daemon's dnsServer in this
    test): A records for a few names, NXDOMAIN for the rest; it remembers
    every name it was asked."""
    def __init__(self, records):
        self.records = records
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(('127.0.0.1', 0))
        self.port = self.sock.getsockname()[1]
        self.asked = []
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                q, addr = self.sock.recvfrom(4096)
            except OSError:
                return
            off, labels = 12, []
            while q[off]:
                labels.append(q[off + 1:off + 1 + q[off]].decode())
                off += 1 + q[off]
            name, qtype = '.'.join(labels).lower(), struct.unpack('>H', q[off + 1:off + 3])[0]
            self.asked.append(name)
            question = q[12:off + 5]
            ip = self.records.get(name)
            answers = b''
            if ip and qtype == 1:
                answers = b'\xc0\x0c' + struct.pack('>HHIH', 1, 1, 60, 4) + socket.inet_aton(ip)
            flags = 0x8180 if name in self.records else 0x8183
            self.sock.sendto(q[:2] + struct.pack('>HHHHH', flags, 1, 1 if answers else 0, 0, 0) + question + answers, addr)

    def close(self):
        self.sock.close()
