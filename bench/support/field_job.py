"""The field report's job as the recovery bench runs it: download the model, load it, train.

Run by the agent as the job's command inside a sandbox instance. It downloads FIELD_MODEL_BYTES
(the 15 GB model times the bench's byte scale; 0 when the agent staged the model into the
Hugging Face cache before setup, measure 1) from the sandbox's metered, throttled
``/sandbox/download`` (through the instance's proxy, as the Hugging Face client would go), waits
FIELD_LOAD_S (loading the weights onto the GPU, at the bench's time scale), writes when each
ended to ``$SANDBOX_DIR/field_phases.json`` (Unix seconds; the bench reads it from the scratch
folder) and becomes the toy trainer (``examples/toy/train.py``: steps, checkpoints, resume).
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path

TOY = Path(__file__).resolve().parents[2] / "examples" / "toy" / "train.py"


def download_model(nbytes: int) -> None:
    base, me = os.environ["SANDBOX_URL"], os.environ["SANDBOX_INSTANCE_ID"]
    url = f"{base}/sandbox/download/{me}?bytes={nbytes}"  # http: the sandbox, local
    with urllib.request.urlopen(url) as reply:  # noqa: S310
        while reply.read(1 << 20):
            pass


def main() -> None:
    started = time.time()
    download_model(int(os.environ["FIELD_MODEL_BYTES"]))
    downloaded = time.time()
    time.sleep(float(os.environ["FIELD_LOAD_S"]))
    marks = {"command": started, "model_downloaded": downloaded, "loaded": time.time()}
    Path(os.environ["SANDBOX_DIR"], "field_phases.json").write_text(json.dumps(marks))
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, str(TOY)])  # noqa: S606 (the toy, by path)


if __name__ == "__main__":
    main()
