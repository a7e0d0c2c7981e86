"""A TCP relay that holds every chunk for a fixed delay in each direction, order kept: a slow link in user space
(the kernel here has no netem). Used by scripts/faults for APNs 200 ms away, and usable by the benchmark's latency mode.

    python3 delay-relay.py --listen HOST:PORT --to HOST:PORT --delay-ms MS
"""
import argparse
import asyncio


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


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", required=True)
    parser.add_argument("--to", required=True)
    parser.add_argument("--delay-ms", type=float, required=True)
    options = parser.parse_args()
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

    server = await asyncio.start_server(handle, listen_host, int(listen_port))
    print(f"relaying {options.listen} -> {options.to} with {options.delay_ms} ms each way", flush=True)
    async with server:
        await server.serve_forever()


asyncio.run(main())
