"""Password guessing limits that an attacker cannot turn against the people they protect.

A limit that refuses the right password stops guessing, but it also lets anyone who knows a
username refuse its owner: ten wrong passwords for ``admin`` used to lock ``admin`` out from
everywhere for 15 minutes, and fifty failures from one address locked out everyone behind it
(under ``make run`` every browser is 127.0.0.1). So the limits here refuse only what an
attacker's own failures earned, and the one limit that must be global per account slows
instead of locking, and never applies to the owner's own browsers:

**Known browsers.** A successful password login leaves a signed cookie (``tau_device``, sent
only to the login page, kept ``TAU_AUTH_LOGIN_DEVICE_DAYS``) naming the accounts that logged
in from that browser. Such a browser's password is always checked, whatever others did to the
account or its address; only its own failures count against it: after
``TAU_AUTH_LOGIN_FAILURES_PER_ACCOUNT_ADDRESS`` of them in a row it is no longer known for
that account until it logs in again (which takes the password), so a stolen cookie buys that
many guesses, once. Nobody can make a cookie for another person's account without its
password: it is signed with the secret key.

**Every other attempt** is counted before its password is checked (so a burst of parallel
guesses is held to the same limits) and given back when it was no failure:

* per account *and* address: ``TAU_AUTH_LOGIN_FAILURES_PER_ACCOUNT_ADDRESS`` failures within
  ``TAU_AUTH_FAILURE_WINDOW_SECONDS`` pause password login for that account *from that
  address* for ``TAU_AUTH_LOGIN_LOCKOUT_SECONDS`` (refused before the check). Other
  addresses, and the owner's known browser behind the same one, are not affected.
* per account, from anywhere: after ``TAU_AUTH_LOGIN_FAILURES_PER_ACCOUNT`` failures in a
  row (since the account's last successful login; forgotten after a day without one) the
  account's attempts from unknown browsers are *slowed*: one at a time, each after a wait of
  ``TAU_AUTH_LOGIN_BACKOFF_SECONDS`` that doubles with every failure up to the lockout time.
  This is what bounds guessing from many addresses at once.
* per address, across accounts: past ``TAU_AUTH_LOGIN_FAILURES_PER_ADDRESS`` failures within
  the window (password spraying: one guess at each of many accounts), one failure for an
  account from that address pauses that account there. An account that did not fail from
  the address is never refused, so the people sharing it keep logging in.

**The bound.** Without a known browser of the account, from any number of addresses, an
attacker gets ``FAILURES_PER_ACCOUNT`` guesses, then one after waits of 1, 2, 4 and 8 minutes
and then one every 15 minutes (the defaults): about 110 on the first day and 96 a day after.
Only the owner's successful login forgives the failures (and so gives a guesser the quick
ones again: about 10 more per login of the owner). The owner logs in from a known
browser at any time, and single sign-on is never limited. What an attacker can still do is
slow a *new* browser's password login for the account they guess at, and pause one account's
login from an address they share with its owner when the owner's browser is not known there
(a new browser behind the same NAT, or under ``make run``); both end by themselves.

The API's token checks do not share these limits: a token that verifies is always served
(``identity.tokens``), since a 238-bit secret cannot be guessed. The cache being down never
turns into an outage: the limits are skipped (with a warning) and the password check stays.
"""

from __future__ import annotations

import hashlib
import logging
import math
import secrets
import time as clock
import unicodedata
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import signing
from django.core.cache import cache
from django.http import HttpRequest, HttpResponseBase
from django.urls import reverse

from portal import audit
from portal.rate_limits import add_to_count

logger = logging.getLogger(__name__)

DEVICE_COOKIE = "tau_device"
_DEVICE_SALT = "identity.login_throttle.device"
#: Accounts one browser is remembered for (the most recent ones).
_DEVICE_ACCOUNTS = 20
#: How long an account's run of failures is remembered without a new one.
_ACCOUNT_MEMORY_SECONDS = 24 * 3600


