"""Django settings both unmodified providers share (plain Django, nothing OAuth-specific)."""

import os


def common_settings(*, installed_app: str, urls: str) -> dict:
    state_dir = os.environ["KIOSKAUTH_IDP_STATE_DIR"]
    return {
        "DEBUG": False,
        "SECRET_KEY": os.environ["KIOSKAUTH_IDP_SECRET_KEY"],
        "ALLOWED_HOSTS": ["127.0.0.1", "localhost"],
        "ROOT_URLCONF": urls,
        "INSTALLED_APPS": [
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            installed_app,
        ],
        "MIDDLEWARE": [],
        "DATABASES": {
            "default": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": os.path.join(state_dir, "idp.sqlite3"),
                "OPTIONS": {"timeout": 20},
            }
        },
        "DEFAULT_AUTO_FIELD": "django.db.models.BigAutoField",
        "USE_TZ": True,
        # Django's documented advice for test suites: a fast hasher.
        "PASSWORD_HASHERS": ["django.contrib.auth.hashers.MD5PasswordHasher"],
        "LOGGING_CONFIG": None,
        "TEMPLATES": [{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True}],
    }
