# Budgets, charges and reconciliation arrive with the spending-limits and invoices issues.
