from django.urls import include, path

urlpatterns = [path("", include("oidc_provider.urls", namespace="oidc_provider"))]
