"""Pages for logging in and out, the user's profile and API tokens, and the audit log."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from django import forms
from django.conf import settings
from django.contrib import auth, messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.mixins import LoginRequiredMixin
from django.core.exceptions import NON_FIELD_ERRORS, PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.utils.decorators import method_decorator
from django.utils.http import urlencode
from django.views import View
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST
from django.views.generic import TemplateView

from identity import oidc, tokens
from identity.login_throttle import LoginThrottle, Refusal, refusal_message
from identity.models import ApiToken, OIDCIdentity
from portal.requests import signed_in_user
from tau.printable import hidden_character_problem
from workspaces.models import Workspace
from workspaces.selectors import user_workspaces

if TYPE_CHECKING:
    from django.contrib.auth.models import User

OIDC_PROBLEMS = {
    "failed": "Single sign-on did not log you in. Try again, or ask your platform team.",
    "unavailable": "{provider} cannot be reached right now. Try again in a minute.",
    "misconfigured": (
        "Single sign-on with {provider} is not set up correctly, so it cannot log anyone in "
        "right now. Trying again will not help: ask your platform team to check TauGrid's "
        "single sign-on settings."
    ),
}


class LoginView(auth_views.LoginView):
    """Single sign-on first when it is configured; the password form when it is allowed,
    with password guessing limited in ways an attacker cannot turn against others
    (:mod:`identity.login_throttle`)."""

    redirect_authenticated_user = True
    throttle: LoginThrottle

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not settings.TAU_LOCAL_LOGIN:
            raise PermissionDenied("Password login is switched off; use single sign-on.")
        self.throttle = LoginThrottle(request, str(request.POST.get("username", "")))
        refusal = self.throttle.begin()
        if refusal is not None:
            return self._refused(refusal)
        return super().post(request, *args, **kwargs)

    def form_valid(self, form: Any) -> HttpResponse:
        response = super().form_valid(form)
        self.throttle.succeeded(response)
        return response

    def form_invalid(self, form: Any) -> HttpResponse:
        if form.has_error(NON_FIELD_ERRORS, "invalid_login") or form.has_error(
            NON_FIELD_ERRORS, "inactive"
        ):
            refusal = self.throttle.failed()
            if refusal is not None:
                return self._refused(refusal)
        else:
            self.throttle.not_attempted()  # incomplete form: no password was checked
        return super().form_invalid(form)

    def _refused(self, refusal: Refusal) -> HttpResponse:
        message = refusal_message(
            refusal,
            sso_provider=settings.TAU_OIDC_PROVIDER_NAME if settings.TAU_OIDC_ENABLED else None,
        )
        # A fresh form: the submitted one must not be validated (that would check the password).
        form = self.get_form_class()(self.request, initial={"username": self.throttle.username})
        context = self.get_context_data(form=form, login_paused=message)
        response = self.render_to_response(context, status=429)
        response["Retry-After"] = str(refusal.seconds)
        return response

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        problem = self.request.GET.get("oidc") or ""
        # What to change is shown to platform staff only, on every page once they are
        # signed in (identity/context_processors.py): the details name URLs and settings.
        message = OIDC_PROBLEMS.get(problem)
        context.update(
            {
                "oidc_enabled": settings.TAU_OIDC_ENABLED,
                "oidc_provider_name": settings.TAU_OIDC_PROVIDER_NAME,
                "local_login": settings.TAU_LOCAL_LOGIN,
                "oidc_problem": message.format(provider=settings.TAU_OIDC_PROVIDER_NAME)
                if message
                else None,
                "logged_out_locally": self.request.GET.get("logged_out") == "portal",
            }
        )
        return context


@require_POST
def logout_view(request: HttpRequest) -> HttpResponseBase:
    """End the portal session, and the provider's session too when it supports that."""
    id_token = request.session.get("oidc_id_token")
    provider_url = oidc.provider_logout_url(request, id_token)
    auth.logout(request)
    if provider_url:
        return HttpResponseRedirect(provider_url)
    if id_token and settings.TAU_OIDC_ENABLED:
        # The provider offers no logout for other sites: say its session may still be open.
        return HttpResponseRedirect(f"{reverse('login')}?logged_out=portal")
    return HttpResponseRedirect(reverse("login"))


