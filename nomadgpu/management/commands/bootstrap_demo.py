from django.core.management.base import BaseCommand

from nomadgpu.services import ensure_demo_team


class Command(BaseCommand):
    help = "Create the demo team and an admin user (the password is printed once, on creation)."

    def handle(self, *args, **options) -> None:
        team, password = ensure_demo_team()
        if password:
            self.stdout.write(
                self.style.SUCCESS(
                    f"Created team '{team.name}' and user 'admin' with password: {password}\n"
                    "  (shown once; change it in the admin, or run: "
                    "python manage.py changepassword admin)"
                )
            )
        else:
            self.stdout.write(f"Team '{team.name}' and user 'admin' already exist.")
