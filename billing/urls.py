from django.urls import path

from billing import banner, views

urlpatterns = [
    path("<slug:slug>/", views.summary, name="finance-summary"),
    path("<slug:slug>/jobs/<int:job_id>/", views.job_detail, name="finance-job"),
    path("<slug:slug>/export.csv", views.export, name="finance-export"),
    path("<slug:slug>/charges.csv", views.charges_csv, name="finance-charges-csv"),
    path("<slug:slug>/upload/", views.upload, name="finance-upload"),
    path("<slug:slug>/import/", views.import_now, name="finance-import"),
    # The spending-limit banner's fragment: for every member of the team, not finance only.
    path("<slug:slug>/limits-banner/", banner.limits_banner, name="budget-banner"),
    path("<slug:slug>/flags/<int:flag_id>/review/", views.review_flag, name="finance-review"),
]
