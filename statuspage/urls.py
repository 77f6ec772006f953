from django.urls import path

from statuspage import views

app_name = "statuspage"

urlpatterns = [
    path("<slug:slug>/", views.page, name="page"),
    path("<slug:slug>.json", views.as_json, name="json"),
    path("<slug:slug>/feed.atom", views.InterruptionFeed(), name="feed"),
    path("<slug:slug>/badge.svg", views.badge, name="badge"),
]
