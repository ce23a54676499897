"""Pages for logging in and out, the user's profile and API tokens, and the audit log."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, time, timedelta
from typing import TYPE_CHECKING, Any, cast

from django import forms
from django.conf import settings
from django.contrib import auth, messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.mixins import LoginRequiredMixin
from django.core.exceptions import PermissionDenied
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

from portal import audit
from portal.identity import oidc, tokens
from portal.models import ApiToken, AuditEvent
from workspaces.access import StaffRequiredMixin, WorkspaceViewMixin
from workspaces.models import Role, Workspace

if TYPE_CHECKING:
    from django.contrib.auth.models import User

AUDIT_PAGE_SIZE = 50
OIDC_PROBLEMS = {
    "failed": "Single sign-on did not log you in. Try again, or ask your platform team.",
    "unavailable": "The identity provider cannot be reached right now. Try again in a minute.",
}


class LoginView(auth_views.LoginView):
    """Single sign-on first when it is configured; the password form when it is allowed."""

    redirect_authenticated_user = True

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not settings.TAU_LOCAL_LOGIN:
            raise PermissionDenied("Password login is switched off; use single sign-on.")
        return super().post(request, *args, **kwargs)

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        problem = self.request.GET.get("oidc")
        context.update(
            {
                "oidc_enabled": settings.TAU_OIDC_ENABLED,
                "oidc_provider_name": settings.TAU_OIDC_PROVIDER_NAME,
                "local_login": settings.TAU_LOCAL_LOGIN,
                "oidc_problem": OIDC_PROBLEMS.get(problem or ""),
            }
        )
        return context


@require_POST
def logout_view(request: HttpRequest) -> HttpResponseBase:
    """End the portal session, and the provider's session too when it supports that."""
    id_token = request.session.get("oidc_id_token")
    provider_url = oidc.provider_logout_url(request, id_token)
    auth.logout(request)
    return HttpResponseRedirect(provider_url or reverse("login"))


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
        from portal.context_processors import user_workspaces

        context = super().get_context_data(**kwargs)
        context["identities"] = list(self.request.user.oidc_identities.all())  # type: ignore[union-attr]
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
            user=request.user,  # type: ignore[arg-type]
            name=form.cleaned_data["name"],
            workspace=form.cleaned_data["workspace"],
            read_only=form.cleaned_data["read_only"],
            expires_in_days=form.cleaned_data["expires_in_days"],
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


class AuditFilterForm(forms.Form):
    action = forms.CharField(required=False, max_length=40)
    actor = forms.CharField(required=False, max_length=150, label="User")
    workspace = forms.SlugField(required=False, max_length=40)
    object_type = forms.CharField(required=False, max_length=100, label="Object type")
    since = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    before = forms.IntegerField(required=False, widget=forms.HiddenInput, min_value=1)


def filtered_audit_events(
    queryset: QuerySet[AuditEvent], data: dict[str, Any]
) -> tuple[list[AuditEvent], int | None]:
    """One page of events matching the filters, newest first, and the cursor for the next."""
    if data.get("action"):
        queryset = queryset.filter(action=data["action"])
    if data.get("actor"):
        queryset = queryset.filter(actor_username=data["actor"])
    if data.get("workspace"):
        queryset = queryset.filter(workspace_slug=data["workspace"])
    if data.get("object_type"):
        queryset = queryset.filter(object_type=data["object_type"])
    if data.get("since"):
        queryset = queryset.filter(
            time__gte=timezone.make_aware(datetime.combine(data["since"], time.min))
        )
    if data.get("until"):
        end = timezone.make_aware(datetime.combine(data["until"], time.min)) + timedelta(days=1)
        queryset = queryset.filter(time__lt=end)
    if data.get("before"):
        queryset = queryset.filter(id__lt=data["before"])
    # Keyset pagination on the id: stays fast however long the log grows.
    rows = list(queryset.order_by("-id")[: AUDIT_PAGE_SIZE + 1])
    next_cursor = rows[AUDIT_PAGE_SIZE - 1].id if len(rows) > AUDIT_PAGE_SIZE else None
    return rows[:AUDIT_PAGE_SIZE], next_cursor


@dataclass(frozen=True)
class AuditEntry:
    """One row of the audit page: the event and its change as people read it."""

    event: AuditEvent
    changes: list[audit.FieldChange]

    @property
    def is_update(self) -> bool:
        """Both sides recorded: the change itself is short, so it is shown as it is."""
        return self.event.before is not None and self.event.after is not None

    @property
    def summary(self) -> str:
        count = len(self.changes)
        return f"show {count} field{'' if count == 1 else 's'}"


def _audit_context(
    request: HttpRequest, queryset: QuerySet[AuditEvent], *, show_workspace: bool
) -> dict[str, Any]:
    form = AuditFilterForm(request.GET or None)
    data = form.cleaned_data if form.is_valid() else {}
    events, next_cursor = filtered_audit_events(queryset, data)
    entries = [AuditEntry(event, audit.describe_changes(event)) for event in events]
    next_query = None
    if next_cursor is not None:
        params: dict[str, str] = {
            key: str(value) for key, value in request.GET.items() if key != "before" and value
        }
        params["before"] = str(next_cursor)
        next_query = urlencode(params)
    return {
        "form": form,
        "entries": entries,
        "next_query": next_query,
        "show_workspace": show_workspace,
        "filtered": any(value for key, value in data.items() if key != "before"),
    }


class PlatformAuditView(StaffRequiredMixin, TemplateView):
    """Every audit event, for platform staff."""

    template_name = "identity/audit.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context.update(
            _audit_context(self.request, AuditEvent.objects.unscoped(), show_workspace=True)
        )
        return context


class WorkspaceAuditView(WorkspaceViewMixin, TemplateView):
    """A workspace's own audit events, for its admins and (read-only) for platform staff."""

    template_name = "identity/audit.html"
    write_role = Role.ADMIN

    @property
    def read_role(self) -> Role:  # type: ignore[override]
        # Platform staff read every workspace's pages (as viewers) to help its members, and
        # its audit log is one of them; among members, only admins read it.
        return Role.VIEWER if self.request.user.is_staff else Role.ADMIN

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context.update(
            _audit_context(
                self.request, AuditEvent.objects.for_workspace(self.workspace), show_workspace=False
            )
        )
        return context
