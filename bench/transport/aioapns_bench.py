"""aioapns side of bench/transport: N live-activity pushes through aioapns to the APNs simulator.

Points aioapns's production endpoint (class attributes APNS_SERVER / APNS_PORT of aioapns 4.x) at HOST:PORT, trusts
the simulator's CA (SSL_CERT_FILE), and sends the same payload and headers as the other two clients, K coroutines at
a time over C connections. Prints one JSON line like marquee-bench transport.
"""

import asyncio
import json
import os
import ssl
import sys
import time

from aioapns import APNs, NotificationRequest, PushType
from aioapns import connection


def token(i: int) -> str:
    return ("%08x" % (i & 0xFFFFFFFF)) * 8


async def main() -> None:
    env = os.environ
    host, port = env["SIM_HOST"], int(env["SIM_PORT"])
    n, connections = int(env["N"]), int(env["CONNECTIONS"])
    concurrency, tokens = int(env["CONCURRENCY"]), int(env.get("TOKENS", "10000"))
    warmup = int(env.get("WARMUP", "200"))
    for cls in (connection.APNsProductionClientProtocol, connection.APNsTLSClientProtocol):
        cls.APNS_SERVER = host
        cls.APNS_PORT = port
    with open(env["KEY_FILE"]) as f:
        key = f.read()
    with open(env["PAYLOAD_FILE"]) as f:
        payload = json.load(f)
    # aioapns 4.0 offers no ALPN on its default context; the simulator (like an HTTP/2-only server) wants "h2".
    context = ssl.create_default_context(cafile=env["SSL_CERT_FILE"])
    context.set_alpn_protocols(["h2"])
    client = APNs(
        key=key, key_id=env["KEY_ID"], team_id=env["TEAM_ID"], topic=env["TOPIC"], use_sandbox=False,
        max_connections=connections, ssl_context=context)

    async def run(total: int):
        latencies, failed, first = [], 0, None

        async def sender(k: int):
            nonlocal failed, first
            for i in range(k, total, concurrency):
                request = NotificationRequest(
                    device_token=token(i % tokens), message=payload, time_to_live=3600, priority=10,
                    push_type=PushType.LIVEACTIVITY)
                started = time.perf_counter()
                result = await client.send_notification(request)
                latencies.append(time.perf_counter() - started)
                if not result.is_successful:
                    failed += 1
                    first = first or f"{result.status} {result.description}"

        await asyncio.gather(*(sender(k) for k in range(min(concurrency, max(total, 1)))))
        return latencies, failed, first

    _, failed, first = await run(warmup)
    if failed:
        sys.exit(f"aioapns warm-up: {failed} of {warmup} not sent; first: {first}")
    start = time.perf_counter()
    latencies, failed, first = await run(n)
    elapsed = time.perf_counter() - start
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, max(0, int(-(-p * len(latencies) // 100)) - 1))] * 1000

    print(json.dumps({
        "bench": "transport", "client": "aioapns", "n": n, "connections": connections, "concurrency": concurrency,
        "seconds": round(elapsed, 3), "pushes_per_second": int(n / elapsed), "p50_ms": round(pct(50), 2),
        "p99_ms": round(pct(99), 2), "max_ms": round(latencies[-1] * 1000, 2), "not_sent": failed}))
    if first:
        print(f"aioapns: first push not sent: {first}", file=sys.stderr)


asyncio.run(main())
