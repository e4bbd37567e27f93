"""django-oauth-toolkit as its documentation configures an OpenID Connect provider.

Only documented settings: OIDC on with an RS256 key, the scopes `openid` and `email`, refresh
token rotation with reuse protection, token lifetimes. Nothing adds claims or tokens, except
that with KIOSKAUTH_IDP_PUBLISH_GROUPS=1 the documented `OAUTH2_VALIDATOR_CLASS` hook
(`get_additional_claims`, see validators.py) publishes the user's real Django groups.
The runner (tests/idp/plain_server.py) sets the environment before Django reads this module.
"""

import os

from tests_idp_common import common_settings

globals().update(common_settings(installed_app="oauth2_provider", urls="dot_plain.urls"))

_access = int(os.environ["KIOSKAUTH_IDP_ACCESS_SECONDS"])
_refresh = int(os.environ["KIOSKAUTH_IDP_REFRESH_SECONDS"])

OAUTH2_PROVIDER = {
    "OIDC_ENABLED": True,
    "OIDC_RSA_PRIVATE_KEY": os.environ["KIOSKAUTH_IDP_RSA_PRIVATE_KEY"],
    "SCOPES": {"openid": "OpenID Connect scope", "email": "Email address"},
    "DEFAULT_SCOPES": ["openid"],
    "ACCESS_TOKEN_EXPIRE_SECONDS": _access,
    # DOT counts the refresh token's lifetime from the access token's expiry.
    "REFRESH_TOKEN_EXPIRE_SECONDS": max(_refresh - _access, 1),
    "ROTATE_REFRESH_TOKEN": True,
    "REFRESH_TOKEN_REUSE_PROTECTION": True,
}
if os.environ.get("KIOSKAUTH_IDP_PUBLISH_GROUPS") == "1":
    OAUTH2_PROVIDER["OAUTH2_VALIDATOR_CLASS"] = "dot_plain.validators.GroupsValidator"
    OAUTH2_PROVIDER["SCOPES"]["groups"] = "Group membership"
