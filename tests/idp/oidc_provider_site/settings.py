"""django-oidc-provider configured through its documented OIDC_* settings only.

The password grant is on (OIDC_GRANT_TYPE_PASSWORD_ENABLE); ID tokens carry the standard
claims of the granted scopes (OIDC_IDTOKEN_INCLUDE_CLAIMS off: the email then comes from
userinfo, which reads the Django user's stored email); OIDC_EXTRA_SCOPE_CLAIMS adds a `groups`
scope whose claim is the user's real Django groups (claims.py). `--sub-generator` sets the
documented OIDC_IDTOKEN_SUB_GENERATOR (claims.subject_by_username: the administrator switches
`sub` from the database id to the username).
"""

import os

from tests_idp_common import common_settings

globals().update(common_settings(installed_app="oidc_provider", urls="oidc_provider_site.urls"))

OIDC_GRANT_TYPE_PASSWORD_ENABLE = True
OIDC_TOKEN_EXPIRE = int(os.environ["KIOSKAUTH_IDP_ACCESS_SECONDS"])
OIDC_IDTOKEN_EXPIRE = int(os.environ["KIOSKAUTH_IDP_ACCESS_SECONDS"])
OIDC_IDTOKEN_INCLUDE_CLAIMS = os.environ.get("KIOSKAUTH_IDP_IDTOKEN_CLAIMS") == "1"
OIDC_EXTRA_SCOPE_CLAIMS = "oidc_provider_site.claims.GroupsScopeClaims"
LOGIN_URL = "/accounts/login/"
if os.environ.get("KIOSKAUTH_IDP_SUB_GENERATOR"):
    OIDC_IDTOKEN_SUB_GENERATOR = os.environ["KIOSKAUTH_IDP_SUB_GENERATOR"]
