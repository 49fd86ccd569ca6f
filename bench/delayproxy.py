"""A TCP relay for bench/bench.py bucket-far: every chunk is held D ms
before it is passed on, both ways, so a server on this host answers as one
a network away would (a round trip of 2 D), where the kernel has no netem."""
import asyncio
import sys

# delayproxy.py LISTEN_PORT HOST PORT D_MS
LPORT, DHOST, DPORT, D = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4]) / 1000

async def pump(r, w):
    loop = asyncio.get_running_loop()
    q = asyncio.Queue()
    async def sender():
        while True:
            t, data = await q.get()
            dt = t - loop.time()
            if dt > 0:
                await asyncio.sleep(dt)
            if data is None:
                try: w.close()
                except Exception: pass
                return
            w.write(data)
            await w.drain()
    s = asyncio.create_task(sender())
    try:
        while True:
            data = await r.read(1 << 16)
            q.put_nowait((loop.time() + D, data or None))
            if not data:
                break
    except Exception:
        q.put_nowait((loop.time() + D, None))
    await s

async def handle(cr, cw):
    try:
        sr, sw = await asyncio.open_connection(DHOST, DPORT)
    except Exception:
        cw.close(); return
    await asyncio.gather(pump(cr, sw), pump(sr, cw), return_exceptions=True)

async def main():
    srv = await asyncio.start_server(handle, '127.0.0.1', LPORT)
    print('ready', flush=True)
    async with srv:
        await srv.serve_forever()
asyncio.run(main())
