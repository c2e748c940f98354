"""What sensors cost: the step with moving sensors beside the plain step, how soon a watcher hears of a
tick, and what more watchers cost the server.

W1 (DIRECTORY, or W1 data of --n proxies made first) with --sensors sphere sensors of radius
--radius scattered over it, all moving every step (0.5 a step, bouncing off the world's sides):

- step: in this process, W1's step (its moves and update()) on a broadphase without sensors,
  alternating step by step with the same step plus the sensors' moves and their events on one with
  them; each step's ratio, median and range over all steps of --repeats runs. The sensors start
  together, so they refresh their partners together, every few steps: the median leaves those
  steps out. The same is then timed with the sensors out of step, as a game's players are (each
  first moved alone for 0 to 15 steps), where every step has its share of refreshes.
- latency: a dbvt-server child process runs the sensor world, streamed tick by tick from one client
  while another watches every sensor; the time from the writer getting a tick's answer to the
  watcher getting that tick's events (both clocks are this process's).
- watchers: the server's CPU time per step (from /proc) with 8 watchers of every sensor against 1,
  the two set-ups alternating run by run.
"""
from __future__ import annotations

import statistics
import threading
import time

import numpy as np

from dbvt import Broadphase
from dbvt_client import Client, Create
from dbvt_server.bench import console, workload
from dbvt_server.bench.console import Progress
from dbvt_server.bench.parallel import ThreadMeter
from dbvt_server.bench.wire import fresh_world, start_server
from dbvt_server.bench.workload import Workload

STEP_TARGET = 2.0
LATENCY_TARGET_MS = 1.0
WATCHERS_TARGET = 1.10
SENSOR_SPEED = 0.5
OUT_OF_STEP = 16        # sensors moved alone for up to this many steps first: longer than a refresh's period


class Sensors:
    """Sphere sensors moving in straight lines, bouncing off the world's sides."""

    def __init__(self, count: int, radius: float, side: float, seed: int):
        rng = np.random.default_rng(seed)
        self.ids = np.arange(count, dtype=np.uint64) + np.uint64(1 << 62)
        self.radius, self.side = radius, side
        self.centres = rng.uniform(0, side, size=(count, 3))
        velocity = rng.normal(size=(count, 3))
        self.velocity = SENSOR_SPEED * velocity / np.linalg.norm(velocity, axis=1, keepdims=True)

    def boxes(self) -> np.ndarray:
        return np.concatenate([self.centres - self.radius, self.centres + self.radius], axis=1).astype(np.float32)

    def step(self, which: np.ndarray | None = None) -> np.ndarray:
        """Move them (or those `which` selects) one step; the boxes of all."""
        velocity = self.velocity if which is None else self.velocity * which[:, None]
        moved = self.centres + velocity
        outside = (moved < 0) | (moved > self.side)
        self.velocity[outside] *= -1
        self.centres = np.clip(moved, 0, self.side)
        return self.boxes()


def step_ratios(work: Workload, args, out_of_step: bool = False) -> tuple[list[float], list[float]]:
    """Per step: the sensor world's step over the plain one, the two alternating; and the plain
    step's time (ms), the anchor."""
    ratios, plain_ms = [], []
    for run in range(args.repeats):
        sensors = Sensors(args.sensors, args.radius, work.meta["world_side"], args.seed + run)
        plain = Broadphase(dims=3, margin=0.05)
        sensed = Broadphase(dims=3, margin=0.05)
        for bp in (plain, sensed):
            bp.create(work.ids, work.boxes)
        sensed.create(sensors.ids, sensors.boxes(), sensor="sphere")
        plain.update(), sensed.update()
        if out_of_step:
            lead = np.random.default_rng(args.seed + run).integers(0, OUT_OF_STEP, args.sensors)
            for ahead in range(OUT_OF_STEP):
                movers = lead > ahead
                sensed.move(sensors.ids[movers], sensors.step(movers)[movers])
                sensed.update()
                sensed.sensor_events()
        # The sensors' paths are the game's simulation, made beforehand like W1's moves: the steps
        # time the world's work alone.
        paths = [sensors.step() for _ in range(work.steps)]
        progress = Progress(f"{'out of step, ' if out_of_step else ''}core run {run + 1}/{args.repeats}", work.steps)
        for step in range(work.steps):
            started = time.perf_counter()
            plain.move(work.move_ids[step], work.move_boxes[step])
            plain.update()
            middle = time.perf_counter()
            sensed.move(work.move_ids[step], work.move_boxes[step])
            sensed.move(sensors.ids, paths[step])
            sensed.update()
            sensed.sensor_events()
            ratios.append((time.perf_counter() - middle) / (middle - started))
            plain_ms.append((middle - started) * 1e3)
            progress.advance()
    return ratios, plain_ms


def _watch(client: Client, world: str, heard: dict, ready: threading.Event, stop: threading.Event) -> None:
    with client.world(world).watch() as feed:
        for events in feed:
            if events.resync:
                ready.set()
            else:
                heard.setdefault(events.tick, time.perf_counter())
            if stop.is_set():
                return


