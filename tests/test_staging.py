"""Staged model weights: ``stage`` entries checked at submit, mirrored once by a real Celery
worker from a local fake Hub (tests/support/hub_fake.py) into the team's storage (local, or S3 on
moto's server, encrypted), a missing or gated repo failing the job before any rent, and the
real agent laying the files out in the Hugging Face cache for a command that runs offline."""

from __future__ import annotations

import hashlib
import pickle
import re
import sys
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from django.utils import timezone

from jobs import job_templates, spec
from jobs.models import Attempt, Job, JobEvent, JobState, StagedObject
from jobs.renting import terms
from jobs.staging import resolve, stage, trouble
from nomadgpu.storage import object_store
from tests.support import hub_fake
from tests.support.factories import (
    JobFactory,
    StagedObjectFactory,
    TeamFactory,
    TeamSecretFactory,
    UserFactory,
    make_attempt,
)
from tests.support.processes import wait_until
from tests.support.staging import (
    CONFIG,
    GATED,
    TINY,
    TINY_ENTRY,
    TOKENIZER,
    WEIGHTS,
    run_agent,
    staged_job,
    tiny_repo,
)


@pytest.fixture
def local_storage(settings, tmp_path):
    settings.STORAGE_BACKEND = "local"
    settings.STORAGE_LOCAL_DIR = tmp_path / "objects"


def stage_spec(*entries: dict, **fields) -> spec.JobSpec:
    return spec.JobSpec(
        name="staged",
        image="pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
        command="true",
        total_steps=10,
        # No such GPU on the sandbox's market: the planned rent finds no offer, rents nothing.
        requirements={"gpu_names": ["No Such GPU 9000"]},
        stage=list(entries),
        **fields,
    )


def submit(team, *entries: dict, **fields) -> Job:
    user = UserFactory()
    return spec.submit_spec(stage_spec(*entries, **fields), team=team, created_by=user, now=now())


def now():
    return timezone.now()


def wait_stage_state(job: Job, state: str, timeout: float = 30) -> Job:
    wait_until(
        lambda: Job.objects.get(pk=job.pk).stage_state == state,
        timeout=timeout,
        what=f"job {job.pk} staging {state}",
    )
    return Job.objects.get(pk=job.pk)


# --- The spec -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "where", "words"),
    [
        ({"hf": "not-a-repo"}, "stage.0.hf.hf", "is not a Hugging Face repo id (ORG/NAME)"),
        ({"model": "org/x"}, "stage.0", "either hf (a repo id) or url (with path)"),
        ({"url": "https://example.org/f", "path": "../f"}, "stage.0.url.path", "without '..'"),
        ({"url": "ftp://example.org/f", "path": "f"}, "stage.0.url.url", "should match"),
        ({"hf": "org/x", "revison": "main"}, "stage.0.hf.revison", "Extra inputs"),
    ],
)
def test_a_stage_entry_of_the_wrong_shape_is_refused_naming_its_field(entry, where, words):
    with pytest.raises(spec.ValidationError) as caught:
        stage_spec(entry)

    errors = spec.error_messages(caught.value)
    assert where in errors, errors
    assert words in errors[where]


def test_the_member_api_refuses_a_malformed_stage_entry_with_a_422(client, cast):
    from nomadgpu import api_tokens

    token = api_tokens.create_token(user=cast.member, name="t", now=now())[1]
    body = {"name": "x", "image": "i", "command": "c", "stage": [{"hf": "nope"}]}

    reply = client.post(
        "/api/jobs/", body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )

    assert reply.status_code == 422
    assert "is not a Hugging Face repo id" in reply.content.decode()


# --- The mirror, on a real worker -------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_worker_mirrors_a_repo_into_storage_before_the_job_s_first_rent(
    hub, local_storage, settings, sandbox, celery_worker_thread
):
    settings.VAST_URL, settings.VAST_API_KEY = sandbox.url, "sandbox-key"
    team = TeamFactory()

    job = submit(team, TINY_ENTRY)

    assert job.stage_state == "staging"
    job = wait_stage_state(job, "ready")
    (obj,) = job.staged_objects.all()
    assert obj.commit == hub.repos[TINY].commit
    store = object_store(team)
    stored = {f["path"]: store.open_read(f["key"]).read() for f in obj.files}
    assert stored == {
        "config.json": CONFIG,
        "tokenizer.json": TOKENIZER,
        "model.safetensors": WEIGHTS,
    }
    assert "README.md" not in stored  # not matched by the entry's globs
    by_path = {f["path"]: f for f in obj.files}
    assert by_path["model.safetensors"]["etag"] == hashlib.sha256(WEIGHTS).hexdigest()
    assert by_path["config.json"]["etag"] == hub_fake.git_blob_id(CONFIG)
    # Only then does the planner rent (here: no offer has that GPU).
    wait_until(lambda: job.attempts.exists(), timeout=20, what="the rent planned after staging")
    kinds = list(JobEvent.objects.filter(job=job).values_list("kind", flat=True))
    assert kinds.index("staged") < kinds.index("renting")
    assert (
        stage.progress(job)["text"]
        == f"staged: 3 of 3 files, {obj.bytes_total / 1e9:.2f} of {obj.bytes_total / 1e9:.2f} GB"
    )
    # The staged bytes are the cost model's model download, in place of the typed 0.
    assert terms.profile_for(job).model_gb == pytest.approx(obj.bytes_total / 1024**3)


