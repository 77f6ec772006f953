"""``nomadgpu``: the member API from a terminal (argparse + httpx, no Django).

A distribution of its own (``pip install .`` from a checkout installs this package, httpx
and pathspec, nothing of the server): it imports only the standard library, httpx and pathspec
(the ``.gitignore`` rules of a code pack, ``pack.py``).

    nomadgpu submit job.toml|--template NAME [--team T] [--follow]
    nomadgpu status [JOB]
    nomadgpu logs JOB [-f]
    nomadgpu cancel JOB
    nomadgpu drill JOB [--times N]
    nomadgpu secret set NAME | list | delete NAME [--team T]   (team admins)

Configuration: ``--url``/``NOMADGPU_URL`` (the portal, default http://127.0.0.1:8000),
``--token``/``NOMADGPU_TOKEN`` (a personal API token from /account/tokens/) and
``NOMADGPU_WORKDIR_MAX_MB`` (the biggest code pack it uploads, default 200 as the server's).

Exit codes: 0 done (with ``--follow``: the job succeeded); 1 the followed job failed, was
cancelled or paused for budget (or a drill did not recover); 2 bad usage, an unreadable job file
or workdir (or one over the cap, or with a link out of it), or the server refused the request
(validation, not found, conflict, forbidden); 3 the token was not accepted; 4 the server could
not be reached or failed.

One command group per file: ``cli`` (the arguments and ``main``), ``submit`` (a job file or
template) with ``workdir`` (its code packed and uploaded) and ``pack`` (the packing),
``follow`` (events and progress until the job stops), ``jobs`` (``status``, ``cancel``),
``logs``, ``drill``, ``secrets`` (``secret set|list|delete``); beneath them ``api`` (the
member API over httpx), ``render`` (durations, money, the progress bar) and ``errors``
(``CliError`` and the exit codes).
"""
