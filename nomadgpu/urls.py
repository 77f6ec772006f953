from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.templatetags.static import static
from django.urls import include, path
from django.utils.functional import lazy
from django.views.generic import RedirectView

from nomadgpu import storage_views, token_views
from nomadgpu.api import api
from nomadgpu.password_views import SetPasswordView

admin.site.site_header = "NomadGPU administration"
admin.site.site_title = "NomadGPU"

urlpatterns = [
    # First: every agent's heartbeat resolves here, before the portal's includes are tried.
    path("api/", api.urls),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path(
        "account/set-password/<uidb64>/<token>/",
        SetPasswordView.as_view(),
        name="set-password",
    ),
    path("account/tokens/", token_views.tokens, name="account-tokens"),
    path("account/tokens/<int:token_id>/revoke/", token_views.revoke, name="account-token-revoke"),
    path("", include("portal.urls")),
    path("finance/", include("billing.urls")),
    path("admin/", admin.site.urls),
    path("status/", include("statuspage.urls")),
    path("storage/<path:key>", storage_views.local_object, name="local-object"),
    # Browsers ask for /favicon.ico on pages without a <link rel="icon"> (the API docs, error
    # pages): the static file, its URL resolved per request (no manifest needed at import).
    path(
        "favicon.ico",
        RedirectView.as_view(url=lazy(static, str)("nomadgpu/favicon.ico"), permanent=True),
        name="favicon",
    ),
]