def account_key(username: str) -> str:
    """What counts as one account: case and compatibility forms ("Alice", "alice" and
    "alice" in fullwidth letters) are one, whether or not such an account exists, so a
    limit reveals nothing about which accounts exist."""
    typed = unicodedata.normalize("NFKC", username).casefold()
    return hashlib.sha256(typed.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Device:
    """A browser that logged in with a password before: its random id and the accounts
    (``account_key``) it logged in to."""

    id: str
    accounts: tuple[str, ...]

    @classmethod
    def of(cls, request: HttpRequest) -> Device | None:
        value = request.COOKIES.get(DEVICE_COOKIE)
        if not value:
            return None
        try:
            data = signing.loads(
                value, salt=_DEVICE_SALT, max_age=settings.TAU_AUTH_LOGIN_DEVICE_DAYS * 86400
            )
            return cls(str(data["d"]), tuple(str(key) for key in data["a"]))
        except (signing.BadSignature, KeyError, TypeError, ValueError):
            return None

    def remembering(self, account: str) -> Device:
        kept = [key for key in self.accounts if key != account][-(_DEVICE_ACCOUNTS - 1) :]
        return Device(self.id, (*kept, account))

    def set_on(self, response: HttpResponseBase) -> None:
        """Keep the cookie for the device's lifetime from now, sent only to the login page."""
        response.set_cookie(
            DEVICE_COOKIE,
            signing.dumps({"d": self.id, "a": list(self.accounts)}, salt=_DEVICE_SALT),
            max_age=settings.TAU_AUTH_LOGIN_DEVICE_DAYS * 86400,
            path=reverse("login"),
            secure=settings.SESSION_COOKIE_SECURE,
            httponly=True,
            samesite="Lax",
        )


@dataclass(frozen=True)
class Refusal:
    """Why an attempt is not checked: ``paused`` (this account from this address) or
    ``slowed`` (this account's new browsers), and when it may be tried again."""

    kind: str
    until: float

    @property
    def seconds(self) -> int:
        return max(1, math.ceil(self.until - clock.time()))


class LoginThrottle:
    """The limits for one password login attempt (see the module's docstring): ``begin``
    before the password is checked, then exactly one of ``failed``, ``succeeded`` or
    ``not_attempted``. Every count is taken before the check and given back when the attempt
    turns out not to be a failure, so parallel guesses are held to the same limits."""

    def __init__(self, request: HttpRequest, username: str) -> None:
        self.username = username[:150]
        self.address = str(request.META.get("REMOTE_ADDR", ""))[:64]
        self.account = account_key(username)
        self.device = Device.of(request)
        self.window = settings.TAU_AUTH_FAILURE_WINDOW_SECONDS
        self.lockout = settings.TAU_AUTH_LOGIN_LOCKOUT_SECONDS
        self.pair_limit = settings.TAU_AUTH_LOGIN_FAILURES_PER_ACCOUNT_ADDRESS
        self.account_limit = settings.TAU_AUTH_LOGIN_FAILURES_PER_ACCOUNT
        self.address_limit = settings.TAU_AUTH_LOGIN_FAILURES_PER_ADDRESS
        device_seconds = settings.TAU_AUTH_LOGIN_DEVICE_DAYS * 86400
        # Cache keys, with how long each count lives.
        self._pair = (f"loginfail:pair:{self.account}:{self.address}", self.window)
        self._pair_lock = f"loginlock:pair:{self.account}:{self.address}"
        self._address = (f"loginfail:addr:{self.address}", self.window)
        self._account = (f"loginfail:user:{self.account}", _ACCOUNT_MEMORY_SECONDS)
        self._slot = f"loginslot:user:{self.account}"
        self._device = (
            (f"loginfail:device:{self.device.id}:{self.account}", device_seconds)
            if self.device is not None and self.account in self.device.accounts
            else None
        )
        self.known = False
        self._counted: list[tuple[str, int]] = []
        self._slot_taken = False

    # --- before the password is checked ----------------------------------------------------

    def begin(self) -> Refusal | None:
        """Count this attempt; a Refusal when its password may not be checked now."""
        try:
            return self._begin()
        except Exception:
            logger.warning("login limits unavailable (cache down); not limiting", exc_info=True)
            self._counted = []
            return None

    def _begin(self) -> Refusal | None:
        if self._device is not None:
            if self._count(self._device) <= self.pair_limit:
                self.known = True
                return None  # the owner's browser: only its own failures count
            self.not_attempted()  # no longer known for this account: the rules below apply
        until = cache.get(self._pair_lock)
        if until is not None:
            return Refusal("paused", float(until))
        failures = self._count(self._account)
        cache.touch(self._account[0], self._account[1])
        if failures > self.account_limit:
            # Slowed: one attempt at a time, each after a wait that doubles per failure.
            over = failures - self.account_limit - 1
            delay = int(
                min(settings.TAU_AUTH_LOGIN_BACKOFF_SECONDS * 2 ** min(over, 30), self.lockout)
            )
            hold_until = clock.time() + delay
            if not cache.add(self._slot, hold_until, timeout=delay):
                self.not_attempted()
                taken = cache.get(self._slot)
                return Refusal("slowed", float(taken) if taken is not None else hold_until)
            self._slot_taken = True
        self._count(self._address)
        if self._count(self._pair) > self.pair_limit:
            # Raced past the limit alongside other attempts: this one is not checked.
            self.not_attempted()
            return Refusal("paused", self._pause_pair())
        return None

    def _count(self, counter: tuple[str, int]) -> int:
        """Add this attempt to a count; the new count."""
        self._counted.append(counter)
        return add_to_count(*counter)

    # --- after ----------------------------------------------------------------------------

    def failed(self) -> Refusal | None:
        """The password was wrong (it stays counted); a Refusal when this failure paused the
        account's login from this address."""
        if self.known:
            return None
        try:
            return self._failed()
        except Exception:
            logger.warning("login limits unavailable (cache down)", exc_info=True)
            return None

    def _failed(self) -> Refusal | None:
        if int(cache.get(self._account[0]) or 0) >= self.account_limit:
            self._audit_once(
                f"loginslowed:{self.account}",
                self._account[1],
                "login.slowed",
                "auth.user",
                f"password login for {self.username!r} from new browsers slowed after "
                f"{self.account_limit} failures in a row",
            )
        from_address = int(cache.get(self._address[0]) or 0)
        spraying = from_address >= self.address_limit
        if spraying:
            self._audit_once(
                f"loginspray:{self.address}",
                self.window,
                "login.locked",
                "address",
                f"{from_address} failed password logins from {self.address} within "
                f"{self.window} s: from now on one failure for an account pauses it there",
            )
        if spraying or int(cache.get(self._pair[0]) or 0) >= self.pair_limit:
            return Refusal("paused", self._pause_pair())
        return None

    def succeeded(self, response: HttpResponseBase) -> None:
        """The password was right: the account's failures (and this address's for it) are
        forgiven, and this browser is remembered for the account."""
        try:
            self.not_attempted()  # a success is no failure
            forgiven = [self._pair[0], self._account[0], self._slot]
            if self._device is not None:
                forgiven.append(self._device[0])
            cache.delete_many(forgiven)
        except Exception:
            logger.warning("login limits unavailable (cache down); not cleared", exc_info=True)
        device = self.device or Device(secrets.token_urlsafe(16), ())
        device.remembering(self.account).set_on(response)

    def not_attempted(self) -> None:
        """No password was checked (an incomplete form, or refused here): take the counts
        back."""
        counted, self._counted = self._counted, []
        try:
            for key, timeout in counted:
                add_to_count(key, timeout, -1)
            if self._slot_taken:
                cache.delete(self._slot)
        except Exception:
            logger.warning("login limits unavailable (cache down)", exc_info=True)
        self._slot_taken = False

    # --- pauses and their audit -----------------------------------------------------------

    def _pause_pair(self) -> float:
        until = clock.time() + self.lockout
        if cache.add(self._pair_lock, until, timeout=self.lockout):
            cache.delete(self._pair[0])  # counting starts afresh once the pause is over
            self._audit(
                "login.locked",
                "auth.user",
                f"password login for {self.username!r} from {self.address} paused for "
                f"{self.lockout} s after failed logins",
            )
            return until
        return float(cache.get(self._pair_lock) or until)

    def _audit_once(self, marker: str, timeout: int, *event: str) -> None:
        if cache.add(marker, 1, timeout=timeout):
            self._audit(*event)

    def _audit(self, action: str, object_type: str, text: str) -> None:
        object_id = self.address
        if object_type == "auth.user":
            user = get_user_model()._default_manager.filter(username=self.username).first()
            object_id = str(user.pk) if user is not None else ""
        audit.record(action=action, object_type=object_type, object_id=object_id, object_repr=text)


def refusal_message(refusal: Refusal, *, sso_provider: str | None) -> str:
    """What the login page says about a refused attempt, with what still works."""
    if refusal.kind == "paused":
        minutes = max(1, math.ceil(refusal.seconds / 60))
        text = (
            "Too many failed logins for this account from your address, so password login "
            f"for it is paused here. Try again in {minutes} minute{'' if minutes == 1 else 's'}."
        )
    else:
        seconds = refusal.seconds
        wait = f"{seconds} seconds" if seconds < 120 else f"{math.ceil(seconds / 60)} minutes"
        text = (
            "Many failed logins for this account, so password logins for it from new "
            f"browsers are slowed. Try again in {wait}; a browser that has logged in to it "
            "before is not slowed."
        )
    if sso_provider:
        text += f" Logging in with {sso_provider} still works."
    return text
