"""Identity: OpenID Connect login, local login, API tokens, and the audit of access."""
