import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kioskauth_testing import KIOSKAUTHD, Daemon  # noqa: E402


def pytest_collection_modifyitems(config, items):
    # The Debian packages' tests come last: in a whole ./scripts/test run their release build runs
    # in the background at idle priority while the other tests run, and they wait for it.
    items.sort(key=lambda item: item.module.__name__ == "test_deb")
    if not KIOSKAUTHD.exists():
        skip = pytest.mark.skip(reason=f"{KIOSKAUTHD} is not built (run swift build first)")
        for item in items:
            if "daemon" in item.fixturenames:
                item.add_marker(skip)


@pytest.fixture
def daemon():
    """A running kioskauthd with fresh directories and a development key."""
    d = Daemon().start()
    yield d
    d.close()


@pytest.fixture
def make_daemon():
    """Factory for daemons with custom configuration; all are stopped at the end."""
    made = []

    def factory(**kwargs):
        d = Daemon(**kwargs)
        made.append(d)
        return d

    yield factory
    for d in made:
        d.close()


@pytest.fixture
def make_fleet():
    """Factory for fleets (tests/fleet_support.py: PostgreSQL and joined terminals); all are
    closed at the end."""
    from fleet_support import Fleet

    made = []

    def factory(drivers, **kwargs):
        fleet = Fleet(drivers, **kwargs)
        made.append(fleet)
        return fleet.start()

    yield factory
    for fleet in made:
        fleet.close()
