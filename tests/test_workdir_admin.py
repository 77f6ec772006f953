"""Code packs in the Django admin: listed for their team's admins only, read-only, no key."""

from __future__ import annotations

import pytest
from django.urls import reverse

from jobs.models import WorkdirPack
from tests.support.factories import JobFactory
from tests.support.workdir import TRAIN_PY, ready_pack, sha256, tar_gz

pytestmark = pytest.mark.django_db

PACK = tar_gz({"train.py": TRAIN_PY})


@pytest.fixture(autouse=True)
def local_storage(settings, tmp_path):
    settings.STORAGE_BACKEND = "local"
    settings.STORAGE_LOCAL_DIR = tmp_path / "objects"


def test_a_team_admin_sees_the_teams_packs_and_not_another_teams(client, cast):
    ours = ready_pack(cast.team_a, PACK, encrypted=True)
    theirs = ready_pack(cast.team_b, tar_gz({"other.py": b"x"}))
    client.force_login(cast.admin)

    listing = client.get(reverse("admin:jobs_workdirpack_changelist")).content.decode()
    other = client.get(reverse("admin:jobs_workdirpack_change", args=[theirs.pk]))

    assert sha256(PACK) in listing
    assert theirs.sha256 not in listing
    assert other.status_code == 404
    page = client.get(reverse("admin:jobs_workdirpack_change", args=[ours.pk])).content.decode()
    assert ours.data_key not in page


def test_packs_are_read_only_in_the_admin(client, cast):
    pack = ready_pack(cast.team_a, PACK)
    client.force_login(cast.admin)

    page = client.get(reverse("admin:jobs_workdirpack_change", args=[pack.pk])).content.decode()
    add = client.get(reverse("admin:jobs_workdirpack_add"))
    delete = client.post(reverse("admin:jobs_workdirpack_delete", args=[pack.pk]), {"post": "yes"})

    assert 'name="_save"' not in page
    assert add.status_code == 403
    assert delete.status_code == 403
    assert WorkdirPack.objects.filter(pk=pack.pk).exists()


def test_a_jobs_workdir_is_shown_in_its_admin_page_and_an_edit_keeps_it(client, cast):
    workdir = {
        "kind": "git",
        "url": "https://x.test/r.git",
        "ref": "main",
        "commit": "0123456789abcdef0123456789abcdef01234567",
        "deploy_key_secret": "",
    }
    job = JobFactory(team=cast.team_a, workdir=workdir)
    client.force_login(cast.admin)
    url = reverse("admin:jobs_job_change", args=[job.pk])
    page = client.get(url)
    form = page.context["adminform"].form
    data = {name: form[name].value() for name in form.fields if form[name].value() is not None}
    data |= {"name": "renamed", "jobevent_set-TOTAL_FORMS": "0", "jobevent_set-INITIAL_FORMS": "0"}

    saved = client.post(url, data)

    assert "workdir" not in form.fields
    assert "0123456789abcdef0123456789abcdef01234567" in page.content.decode()
    assert saved.status_code == 302
    job.refresh_from_db()
    assert (job.name, job.workdir) == ("renamed", workdir)
