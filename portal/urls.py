from django.urls import path
from django.views.generic import RedirectView

from portal import views

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("teams/<slug:slug>/", views.team_detail, name="team-detail"),
    # The finance pages live under /finance/<team>/ (billing/urls.py: the job, export, upload
    # and import pages hang below it); this is where a reader of the team's page looks first.
    path(
        "teams/<slug:slug>/finance/",
        RedirectView.as_view(pattern_name="finance-summary", query_string=True),
        name="team-finance",
    ),
    path("teams/<slug:slug>/secrets/", views.team_secret_set, name="team-secret-set"),
    path(
        "teams/<slug:slug>/secrets/<str:name>/delete/",
        views.team_secret_delete,
        name="team-secret-delete",
    ),
    path("jobs/", views.job_list, name="job-list"),
    path("jobs/new/", views.job_new, name="job-new"),
    path("jobs/<int:job_id>/", views.job_detail, name="job-detail"),
    path("jobs/<int:job_id>/cancel/", views.job_cancel, name="job-cancel"),
    path("jobs/<int:job_id>/resume/", views.job_resume, name="job-resume"),
    path(
        "jobs/<int:job_id>/checkpoints/<int:checkpoint_id>/download/",
        views.checkpoint_download,
        name="checkpoint-download",
    ),
]
