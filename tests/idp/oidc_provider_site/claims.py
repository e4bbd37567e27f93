"""A `groups` scope for django-oidc-provider (its documented OIDC_EXTRA_SCOPE_CLAIMS): the
user's real Django groups; and a subject scheme for its documented OIDC_IDTOKEN_SUB_GENERATOR."""

from oidc_provider.lib.claims import ScopeClaims


class GroupsScopeClaims(ScopeClaims):
    info_groups = ("Groups", "Your group memberships.")

    def scope_groups(self):
        return {"groups": sorted(g.name for g in self.user.groups.all())}


def subject_by_username(user):
    """`sub` = the username (the default is the database id)."""
    return user.get_username()
