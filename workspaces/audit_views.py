"""The audit log as pages: every event for platform staff, a workspace's own events for its
admins (and, read-only, for staff)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any

from django import forms
from django.contrib import messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.http import urlencode
from django.views.generic import TemplateView

from portal import audit
from portal.audit_kinds import COUNT_LIMIT, AuditKind, left_out, of_kind
from portal.models import AuditEvent
from workspaces.access import StaffRequiredMixin, WorkspaceViewMixin
from workspaces.models import Role

AUDIT_PAGE_SIZE = 50
#: What the default view's summary calls the entries it leaves out.
LEFT_OUT_WORDS: dict[str, str] = {
    AuditKind.RUN_TOKENS: "run-token entries (each attempt of a run is issued a token, revoked "
    "when it ends)",
    AuditKind.SIGN_INS: "sign-ins and sign-outs",
}
# The dates the audit filters take: any real entry lies between them, and the day after the
# last still exists (9999-12-31 has none).
AUDIT_EARLIEST = date(1900, 1, 1)
AUDIT_LATEST = date(9998, 12, 31)


class AuditFilterForm(forms.Form):
    kind = forms.ChoiceField(required=False, choices=AuditKind.choices, label="Kind")
    action = forms.CharField(required=False, max_length=40)
    actor = forms.CharField(
        required=False,
        max_length=150,
        label="Who",
        help_text='A username, or "system" for what TauGrid did itself.',
    )
    workspace = forms.SlugField(required=False, max_length=40)
    object_type = forms.CharField(required=False, max_length=100, label="Object type")
    since = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    before = forms.IntegerField(required=False, widget=forms.HiddenInput, min_value=1)

    def _date_in_range(self, name: str) -> date | None:
        value: date | None = self.cleaned_data.get(name)
        if value is not None and not AUDIT_EARLIEST <= value <= AUDIT_LATEST:
            raise forms.ValidationError(f"Give a date between {AUDIT_EARLIEST} and {AUDIT_LATEST}.")
        return value

    def clean_since(self) -> date | None:
        return self._date_in_range("since")

    def clean_until(self) -> date | None:
        return self._date_in_range("until")


def filtered_audit_events(
    queryset: QuerySet[AuditEvent], data: dict[str, Any]
) -> tuple[list[AuditEvent], int | None]:
    """One page of events matching the filters, newest first, and the cursor for the next."""
    queryset = of_kind(_filtered(queryset, data), data.get("kind") or "")
    if data.get("before"):
        queryset = queryset.filter(id__lt=data["before"])
    # Keyset pagination on the id: stays fast however long the log grows.
    rows = list(queryset.order_by("-id")[: AUDIT_PAGE_SIZE + 1])
    next_cursor = rows[AUDIT_PAGE_SIZE - 1].id if len(rows) > AUDIT_PAGE_SIZE else None
    return rows[:AUDIT_PAGE_SIZE], next_cursor


def _filtered(queryset: QuerySet[AuditEvent], data: dict[str, Any]) -> QuerySet[AuditEvent]:
    """The entries matching every filter but the kind and the page."""
    if data.get("action"):
        queryset = queryset.filter(action=data["action"])
    if data.get("actor"):
        # What TauGrid did itself is recorded without a user.
        actor = "" if data["actor"] == "system" else data["actor"]
        queryset = queryset.filter(actor_username=actor)
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
    return queryset


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
    valid = form.is_valid()
    refused = form.is_bound and not valid
    for name, errors in form.errors.items() if refused else ():
        field = form.fields.get(name)
        label = (field.label if field is not None else None) or name.replace("_", " ")
        said = " ".join(str(error) for error in errors)
        messages.error(request, f"{str(label).capitalize()}: {said}")
    data = form.cleaned_data if valid else {}
    events, next_cursor = filtered_audit_events(queryset, data)
    kind = data.get("kind") or AuditKind.NOT_ROUTINE
    # The default view says what it leaves out (on the first page only: it is the same on
    # every page), with a link to each.
    left = (
        left_out(_filtered(queryset, data))
        if kind == AuditKind.NOT_ROUTINE and not data.get("before")
        else {}
    )
    summary = [
        {
            "count": count,
            "more": count > COUNT_LIMIT,
            "limit": COUNT_LIMIT,
            "kind": shown,
            "words": LEFT_OUT_WORDS[shown],
            "query": urlencode(
                {
                    **{key: str(value) for key, value in request.GET.items() if value},
                    "kind": shown,
                }
            ),
        }
        for shown, count in left.items()
        if count
    ]
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
        "refused": refused,
        "left_out": summary,
    }


class AuditFiltersRefusedMixin:
    """A filter that cannot be applied (a date out of range, say) shows the unfiltered log
    with what was wrong, as a 400."""

    def render_to_response(self, context: dict[str, Any], **response_kwargs: Any) -> HttpResponse:
        if context.get("refused"):
            response_kwargs.setdefault("status", 400)
        response: HttpResponse = super().render_to_response(  # type: ignore[misc]
            context, **response_kwargs
        )
        return response


class PlatformAuditView(AuditFiltersRefusedMixin, StaffRequiredMixin, TemplateView):
    """Every audit event, for platform staff."""

    template_name = "workspaces/audit.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context.update(
            _audit_context(self.request, AuditEvent.objects.unscoped(), show_workspace=True)
        )
        return context


class WorkspaceAuditView(AuditFiltersRefusedMixin, WorkspaceViewMixin, TemplateView):
    """A workspace's own audit events, for its admins and (read-only) for platform staff."""

    template_name = "workspaces/audit.html"
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
