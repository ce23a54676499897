"""ID token verification refuses every token that is not exactly right."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import jwt
import pytest
from django.test import override_settings

from identity.oidc import OIDCError, ProviderClient, verify_id_token
from tests.identity.issuer import CLIENT_ID, Issuer, Key


@pytest.fixture
def issuer() -> Iterator[Issuer]:
    server = Issuer()
    with override_settings(
        TAU_OIDC_ISSUER=server.url, TAU_OIDC_ENABLED=True, OIDC_RP_CLIENT_ID=CLIENT_ID
    ):
        yield server
    server.close()


@pytest.fixture
def client(issuer: Issuer) -> ProviderClient:
    return ProviderClient(issuer.url)


def nonce() -> str:
    return uuid.uuid4().hex


def verify(token: str, client: ProviderClient, expected_nonce: str) -> dict[str, Any]:
    return verify_id_token(token, nonce=expected_nonce, client=client)


def test_a_correct_token_is_accepted(issuer: Issuer, client: ProviderClient) -> None:
    n = nonce()
    claims = verify(issuer.token(nonce=n), client, n)
    assert claims["sub"] == "subject-1"
    assert claims["iss"] == issuer.url


def test_es256_is_accepted_too(issuer: Issuer, client: ProviderClient) -> None:
    key = Key("ec-1", alg="ES256")
    issuer.keys.append(key)
    n = nonce()
    assert verify(issuer.token(key=key, nonce=n), client, n)["sub"] == "subject-1"


@pytest.mark.parametrize(
    ("claims", "reason"),
    [
        ({"aud": "someone-else"}, "for the client 'someone-else', but TAU_OIDC_CLIENT_ID is"),
        ({"iss": "https://evil.example.org"}, "issuer"),
        ({"exp": int(time.time()) - 3600, "iat": int(time.time()) - 7200}, "expired"),
        ({"exp": None}, "exp"),
        ({"iat": None}, "iat"),
        ({"sub": None}, "sub"),
        ({"aud": [CLIENT_ID, "other-app"]}, "several parties"),
    ],
    ids=[
        "wrong-audience",
        "wrong-issuer",
        "expired",
        "no-exp",
        "no-iat",
        "no-sub",
        "multi-audience-no-azp",
    ],
)
def test_bad_claims_are_refused(
    issuer: Issuer, client: ProviderClient, claims: dict[str, Any], reason: str
) -> None:
    n = nonce()
    with pytest.raises(OIDCError, match=reason):
        verify(issuer.token(nonce=n, **claims), client, n)


def test_several_audiences_are_fine_when_authorised_for_us(
    issuer: Issuer, client: ProviderClient
) -> None:
    n = nonce()
    token = issuer.token(nonce=n, aud=[CLIENT_ID, "other-app"], azp=CLIENT_ID)
    assert verify(token, client, n)["azp"] == CLIENT_ID


def test_a_bad_signature_is_refused(issuer: Issuer, client: ProviderClient) -> None:
    impostor = Key("key-1")  # same key id, different key
    n = nonce()
    with pytest.raises(OIDCError, match="Signature verification failed"):
        verify(issuer.token(key=impostor, nonce=n), client, n)


def test_a_tampered_payload_is_refused(issuer: Issuer, client: ProviderClient) -> None:
    n = nonce()
    header, payload, signature = issuer.token(nonce=n).split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    claims["sub"] = "somebody-else"
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    with pytest.raises(OIDCError):
        verify(f"{header}.{forged}.{signature}", client, n)


def test_an_unknown_key_id_is_refused_after_one_refetch(
    issuer: Issuer, client: ProviderClient
) -> None:
    n = nonce()
    verify(issuer.token(nonce=n), client, n)  # warms the key cache
    before = issuer.jwks_requests
    stranger = Key("never-published")
    with pytest.raises(OIDCError, match="no signing key 'never-published'"):
        verify(issuer.token(key=stranger, nonce=nonce()), client, n)
    assert issuer.jwks_requests <= before + 1


def test_a_rotated_key_is_picked_up_when_a_token_names_it(
    issuer: Issuer, client: ProviderClient
) -> None:
    n = nonce()
    verify(issuer.token(nonce=n), client, n)
    rotated = Key("key-2")
    issuer.keys = [rotated]
    # The cached key set is fresh, but a new kid justifies one refetch (once it is older than
    # the minimum refresh interval).
    client._jwks.fetched_at -= 60  # type: ignore[union-attr]
    n2 = nonce()
    assert verify(issuer.token(key=rotated, nonce=n2), client, n2)["sub"] == "subject-1"


def test_a_nonce_mismatch_is_refused(issuer: Issuer, client: ProviderClient) -> None:
    with pytest.raises(OIDCError, match="nonce does not match"):
        verify(issuer.token(nonce="from-another-login"), client, nonce())
    with pytest.raises(OIDCError, match="nonce does not match"):
        verify(issuer.token(nonce=None), client, nonce())


def test_a_replayed_token_is_refused(issuer: Issuer, client: ProviderClient) -> None:
    n = nonce()
    token = issuer.token(nonce=n)
    verify(token, client, n)
    with pytest.raises(OIDCError, match="already used"):
        verify(token, client, n)


def test_alg_none_is_refused(issuer: Issuer, client: ProviderClient) -> None:
    n = nonce()
    unsigned = jwt.encode(issuer.claims(nonce=n), key=None, algorithm="none")  # type: ignore[arg-type]
    with pytest.raises(OIDCError, match="'none' are not accepted"):
        verify(unsigned, client, n)


def test_hmac_with_the_public_key_is_refused(issuer: Issuer, client: ProviderClient) -> None:
    """The classic algorithm confusion: HS256 "signed" with the provider's public key."""
    n = nonce()
    header = base64.urlsafe_b64encode(
        json.dumps({"alg": "HS256", "kid": "key-1", "typ": "JWT"}).encode()
    ).rstrip(b"=")
    body = base64.urlsafe_b64encode(json.dumps(issuer.claims(nonce=n)).encode()).rstrip(b"=")
    forged = f"{header.decode()}.{body.decode()}.c2lnbmF0dXJl"
    with pytest.raises(OIDCError, match="'HS256' are not accepted"):
        verify(forged, client, n)


def test_a_provider_that_names_another_issuer_is_refused(issuer: Issuer) -> None:
    client = ProviderClient(issuer.url + "/somewhere-else")
    with pytest.raises(OIDCError, match="says its issuer is"):
        client.metadata()


def test_garbage_is_refused(client: ProviderClient) -> None:
    with pytest.raises(OIDCError, match="malformed"):
        verify("not-a-jwt", client, nonce())
