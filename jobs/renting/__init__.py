"""Renting a host for a job: from a job's spec to a rented instance, exactly once.

- ``terms``: a job (or a spec not yet submitted) in the market's terms: requirements, profile;
- ``shape_history``, ``measures``, ``corrections``: what earlier runs of the job's shape
  measured, and the profile it corrects;
- ``reference``: the reference host a job is priced on before any search (budgets);
- ``image_cache``: which machines already hold a job's image;
- ``interruption_rates``: how often the team's rentals were lost per rented hour;
- ``market``: a client of the team's Vast account, and the one search of its offers;
- ``rent``: the provider call: claim, search, choose (``hosts.selection``), create;
- ``claims``: who holds a rent, so a dead claimer is seen at once;
- ``settle``: a rent adopted by label, a dead claim settled, or given up;
"""
