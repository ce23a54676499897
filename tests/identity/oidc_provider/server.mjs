// A real OpenID Connect provider for TauGrid's test suite: the OpenID-certified
// `oidc-provider` package with its development login pages (any login name, any password),
// a consent step, RP-initiated logout, and RS256 keys generated at start.
//
// Configuration comes as JSON in the TAU_TEST_OP_CONFIG environment variable:
//   { "issuer": "http://127.0.0.2:PORT", "port": PORT, "host": "127.0.0.2",
//     "client": { "client_id", "client_secret", "redirect_uris", "post_logout_redirect_uris" },
//     "accounts": { "<sub>": { "email": ..., "name": ..., "preferred_username": ..., "groups": [...] } } }
// It prints "ready <issuer>" once it listens.
import { generateKeyPairSync } from 'node:crypto';
import Provider from 'oidc-provider';

const config = JSON.parse(process.env.TAU_TEST_OP_CONFIG || '{}');
const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
const jwk = { ...privateKey.export({ format: 'jwk' }), kid: 'test-key-1', use: 'sig', alg: 'RS256' };

const provider = new Provider(config.issuer, {
  clients: [{
    ...config.client,
    grant_types: ['authorization_code'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
    id_token_signed_response_alg: 'RS256',
  }],
  jwks: { keys: [jwk] },
  cookies: { keys: [config.cookie_key || 'test-cookie-key-not-a-secret'] },
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name', 'given_name', 'family_name', 'preferred_username'],
    groups: ['groups'],
  },
  scopes: ['openid', 'email', 'profile', 'groups'],
  features: {
    devInteractions: { enabled: true },
    rpInitiatedLogout: { enabled: true },
  },
  async findAccount(ctx, id) {
    const extra = (config.accounts || {})[id] || {};
    return {
      accountId: id,
      async claims() {
        return { sub: id, email_verified: true, preferred_username: id, ...extra };
      },
    };
  },
});
provider.on('server_error', (ctx, err) => console.error('server_error', err));

provider.listen(config.port, config.host, () => {
  console.log(`ready ${config.issuer}`);
});
