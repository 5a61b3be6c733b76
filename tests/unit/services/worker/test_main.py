"""The worker process's own settings: gRPC's that lets it fork its Spark JVM while it serves, and
the interpreter's switch interval."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

FORKS = 100

_FORKING_BESIDE_A_BUSY_SERVER = textwrap.dedent(f"""
    import asyncio, signal, subprocess, threading
    import millpond.services.worker.__main__  # the worker's entry point, first, as `python -m` runs it
    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    async def main():
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        stop = threading.Event()

        async def ask():
            async with grpc.aio.insecure_channel(f"127.0.0.1:{{port}}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                while not stop.is_set():
                    await stub.Check(health_pb2.HealthCheckRequest())

        askers = asyncio.gather(ask(), ask())
        await asyncio.sleep(0.2)

        def launch():  # as PySpark launches its JVM: a preexec_fn runs Python in the child
            return [subprocess.Popen(["/bin/true"], stdin=subprocess.PIPE,
                                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)).wait()
                    for _ in range({FORKS})]

        codes = await asyncio.to_thread(launch)
        stop.set()
        await askers
        await server.stop(0)
        print(sorted(set(codes)), codes.count(0))

    asyncio.run(main())
""")


def test_the_worker_forks_children_that_live_while_its_grpc_server_is_busy() -> None:
    """With gRPC's fork support on, 15 of 100 such children died before their exec (SIGSEGV
    or SIGABRT); the worker's entry point turns it off before gRPC is imported."""
    done = subprocess.run([sys.executable, "-c", _FORKING_BESIDE_A_BUSY_SERVER], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[0] == f"[0] {FORKS}", done.stdout


_SWITCH_INTERVAL_AT_SERVE = textwrap.dedent("""
    import sys
    import millpond.services.worker.__main__ as entry

    async def serve(settings):
        print(sys.getswitchinterval())

    entry.serve = serve
    entry.main()
""")


def test_the_worker_sets_the_interpreters_switch_interval_before_it_serves() -> None:
    """A thread waiting for the interpreter lock (each call into Spark's JVM, when its answer
    comes) gets it after the worker's interval, not Python's 5 ms."""
    env = {**os.environ, "MILLPOND_GIL_SWITCH_INTERVAL_MS": "0.7"}
    done = subprocess.run([sys.executable, "-c", _SWITCH_INTERVAL_AT_SERVE], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.strip()) == 0.0007, done.stdout
