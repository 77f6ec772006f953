from django.urls import path

from jobs import views

urlpatterns = [
    path("jobs/", views.job_list, name="job-list"),
    path("jobs/new/", views.job_new, name="job-new"),
    path("jobs/<int:job_id>/", views.job_detail, name="job-detail"),
    path("jobs/<int:job_id>/cancel/", views.job_cancel, name="job-cancel"),
    path(
        "jobs/<int:job_id>/checkpoints/<int:checkpoint_id>/download/",
        views.checkpoint_download,
        name="checkpoint-download",
    ),
]