def admin_login(request: HttpRequest) -> HttpResponseBase:
    """The admin uses the portal's login page (and so single sign-on, when configured)."""
    next_url = request.GET.get("next") or reverse("admin:index")
    if request.user.is_authenticated:
        if request.user.is_staff:
            return HttpResponseRedirect(reverse("admin:index"))
        raise PermissionDenied("The platform admin is for platform staff.")
    return HttpResponseRedirect(f"{reverse('login')}?{urlencode({'next': next_url})}")


class ProfileView(LoginRequiredMixin, TemplateView):
    template_name = "identity/profile.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["identities"] = list(OIDCIdentity.objects.filter(user=signed_in_user(self.request)))
        context["workspaces"] = user_workspaces(self.request)
        return context


class TokenForm(forms.Form):
    name = forms.CharField(
        max_length=100, help_text="What it is for, e.g. “laptop CLI” or “nightly eval”."
    )
    workspace = forms.ModelChoiceField(
        queryset=Workspace.objects.none(),
        required=False,
        empty_label="All my workspaces",
        to_field_name="slug",
        help_text="A token for one workspace cannot touch any other.",
    )
    read_only = forms.BooleanField(
        required=False, help_text="Can read, cannot submit or change anything."
    )
    invoke_endpoints = forms.BooleanField(
        required=False,
        label="Invoke endpoints",
        help_text="Scope endpoints:invoke: may send requests to the workspace's endpoints "
        "(also when read-only). Without it a token cannot.",
    )
    expires_in_days = forms.IntegerField(min_value=1, label="Expires in (days)")

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        workspace_field = self.fields["workspace"]
        assert isinstance(workspace_field, forms.ModelChoiceField)
        workspace_field.queryset = Workspace.objects.visible_to(user).order_by("name")
        days = self.fields["expires_in_days"]
        assert isinstance(days, forms.IntegerField)
        days.widget.attrs["max"] = settings.TAU_TOKEN_MAX_DAYS
        days.initial = settings.TAU_TOKEN_DEFAULT_DAYS
        days.help_text = f"At most {settings.TAU_TOKEN_MAX_DAYS} days."

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"]
        hidden = hidden_character_problem(name, "A token's name")
        if hidden:
            raise forms.ValidationError(f"{hidden}.")
        return name

    def clean_expires_in_days(self) -> int:
        days: int = self.cleaned_data["expires_in_days"]
        if days > settings.TAU_TOKEN_MAX_DAYS:
            raise forms.ValidationError(
                f"A token can last at most {settings.TAU_TOKEN_MAX_DAYS} days."
            )
        return days


@method_decorator(never_cache, name="dispatch")  # a new token's secret must not be cached
class TokensView(LoginRequiredMixin, View):
    """List, create and revoke your API tokens. A new token's secret is shown once."""

    template_name = "identity/tokens.html"

    def _tokens(self) -> QuerySet[ApiToken]:
        return (
            ApiToken.objects.filter(user=cast("User", self.request.user), kind=ApiToken.Kind.USER)
            .select_related("workspace")
            .order_by("-created_at")
        )

    def _render(
        self, request: HttpRequest, form: TokenForm, issued: str | None = None, status: int = 200
    ) -> HttpResponse:
        return render(
            request,
            self.template_name,
            {"form": form, "tokens": list(self._tokens()), "issued": issued, "now": timezone.now()},
            status=status,
        )

    def get(self, request: HttpRequest) -> HttpResponse:
        return self._render(request, TokenForm(user=request.user))

    def post(self, request: HttpRequest) -> HttpResponse:
        form = TokenForm(request.POST, user=request.user)
        if not form.is_valid():
            return self._render(request, form, status=400)
        issued = tokens.issue_token(
            user=signed_in_user(request),
            name=form.cleaned_data["name"],
            workspace=form.cleaned_data["workspace"],
            read_only=form.cleaned_data["read_only"],
            expires_in_days=form.cleaned_data["expires_in_days"],
            scopes=[ApiToken.Scope.ENDPOINTS_INVOKE]
            if form.cleaned_data["invoke_endpoints"]
            else [],
        )
        return self._render(
            request, TokenForm(user=request.user), issued=issued.plaintext, status=201
        )


class TokenRevokeView(LoginRequiredMixin, View):
    def post(self, request: HttpRequest, pk: int) -> HttpResponse:
        token = get_object_or_404(ApiToken, pk=pk, user=request.user, kind=ApiToken.Kind.USER)
        tokens.revoke_token(token=token)
        messages.success(request, f"Revoked “{token.name}”. Anything using it stops working now.")
        return HttpResponseRedirect(reverse("tokens"))
