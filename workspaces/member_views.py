"""The members page, ``/w/<slug>/members/``: who is in the workspace with which role, and for
its admins a form to add people, change roles and remove members.

Everyone who reads the workspace reads the list (platform staff too, as they read every
workspace); only its admins change it (403 for anyone else, as in the API). The changes are
the API's own services (``workspaces.services``), so the rules are the same on both: only
people who already share a workspace with the admin can be added, with one answer for every
name that cannot; a workspace keeps at least one admin; every change is an audit event.

Forms work without JavaScript (post, then back to the page, which says what happened); with
it, htmx sends them and swaps the ``members`` fragment, which says it in place.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.vary import vary_on_headers

from portal.requests import signed_in_user
from workspaces import services
from workspaces.access import WorkspaceViewMixin, resolve_workspace_access
from workspaces.models import Membership, Role

#: How many names the add form suggests (people the admin could add; typing any works).
SUGGESTED_USERS = 200


class AddMemberForm(forms.Form):
    username = forms.CharField(
        max_length=150,
        label="Username",
        help_text=(
            "Someone who already shares a workspace with you; your platform team adds anyone else."
        ),
        widget=forms.TextInput(
            attrs={
                "autocomplete": "off",
                "autocapitalize": "none",
                "spellcheck": "false",
                "list": "addable-users",
            }
        ),
    )
    role = forms.ChoiceField(choices=Role.choices, initial=Role.RESEARCHER, label="Role")


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)


def _refusal(error: ValidationError) -> str:
    return " ".join(error.messages)


@method_decorator(vary_on_headers("HX-Request"), name="dispatch")  # fragments for htmx
class MembersPage(WorkspaceViewMixin, View):
    """What the page's views share: reading is for the workspace's readers, changing for its
    admins; each answers with the page or, for htmx, its ``members`` fragment."""

    write_role = Role.ADMIN
    template_name = "workspaces/members.html"

    def members(self) -> list[Membership]:
        rows: QuerySet[Membership] = (
            Membership.objects.for_workspace(self.workspace)
            .select_related("user")
            .order_by("user__username")
        )
        return list(rows)

    def render_members(
        self,
        request: HttpRequest,
        *,
        form: AddMemberForm | None = None,
        notice: str = "",
        refusal: str = "",
        status: int = 200,
    ) -> HttpResponse:
        """The page, or for htmx its ``members`` fragment, as the caller may now see it."""
        can_manage = self.access.allows(Role.ADMIN)
        members = self.members()
        suggestions: list[str] = []
        if can_manage:
            present = {member.user_id for member in members}
            suggestions = [
                name
                for pk, name in services.addable_users(signed_in_user(request))
                .order_by("username")
                .values_list("pk", "username")[: SUGGESTED_USERS + len(present)]
                if pk not in present
            ][:SUGGESTED_USERS]
        context: dict[str, Any] = {
            "workspace": self.workspace,
            "access": self.access,
            "members": members,
            "admins": [m for m in members if m.role == Role.ADMIN],
            "can_manage": can_manage,
            "form": form or AddMemberForm(),
            "roles": Role.choices,
            "suggestions": suggestions,
            "notice": notice,
            "refusal": refusal,
        }
        template = self.template_name
        if request.headers.get("HX-Request"):
            template += "#members"
        return render(request, template, context, status=status)

    def done(self, request: HttpRequest, notice: str) -> HttpResponse:
        """After a change: htmx gets the fragment saying so; a plain form post goes back to
        the page (post, redirect, get), which says so once."""
        if request.headers.get("HX-Request"):
            # The caller's own role may just have changed: show what they may do now.
            self.access = resolve_workspace_access(request.user, self.workspace.slug)
            return self.render_members(request, notice=notice)
        messages.success(request, notice)
        return HttpResponseRedirect(
            reverse("workspace-members", kwargs={"workspace_slug": self.workspace.slug})
        )

    def refused(
        self, request: HttpRequest, refusal: str, form: AddMemberForm | None = None
    ) -> HttpResponse:
        """A change that was not made: the page (or fragment) saying why, as a 400."""
        return self.render_members(request, form=form, refusal=refusal, status=400)

    def membership(self, username: str) -> Membership:
        found = (
            Membership.objects.for_workspace(self.workspace)
            .select_related("user")
            .filter(user__username=username)
            .first()
        )
        if found is None:
            raise Http404(f"{username} is not a member of this workspace.")
        return found


class MembersView(MembersPage):
    """The list, and adding a member (POST)."""

    def get(self, request: HttpRequest, workspace_slug: str) -> HttpResponse:
        return self.render_members(request)

    def post(self, request: HttpRequest, workspace_slug: str) -> HttpResponse:
        form = AddMemberForm(request.POST)
        if not form.is_valid():
            return self.refused(request, "The member was not added: see the form.", form)
        try:
            membership = services.add_member(
                workspace=self.workspace,
                username=form.cleaned_data["username"].strip(),
                role=Role(form.cleaned_data["role"]),
                by=signed_in_user(request),
            )
        except ValidationError as exc:
            for name, errors in exc.message_dict.items():
                for error in errors:
                    form.add_error(name if name in form.fields else None, error)
            return self.refused(request, "The member was not added: see the form.", form)
        return self.done(
            request,
            f"Added {membership.user.get_username()} to {self.workspace.name} as "
            f"{Role(membership.role).label.lower()}.",
        )


class MemberRoleView(MembersPage):
    """Change a member's role (POST); the last admin cannot stop being one."""

    http_method_names = ["post"]

    def post(self, request: HttpRequest, workspace_slug: str, username: str) -> HttpResponse:
        membership = self.membership(username)
        form = MemberRoleForm(request.POST)
        if not form.is_valid():
            return self.refused(request, f"Choose viewer, researcher or admin for {username}.")
        role = Role(form.cleaned_data["role"])
        if membership.role == role:
            return self.done(request, f"{username} is already {role.label.lower()} here.")
        try:
            services.change_member_role(membership=membership, role=role)
        except ValidationError as exc:
            return self.refused(request, f"{username} stays {membership.role}: {_refusal(exc)}")
        return self.done(request, f"{username} is now {role.label.lower()}.")


class MemberRemoveView(MembersPage):
    """Remove a member (POST); the last admin cannot be removed. Removing yourself leaves the
    workspace: you are taken to your workspaces."""

    http_method_names = ["post"]

    def post(self, request: HttpRequest, workspace_slug: str, username: str) -> HttpResponse:
        membership = self.membership(username)
        try:
            services.remove_member(membership=membership)
        except ValidationError as exc:
            return self.refused(request, f"{username} stays a member: {_refusal(exc)}")
        if membership.user_id != request.user.pk:
            return self.done(request, f"Removed {username} from {self.workspace.name}.")
        messages.success(request, f"You left {self.workspace.name}.")
        home = reverse("home")
        if request.headers.get("HX-Request"):
            response = HttpResponse(status=204)
            response["HX-Redirect"] = home
            return response
        return HttpResponseRedirect(home)
