"""What tests share: factories, process and server helpers, and fakes of the services NomadGPU
talks to (Vast's billing, the Hugging Face Hub, Telegram, webhooks). One module per helper; a
test imports what it needs from here, never from another test module.

Rows and the cast:
    factories.py       factory-boy factories for every model row a test builds
    charges.py         Vast's billing rows as the import stores them (``bill``)
    bad_rows.py        rows broken the way a real installation breaks them
Processes and waiting:
    processes.py       a Celery worker, subprocess helpers, ``wait_until`` (plugin)
    waiting.py         waiting for a job: its state, a running attempt, a checkpoint, a loss
    tcp_proxy.py       a TCP forwarder a test can cut and restore
    session_launcher.py  a stand-in for torchrun (a script, run by path)
The whole supervisor:
    supervisor.py      the supervisor against the sandbox (fixtures for e2e/, hf/, the browser)
    toy.py             the toy trainer: its command, shorter runs, reference digests
    instances.py       the sandbox account's instances, now and over a whole test
The market and the sandbox:
    sandbox.py         the sandbox marketplace as a subprocess (plugin)
    market.py          one offer to vary, the shipped market, the field report's job
    bids.py            interruptible rentals on a sandbox over raw HTTP
The agent:
    agent_fake_supervisor.py  the agent API's stand-in the agent's tests run against
    agent_runs.py      an agent's run read back; the module's fake S3 (plugin)
    agent_api.py       the agent API called as an agent calls it
    qlora.py           the tiny QLoRA run the Hugging Face tests share (no torch here)
Storage, code and staged weights:
    s3.py              moto's S3 server and a bucket (plugin)
    workdir.py         code packs and git repositories, made for real
    staging.py         the fake Hub, the storage backends, a staged job (plugin)
    hub_fake.py        the parts of the Hugging Face Hub that staging uses
The CLI, billing and notifications:
    cli.py             the ``nomadgpu`` CLI as a subprocess
    member_api_standin.py  the member API's code-pack endpoints, stood in
    vast_billing_fake.py   Vast's billing endpoints from a fixed ledger (plugin)
    telegram_fake.py   the Telegram Bot API's ``sendMessage``
    webhook_receiver.py    a careful webhook receiver

"(plugin)": listed in ``pytest_plugins`` in tests/conftest.py, its fixtures are everywhere.
"""
