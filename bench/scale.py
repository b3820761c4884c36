"""Scale-out: what one ``recap worker`` holds in memory, and what a second worker process adds.

- ``worker_rss_mib``: total resident memory (the sum of ``VmRSS`` from ``/proc`` over the
  supervisor and every process under it) of one ``recap worker`` with both queues, a summary model
  configured, idle after start-up (read once two readings a second apart agree within 1 MiB);
  bound 550. ``worker_rss_compress_mib`` is the compress process's share (reported); the
  description names the supervisor's and the maintenance worker's.
- ``scale_two_processes_vs_one_redis`` and ``..._rabbitmq``: compressions per second with two
  ``recap worker --queues compress`` processes (16 threads each) over one, the model answering in
  1 s, PostgreSQL, on a Redis server and a RabbitMQ node of the benchmark's own (reported; 2 would
  be ideal). Each description gives the CPU seconds the worker processes used per compression
  (``utime + stime`` from ``/proc``), which is what bounds the ratio on a small machine.
"""

from __future__ import annotations

import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench import Figure

RSS_BOUND_MIB = 550
STABLE_MIB = 1.0  # two readings this close, a second apart: start-up is over
STABLE_TIMEOUT = 120.0
READING_SECONDS = 1.0  # between two memory readings
RUNS = 128  # compressions timed per configuration
WARM_UP_RUNS = 4  # first compressions of fresh processes, not timed
MODEL_SECONDS = 1.0
WINDOW = 3_000  # the throughput benchmark's synthetic conversations are over its trigger
RUN_TIMEOUT = 300.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# --- /proc ---------------------------------------------------------------------------------------


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process under it."""
    found = [pid]
    tasks = Path(f"/proc/{pid}/task")
    for task in tasks.iterdir() if tasks.exists() else []:
        try:
            children = (task / "children").read_text().split()
        except OSError:  # the thread ended meanwhile
            continue
        for child in children:
            found += process_tree(int(child))
    return found


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU time the processes used so far."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / CLOCK_TICKS


def command_of(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


# --- memory --------------------------------------------------------------------------------------


def settled_rss(root: int) -> dict[int, float]:
    """RSS per process of the tree once two readings a second apart agree."""
    from tests.support.worker_stack import wait_for

    last: list[dict[int, float]] = [{}]

    def steady() -> bool:
        now = {pid: rss_mib(pid) for pid in process_tree(root)}
        before, last[0] = last[0], now
        change = abs(sum(now.values()) - sum(before.values()))
        return set(now) == set(before) and change < STABLE_MIB

    wait_for(steady, STABLE_TIMEOUT, "the worker's memory to settle", poll=READING_SECONDS)
    return last[0]


def memory_figures(folder: Path) -> list[Figure]:
    from bench.compress import stand_in_env
    from recap.core.storage.db import make_engine
    from recap.core.storage.migrate import upgrade
    from tests.support.services import RedisServer
    from tests.support.worker_stack import WorkerProcess, worker_env

    url = f"sqlite:///{folder / 'memory.db'}"
    upgrade(make_engine(url))
    with RedisServer.started() as broker:
        env = worker_env(**stand_in_env(folder, url, broker.url, "http://127.0.0.1:9/v1"))
        worker = WorkerProcess(env, folder / "memory.log", args=())
        worker.start()
        try:
            worker.wait_ready(2)  # the compress and the maintenance worker
            assert worker.process is not None
            readings = settled_rss(worker.process.pid)
            roles = {pid: role_of(command_of(pid)) for pid in readings}
        finally:
            worker.stop()
    by_role: dict[str, float] = {}
    for pid, mib in readings.items():
        by_role[roles[pid]] = by_role.get(roles[pid], 0.0) + mib
    total = sum(readings.values())
    parts = ", ".join(f"{role} {mib:.0f}" for role, mib in sorted(by_role.items()))
    return [
        Figure(
            "worker_rss_mib",
            round(total, 1),
            f"<= {RSS_BOUND_MIB}",
            f"resident memory of one `recap worker` (both queues, summary model configured, idle "
            f"after start-up), summed over its {len(readings)} processes from /proc: {parts} MiB",
        ),
        Figure(
            "worker_rss_compress_mib",
            round(by_role.get("compress", 0.0), 1),
            "",
            "the compress worker's share (threads pool of 16, litellm loaded)",
        ),
    ]


def role_of(command: str) -> str:
    if "recap.workers.runner" in command:
        return "supervisor"
    if "--queues compress" in command:
        return "compress"
    if "--queues maintenance" in command:
        return "maintenance"
    return "other"


# --- throughput ----------------------------------------------------------------------------------


def timed_runs(
    engine: Any, broker_url: str, ids: list[str], workers: list[Any]
) -> tuple[float, float, float]:
    """(seconds, worker CPU seconds, growth of the workers' resident memory in MiB from idle to
    after the runs) for compressing ``ids`` once each after a warm-up."""
    from bench.compress import wait_for_runs
    from recap.workers.enqueue import compress_later

    warm, timed = ids[:WARM_UP_RUNS], ids[WARM_UP_RUNS:]
    idle = sum(rss_mib(pid) for w in workers for pid in process_tree(w.process.pid))
    for cid in warm:
        compress_later(cid, broker_url=broker_url)
    wait_for_runs(engine, len(warm), timeout=RUN_TIMEOUT)
    pids = [pid for w in workers for pid in process_tree(w.process.pid)]
    cpu_before = cpu_seconds(pids)
    started = time.perf_counter()
    for cid in timed:
        compress_later(cid, broker_url=broker_url)
    actions = wait_for_runs(engine, len(ids), timeout=RUN_TIMEOUT)
    elapsed = time.perf_counter() - started
    cpu = cpu_seconds(pids) - cpu_before
    grown = sum(rss_mib(pid) for pid in pids) - idle
    summarized = actions.count("summarized")
    if summarized != len(ids):
        raise SystemExit(f"bench.scale: {summarized} of {len(ids)} runs summarized: {actions}")
    return elapsed, cpu, grown


def one_configuration(
    folder: Path, kind: str, processes: int, api_base: str
) -> tuple[float, float, float]:
    """``timed_runs`` for ``RUNS`` compressions on ``processes`` workers."""
    from bench.compress import prepared, stand_in_env
    from bench.services import broker, database
    from tests.support.worker_stack import WorkerProcess, stop_workers, worker_env

    with database() as url, broker(kind) as broker_url:
        engine, ids = prepared(url, RUNS + WARM_UP_RUNS, f"{kind}{processes}-")
        env = worker_env(**stand_in_env(folder, url, broker_url, api_base))
        log = folder / f"{kind}-{processes}"
        workers = [
            WorkerProcess(env, Path(f"{log}-{n}.log"), args=("--queues", "compress"))
            for n in range(processes)
        ]
        try:
            with ThreadPoolExecutor(processes) as starting:
                list(starting.map(WorkerProcess.start, workers))
            return timed_runs(engine, broker_url, ids, workers)
        finally:
            stop_workers(workers)
            engine.dispose()


def scale_figure(folder: Path, kind: str, api_base: str) -> Figure:
    one_s, one_cpu, one_grown = one_configuration(folder, kind, 1, api_base)
    two_s, two_cpu, _ = one_configuration(folder, kind, 2, api_base)
    timed = RUNS
    ratio = (timed / two_s) / (timed / one_s)
    return Figure(
        f"scale_two_processes_vs_one_{kind}",
        round(ratio, 3),
        "",
        f"{timed} compressions (model answering in {MODEL_SECONDS:g} s, PostgreSQL, "
        f"{'Redis' if kind == 'redis' else 'RabbitMQ'}): two `recap worker --queues compress` "
        f"processes of 16 threads {timed / two_s:.1f}/s over one {timed / one_s:.1f}/s (ideal 2); "
        f"worker CPU {two_cpu:.1f} s and {one_cpu:.1f} s, "
        f"{1000 * two_cpu / timed:.0f} and {1000 * one_cpu / timed:.0f} ms per compression, "
        f"on {os.cpu_count()} cores; one process's memory grew {one_grown:.0f} MiB from idle "
        f"to after its 16 threads ran",
    )


def run(_data: list[Path] | None = None) -> list[Figure]:
    from bench.compress import model_process, quiet_logs
    from tests.support.services import missing_rabbitmq

    quiet_logs()
    with tempfile.TemporaryDirectory(prefix="recap-scale-") as tmp:
        folder = Path(tmp)
        os.environ["RECAP_OUTPUT_DIR"] = str(folder / "outputs")
        figures = memory_figures(folder)
        model = model_process(MODEL_SECONDS)
        try:
            api_base = str(model.stdout.readline().decode().strip())  # type: ignore[union-attr]
            kinds = ["redis"] if missing_rabbitmq() else ["redis", "rabbitmq"]
            figures += [scale_figure(folder, kind, api_base) for kind in kinds]
        finally:
            model.kill()
            model.wait()
    return figures
