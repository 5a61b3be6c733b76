"""``millpond``: start a local cluster, run SQL against it, or run the readings demo."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Annotated

import grpc
import typer
from google.protobuf.json_format import MessageToJson
from rich.console import Console

from millpond.cli.client import PushStream, RouterClient, metastore_digest
from millpond.cli.output import print_outcome, print_stream
from millpond.cli.status import lag_outcome, leader_status, router_status, status_outcome
from millpond.shared.errors import MillpondError, SetupError
from millpond.shared.net import free_port
from millpond.shared.results import Outcome
from millpond.shared.rpc.tls import ClientCredentials, TlsFiles
from millpond.shared.sql.parser import parse_script

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Millpond: SQL over Kafka streams.")
out = Console(soft_wrap=True)
err = Console(stderr=True)

DEFAULT_SERVER = "127.0.0.1:8088"


_credentials = ClientCredentials()


@app.callback()
def connection(
    token: Annotated[str | None, typer.Option(envvar="MILLPOND_TOKEN", help=(
        "Bearer token for a cluster that authenticates clients (sent only over TLS)."))] = None,
    tls_ca_file: Annotated[Path | None, typer.Option(envvar="MILLPOND_TLS_CA_FILE", help=(
        "CA certificate (PEM) that signs the cluster's certificates: connect with TLS."))] = None,
    tls_cert_file: Annotated[Path | None, typer.Option(envvar="MILLPOND_TLS_CERT_FILE", help=(
        "Client certificate (PEM) for the cluster's mutual TLS."))] = None,
    tls_key_file: Annotated[Path | None, typer.Option(envvar="MILLPOND_TLS_KEY_FILE", help=(
        "Private key (PEM) of the client certificate."))] = None,
) -> None:
    """How sql, status and digest connect: plaintext, or TLS with a client certificate and a token."""
    global _credentials
    try:
        tls = TlsFiles.of(*(str(f) if f else None for f in (tls_cert_file, tls_key_file, tls_ca_file)))
    except SetupError as error:
        err.print(error.message, markup=False)
        raise typer.Exit(2) from None
    _credentials = ClientCredentials(tls, token)


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM stops ``up`` the same way Ctrl-C does."""
    raise KeyboardInterrupt


