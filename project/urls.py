from django.contrib import admin
from django.urls import include, path

from project.views import index

urlpatterns = [
    path("", index, name="index"),
    path("admin/", admin.site.urls),
    path("", include("composition.urls")),
    path("", include("billing.urls")),
]
