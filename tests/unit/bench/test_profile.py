"""How bench/profile reads py-spy's folded stacks: waiting samples set apart, busy samples
by area and function, and inclusive time only for Millpond's own frames (loaded through
src/millpond, which py-spy shortens to the module path)."""

from __future__ import annotations

from pathlib import Path

from bench.profile import fold, share

ROOT = str(Path(__file__).resolve().parents[3]) + "/"
LOOP = "run_forever (asyncio/base_events.py:607);_run_once (asyncio/base_events.py:1922)"
CALL = f"{LOOP};Handle._run (asyncio/events.py:84);Execute ({ROOT}src/millpond/services/router/servicer.py:40)"
GRPC = ".venv/lib/python3.11/site-packages/grpc/aio/_call.py:560"
FOLDED = f"""\
{LOOP};EpollSelector.select (selectors.py:468) 50
Thread._bootstrap (threading.py:1002);Thread.run (threading.py:982) 30
{LOOP};Handle._run (asyncio/events.py:84) 8
{CALL};execute_pull (millpond/services/router/pull.py:12) 6
{CALL};UnaryUnaryCall._invoke ({GRPC}) 4
{CALL};Execute ({ROOT}src/millpond/services/router/servicer.py:44) 2
"""


def test_waiting_samples_are_set_apart_and_busy_ones_summed(tmp_path: Path) -> None:
    path = tmp_path / "router.folded"
    path.write_text(FOLDED)
    total, busy, own, inclusive, areas = fold(path)
    assert (total, busy) == (100, 20)
    assert areas == {"C callbacks (gRPC Cython, asyncio)": 8, "millpond": 8, "grpc": 4}
    assert own["execute_pull (services/router/pull.py)"] == 6
    # a recursive frame counts once per sample; only our own modules are listed inclusive
    assert inclusive == {"Execute (services/router/servicer.py)": 12, "execute_pull (services/router/pull.py)": 6}
    assert share(areas, busy, 2) == {"C callbacks (gRPC Cython, asyncio)": 40.0, "millpond": 40.0}
