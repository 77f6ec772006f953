from django.urls import path

from jobs import views

urlpatterns = [
    path("jobs/<int:job_id>/", views.job_detail, name="job-detail"),
]
