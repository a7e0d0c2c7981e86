"""A TCP relay that holds every chunk for a fixed delay in each direction, order kept: a slow link in user space
(the kernel here has no netem). Used by scripts/faults for APNs 200 ms away, and by `scripts/bench --rtt`.

    python3 delay-relay.py --listen HOST:PORT --to HOST:PORT --delay-ms MS [--processes N]

With --processes N, N processes share the listening port (SO_REUSEPORT, the kernel spreading connections over them):
one asyncio loop is one core, and a benchmark must not measure the relay's ceiling instead of the client's.
"""
import argparse
import asyncio
import os
import signal
import sys


async def pump(reader, writer, delay):
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue()

    async def deliver():
        while True:
            due, chunk = await queue.get()
            if chunk is None:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(chunk)
            await writer.drain()
        writer.close()

    sender = asyncio.create_task(deliver())
    try:
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                break
            queue.put_nowait((loop.time() + delay, chunk))
    except ConnectionError:
        pass
    queue.put_nowait((loop.time() + delay, None))
    try:
        await sender
    except ConnectionError:
        pass


async def serve(options, bound=None):
    listen_host, listen_port = options.listen.rsplit(":", 1)
    target_host, target_port = options.to.rsplit(":", 1)
    delay = options.delay_ms / 1000

    async def handle(client_reader, client_writer):
        try:
            server_reader, server_writer = await asyncio.open_connection(target_host, int(target_port))
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(pump(client_reader, server_writer, delay), pump(server_reader, client_writer, delay))

    server = await asyncio.start_server(handle, listen_host, int(listen_port), reuse_port=options.processes > 1)
    if bound is not None:
        os.write(bound, b"b")
    async with server:
        await server.serve_forever()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", required=True)
    parser.add_argument("--to", required=True)
    parser.add_argument("--delay-ms", type=float, required=True)
    parser.add_argument("--processes", type=int, default=1)
    options = parser.parse_args()
    if options.processes <= 1:
        print(f"relaying {options.listen} -> {options.to} with {options.delay_ms} ms each way", flush=True)
        asyncio.run(serve(options))
        return
    children = []
    bound_read, bound_write = os.pipe()
    for _ in range(options.processes):
        child = os.fork()
        if child == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            asyncio.run(serve(options, bound=bound_write))
            os._exit(0)
        children.append(child)
    # Ready once every child has bound its socket (one byte each): callers wait for the line below.
    for _ in children:
        os.read(bound_read, 1)

    def stop(*_):
        for child in children:
            os.kill(child, signal.SIGTERM)
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"relaying {options.listen} -> {options.to} with {options.delay_ms} ms each way, "
          f"{options.processes} processes", flush=True)
    for child in children:
        os.waitpid(child, 0)


main()
