from django.urls import path

from billing import views

urlpatterns = [
    path("jobs/<int:job_id>/resume/", views.job_resume, name="job-resume"),
]