@pytest.mark.django_db(transaction=True)
def test_a_second_job_with_the_same_entry_reuses_the_mirror(
    hub, local_storage, settings, sandbox, celery_worker_thread
):
    settings.VAST_URL, settings.VAST_API_KEY = sandbox.url, "sandbox-key"
    team = TeamFactory()
    first = wait_stage_state(submit(team, TINY_ENTRY), "ready")
    served = dict(hub.served)

    second = wait_stage_state(submit(team, TINY_ENTRY), "ready")

    assert hub.served == served  # not one byte fetched from the Hub again
    assert list(second.staged_objects.all()) == list(first.staged_objects.all())
    assert StagedObject.objects.count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({"hf": "org/no-such-model"}, "stage[1] hf org/no-such-model: not found on {url} (401)"),
        ({"hf": TINY, "revision": "v9"}, f"stage[1] hf {TINY}: has no revision 'v9' (404)"),
        ({"hf": TINY, "files": ["*.gguf"]}, f"stage[1] hf {TINY}: has no file matching *.gguf"),
        (
            {"hf": GATED},
            f"stage[1] hf {GATED}: gated (401): add HF_TOKEN (a token of an account that "
            "accepted its terms)",
        ),
    ],
    ids=["missing-repo", "missing-revision", "no-matching-file", "gated-without-token"],
)
def test_an_entry_that_cannot_be_staged_fails_the_job_at_once_before_any_rent(
    hub, local_storage, celery_worker_thread, entry, words
):
    job = submit(TeamFactory(), TINY_ENTRY, entry)

    job = wait_stage_state(job, "failed")

    assert job.state == JobState.FAILED
    assert job.failure_reason.startswith("staging: " + words.format(url=hub.url))
    assert not Attempt.objects.filter(job=job).exists()
    assert not job.events.filter(kind="staging_retry").exists()  # a refusal is not retried


@pytest.fixture
def quick_retries(monkeypatch):
    """The retry schedule at a tenth of its 2, 4, 8, 16 s (the worker runs in this process)."""
    monkeypatch.setattr(trouble, "RETRY_DELAYS_S", (0.2, 0.4, 0.8, 1.6))


def retries(job: Job) -> list[str]:
    return list(job.events.filter(kind="staging_retry").values_list("message", flat=True))


@pytest.mark.django_db(transaction=True)
def test_a_repo_that_does_not_exist_fails_at_once_naming_the_entry_and_what_to_check(
    hub, local_storage, celery_worker_thread
):
    job = submit(TeamFactory(), {"hf": "Qwen/NoSuch"})

    job = wait_stage_state(job, "failed")

    assert job.failure_reason == (
        f"staging: stage[0] hf Qwen/NoSuch: not found on {hub.url} (401), or private: check the"
        " repo id and revision; for a private repo add HF_TOKEN to the team's secrets and name"
        " it in the job's secrets"
    )
    kinds = list(job.events.values_list("kind", "message"))
    assert ("staging", "resolving stage[0] hf Qwen/NoSuch") in kinds
    assert retries(job) == []


@pytest.mark.django_db(transaction=True)
def test_a_hub_that_refuses_connections_is_tried_again_and_the_timeline_names_each_retry(
    settings, local_storage, sandbox, quick_retries, celery_worker_thread
):
    settings.VAST_URL, settings.VAST_API_KEY = sandbox.url, "sandbox-key"
    fake = hub_fake.FakeHub(repos={TINY: tiny_repo()})
    with hub_fake.running(fake, refusing=True):
        settings.HF_ENDPOINT = fake.url
        job = submit(TeamFactory(), TINY_ENTRY)
        wait_until(lambda: len(retries(job)) >= 2, timeout=30, what="two refused tries")
        fake.listen()

        job = wait_stage_state(job, "ready")

    seen = retries(job)
    refused = f"stage[0] hf {TINY}: the Hub is unreachable from the worker (connection refused)"
    assert seen[:2] == [
        f"{refused}, retrying in 0.2 s (attempt 1 of 5)",
        f"{refused}, retrying in 0.4 s (attempt 2 of 5)",
    ]
    assert len(seen) <= 4  # it answered before the tries were spent


