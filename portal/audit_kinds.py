"""Kinds of audit entries, for reading the log: changes people made, sign-ins, API tokens of
people, and run tokens.

A run token is issued and revoked with every attempt of every run (``runs.run_tokens``), and
everyone signs in every day: on a busy platform those entries are most of the log, and the
changes someone needs to find drown in them. The audit pages and the admin list show the
log without them by default (``ROUTINE``) and say how many they left out; each kind is one
choice away. Nothing is ever removed from the log.

Which entries are run tokens is told by what the server recorded (``"kind": "run"`` with
the token's creation and revocation), never by a token's name, which its owner chooses:
naming a token "run x attempt 1" does not hide its creation. Revocations recorded before
the kind was (no ``after``) are told by the name run tokens are given.
"""

from __future__ import annotations

from django.db.models import Q, QuerySet, TextChoices, TextField, Value
from django.db.models.fields.json import KT
from django.db.models.functions import Coalesce

from portal.models import AuditEvent

#: The object type the token service records (``identity.tokens.TOKEN_OBJECT_TYPE``; the
#: kernel imports no app).
TOKEN_OBJECT_TYPE = "portal.apitoken"  # noqa: S105 - a name, not a secret


class AuditKind(TextChoices):
    NOT_ROUTINE = "", "Everything but run tokens and sign-ins"
    CHANGES = "changes", "Changes (workspaces, members, quotas, settings)"
    SIGN_INS = "sign-ins", "Sign-ins and sign-outs"
    TOKENS = "tokens", "API tokens of people"
    RUN_TOKENS = "run-tokens", "Run tokens (one per attempt)"
    ALL = "all", "Everything"


# ``recorded_kind`` is never NULL (see ``_with_kind``), so these conditions negate as
# they read: an entry whose ``after`` has no "kind" is not a run token, and NOT says so.
RUN_TOKENS = Q(object_type=TOKEN_OBJECT_TYPE) & (
    Q(recorded_kind="run")
    | Q(action="token.revoke", after__isnull=True, object_repr__regex=r"^run \S+ attempt [0-9]+ ")
)
SIGN_INS = Q(action__startswith="login.") | Q(action="logout")
#: Successful sign-ins and sign-outs: everyday. Failed and refused ones stay in view.
ROUTINE_SIGN_INS = Q(action__in=("login.success", "logout"))
TOKENS = Q(object_type=TOKEN_OBJECT_TYPE) & ~RUN_TOKENS

_KINDS: dict[str, Q | None] = {
    AuditKind.NOT_ROUTINE: ~RUN_TOKENS & ~ROUTINE_SIGN_INS,
    AuditKind.CHANGES: ~SIGN_INS & ~Q(object_type=TOKEN_OBJECT_TYPE),
    AuditKind.SIGN_INS: SIGN_INS,
    AuditKind.TOKENS: TOKENS,
    AuditKind.RUN_TOKENS: RUN_TOKENS,
    AuditKind.ALL: None,
}


def _with_kind(queryset: QuerySet[AuditEvent]) -> QuerySet[AuditEvent]:
    # The "kind" the server recorded, "" when none: a missing JSON key reads as NULL in SQL,
    # and NOT (NULL = 'run') would leave every such entry out.
    return queryset.alias(
        recorded_kind=Coalesce(KT("after__kind"), Value(""), output_field=TextField())
    )


def of_kind(queryset: QuerySet[AuditEvent], kind: str) -> QuerySet[AuditEvent]:
    """The entries of ``kind`` (an ``AuditKind`` value; anything else reads as the default)."""
    condition = _KINDS.get(kind, _KINDS[AuditKind.NOT_ROUTINE])
    return queryset if condition is None else _with_kind(queryset).filter(condition)


#: Left-out entries are counted up to this many; past it the page says "more than".
COUNT_LIMIT = 1000


def left_out(queryset: QuerySet[AuditEvent]) -> dict[str, int]:
    """How many run-token and everyday sign-in entries the default view leaves out of
    ``queryset`` (each counted up to ``COUNT_LIMIT`` + 1: a log of millions is not counted
    through for a page)."""
    return {
        AuditKind.RUN_TOKENS: _with_kind(queryset).filter(RUN_TOKENS)[: COUNT_LIMIT + 1].count(),
        AuditKind.SIGN_INS: queryset.filter(ROUTINE_SIGN_INS)[: COUNT_LIMIT + 1].count(),
    }
