"""Pages: a workspace's webhooks (its admins'), your e-mail preferences, and the
one-click unsubscribe page that works without logging in."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.mixins import LoginRequiredMixin
from django.core.exceptions import ValidationError
from django.db.models import OuterRef, Subquery
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.csrf import csrf_exempt

from notifications import preferences, services
from notifications.events import EVENTS
from notifications.forms import EmailPreferencesForm, WebhookForm
from notifications.models import NotificationDelivery, Webhook
from notifications.unsubscribe import read_token
from portal.requests import signed_in_user
from workspaces.access import WorkspaceViewMixin
from workspaces.models import Role


def _newest_delivery(field: str) -> Subquery:
    return Subquery(
        NotificationDelivery.objects.unscoped()
        .filter(webhook=OuterRef("pk"))
        .order_by("-pk")
        .values(field)[:1]
    )


class WebhooksView(WorkspaceViewMixin, View):
    """The workspace's webhooks: its admins add and remove them here (and in the API)."""

    read_role = Role.ADMIN
    write_role = Role.ADMIN
    template_name = "notifications/webhooks.html"

    def webhooks(self) -> list[Webhook]:
        return list(
            Webhook.objects.for_workspace(self.workspace)
            .defer("secret")
            .annotate(
                last_tried_at=_newest_delivery("last_tried_at"),
                last_delivered_at=_newest_delivery("delivered_at"),
                last_error=_newest_delivery("last_error"),
            )
            .order_by("created_at", "id")
        )

    def _render(self, request: HttpRequest, form: WebhookForm, status: int = 200) -> HttpResponse:
        context = {
            "workspace": self.workspace,
            "access": self.access,
            "form": form,
            "webhooks": self.webhooks(),
            "webhook_limit": services.webhook_limit(),
            "now": timezone.now(),
            "events": EVENTS,
        }
        return render(request, self.template_name, context, status=status)

    def get(self, request: HttpRequest, workspace_slug: str) -> HttpResponse:
        return self._render(request, WebhookForm())

    def post(self, request: HttpRequest, workspace_slug: str) -> HttpResponse:
        form = WebhookForm(request.POST)
        if not form.is_valid():
            return self._render(request, form, status=400)
        try:
            webhook = services.create_webhook(
                workspace=self.workspace,
                url=form.cleaned_data["url"],
                secret=form.cleaned_data["secret"],
                events=form.cleaned_data["events"],
                fmt=form.cleaned_data["format"],
                by=signed_in_user(request),
            )
        except ValidationError as exc:
            for name, errors in exc.message_dict.items():
                for error in errors:
                    form.add_error(name if name in form.fields else None, error)
            return self._render(request, form, status=400)
        messages.success(request, f"Webhook to {webhook.endpoint} added; it gets the next event.")
        return HttpResponseRedirect(
            reverse("workspace-webhooks", kwargs={"workspace_slug": self.workspace.slug})
        )


class WebhookDeleteView(WorkspaceViewMixin, View):
    read_role = Role.ADMIN
    write_role = Role.ADMIN
    http_method_names = ["post"]

    def post(self, request: HttpRequest, workspace_slug: str, webhook_id: int) -> HttpResponse:
        webhook = Webhook.objects.for_workspace(self.workspace).filter(pk=webhook_id).first()
        if webhook is None:
            raise Http404("No such webhook in this workspace.")
        services.delete_webhook(webhook=webhook, by=signed_in_user(request))
        messages.success(request, f"Webhook to {webhook.endpoint} removed, with its delivery log.")
        return HttpResponseRedirect(
            reverse("workspace-webhooks", kwargs={"workspace_slug": self.workspace.slug})
        )


class EmailPreferencesView(LoginRequiredMixin, View):
    """What you are e-mailed about (linked from your profile)."""

    template_name = "notifications/preferences.html"

    def _render(
        self, request: HttpRequest, form: EmailPreferencesForm, status: int = 200
    ) -> HttpResponse:
        user = signed_in_user(request)
        context = {
            "form": form,
            "email": user.email,
            "email_enabled": services.email_enabled(),
        }
        return render(request, self.template_name, context, status=status)

    def get(self, request: HttpRequest) -> HttpResponse:
        chosen = preferences.email_events_for(signed_in_user(request).pk)
        return self._render(request, EmailPreferencesForm(initial={"events": chosen}))

    def post(self, request: HttpRequest) -> HttpResponse:
        form = EmailPreferencesForm(request.POST)
        if not form.is_valid():
            return self._render(request, form, status=400)
        services.set_email_events(user=signed_in_user(request), events=form.cleaned_data["events"])
        messages.success(request, "Your e-mail preferences are saved.")
        return HttpResponseRedirect(reverse("notification-preferences"))


@method_decorator(csrf_exempt, name="dispatch")
class UnsubscribeView(View):
    """The link in every e-mail. GET asks to confirm (mail scanners follow links, and a GET
    must change nothing); POST unsubscribes, also the one-click POST of RFC 8058 that mail
    clients send without a session or a CSRF token: the signed token is the proof."""

    template_name = "notifications/unsubscribe.html"
    http_method_names = ["get", "post"]

    def _context(self, token: str) -> dict[str, Any] | None:
        unsubscribe = read_token(token)
        if unsubscribe is None:
            return None
        return {"event": unsubscribe.event, "words": EVENTS[unsubscribe.event], "token": token}

    def _refused(self, request: HttpRequest) -> HttpResponse:
        return render(request, self.template_name, {"refused": True}, status=400)

    def get(self, request: HttpRequest, token: str) -> HttpResponse:
        context = self._context(token)
        if context is None:
            return self._refused(request)
        return render(request, self.template_name, context)

    def post(self, request: HttpRequest, token: str) -> HttpResponse:
        unsubscribe = read_token(token)
        context = self._context(token)
        if unsubscribe is None or context is None:
            return self._refused(request)
        if not services.unsubscribe(user_id=unsubscribe.user_id, event=unsubscribe.event):
            return self._refused(request)
        return render(request, self.template_name, {**context, "done": True})
