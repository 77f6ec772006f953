"""Benchmark: agent heartbeats per second on the production web stack.

Usage: ``python bench/heartbeats.py [--quick] [--agents N] [--clients P] [--conns C]
[--seconds S] [--rounds R] [--profile]`` (about a minute; ``--quick`` about 30 s). Needs
Postgres at ``BENCH_PG_URL`` (default ``postgres://postgres@127.0.0.1:5432``): the bench creates
a fresh ``bench_hb_<pid>`` database, migrates it and drops it at the end.

The stack is production's: gunicorn started with the web command of ``docker-compose.yml``
(only the bind address changed), ``DEBUG=0``, Postgres, ``conn_max_age`` as configured.
N running attempts get real agent tokens; P client processes of C connections each play the
agents in a closed loop (a request is sent as soon as the previous answer arrived), with
HTTP/1.1 keep-alive where the server keeps the connection open. Each heartbeat is a real
agent's body (GPU health, progress, a 2 KB log tail) with a rising ``seq``.

Baseline, same run and stack: ``/bench/touch`` (``bench/support/site_urls.py``, mounted only by
the bench's settings module), a plain Django view that parses the JSON body and updates one
row by primary key. The two alternate, R rounds of a baseline phase then a heartbeat phase; the
ratio is the median of the rounds' ratios. Printed: heartbeats/s, baseline req/s, the ratio,
p50/p99 latency, and where the CPU went (gunicorn, Postgres, the client processes, the machine
as a whole): on a small machine the client shares the cores with the server, and the line says
how much.

``--profile`` runs the heartbeat path in-process under cProfile (Django's test client, same
settings and database) and prints the top functions instead of the load test.
"""

from __future__ import annotations

import argparse
import base64
import json
import multiprocessing
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.support import line, percentile  # noqa: E402

