from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the development superuser admin/admin when no superuser exists (example project only)."

    def handle(self, *args: Any, **options: Any) -> None:
        user_model = get_user_model()
        if not user_model.objects.filter(is_superuser=True).exists():
            user_model.objects.create_superuser("admin", "admin@example.invalid", "admin")
            self.stdout.write("created superuser admin / admin")
