"""Create an API token for a user from the command line (first setup, automation).

    manage.py create_token USERNAME [--workspace SLUG] [--read-only] [--expires-days N]
                                    [--name NAME] [--scope endpoints:invoke]

Prints only the token on standard output, so it can be captured:
TOKEN=$(manage.py create_token ...).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from identity import tokens
from identity.models import ApiToken
from portal import audit
from workspaces.access import resolve_workspace_access


class Command(BaseCommand):
    help = "Create an API token for USERNAME and print it (shown once; only a hash is stored)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("username")
        parser.add_argument("--workspace", help="limit the token to this workspace (slug)")
        parser.add_argument("--read-only", action="store_true", help="the token can only read")
        parser.add_argument(
            "--expires-days",
            type=int,
            default=None,
            help=f"days until it expires (default {settings.TAU_TOKEN_DEFAULT_DAYS}, "
            f"at most {settings.TAU_TOKEN_MAX_DAYS})",
        )
        parser.add_argument("--name", default="created with manage.py create_token")
        parser.add_argument(
            "--scope",
            action="append",
            default=[],
            choices=ApiToken.Scope.values,
            help="what it may do beyond what every token may (repeat for several): "
            + "; ".join(f"{scope.value}: {scope.label.lower()}" for scope in ApiToken.Scope),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        user_model = get_user_model()
        try:
            user = user_model._default_manager.get(username=options["username"], is_active=True)
        except user_model.DoesNotExist:
            raise CommandError(f"no active user is called {options['username']!r}") from None
        workspace = None
        if options["workspace"]:
            try:
                workspace = resolve_workspace_access(user, options["workspace"]).workspace
            except Exception:
                raise CommandError(
                    f"{options['username']} has no access to a workspace {options['workspace']!r}"
                ) from None
        with audit.acting_as(None, source="cli"):
            try:
                issued = tokens.issue_token(
                    user=user,
                    name=options["name"],
                    workspace=workspace,
                    read_only=options["read_only"],
                    expires_in_days=options["expires_days"],
                    scopes=options["scope"],
                )
            except tokens.TokenPolicyError as exc:
                raise CommandError(str(exc)) from None
        self.stderr.write(
            f"Token for {user.get_username()}"
            f"{' in ' + workspace.slug if workspace else ' (all workspaces)'}"
            f"{', read-only' if options['read_only'] else ''}"
            f"{''.join(', ' + scope for scope in issued.token.scopes)}, expires "
            f"{issued.token.expires_at:%Y-%m-%d}. It is shown only now:"
        )
        self.stdout.write(issued.plaintext)
