"""Runs inside the sandbox: draws y = sin(x) and writes /workspace/plot.png
with nothing but the standard library (zlib + struct)."""
import math
import struct
import zlib

W, H = 320, 200
px = [[(255, 255, 255) for _ in range(W)] for _ in range(H)]
for x in range(W):  # axes
    px[H // 2][x] = (180, 180, 180)
for y in range(H):
    px[y][W // 16] = (180, 180, 180)
for i in range(W * 4):  # the curve, thick enough to see
    x = i / 4
    y = H / 2 - math.sin(x / W * 4 * math.pi) * (H / 2 - 12)
    for dy in (-1, 0, 1):
        yy = int(y) + dy
        if 0 <= yy < H:
            px[yy][int(x)] = (220, 60, 40)


def chunk(kind, data):
    c = struct.pack('>I', len(data)) + kind + data
    return c + struct.pack('>I', zlib.crc32(kind + data) & 0xffffffff)


raw = b''.join(b'\x00' + bytes(v for p in row for v in p) for row in px)
png = (b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', W, H, 8, 2, 0, 0, 0))
       + chunk(b'IDAT', zlib.compress(raw, 9)) + chunk(b'IEND', b''))
open('/workspace/plot.png', 'wb').write(png)
print('wrote /workspace/plot.png (%d bytes)' % len(png))
