"""Renting a host for a job: from a job's spec to a rented instance, exactly once.

- ``terms``: a job (or a spec not yet submitted) in the market's terms: requirements, profile;
- ``shape_history``, ``measures``, ``corrections``: what earlier runs of the job's shape
  measured, and the profile it corrects;
- ``reference``: the reference host a job is priced on before any search (budgets);
- ``image_cache``: which machines already hold a job's image;
- ``interruption_rates``: how often the team's rentals were lost per rented hour;
- ``market``: a client of the team's Vast account, and the one search of its offers;
- ``rent``: the provider call: claim, search, choose (``hosts.selection``), create;
- ``race``, ``race_start``, ``race_end``: hedged rents: how many instances at once, creating
  the racers, the first to register kept and the rest destroyed;
- ``offer_claims``: one offer is never bought twice (a claim before every create);
- ``creates``: what one create rents, and what is said when it does not;
- ``claims``: who holds a rent, so a dead claimer is seen at once;
- ``settle``: a rent adopted by label, a dead claim settled, or given up;
"""