@app.command()
def up(
    workers: Annotated[int, typer.Option(help="How many query workers to start.")] = 2,
    kafka: Annotated[str | None, typer.Option(help="Use this Kafka cluster instead of an embedded broker.")] = None,
    port: Annotated[int, typer.Option(help="The router's port (the client front door).")] = 8088,
    data_dir: Annotated[Path, typer.Option(help="Broker data, state stores and logs.")] = Path(".millpond"),
    spark_master: Annotated[str, typer.Option(help="Spark master URL for every worker.")] = "local[1]",
    service_id: Annotated[str, typer.Option(help="The cluster's id (names its command topic).")] = "millpond",
    coordinators: Annotated[int, typer.Option(help="Coordinators: one leads, the others stand by.")] = 1,
    secure: Annotated[bool, typer.Option(help=(
        "Mutual TLS everywhere (a throwaway CA under DATA_DIR/tls) and bearer tokens for clients."))] = False,
) -> None:
    """Start a local cluster in the foreground; Ctrl-C or SIGTERM stops all of it."""
    from millpond.deploy.local.launcher import LocalCluster  # (the commands that talk to a cluster start faster)

    cluster = LocalCluster(data_dir=data_dir, workers=workers, kafka=kafka, router_port=port,
                           spark_master=spark_master, service_id=service_id, coordinators=coordinators,
                           secure=secure)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        cluster.start()
        print(f"ready {cluster.describe()} logs={data_dir / 'logs'}", flush=True)
        if cluster.client_tls is not None:
            tls = cluster.client_tls
            print(f"secure: clients need MILLPOND_TLS_CA_FILE={tls.ca} MILLPOND_TLS_CERT_FILE={tls.cert} "
                  f"MILLPOND_TLS_KEY_FILE={tls.key} and a token from {tls.ca.parent / 'tokens.toml'} "
                  f"(admin: MILLPOND_TOKEN={cluster.tokens['admin']})", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    except MillpondError as error:
        err.print(f"[red]{error.message}[/red]")
        raise typer.Exit(1) from None
    finally:
        cluster.stop()
        print("stopped", flush=True)


def _run_statements(client: RouterClient, text: str, output: str) -> None:
    for outcome in client.run_script(text):
        if isinstance(outcome, PushStream):
            print_stream(outcome, output, out)
        else:
            print_outcome(outcome, output, out)


def _shell(client: RouterClient, output: str) -> None:
    out.print("millpond sql shell; end statements with ';', Ctrl-D to quit.")
    buffer = ""
    while True:
        try:
            line = input("millpond> " if not buffer else "      ...> ")
        except EOFError:
            return
        buffer += line + "\n"
        if not line.rstrip().endswith(";"):
            continue
        try:
            _run_statements(client, buffer, output)
        except (MillpondError, grpc.RpcError) as error:
            err.print(_message(error), markup=False)
        buffer = ""


def _message(error: BaseException) -> str:
    if isinstance(error, grpc.RpcError):
        return f"{error.code().name}: {error.details()}"
    if isinstance(error, MillpondError):
        return error.message
    return str(error)


@app.command()
def sql(
    server: Annotated[str, typer.Option(envvar="MILLPOND_SERVER", help="The router, host:port.")] = DEFAULT_SERVER,
    execute: Annotated[str | None, typer.Option("-e", "--execute", help="Statements to run.")] = None,
    file: Annotated[Path | None, typer.Option("-f", "--file", help="A file of statements to run.")] = None,
    output: Annotated[str, typer.Option(help="table or json (JSON Lines).")] = "table",
) -> None:
    """Run SQL through the router: -e, -f, or an interactive shell."""
    if output not in ("table", "json"):
        err.print("--output must be table or json")
        raise typer.Exit(2)
    client = RouterClient(server, credentials=_credentials)
    try:
        if execute is None and file is None:
            _shell(client, output)
            return
        text = execute if execute is not None else file.read_text()  # type: ignore[union-attr]
        _run_statements(client, text, output)
    except (MillpondError, grpc.RpcError) as error:
        err.print(_message(error), markup=False)
        raise typer.Exit(1) from None
    finally:
        client.close()


def _wait_for_rows(client: RouterClient, query: str, rows: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if len(client.execute(query)[0].rows) >= rows:
                return
        except grpc.RpcError:
            pass
        time.sleep(0.5)
    raise MillpondError(f"{query!r} did not return {rows} rows within {timeout}s")


@app.command()
def demo(
    workers: Annotated[int, typer.Option(help="How many query workers to start.")] = 2,
    port: Annotated[int, typer.Option(help="The router's port.")] = 8088,
    data_dir: Annotated[Path, typer.Option(help="Where the demo cluster keeps its data.")] = Path(".millpond/demo"),
) -> None:
    """Start a fresh local cluster, run seed 000's readings example, print the table, stop."""
    from millpond.deploy.local.launcher import LocalCluster

    shutil.rmtree(data_dir, ignore_errors=True)
    cluster = LocalCluster(data_dir=data_dir, workers=workers, router_port=port)
    try:
        out.print(f"starting a local cluster with {workers} workers ...")
        cluster.start()
        out.print(f"ready {cluster.describe()}")
        client = RouterClient(cluster.router)
        script = resources.files("millpond.cli").joinpath("readings.sql").read_text()
        out.print(f"running {len(parse_script(script))} statements of the readings example ...")
        for _ in client.run_script(script):
            pass
        _wait_for_rows(client, "SELECT * FROM avg_readings;", 8, timeout=300)
        for query in ("SELECT * FROM avg_readings;", "SELECT * FROM avg_readings WHERE sensor = 'sensor-1';"):
            out.print(f"\nmillpond> {query}")
            print_outcome(client.execute(query)[0], "table", out)
        client.close()
    except (MillpondError, grpc.RpcError) as error:
        err.print(_message(error), markup=False)
        err.print(f"service logs are in {data_dir / 'logs'}")
        raise typer.Exit(1) from None
    finally:
        cluster.stop()


@app.command()
def jars() -> None:
    """Fetch the Kafka broker, the Spark Kafka connector and the Kafka tools from Maven Central,
    and build Millpond's Spark extension (a JDK's javac), into the jar cache (MILLPOND_CACHE or
    ~/.cache/millpond); workers only look them up."""
    from millpond.deploy import jars as jar_cache

    try:
        for bundle in jar_cache.BUNDLES:
            found = jar_cache.ensure_jars(bundle)
            out.print(f"{bundle}: {len(found)} jars in {found[0].parent}")
    except MillpondError as error:
        err.print(f"error: {error}")
        raise typer.Exit(1) from None


@app.command()
def digest(
    endpoints: Annotated[list[str], typer.Argument(help="host:port of any coordinator, worker or router.")],
    output: Annotated[str, typer.Option(help="table or json (JSON Lines).")] = "table",
) -> None:
    """Compare the metastore digests of nodes; exits 1 when they differ."""
    answers = []
    try:
        for endpoint in endpoints:
            answers.append((endpoint, metastore_digest(endpoint, credentials=_credentials)))
    except grpc.RpcError as error:
        err.print(_message(error), markup=False)
        raise typer.Exit(1) from None
    outcome = Outcome("digest", status="", columns=[(c, "VARCHAR") for c in
                                                    ("ENDPOINT", "NODE", "COMMAND_OFFSET", "DIGEST", "ERRORS")],
                      rows=[[e, a.node, a.command_offset, a.digest, "; ".join(a.errors)] for e, a in answers])
    print_outcome(outcome, output, out)
    if len({a.digest for _, a in answers}) > 1:
        err.print("the nodes' metastores differ")
        raise typer.Exit(1)


@app.command()
def status(
    server: Annotated[str, typer.Option(envvar="MILLPOND_SERVER", help="The router, host:port.")] = DEFAULT_SERVER,
    coordinator: Annotated[str | None, typer.Option(
        envvar="MILLPOND_COORDINATOR",
        help="Ask these coordinators directly (host:port[,host:port...]) instead of the router.")] = None,
    output: Annotated[str, typer.Option(help="table, or json (the whole status as one JSON object).")] = "table",
) -> None:
    """Show every worker: alive, last heartbeat, active/standby/warm-up tasks, restores, and
    every table copy's changelog offset, end offset and lag."""
    try:
        if coordinator is not None:
            from millpond.shared.config import endpoints

            cluster, router_hosts, message = leader_status(endpoints(coordinator), credentials=_credentials), [], None
        else:
            answer = router_status(server, credentials=_credentials)
            cluster, router_hosts, message = answer.cluster, list(answer.router_hosts), answer
    except MillpondError as error:
        err.print(error.message, markup=False)
        raise typer.Exit(1) from None
    except grpc.RpcError as error:
        err.print(_message(error), markup=False)
        raise typer.Exit(1) from None
    if output == "json":
        out.print(MessageToJson(message if message is not None else cluster, indent=None), markup=False,
                  highlight=False, soft_wrap=True)
        return
    print_outcome(status_outcome(cluster, router_hosts=router_hosts), "table", out)
    print_outcome(lag_outcome(cluster), "table", out)


@app.command()
def loadtest(
    server: Annotated[str, typer.Option(envvar="MILLPOND_SERVER", help="The router, host:port.")] = DEFAULT_SERVER,
    kafka: Annotated[str | None, typer.Option(help="The cluster's Kafka bootstrap servers (events are produced "
                                                   "there directly).")] = None,
    local: Annotated[bool, typer.Option(help="Start a local cluster for the test (needed for --fault).")] = False,
    workers: Annotated[int, typer.Option(help="With --local: workers to start.")] = 3,
    standbys: Annotated[int, typer.Option(help="With --local: standby replicas per table partition.")] = 1,
    data_dir: Annotated[Path, typer.Option(help="With --local: where the cluster keeps its data.")] = Path(
        ".millpond/loadtest"),
    stream: Annotated[str, typer.Option(help="The stream to write; the table is STREAM_avg.")] = "loadtest",
    keys: Annotated[int, typer.Option(help="Distinct keys.")] = 1000,
    partitions: Annotated[int, typer.Option(help="Partitions of the stream and table.")] = 8,
    duration: Annotated[float, typer.Option(help="Seconds to run.")] = 30.0,
    events_per_s: Annotated[float, typer.Option(help="Target events per second; 0 for as fast as possible.")] = 1000.0,
    pull_concurrency: Annotated[int, typer.Option(help="Concurrent pull-query callers.")] = 4,
    pull_rate: Annotated[float, typer.Option(help="Target pulls per second in all; 0 for as fast as possible.")] = 0.0,
    distribution: Annotated[str, typer.Option(help="Key distribution of the pulls: uniform or zipf.")] = "uniform",
    standby_reads: Annotated[bool, typer.Option(help="Let standbys answer pulls.")] = True,
    fault: Annotated[list[str] | None, typer.Option(help=(
        "With --local: kill:worker-1@10 (SIGKILL at 10 s), stop:worker-2@20, restart:worker-1@30, add@15; "
        "stop:worker-1@+10: 10 s after the fault before it finished (an add: once partitions moved to the new worker)."))] = None,
) -> None:
    """Drive a cluster with events and pull queries (and faults); print a JSON summary."""
    import asyncio

    from millpond.cli import loadtest as harness
    from millpond.deploy.local.launcher import LocalCluster

    cluster: LocalCluster | None = None
    try:
        faults = [harness.Fault.parse(f) for f in fault or []]
        if local:
            shutil.rmtree(data_dir, ignore_errors=True)
            cluster = LocalCluster(data_dir=data_dir, workers=workers, router_port=free_port(), service_id="loadtest",
                                   coordinator_env={"MILLPOND_NUM_STANDBY_REPLICAS": str(standbys)})
            err.print(f"starting a local cluster with {workers} workers ...")
            cluster.start()
            server, kafka = cluster.router, cluster.bootstrap
        if kafka is None:
            raise MillpondError("give --kafka (the cluster's bootstrap servers) or --local")
        config = harness.Config(server=server, kafka=kafka, stream=stream, keys=keys, partitions=partitions,
                                duration_s=duration, events_per_s=events_per_s, pull_concurrency=pull_concurrency,
                                pull_rate=pull_rate, distribution=distribution, standby_reads=standby_reads,
                                faults=faults, credentials=_credentials)
        summary = asyncio.run(harness.run(config, cluster, err))
        print(json.dumps(summary, indent=2), flush=True)
    except (MillpondError, grpc.RpcError) as error:
        err.print(_message(error), markup=False)
        raise typer.Exit(1) from None
    finally:
        if cluster is not None:
            cluster.stop()


def main() -> None:
    """Console-script entry point."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    app()


if __name__ == "__main__":
    main()
