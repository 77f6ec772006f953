"""The commands, their rendering and the HTTP client: see the package docstring."""

from __future__ import annotations

import argparse
import os
import sys
import time
import tomllib
import urllib.parse
from collections.abc import Callable
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any, BinaryIO

import httpx

from nomadgpu_cli import pack

EXIT_OK, EXIT_JOB_FAILED, EXIT_REFUSED, EXIT_AUTH, EXIT_UNREACHABLE = 0, 1, 2, 3, 4
DEFAULT_URL = "http://127.0.0.1:8000"
ENDED = {"succeeded": EXIT_OK, "failed": EXIT_JOB_FAILED, "cancelled": EXIT_JOB_FAILED}
# Not terminal on the server (a raised budget lets it continue), but nothing more will happen
# without a person: a follower stops here.
STOPPED = {**ENDED, "paused_budget": EXIT_JOB_FAILED, "needs_attention": EXIT_JOB_FAILED}


class CliError(Exception):
    def __init__(self, message: str, code: int, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status  # the server's HTTP status, when it answered


# ---- talking to the server --------------------------------------------------------------------


class Api:
    def __init__(self, url: str, token: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.http = httpx.Client(
            base_url=self.url + "/api",
            headers={"Authorization": f"Bearer {token}", "User-Agent": "nomadgpu-cli"},
            timeout=timeout,
        )

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise CliError(f"cannot reach {self.url}: {exc}", EXIT_UNREACHABLE) from exc
        if response.is_success:
            return response.json() if response.content else None
        status = response.status_code
        raise CliError(describe_error(response), exit_code_for(status), status)

    def get(self, path: str, **params: Any) -> Any:
        return self.call("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: dict | None = None) -> Any:
        return self.call("POST", path, json=body or {})

    def own_url(self, url: str) -> str:
        """URL (absolute, or a path on the portal) if it is on the portal itself: only there may
        the token go."""
        full = urllib.parse.urljoin(self.url + "/", url)
        if origin(full) != origin(self.url):
            raise CliError(
                f"the server asked for the token to be sent to {full}, not to itself: refused",
                EXIT_REFUSED,
            )
        return full


def origin(url: str) -> tuple[str, str]:
    """Scheme and host[:port] of URL: what must match for the token to be sent there."""
    parts = urllib.parse.urlsplit(url)
    return parts.scheme.lower(), parts.netloc.lower()


def exit_code_for(status: int) -> int:
    if status == 401:
        return EXIT_AUTH
    return EXIT_UNREACHABLE if status >= 500 else EXIT_REFUSED


def describe_error(response: httpx.Response) -> str:
    """The server's ``detail`` as text; validation errors one field per line."""
    try:
        detail = response.json().get("detail")
    except ValueError:
        detail = response.text[:500]
    if response.status_code == 401:
        return "the server did not accept the token (revoked? set NOMADGPU_TOKEN)"
    if isinstance(detail, list):
        lines = [f"  {field_name(e.get('loc', []))}: {e.get('msg', e)}" for e in detail]
        return "the server refused the request:\n" + "\n".join(lines)
    return f"{response.status_code}: {detail}"


def field_name(loc: list) -> str:
    """``["body", "payload", "requirements", "num_gpus"]`` → ``requirements.num_gpus``."""
    parts = [str(p) for p in loc]
    while parts and parts[0] in ("body", "payload", "query", "path"):
        parts.pop(0)
    return ".".join(parts) or "(request)"


# ---- rendering --------------------------------------------------------------------------------


def duration(seconds: float | None, none: str = "-") -> str:
    """The server's rule (``nomadgpu.humanize.duration``; the CLI installs without it, and
    ``tests/test_humanize.py`` holds the two to the same texts): "45 s", "1 min 30 s",
    "12 min", "2 h 05 min"."""
    if seconds is None:
        return none
    whole = int(seconds + 0.5)
    if whole < 60:
        return f"{whole} s"
    if whole < 600:
        minutes, rest = divmod(whole, 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    minutes = (whole + 30) // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if minutes else f"{hours} h"


def loss(value: float | None, none: str = "-") -> str:
    """The server's rule (``nomadgpu.humanize.loss``, held to the same texts by
    ``tests/test_humanize.py``): four significant digits, "0.6931", "1.351e-05"."""
    if value is None:
        return none
    return f"{value:.4g}"


def _places(amount: Decimal) -> int:
    if amount >= 1 or amount == 0:
        return 2
    return min(2 - amount.adjusted(), 6)


def money(usd: float | None, none: str = "-") -> str:
    """The server's rule (``nomadgpu.humanize.money``, held to the same texts by
    ``tests/test_humanize.py``): cents from $1, three significant digits under it, at most
    six decimals: "$1.24", "$0.0191", "$0.00820", "$0.00"."""
    if usd is None:
        return none
    amount = Decimal(str(usd))
    step = _places(abs(amount))
    places = _places(abs(amount).quantize(Decimal(1).scaleb(-step), rounding=ROUND_HALF_UP))
    shown = abs(amount).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
    return f"{'-' if amount < 0 and shown else ''}${shown:,.{places}f}"


def progress_bar(job: dict, width: int = 30) -> str:
    """``[#########.........] 150/300  50%  ETA 10 min  running`` (text only: works in logs)."""
    step, total = job.get("step"), job.get("total_steps")
    fraction = job.get("progress")
    filled = round((fraction or 0) * width)
    counts = f"{step if step is not None else '-'}/{total or '?'}"
    percent = f"{fraction * 100:3.0f}%" if fraction is not None else "  ?%"
    eta = f"ETA {duration(job.get('eta_s'))}" if job.get("eta_s") is not None else ""
    bar = "#" * filled + "." * (width - filled)
    return f"[{bar}] {counts} {percent}  {eta}  {job['state']}".rstrip()


def event_line(event: dict) -> str:
    moment = datetime.fromisoformat(event["created_at"]).astimezone()
    text = f"{moment:%H:%M:%S} {event['kind']}"
    return f"{text}: {event['message']}" if event.get("message") else text


class Screen:
    """Events as lines and one progress line: redrawn in place on a terminal, printed when it
    changes otherwise (a CI log gets one line per change, not a smear of carriage returns)."""

    def __init__(self, stream=None) -> None:
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.bar = ""

    def line(self, text: str) -> None:
        if self.tty and self.bar:
            self.stream.write("\r\033[K")
        self.stream.write(text + "\n")
        if self.tty and self.bar:
            self.stream.write(self.bar)
        self.stream.flush()

    def progress(self, bar: str) -> None:
        if bar == self.bar:
            return
        self.bar = bar
        self.stream.write(f"\r\033[K{bar}" if self.tty else bar + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.tty and self.bar:
            self.stream.write("\n")
            self.stream.flush()


# ---- commands ---------------------------------------------------------------------------------


def read_job_file(path: str) -> dict:
    try:
        return tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}", EXIT_REFUSED) from exc
    except tomllib.TOMLDecodeError as exc:
        raise CliError(f"{path} is not valid TOML: {exc}", EXIT_REFUSED) from exc


def cmd_submit(api: Api, args: argparse.Namespace) -> int:
    if (args.file is None) == (args.template is None):
        raise CliError("give a job file or --template NAME (one of them)", EXIT_REFUSED)
    spec = read_job_file(args.file) if args.file else api.get(f"/jobs/templates/{args.template}")
    if args.team:
        spec["team"] = args.team
    resolve_workdir(api, spec, base=Path(args.file).parent if args.file else Path.cwd())
    job = api.post("/jobs/", spec)
    print(f"submitted job {job['id']} ({job['name']}) to {job['team']}: {job['state']}")
    if not args.follow:
        return EXIT_OK
    return follow_job(api, job["id"], poll_s=args.poll)


# ---- the job's code ---------------------------------------------------------------------------

DEFAULT_WORKDIR_MAX_MB = 200  # the server's WORKDIR_MAX_MB default
UPLOAD_TIMEOUT_S = 600.0


def resolve_workdir(api: Api, spec: dict, *, base: Path) -> None:
    """The job file's ``workdir`` as the API takes it: a folder (relative to the job file) is
    packed, stored on the server and named by its sha256; a git table gets its ``kind``."""
    workdir = spec.get("workdir")
    if workdir == "":
        raise CliError('workdir is empty: name a folder ("." is the job file\'s)', EXIT_REFUSED)
    if isinstance(workdir, str):
        encrypted = bool(spec.get("encrypt_checkpoints"))
        spec["workdir"] = upload_folder(
            api, base / workdir, team=spec.get("team"), encrypted=encrypted
        )
    elif isinstance(workdir, dict) and "git" in workdir:
        rest = {k: v for k, v in workdir.items() if k != "git"}
        spec["workdir"] = {"kind": "git", "url": workdir["git"], **rest}


def upload_folder(api: Api, folder: Path, *, team: str | None, encrypted: bool) -> dict:
    """Pack FOLDER and see that the server holds the pack; the ``workdir`` that names it."""
    folder = Path(os.path.normpath(folder))
    try:
        packed = pack.pack_folder(folder, max_bytes=workdir_max_bytes())
    except pack.PackTooBig as exc:
        limit = "NOMADGPU_WORKDIR_MAX_MB here, WORKDIR_MAX_MB on the server"
        raise CliError(
            f"{exc} ({limit}); {pack.biggest_lines(exc.entries)}", EXIT_REFUSED
        ) from None
    except pack.PackError as exc:
        raise CliError(str(exc), EXIT_REFUSED) from None
    with packed:
        print(f"packed {folder}: {packed.files} files, {pack.human_size(packed.size)}")
        store_pack(api, packed, team=team, encrypted=encrypted)
    return {"kind": "archive", "sha256": packed.sha256}


def workdir_max_bytes() -> int:
    """The biggest pack this CLI uploads, from ``NOMADGPU_WORKDIR_MAX_MB``."""
    raw = os.environ.get("NOMADGPU_WORKDIR_MAX_MB", str(DEFAULT_WORKDIR_MAX_MB))
    try:
        return int(float(raw) * pack.MB)
    except ValueError:
        raise CliError(f"NOMADGPU_WORKDIR_MAX_MB is not a number: {raw!r}", EXIT_REFUSED) from None


def store_pack(api: Api, packed: pack.Pack, *, team: str | None, encrypted: bool) -> None:
    """Ask the server where the pack goes and upload it if it has not got it. A stored object
    the server finds different from the pack (409 on complete) is uploaded once more."""
    body = {"team": team, "sha256": packed.sha256, "size": packed.size, "encrypted": encrypted}
    for attempt in (1, 2):
        offer = ask_to_store(api, body, packed)
        if offer["state"] == "ready":
            print("code unchanged: nothing to upload" if attempt == 1 else "code stored")
            return
        put_pack(api, packed, offer["upload"])
        if offer["upload"]["via"] == "api" or complete_pack(api, body, last=attempt == 2):
            print(f"code uploaded ({pack.human_size(packed.size)})")
            return


def ask_to_store(api: Api, body: dict, packed: pack.Pack) -> dict:
    """The server's answer to ``POST /api/workdirs``: ready, or where to upload."""
    try:
        return api.post("/workdirs", body)
    except CliError as exc:
        if exc.status == 413:  # the server's cap is lower than this CLI's
            raise CliError(f"{exc}; {pack.biggest_lines(packed.entries)}", exc.code, 413) from None
        raise


def put_pack(api: Api, packed: pack.Pack, upload: dict) -> None:
    """PUT the pack where the server said: its own API (encrypted packs: the server encrypts
    what it receives) with the token, or a presigned storage URL without it."""
    if upload.get("method", "PUT") != "PUT":
        raise CliError(f"the server asked for an upload by {upload['method']}", EXIT_REFUSED)
    packed.file.seek(0)
    # An explicit length keeps httpx from chunked encoding, which S3 PUTs refuse.
    headers = {"Content-Length": str(packed.size)}
    if upload["via"] == "api":
        url = api.own_url(upload["url"])
        api.call("PUT", url, content=packed.file, headers=headers, timeout=UPLOAD_TIMEOUT_S)
    else:
        put_to_storage(upload["url"], packed.file, headers)


def put_to_storage(url: str, body: BinaryIO, headers: dict[str, str]) -> None:
    # A plain httpx call, not the API's client: the URL's signature is the permission, and the
    # token must never reach a storage provider.
    try:
        response = httpx.put(url, content=body, headers=headers, timeout=UPLOAD_TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise CliError(f"cannot upload the code pack to storage: {exc}", EXIT_UNREACHABLE) from exc
    if not response.is_success:
        why = f"{response.status_code} {response.text[:300]}".strip()
        raise CliError(f"storage refused the code pack: {why}", EXIT_UNREACHABLE)


def complete_pack(api: Api, body: dict, *, last: bool) -> bool:
    """Tell the server a plain pack is in storage; False when it found it different (and this
    was not the last try), so that it is uploaded again."""
    try:
        api.post(
            f"/workdirs/{body['sha256']}/complete", {k: body[k] for k in ("team", "encrypted")}
        )
    except CliError as exc:
        if exc.status != 409 or last:
            raise
        print(f"nomadgpu: {exc}; uploading again", file=sys.stderr)
        return False
    return True


def follow_job(
    api: Api,
    job_id: int,
    *,
    poll_s: float,
    after: int = 0,
    until: Callable[[dict], bool] | None = None,
    screen: Screen | None = None,
) -> int:
    """Print JOB's events and progress until it stops (or UNTIL(event) holds); the exit code."""
    screen = screen or Screen()
    cursor = after
    try:
        while True:
            # The job first, then its events: a stop read here was committed with its event,
            # so the events asked for next include it (read the other way round, a job that
            # finished between the two reads ended the follow without its last event).
            job = api.get(f"/jobs/{job_id}")
            page = api.get(f"/jobs/{job_id}/events", after=cursor)
            for event in page["events"]:
                screen.line(event_line(event))
                if until and until(event):
                    return EXIT_OK
            cursor = page["cursor"]
            screen.progress(progress_bar(job))
            if job["state"] in STOPPED and not page["events"]:
                code = finish(job, screen)
                # waiting for an event that never came (a drill's recovery) is a failure
                return EXIT_JOB_FAILED if until else code
            time.sleep(poll_s)
    finally:
        screen.done()


def finish(job: dict, screen: Screen) -> int:
    code = STOPPED[job["state"]]
    why = f" ({job['failure_reason']})" if job.get("failure_reason") else ""
    screen.line(f"job {job['id']} {job['state']}{why}; cost {cost_text(job)}")
    return code


def cmd_status(api: Api, args: argparse.Namespace) -> int:
    if args.job is None:
        jobs = api.get("/jobs/", team=args.team, state=args.state)
        print(
            f"{'ID':>5}  {'TEAM':<12} {'NAME':<24} {'STATE':<13} {'STEP':>11} {'ETA':>10} "
            f"{'COST':>10} {'':<8}  {'GPU':<14} INT"
        )
        for j in jobs:
            step = f"{j['step'] if j['step'] is not None else '-'}/{j['total_steps'] or '?'}"
            print(
                f"{j['id']:>5}  {j['team'][:12]:<12} {j['name'][:24]:<24} {j['state']:<13} "
                f"{step:>11} {duration(j['eta_s']):>10} {money(j['cost_usd']):>10} "
                f"{j['cost_basis']:<8}  "
                f"{j['gpu_name'][:14]:<14} {j['interruptions']}"
            )
        return EXIT_OK
    job = api.get(f"/jobs/{args.job}")
    print_job(job)
    return EXIT_OK


def cost_text(job: dict) -> str:
    """``$0.0191 (recorded)``: the job's one cost and which it is, as the portal writes it."""
    return f"{money(job['cost_usd'])} ({job['cost_basis']})"


def print_job(job: dict) -> None:
    host = job["host"]
    rows = [
        ("job", f"{job['id']} {job['name']} (team {job['team']})"),
        ("state", job["state"] + (f": {job['failure_reason']}" if job["failure_reason"] else "")),
        ("progress", progress_bar(job)),
        ("loss", loss(job["loss"])),
        (
            "cost",
            cost_text(job) + (f", budget {money(job['budget_usd'])}" if job["budget_usd"] else ""),
        ),
        ("breakdown", " · ".join(f"{k} {v}" for k, v in job["cost_breakdown_text"].items())),
        (
            "host",
            "-"
            if host is None
            else f"{host['gpu_name']} instance {host['instance_id']} "
            f"(attempt {host['attempt']}, {host['attempt_state']}, {money(host['dph'])}/h)",
        ),
        ("interruptions", job["interruptions"]),
    ]
    for name, value in rows:
        print(f"{name:>14}: {value}")
    for i in job["interruption_list"]:
        back = i["running_again_at"] or "not yet"
        note = f"; {i['resume_note']}" if i.get("resume_note") else ""
        print(
            f"{'':>16}attempt {i['attempt']}: {i['cause']} detected {i['detected_at']}, "
            f"running again {back}, resumed from step {i['resumed_step']}{note}"
        )


def cmd_logs(api: Api, args: argparse.Namespace) -> int:
    chunk = api.get(f"/jobs/{args.job}/logs")
    print_lines(chunk)
    if not args.follow:
        if chunk["pending"]:
            print(chunk["pending"])
        return EXIT_OK
    while chunk["state"] not in ENDED:
        time.sleep(args.poll)
        chunk = api.get(f"/jobs/{args.job}/logs", cursor=chunk["cursor"])
        print_lines(chunk)
    return EXIT_OK


def print_lines(chunk: dict) -> None:
    if chunk["gap"]:
        print("[nomadgpu] … lines missed: the log tail moved on faster than it was read")
    attempt = None
    for line in chunk["lines"]:
        if attempt is not None and line["attempt"] != attempt:
            print(f"[nomadgpu] --- host of attempt {line['attempt']} ---")
        attempt = line["attempt"]
        print(line["text"])
    sys.stdout.flush()


def cmd_cancel(api: Api, args: argparse.Namespace) -> int:
    job = api.post(f"/jobs/{args.job}/cancel")
    print(f"job {job['id']} {job['state']}")
    return EXIT_OK


def cmd_drill(api: Api, args: argparse.Namespace) -> int:
    """Destroy the job's host N times, each time waiting until it trains again elsewhere."""
    for n in range(1, args.times + 1):
        wait_running(api, args.job, poll_s=args.poll, timeout_s=args.timeout)
        cursor = api.get(f"/jobs/{args.job}/events", after=0, limit=1000)["cursor"]
        drill = api.post(f"/jobs/{args.job}/drill")
        print(
            f"drill {n}/{args.times}: destroyed instance {drill['instance_id']} "
            f"(attempt {drill['attempt']}) at step {drill['step']} (its last heartbeat)"
        )
        code = follow_job(
            api,
            args.job,
            poll_s=args.poll,
            after=cursor,
            until=lambda e: e["kind"] == "running_again",
        )
        if code != EXIT_OK:
            return code
        print(drill_summary(api.get(f"/jobs/{args.job}"), drill))
    return EXIT_OK


def wait_running(api: Api, job_id: int, *, poll_s: float, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        job = api.get(f"/jobs/{job_id}")
        host = job["host"]
        if job["state"] == "running" and host and host["attempt_state"] == "running":
            return
        if job["state"] in STOPPED:
            raise CliError(f"job {job_id} is {job['state']}: nothing to drill", EXIT_JOB_FAILED)
        if time.monotonic() > deadline:
            raise CliError(f"job {job_id} is not running ({job['state']})", EXIT_JOB_FAILED)
        time.sleep(poll_s)


def drill_summary(job: dict, drill: dict) -> str:
    mine = [i for i in job["interruption_list"] if i["attempt"] == drill["attempt"]]
    if not mine:
        return "no interruption recorded for the destroyed host"
    i, start = mine[0], datetime.fromisoformat(drill["destroyed_at"])

    def after(moment: str | None) -> str:
        return (
            "-"
            if moment is None
            else duration((datetime.fromisoformat(moment) - start).total_seconds())
        )

    note = f"; {i['resume_note']}" if i.get("resume_note") else ""
    return (
        f"detected after {after(i['detected_at'])}, replacement rented after "
        f"{after(i['replacement_rented_at'])}, training again after "
        f"{after(i['running_again_at'])}, resumed from step {i['resumed_step']}{note}"
    )


# ---- entry point ------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nomadgpu",
        description="Submit and watch NomadGPU jobs through the member API.",
        epilog="Exit codes: 0 ok/succeeded, 1 job failed/cancelled/paused, 2 refused or bad "
        "usage, 3 token not accepted, 4 server unreachable or failing.",
    )
    p.add_argument(
        "--url",
        default=os.environ.get("NOMADGPU_URL", DEFAULT_URL),
        help="portal URL (env NOMADGPU_URL; default %(default)s)",
    )
    p.add_argument(
        "--token",
        default=os.environ.get("NOMADGPU_TOKEN"),
        help="personal API token (env NOMADGPU_TOKEN)",
    )
    p.add_argument("--poll", type=float, default=1.0, help="seconds between polls when following")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("submit", help="submit a job file (TOML) or a server template")
    s.add_argument("file", nargs="?")
    s.add_argument("--template", help="a template of the server instead of a file: toy, qlora")
    s.add_argument("--team", help="team slug (needed when you belong to several)")
    s.add_argument("--follow", "-f", action="store_true", help="show progress and events")
    s.set_defaults(run=cmd_submit)

    s = sub.add_parser("status", help="list jobs, or show one")
    s.add_argument("job", nargs="?", type=int)
    s.add_argument("--team")
    s.add_argument("--state", help="e.g. running or running,recovering")
    s.set_defaults(run=cmd_status)

    s = sub.add_parser("logs", help="the job's log tail")
    s.add_argument("job", type=int)
    s.add_argument("--follow", "-f", action="store_true", help="keep printing new lines")
    s.set_defaults(run=cmd_logs)

    s = sub.add_parser("cancel", help="cancel a job (its checkpoints are kept)")
    s.add_argument("job", type=int)
    s.set_defaults(run=cmd_cancel)

    s = sub.add_parser("drill", help="fire drill: destroy the job's host (team admins)")
    s.add_argument("job", type=int)
    s.add_argument("--times", type=int, default=1)
    s.add_argument("--timeout", type=float, default=900, help="seconds to wait for running")
    s.set_defaults(run=cmd_drill)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not args.token:
        print(
            f"nomadgpu: no token: set NOMADGPU_TOKEN or pass --token (create one at "
            f"{args.url.rstrip('/')}/account/tokens/)",
            file=sys.stderr,
        )
        return EXIT_REFUSED
    api = Api(args.url, args.token)
    try:
        return args.run(api, args)
    except CliError as exc:
        print(f"nomadgpu: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    finally:
        api.http.close()