@pytest.mark.django_db(transaction=True)
def test_a_hub_whose_name_does_not_resolve_fails_with_the_dns_sentence_after_the_retries(
    settings, local_storage, quick_retries, celery_worker_thread
):
    settings.HF_ENDPOINT = "http://hub.nomadgpu.invalid"  # RFC 6761: never resolves

    job = wait_stage_state(submit(TeamFactory(), TINY_ENTRY), "failed")

    dns = f"staging: stage[0] hf {TINY}: the Hub is unreachable from the worker (DNS: "
    assert job.failure_reason.startswith(dns), job.failure_reason
    assert job.failure_reason.endswith("): check the worker's network")
    attempts = [re.search(r"\(attempt (\d) of 5\)$", m).group(1) for m in retries(job)]
    assert attempts == ["1", "2", "3", "4"]
    assert "retrying in 1.6 s (attempt 4 of 5)" in retries(job)[-1]
    assert not Attempt.objects.filter(job=job).exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("status", "words"),
    [
        (503, "the Hub answered 503, a fault on its side, retrying in 0.2 s (attempt 1 of 5)"),
        (
            429,
            "the Hub is rate-limiting the worker (429, asking to wait 1 s), retrying in 1 s"
            " (attempt 1 of 5)",
        ),
    ],
    ids=["fault", "rate-limited"],
)
def test_a_fault_of_the_hub_is_tried_again(
    hub, local_storage, settings, sandbox, quick_retries, celery_worker_thread, status, words
):
    settings.VAST_URL, settings.VAST_API_KEY = sandbox.url, "sandbox-key"
    hub.fail_next.append(status)

    job = wait_stage_state(submit(TeamFactory(), TINY_ENTRY), "ready")

    assert retries(job) == [f"stage[0] hf {TINY}: {words}"]


@pytest.mark.django_db(transaction=True)
def test_a_hub_whose_certificate_the_worker_does_not_trust_fails_at_once(
    settings, local_storage, celery_worker_thread
):
    with hub_fake.running(hub_fake.FakeHub(repos={TINY: tiny_repo()}), self_signed=True) as fake:
        settings.HF_ENDPOINT = fake.url

        job = wait_stage_state(submit(TeamFactory(), TINY_ENTRY), "failed")

    assert job.failure_reason.startswith(
        f"staging: stage[0] hf {TINY}: the worker does not trust the Hub's TLS certificate ("
    )
    assert job.failure_reason.endswith(
        "): check the worker's CA certificates (SSL_CERT_FILE) and any proxy in between"
    )
    assert retries(job) == []


def test_a_transient_fault_is_tried_on_the_documented_schedule_then_fails():
    fault = trouble.StageTrouble("stage[0] hf a/b", "the Hub is unreachable", transient=True)

    delays = [trouble.retry_delay(fault, failures=n) for n in range(1, 6)]

    assert delays == [2, 4, 8, 16, None]  # five tries over 30 s
    assert trouble.attempts() == 5
    assert fault.retrying(8, 3) == (
        "stage[0] hf a/b: the Hub is unreachable, retrying in 8 s (attempt 3 of 5)"
    )
    again = pickle.loads(pickle.dumps(fault))  # noqa: S301 (our own bytes, as Celery may keep it)
    assert again.sentence == fault.sentence


def test_a_refusal_fails_at_once_and_a_retry_after_is_waited_up_to_a_minute():
    refusal = trouble.StageTrouble("stage[0] hf a/b", "not found", transient=False)
    slow = trouble.StageTrouble("", "429", transient=True, retry_after=5)
    later = trouble.StageTrouble("", "429", transient=True, retry_after=3600)

    assert trouble.retry_delay(refusal, failures=1) is None
    assert trouble.retry_delay(slow, failures=1) == 5  # more than the schedule's 2 s
    assert trouble.retry_delay(slow, failures=3) == 8
    assert trouble.retry_delay(later, failures=1) is None  # an hour: out of this job's reach


