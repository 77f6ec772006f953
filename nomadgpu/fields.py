"""A model field whose value is sealed at rest (see ``nomadgpu.crypto``)."""

from __future__ import annotations

from django.db import models

from nomadgpu import crypto


class SecretStr(str):
    """A decrypted secret: a plain str to code, masked in repr() so logs and tracebacks hide it."""

    def __repr__(self) -> str:
        return repr(crypto.mask(str(self)))


class EncryptedTextField(models.TextField):
    """Stores ``crypto.seal(value)``; the column never holds the plaintext. Empty stays empty."""

    def _context(self) -> str:
        return f"{self.model._meta.label_lower}.{self.name}"

    def from_db_value(self, value, expression, connection):
        if not value:
            return SecretStr("")
        return SecretStr(crypto.open_sealed(value, context=self._context()))

    def get_prep_value(self, value):
        value = super().get_prep_value(value)
        if not value:
            return ""
        return crypto.seal(str(value), context=self._context())

    def to_python(self, value):
        return SecretStr(value or "")