def server_run(target: str, pid: int, work: Workload, args, watchers: int, run: int) -> dict:
    """The sensor world streamed tick by tick with `watchers` watching: latencies and server CPU."""
    sensors = Sensors(args.sensors, args.radius, work.meta["world_side"], args.seed + run)
    with Client(target) as writer:
        world = fresh_world(writer, "dbvt-bench-sensors")
        world.apply(create=(work.ids, work.boxes))
        world.apply(create=Create(sensors.ids, sensors.boxes(), sensor="sphere"))
        clients = [Client(target) for _ in range(watchers)]
        heard, stop = [{} for _ in clients], threading.Event()
        ready = [threading.Event() for _ in clients]
        threads = [threading.Thread(target=_watch, args=(client, world.name, got, up, stop), daemon=True)
                   for client, got, up in zip(clients, heard, ready)]
        for thread in threads:
            thread.start()
        for up in ready:
            up.wait(60)
        answered = {}
        cpu = schedstat_seconds(pid)
        progress = Progress(f"{watchers} watcher(s), run {run + 1}/{args.repeats}", work.steps)
        with world.stream() as stream:
            for step in range(work.steps):
                result = stream.apply(move=(np.concatenate([work.move_ids[step], sensors.ids]),
                                            np.concatenate([work.move_boxes[step], sensors.step()])))
                answered[result.tick] = time.perf_counter()
                progress.advance()
        cpu = schedstat_seconds(pid) - cpu
        time.sleep(0.2)
        stop.set()
        world.apply(create=([1 << 63], [[-1, -1, -1, 0, 0, 0]]))     # a last tick wakes the watchers
        for thread in threads:
            thread.join(10)
        for client in clients:
            client.close()
        writer.delete_world(world.name)
    latencies = [(got[tick] - answered[tick]) * 1e3 for got in heard for tick in answered if tick in got]
    return {"cpu_per_step": cpu / work.steps, "latency_ms": latencies}


def schedstat_seconds(pid: int) -> float:
    """CPU seconds of all the server's threads so far."""
    found = ThreadMeter(pid).read()
    if found is None:
        raise SystemExit(f"cannot read /proc/{pid}/task/*/schedstat for the server's CPU time")
    return found[0]


def report(work: Workload, args, together: tuple, apart: tuple, one: list[dict], eight: list[dict]) -> list[str]:
    latencies = [value for run in one for value in run["latency_ms"]]
    cpu_ratios = [e["cpu_per_step"] / o["cpu_per_step"] for o, e in zip(one, eight)]
    return [
        f"W1: N={work.n}, {work.steps} steps of {work.moves} moves; {args.sensors} sphere sensors of radius "
        f"{args.radius:g}, all moving; {args.repeats} runs",
        f"step with sensors / plain step: {_ratios(*together)}  target <= {STEP_TARGET:.1f}",
        f"the same, the sensors out of step: {_ratios(*apart)}",
        f"a watcher hears a tick after its answer: median {statistics.median(latencies):.3f} ms "
        f"(90th percentile {np.percentile(latencies, 90):.3f} ms)  target <= {LATENCY_TARGET_MS:.1f} ms",
        f"server CPU per step, 8 watchers / 1: median {statistics.median(cpu_ratios):.2f} "
        f"(range {min(cpu_ratios):.2f}-{max(cpu_ratios):.2f}; "
        f"{statistics.median(run['cpu_per_step'] for run in one) * 1e3:.1f} ms with 1)  target <= {WATCHERS_TARGET:.2f}",
    ]


def _ratios(ratios: list[float], plain_ms: list[float]) -> str:
    return (f"median {statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f}, "
            f"mean {statistics.fmean(ratios):.2f}; plain step median {statistics.median(plain_ms):.2f} ms)")


def add_arguments(parser) -> None:
    workload.add_w1_arguments(parser, __doc__, "seed of the W1 data and the sensors")
    parser.add_argument("--sensors", type=workload.at_least(1), default=2000, help="sphere sensors [2000]")
    parser.add_argument("--radius", type=float, default=15.0, help="their radius [15]")
    parser.add_argument("--repeats", type=workload.at_least(1), default=3, help="runs of each measure [3]")


def run(args, facts: dict) -> int:
    work = workload.w1_for(args, "sensors")
    together = step_ratios(work, args)
    apart = step_ratios(work, args, out_of_step=True)
    process, target = start_server()
    try:
        one, eight = [], []
        for attempt in range(args.repeats):
            for watchers in ((1, 8) if attempt % 2 == 0 else (8, 1)):
                (one if watchers == 1 else eight).append(server_run(target, process.pid, work, args, watchers, attempt))
    finally:
        process.terminate()
        process.wait(60)
    print("\n".join(report(work, args, together, apart, one, eight)))
    console.footer(facts)
    return 0
