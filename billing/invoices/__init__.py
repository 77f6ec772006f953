"""Importing what Vast billed: charges (per contract per UTC day) and payments/credits.

Two ways in, one store:

- ``sync``: the periodic sync (``sync_team``) asks ``GET /api/v0/charges/`` for one UTC day at a
  time, every page, and ``GET /api/v1/invoices/`` for payments (``docs/vast-api.md`` §6);
- ``csv_file``: finance uploads a CSV export in the portal (``import_csv``; columns in
  ``CSV_COLUMNS``), and downloads a period's charges in the same format (``export_rows``);
- ``store``: both write ``Charge`` rows keyed by (team, source, day), so importing the same day
  again, from either way in, replaces the row: re-import is idempotent.

Each day is written in its own transaction together with the sync cursor, so a failure halfway
leaves the finished days in place and the next run resumes at the first unfinished one. A CSV
file is all or nothing.

This module re-exports the public names, so callers keep writing ``invoices.sync_team``.
"""

from __future__ import annotations

from billing.invoices.csv_file import (
    CSV_COLUMNS,
    CSV_MAX_BYTES,
    CsvRejected,
    export_rows,
    import_csv,
    parse_csv,
)
from billing.invoices.store import ChargeRecord, ImportResult, charge_filter, store_charges
from billing.invoices.sync import sync_team

__all__ = [
    "CSV_COLUMNS",
    "CSV_MAX_BYTES",
    "ChargeRecord",
    "CsvRejected",
    "ImportResult",
    "charge_filter",
    "export_rows",
    "import_csv",
    "parse_csv",
    "store_charges",
    "sync_team",
]
