"""A `groups` scope for django-oidc-provider (its documented OIDC_EXTRA_SCOPE_CLAIMS): the
user's real Django groups."""

from oidc_provider.lib.claims import ScopeClaims


class GroupsScopeClaims(ScopeClaims):
    info_groups = ("Groups", "Your group memberships.")

    def scope_groups(self):
        return {"groups": sorted(g.name for g in self.user.groups.all())}