def test_a_retry_after_reads_seconds_and_http_dates():
    in_a_minute = format_datetime(datetime.now(UTC) + timedelta(seconds=60), usegmt=True)

    assert resolve.retry_after_s("7") == 7
    assert resolve.retry_after_s(in_a_minute) == pytest.approx(60, abs=2)
    assert resolve.retry_after_s("soon") is None
    assert resolve.retry_after_s(None) is None


@pytest.mark.django_db(transaction=True)
def test_the_page_the_api_and_the_cli_say_what_the_staging_does_from_its_start(
    settings, local_storage, celery_worker_thread, cast, client, live_server, capsys
):
    from nomadgpu import api_tokens
    from nomadgpu_cli import cli

    client.force_login(cast.member)
    token = api_tokens.create_token(user=cast.member, name="t", now=now())[1]
    with hub_fake.silent() as url:  # the task waits on the Hub's answer
        settings.HF_ENDPOINT = url
        job = submit(cast.team_a, TINY_ENTRY)
        doing = f"staging: resolving stage[0] hf {TINY} …"
        page = lambda: client.get(f"/jobs/{job.pk}/").content.decode()  # noqa: E731
        wait_until(lambda: doing in page(), timeout=30, what="the page to say it resolves")
        api = client.get(f"/api/jobs/{job.pk}", HTTP_AUTHORIZATION=f"Bearer {token}").json()
        cli.main(["--url", live_server.url, "--token", token, "status", str(job.pk)])

    assert api["stage"]["text"] == doing
    assert api["stage"]["doing"] == f"resolving stage[0] hf {TINY}"
    assert f"   model files: {doing}" in capsys.readouterr().out.splitlines()


def test_a_staging_job_whose_task_has_not_started_says_it_waits_for_a_worker(client, cast):
    job = staging_job(team=cast.team_a)
    client.force_login(cast.member)

    assert "staging: waiting for a worker" in client.get(f"/jobs/{job.pk}/").content.decode()


@pytest.mark.django_db(transaction=True)
def test_a_gated_repo_is_mirrored_with_the_team_s_hf_token_when_the_job_names_it(
    hub, local_storage, settings, sandbox, celery_worker_thread
):
    settings.VAST_URL, settings.VAST_API_KEY = sandbox.url, "sandbox-key"
    team = TeamFactory()
    TeamSecretFactory(team=team, name="HF_TOKEN", value=hub.token)

    job = wait_stage_state(submit(team, {"hf": GATED}, secrets=["HF_TOKEN"]), "ready")

    (obj,) = job.staged_objects.all()
    assert [f["path"] for f in obj.files] == ["config.json"]


# --- The agent lays it out ----------------------------------------------------------------

# The command: the snapshot's files are there, with the Hub's bytes, and nothing may go online.
CHECK_CACHE = """
import hashlib, os, sys
from pathlib import Path
assert os.environ["HF_HUB_OFFLINE"] == "1"
repo = Path(os.environ["HF_HOME"]) / "hub" / "models--org--tiny-model"
commit = (repo / "refs" / "main").read_text()
snap = repo / "snapshots" / commit
for name, digest in [a.split("=") for a in sys.argv[1:]]:
    path = snap / name
    assert path.is_symlink() and not os.path.isabs(os.readlink(path)), name
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, name
url_entry = Path(os.environ["NOMAD_STAGE_DIR"]) / "data" / "tokenizer.json"
assert url_entry.read_bytes() == b'{"version": "1.0", "model": {"type": "BPE"}}'
print("staged cache ok at", commit, flush=True)
"""


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
def test_the_agent_lays_out_the_hf_cache_and_the_command_finds_it_offline(
    hub, backend, encrypted, live_server, tmp_path, monkeypatch
):
    monkeypatch.setattr("jobs.lifecycle.send_task", lambda *a: None)
    script = tmp_path / "check.py"
    script.write_text(CHECK_CACHE)
    digests = [
        f"{name}={hashlib.sha256(data).hexdigest()}"
        for name, data in [("config.json", CONFIG), ("model.safetensors", WEIGHTS)]
    ]
    # A URL entry too (here a file the fake Hub serves), for $NOMAD_STAGE_DIR.
    url = {"url": f"{hub.url}/{TINY}/resolve/main/tokenizer.json", "path": "data/tokenizer.json"}
    job = staged_job(encrypted, f"{sys.executable} {script} {' '.join(digests)}", url)
    obj = job.staged_objects.get(kind="hf")
    assert job.staged_objects.count() == 2
    stored = object_store(job.team).open_read(obj.files[0]["key"]).read()
    assert (stored[:4] == b"NGCK") is encrypted
    attempt, token = make_attempt(job, state="starting")

    result = run_agent(live_server, token, tmp_path / "host")

    attempt.refresh_from_db()
    assert result.returncode == 0, result.stderr[-3000:]
    assert "staged cache ok at " + obj.commit in attempt.log_tail
    assert attempt.stage_done_at is not None
    blobs = tmp_path / "host" / "hf" / "hub" / "models--org--tiny-model" / "blobs"
    assert (blobs / hashlib.sha256(WEIGHTS).hexdigest()).read_bytes() == WEIGHTS


