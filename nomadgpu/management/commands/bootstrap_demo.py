from __future__ import annotations

from django.core.management.base import BaseCommand

from nomadgpu.services import DemoUser, ensure_demo_team

ROLE_WORDS = {"admin": "team admin and superuser", "member": "member", "finance": "finance"}


class Command(BaseCommand):
    help = (
        "Create the demo team with one user per role (admin, member, finance); each password "
        "is printed once, when its user is created."
    )

    def handle(self, *args, **options) -> None:
        team, users = ensure_demo_team()
        created = [u for u in users if u.password]
        if not created:
            names = ", ".join(u.username for u in users)
            self.stdout.write(f"Team '{team.name}' and users {names} already exist.")
            return
        lines = [f"Team '{team.name}': sign in as any of these to try each role (shown once):"]
        lines += [self.user_line(u) for u in created]
        lines.append(
            "  (change a password in the admin, or run: python manage.py changepassword NAME)"
        )
        self.stdout.write(self.style.SUCCESS("\n".join(lines)))

    @staticmethod
    def user_line(user: DemoUser) -> str:
        role = f"({ROLE_WORDS.get(user.role, user.role)})"
        return f"  {user.username:<8} {role:<28} password: {user.password}"
