"""Login, logout, single sign-on, the profile and API tokens (the shell mounts them at the
root)."""

from django.urls import path

from identity import oidc, views

urlpatterns = [
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", views.logout_view, name="logout"),
    path("oidc/login/", oidc.OIDCLoginView.as_view(), name="oidc-login"),
    path("oidc/callback/", oidc.OIDCCallbackView.as_view(), name="oidc-callback"),
    path("profile/", views.ProfileView.as_view(), name="profile"),
    path("tokens/", views.TokensView.as_view(), name="tokens"),
    path("tokens/<int:pk>/revoke/", views.TokenRevokeView.as_view(), name="token-revoke"),
    # One login page for everything: the admin's own login form would bypass single sign-on.
    path("admin/login/", views.admin_login),
]