GOAL_HB_S = 1500.0  # 90,000 jobs beating once a minute
GOAL_RATIO = 0.7
STEP_START = 1000
LOG_TAIL = "".join(f"step {i} loss 0.{i:04d} lr 2e-4 it/s 0.25\n" for i in range(60))[:2048]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter phases, fewer agents")
    parser.add_argument("--agents", type=int, help="running attempts (default 2000; quick 500)")
    parser.add_argument("--clients", type=int, default=2, help="client processes (default 2)")
    parser.add_argument("--conns", type=int, default=8, help="connections per client (default 8)")
    parser.add_argument("--seconds", type=float, help="length of each phase (default 6; quick 4)")
    parser.add_argument(
        "--rounds", type=int, help="baseline + heartbeat phase pairs (default 3; quick 2)"
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the heartbeat path")
    parser.add_argument(
        "--gunicorn", default="", help='extra gunicorn options to try, e.g. "--threads 4"'
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dir and database")
    args = parser.parse_args()
    args.agents = args.agents or (500 if args.quick else 2000)
    args.seconds = args.seconds or (4.0 if args.quick else 6.0)
    args.rounds = args.rounds or (2 if args.quick else 3)
    return args


# ---- the installation --------------------------------------------------------------------


def pg_url() -> str:
    return os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432").rstrip("/")


def psql_admin(sql: str) -> None:
    subprocess.run(["psql", f"{pg_url()}/postgres", "-q", "-c", sql], check=True)


def configure(tmp: Path, db: str) -> dict:
    """Environment of the production web process (DEBUG=0) on the bench database."""
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="bench.support.site_settings",
        DEBUG="0",
        SECRET_KEY=base64.b64encode(os.urandom(40)).decode(),
        FIELD_ENCRYPTION_KEY=base64.b64encode(os.urandom(32)).decode(),
        NOMADGPU_VAR_DIR=str(tmp / "var"),
        DATABASE_URL=f"{pg_url()}/{db}",
        CELERY_BROKER_URL="memory://",
        NOMADGPU_ENV="bench",
        LOG_LEVEL="WARNING",
        PYTHONPATH=str(ROOT),
    )
    os.environ.update(env)
    return env


def web_command(port: int) -> list[str]:
    """docker-compose.yml's web command, bound to PORT on the loopback."""
    import yaml

    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    argv = shlex.split(compose["services"]["web"]["command"])
    assert argv[0] == "gunicorn", argv
    bind = argv.index("--bind")
    argv[bind + 1] = f"127.0.0.1:{port}"
    return [sys.executable, "-m", "gunicorn", *argv[1:]]


def seed(agents: int) -> list[tuple[int, str]]:
    """AGENTS running attempts of as many running jobs; returns (attempt id, token) pairs."""
    from django.utils import timezone

    from jobs.models import Attempt, Job
    from nomadgpu.crypto import new_data_key
    from nomadgpu.models import Team
    from nomadgpu.tokens import issue_token

    now = timezone.now()
    # A production team: its own provider key, bucket keys and bot token (sealed at rest).
    team = Team.objects.create(
        name="Bench",
        slug="bench",
        vast_api_key="vast-" + "k" * 60,
        storage_access_key_id="AKIA" + "A" * 16,
        storage_secret_access_key="s" * 40,
        telegram_bot_token="123456:" + "t" * 35,
    )
    jobs = Job.objects.bulk_create(
        Job(
            team=team,
            name=f"hb-{i}",
            image="pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime",
            command="python train.py --config qlora.yaml",
            env={"HF_HOME": "/workspace/hf", "WANDB_MODE": "offline"},
            state="running",
            encrypt_checkpoints=True,
            data_key=new_data_key(),
            requirements={"gpu_names": ["RTX 4090"], "min_reliability": 0.98},
            profile={"model_gb": 15, "steps_total": 300},
        )
        for i in range(agents)
    )
    issued = [issue_token() for _ in jobs]
    attempts = Attempt.objects.bulk_create(
        Attempt(
            job=job,
            number=1,
            state="running",
            token_prefix=tok.prefix,
            token_digest=tok.digest,
            registered_at=now,
            running_at=now,
            last_heartbeat_at=now,
            heartbeat_deadline=now + job.heartbeat_timeout,
            step=0,
            label=f"ngpu:bench:{job.pk}:1",
            gpu_name="RTX 4090",
            decision={
                "chosen_offer_id": 1,
                "candidates": [{"id": i, "usd": 1.0} for i in range(5)],
            },
            log_tail=LOG_TAIL,
        )
        for job, tok in zip(jobs, issued, strict=True)
    )
    return [(a.pk, tok.token) for a, tok in zip(attempts, issued, strict=True)]


def wait_healthy(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gunicorn exited with {proc.returncode}")
        probe = b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Forwarded-Proto: https\r\n\r\n"
        try:
            if Connection(port).request(probe) == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("gunicorn did not become healthy")


# ---- CPU accounting ----------------------------------------------------------------------

TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) PID has used; 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def pids_named(name: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == name:
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                found.append(int(entry.name))
    return found


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]
    return (sum(values) - idle) / TICK, sum(values) / TICK


@dataclass
class CpuMeter:
    """CPU used by gunicorn (master + workers), Postgres and the machine during a phase."""

    gunicorn_pid: int
    start: dict = field(default_factory=dict)

    def sample(self) -> dict:
        workers = [self.gunicorn_pid, *children(self.gunicorn_pid)]
        return {
            "gunicorn": sum(proc_cpu(p) for p in workers),
            "postgres": sum(proc_cpu(p) for p in pids_named("postgres")),
            "machine": machine_busy(),
        }

    def begin(self) -> None:
        self.start = self.sample()

    def end(self, wall: float) -> dict:
        end = self.sample()
        busy = end["machine"][0] - self.start["machine"][0]
        total = end["machine"][1] - self.start["machine"][1]
        return {
            "gunicorn": (end["gunicorn"] - self.start["gunicorn"]) / wall,
            "postgres": (end["postgres"] - self.start["postgres"]) / wall,
            "machine": busy / wall,
            "machine_cores": total / wall,
        }


# ---- the simulated agents ----------------------------------------------------------------


def heartbeat_request(token: str, seq: int, step: int) -> bytes:
    body = json.dumps(
        {
            "seq": seq,
            "phase": "running",
            "step": step,
            "total_steps": 10**6,
            "loss": 1.0 / (1 + seq),
            "seconds_per_step": 4.0,
            "gpu": {"ok": True, "error": ""},
            "bytes_down": 15 * 10**9,
            "bytes_up": seq * 1000,
            "log_tail": LOG_TAIL,
        }
    ).encode()
    return http_post("/api/agent/heartbeat", body, f"Authorization: Bearer {token}\r\n")


def training_step(beats: int, agents: int) -> int:
    """The step an agent reports after BEATS requests of its connection, shared by AGENTS: about
    4 steps a beat (4 s steps, 15 s beats) from the same start in every phase. The loss chart's
    sampling (a LossPoint row when the step enters a new bucket) then stays as rare as in
    production, about 100 rows over a job's many thousand beats. When the step rose with the
    seq, every agent's first beat of each phase entered a new bucket, and a third of the
    heartbeats measured were those inserts."""
    return STEP_START + 4 * (beats // max(agents, 1))


def touch_request(attempt_id: int, seq: int) -> bytes:
    body = json.dumps({"id": attempt_id, "seq": seq}).encode()
    return http_post("/bench/touch", body, "")


def http_post(path: str, body: bytes, extra: str) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Forwarded-Proto: https\r\n{extra}"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class Connection:
    """One HTTP/1.1 client connection that reconnects when the server closes it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock: socket.socket | None = None
        self.connects = 0

    def request(self, data: bytes) -> int:
        if self.sock is None:
            self.sock = socket.create_connection(("127.0.0.1", self.port))
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.connects += 1
        self.sock.sendall(data)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("server closed the connection mid-answer")
            buf += chunk
        head, _, rest = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("server closed the connection mid-body")
            rest += chunk
        if headers.get("connection", "").lower() == "close":
            self.sock.close()
            self.sock = None
        return status


def client_process(port, kind, agents, conns, seq0, start_at, end_at, results) -> None:
    """One client process: CONNS threads, each beating for its share of AGENTS in turn."""
    latencies: list[list[float]] = [[] for _ in range(conns)]
    errors = [0] * conns
    connects = [0] * conns

    def loop(i: int) -> None:
        mine = agents[i::conns]
        conn = Connection(port)
        seq = seq0
        while time.time() < start_at:
            time.sleep(0.001)
        while True:
            for attempt_id, token in mine:
                seq += 1
                data = (
                    heartbeat_request(token, seq, training_step(seq - seq0, len(mine)))
                    if kind == "heartbeat"
                    else touch_request(attempt_id, seq)
                )
                t0 = time.time()
                if t0 >= end_at:
                    connects[i] = conn.connects
                    return
                try:
                    status = conn.request(data)
                except OSError:
                    status, conn.sock = 0, None
                t1 = time.time()
                if t1 <= end_at:
                    if status == 200:
                        latencies[i].append(t1 - t0)
                    else:
                        errors[i] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(conns)]
    cpu0 = sum(os.times()[:2])
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cpu = sum(os.times()[:2]) - cpu0
    results.put(
        {
            "latencies": [x for lat in latencies for x in lat],
            "errors": sum(errors),
            "connects": sum(connects),
            "cpu": cpu,
        }
    )


@dataclass
class Phase:
    kind: str
    wall: float
    latencies: list[float]
    errors: int
    connects: int
    client_cpu: float
    cpu: dict

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.wall

    @classmethod
    def pooled(cls, phases: list[Phase]) -> Phase:
        """One phase of PHASES' requests over their summed time (CPU figures time-weighted)."""
        wall = sum(p.wall for p in phases)

        def weighted(value) -> float:
            return sum(value(p) * p.wall for p in phases) / wall

        return cls(
            kind=phases[0].kind,
            wall=wall,
            latencies=[x for p in phases for x in p.latencies],
            errors=sum(p.errors for p in phases),
            connects=sum(p.connects for p in phases),
            client_cpu=weighted(lambda p: p.client_cpu),
            cpu={k: weighted(lambda p, k=k: p.cpu[k]) for k in phases[0].cpu},
        )


def run_phase(port, kind, agents, args, meter: CpuMeter, seq0: int, seconds: float) -> Phase:
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    start_at = time.time() + 1.5  # spawned interpreters start up before the clock runs
    end_at = start_at + seconds
    shares = [agents[i :: args.clients] for i in range(args.clients)]
    procs = [
        ctx.Process(
            target=client_process,
            args=(port, kind, share, args.conns, seq0, start_at, end_at, results),
        )
        for share in shares
    ]
    for p in procs:
        p.start()
    time.sleep(max(0.0, start_at - time.time()))
    meter.begin()
    time.sleep(max(0.0, end_at - time.time()))
    cpu = meter.end(seconds)
    outs = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join()
    return Phase(
        kind=kind,
        wall=seconds,
        latencies=[x for o in outs for x in o["latencies"]],
        errors=sum(o["errors"] for o in outs),
        connects=sum(o["connects"] for o in outs),
        client_cpu=sum(o["cpu"] for o in outs) / seconds,
        cpu=cpu,
    )


# ---- profile -----------------------------------------------------------------------------


def profile(agents: list[tuple[int, str]], n: int = 3000) -> None:
    """The heartbeat path in-process under cProfile (test client; its own frames show apart)."""
    import cProfile
    import pstats

    from django.test import Client

    client = Client(HTTP_X_FORWARDED_PROTO="https")
    requests = []
    for i in range(n):
        _, token = agents[i % len(agents)]
        raw = heartbeat_request(token, 10**6 + i, training_step(i, len(agents)))
        requests.append((token, raw.partition(b"\r\n\r\n")[2]))
    for token, body in requests[:200]:  # warm: imports, connection, URL resolver
        client.post(
            "/api/agent/heartbeat",
            body,
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )
    cpu0, t0 = time.process_time(), time.perf_counter()
    for token, body in requests[200:]:
        client.post(
            "/api/agent/heartbeat",
            body.replace(b'"seq": ', b'"seq": 1'),  # higher seqs: these count too
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )
    cpu, spent = time.process_time() - cpu0, time.perf_counter() - t0
    print(
        f"unprofiled: {(n - 200) / spent:.0f} heartbeats/s in-process, "
        f"{cpu / (n - 200) * 1000:.2f} ms CPU each (test client included)"
    )
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for token, body in requests[200:]:
        resp = client.post(
            "/api/agent/heartbeat",
            body,
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )
        assert resp.status_code == 200, resp.content
    prof.disable()
    spent = time.perf_counter() - t0
    print(f"profile: {n - 200} heartbeats in {spent:.2f} s ({(n - 200) / spent:.0f}/s in-process)")
    stats = pstats.Stats(prof)
    stats.sort_stats("cumulative").print_stats(45)
    stats.sort_stats("tottime").print_stats(25)


# ---- main --------------------------------------------------------------------------------


def report(hbs: list[Phase], bases: list[Phase], args, workers: str) -> None:
    def ms(values: list[float], pct: int) -> float:
        return percentile(values, pct) * 1000 if values else float("nan")

    # The ratio is each round's (baseline, then heartbeats, back to back) and its median: a
    # shared machine's speed drifts over a minute more than between two neighbouring phases.
    ratios = sorted(h.rate / b.rate for h, b in zip(hbs, bases, strict=True) if b.rate)
    ratio = percentile(ratios, 50) if ratios else float("nan")
    hb, base = Phase.pooled(hbs), Phase.pooled(bases)
    print(
        f"heartbeats bench: {args.agents} agents, {args.clients} client processes x "
        f"{args.conns} connections, {args.rounds} rounds of {args.seconds:g} s per phase, "
        f"gunicorn {workers}, {os.cpu_count()} CPUs"
    )
    print(
        line("heartbeats/s", f"{hb.rate:7.0f} /s", f"goal {GOAL_HB_S:.0f} /s", hb.rate / GOAL_HB_S)
    )
    print(
        line(
            "heartbeats/s vs baseline",
            f"{hb.rate:7.0f} /s",
            f"one-row UPDATE view {base.rate:.0f} req/s",
            ratio,
        )
        + f"  (rounds, lowest first: {', '.join(f'{r:.2f}' for r in ratios)})"
    )
    print(
        line(
            "heartbeat latency p50",
            f"{ms(hb.latencies, 50):7.1f} ms",
            f"p50 {ms(base.latencies, 50):.1f} ms",
            ms(hb.latencies, 50) / ms(base.latencies, 50),
        )
    )
    print(
        line(
            "heartbeat latency p99",
            f"{ms(hb.latencies, 99):7.1f} ms",
            f"p99 {ms(base.latencies, 99):.1f} ms",
            ms(hb.latencies, 99) / ms(base.latencies, 99),
        )
    )
    for phase in (hb, base):
        c = phase.cpu
        per_req = (c["gunicorn"] + c["postgres"]) / phase.rate * 1000 if phase.rate else 0
        print(
            f"  {phase.kind}: cores busy: gunicorn {c['gunicorn']:.2f}, postgres "
            f"{c['postgres']:.2f}, client {phase.client_cpu:.2f}, whole machine "
            f"{c['machine']:.2f} of {c['machine_cores']:.1f} (others included); server CPU "
            f"{per_req:.2f} ms/request; {phase.errors} errors, {phase.connects} connects"
        )


def main() -> int:
    args = parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="nomadgpu-hb-bench-"))
    db = f"bench_hb_{os.getpid()}"
    env = configure(tmp, db)
    psql_admin(f"CREATE DATABASE {db}")
    gunicorn = None
    try:
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connections

        call_command("migrate", verbosity=0)
        agents = seed(args.agents)
        if args.profile:
            profile(agents)
            return 0
        connections.close_all()

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        argv = web_command(port) + shlex.split(args.gunicorn)
        workers = " ".join(argv[argv.index("--workers") :][:2]) if "--workers" in argv else ""
        workers = f"{workers} {args.gunicorn}".strip()
        log = (tmp / "gunicorn.log").open("wb")
        gunicorn = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        wait_healthy(port, gunicorn)
        meter = CpuMeter(gunicorn.pid)
        # Warm both paths (imports, connections, caches) before anything is timed.
        run_phase(port, "heartbeat", agents, args, meter, 0, 1.0)
        run_phase(port, "touch", agents, args, meter, 0, 1.0)
        bases, hbs = [], []
        for r in range(args.rounds):
            # Each round's seqs start above the last round's (the heartbeat's guard).
            bases.append(
                run_phase(port, "touch", agents, args, meter, 10**6 * (r + 1), args.seconds)
            )
            hbs.append(
                run_phase(port, "heartbeat", agents, args, meter, 10**8 * (r + 1), args.seconds)
            )
        report(hbs, bases, args, workers)
        errors = sum(p.errors for p in hbs + bases)
        if errors:
            print(f"{errors} requests failed; see {tmp / 'gunicorn.log'}", file=sys.stderr)
            args.keep = True
            return 1
    finally:
        if gunicorn is not None:
            gunicorn.terminate()
            gunicorn.wait(timeout=30)
        from django.db import connections

        connections.close_all()
        if args.keep:
            print(f"kept {tmp} and database {db}", file=sys.stderr)
        else:
            psql_admin(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