# --- Waiting for it ------------------------------------------------------------------------


def staging_job(**fields) -> Job:
    return JobFactory(state=JobState.QUEUED, stage=[TINY_ENTRY], stage_state="staging", **fields)


def test_the_planner_rents_nothing_for_a_job_still_staging(db):
    from jobs import lifecycle
    from jobs.watchdog import passes

    job = staging_job()

    assert job.pk not in passes.jobs_needing_a_host(now())
    assert lifecycle.plan_rent(job.pk, now=now()) is None
    assert not job.attempts.exists()


def test_the_job_page_and_the_member_api_show_the_staging_progress(client, cast):
    from nomadgpu import api_tokens

    job = staging_job(team=cast.team_a)
    obj = StagedObjectFactory(
        team=cast.team_a, kind="hf", source="hf:x", files_total=4, files_done=1,
        bytes_total=4_000_000_000, bytes_done=1_500_000_000,
    )  # fmt: skip
    job.staged_objects.add(obj)
    client.force_login(cast.member)
    token = api_tokens.create_token(user=cast.member, name="t", now=now())[1]

    page = client.get(f"/jobs/{job.pk}/").content.decode()
    api = client.get(f"/api/jobs/{job.pk}", HTTP_AUTHORIZATION=f"Bearer {token}").json()

    assert "staging: 1 of 4 files, 1.50 of 4.00 GB" in page
    assert "rents a host once they are in the team" in page
    assert api["stage"]["state"] == "staging"
    assert (api["stage"]["bytes_done"], api["stage"]["bytes_total"]) == (1_500_000_000, 4 * 10**9)


@pytest.mark.django_db(transaction=True)
def test_the_watchdog_sends_a_lost_stage_task_again(
    hub, local_storage, settings, sandbox, celery_worker_thread
):
    from jobs.tasks import watchdog_tick

    settings.VAST_URL, settings.VAST_API_KEY = sandbox.url, "sandbox-key"
    settings.STAGE_NUDGE_AFTER_S = 0
    # Staging, but its task was never sent (a lost message). No offer has its GPU.
    job = staging_job(requirements={"gpu_names": ["No Such GPU 9000"]})
    team = job.team

    watchdog_tick.delay()

    job = wait_stage_state(job, "ready")
    assert job.staged_objects.get().team == team


# --- The portal's form ---------------------------------------------------------------------


def toy_form(**overrides):
    from portal.forms import spec_to_initial

    data = {**spec_to_initial(job_templates.template_spec("toy")), "team": "team-a", **overrides}
    data["verified_only"] = "on"
    return data


def test_the_new_job_form_takes_stage_entries_one_per_line(
    client, cast, django_capture_on_commit_callbacks
):
    client.force_login(cast.member)
    lines = '{hf = "org/tiny-model", revision = "main", files = ["*.json"]}\n'
    lines += '{url = "https://example.org/train.jsonl", path = "data/train.jsonl"}\n'

    with django_capture_on_commit_callbacks() as callbacks:
        response = client.post("/jobs/new/", toy_form(stage=lines))

    job = Job.objects.get()
    assert response.status_code == 302
    assert job.stage == [
        {"hf": "org/tiny-model", "revision": "main", "files": ["*.json"]},
        {"url": "https://example.org/train.jsonl", "path": "data/train.jsonl"},
    ]
    assert job.stage_state == "staging"
    assert callbacks  # the stage task is sent once the submit commits


def test_the_new_job_form_names_a_stage_line_it_cannot_read(client, cast):
    client.force_login(cast.member)

    bad_line = client.post("/jobs/new/", toy_form(stage="hf = nope"))
    bad_repo = client.post("/jobs/new/", toy_form(stage='{hf = "nope"}'))

    assert "line 1 is not an entry like" in bad_line.context["form"].errors["stage"][0]
    assert "is not a Hugging Face repo id" in bad_repo.context["form"].errors["stage"][0]
    assert not Job.objects.exists()
