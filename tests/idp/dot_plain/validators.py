"""DOT's documented way to add OIDC claims (OAUTH2_VALIDATOR_CLASS + get_additional_claims):
the user's real Django groups, and nothing else."""

from oauth2_provider.oauth2_validators import OAuth2Validator


class GroupsValidator(OAuth2Validator):
    oidc_claim_scope = {**OAuth2Validator.oidc_claim_scope, "groups": "groups"}

    def get_additional_claims(self, request):
        return {"groups": sorted(g.name for g in request.user.groups.all())}
