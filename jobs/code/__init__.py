"""A job's own code: what it runs besides its image, and the secrets it names.

- ``packs``: code packs stored once by content in the team's storage (upload plan, complete,
  the encrypted PUT, the portal's store), and the local store's guard over their objects.
- ``archives``: an archive uploaded through the portal's form, checked and made into a pack.
- ``git_refs``: a git workdir's ref resolved to a commit with ``git ls-remote``.
- ``submit``: what a job's ``workdir`` column holds, decided at submit.
- ``for_agent``: what an agent is told of its job's code at register.
- ``job_secrets``: the team secrets a job names, and the only places their values go.
"""
