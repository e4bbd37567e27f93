from django.urls import include, path

urlpatterns = [path("", include("oauth2_provider.urls"))]
