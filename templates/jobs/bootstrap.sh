{% autoescape off %}#!/usr/bin/env bash
# NomadGPU bootstrap for job {{ attempt.job_id }}, attempt {{ attempt.number }}.
# Installs the agent's two dependencies if missing, fetches the agent, starts it in the background.
set -u
# When the container came up, for the job page's recovery anatomy (the agent reports it).
export NOMAD_CONTAINER_STARTED_AT="$(date +%s)"
export NOMAD_SUPERVISOR_URL='{{ supervisor_url }}'
export NOMAD_AGENT_TOKEN='{{ token }}'
# The working folder of onstart (the sandbox gives each instance its own).
NOMAD_HOME="${NOMAD_HOME:-$PWD/.nomadgpu}"
mkdir -p "$NOMAD_HOME" && cd "$NOMAD_HOME" || exit 1
PY="$(command -v python3 || command -v python)" || { echo "no python3 in this image" >&2; exit 1; }

if ! "$PY" -c 'import httpx, cryptography' 2>/dev/null; then
  "$PY" -m pip install --quiet --disable-pip-version-check {{ dependencies }} \
    || "$PY" -m pip install --quiet --user {{ dependencies }} \
    || { echo "could not install {{ dependencies }}" >&2; exit 1; }
fi
export NOMAD_DEPS_READY_AT="$(date +%s)"

fetch_agent() {
  "$PY" - <<'PYEOF'
import hashlib, os, sys, time, urllib.request
url = os.environ["NOMAD_SUPERVISOR_URL"] + "/api/agent/agent.pyz"
req = urllib.request.Request(url, headers={"Authorization": "Bearer " + os.environ["NOMAD_AGENT_TOKEN"]})
for attempt in range(8):
    try:
        data = urllib.request.urlopen(req, timeout=60).read()
        break
    except Exception as exc:  # the supervisor may be briefly unreachable: retry with backoff
        print(f"agent download failed ({exc}); retrying", file=sys.stderr)
        time.sleep(min(2 ** attempt, 30))
else:
    sys.exit("could not download the agent")
if hashlib.sha256(data).hexdigest() != "{{ agent_sha256 }}":
    sys.exit("downloaded agent does not match the expected sha256")
with open("agent.pyz.tmp", "wb") as out:
    out.write(data)
os.replace("agent.pyz.tmp", "agent.pyz")
PYEOF
}

fetch_agent || exit 1
nohup "$PY" agent.pyz >> agent.log 2>&1 &
echo "nomadgpu agent started (pid $!), log: $NOMAD_HOME/agent.log"
{% endautoescape %}
