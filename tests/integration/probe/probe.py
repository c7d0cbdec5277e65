"""Probe that stands in for every srl component in Slurm placement tests (installed as python, srl, torchrun and
vllm-router on PATH). It records where it runs and what it was given, then behaves like its role:

- inference engines and the router serve ``GET /health`` on their planned host and port until terminated, and end
  with status 0 on SIGTERM, an engine on SIGINT too, as vLLM's server and vllm-router shut down (the trainer and
  orchestrator probes exit 143 on SIGTERM); an engine started again in the same attempt (a restart: its record
  exists already) first waits ``probe/engine_restart_delay_s`` seconds (default 0), so a test can tell a health
  check from none;
- the orchestrator waits for the stop request, then exits 0;
- the trainer exits 0 after ``probe/trainer_seconds`` seconds (default 4); when a stop request appears first it
  writes ``checkpoints/step_1/COMPLETE`` (the checkpoint marker) and exits 0.

Records: ``<run>/probe/<process>@<SLURMD_NODENAME>#<SLURM_RESTART_COUNT>.json``.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

run = Path(os.environ["SRL_RUN_DIR"])
name = os.environ.get("SRL_PROCESS", "unknown")
role = os.environ.get("SRL_ROLE", "unknown")
node = os.environ.get("SLURMD_NODENAME", "none")
restart = os.environ.get("SLURM_RESTART_COUNT", "0")
rec = {
    "process": name,
    "role": role,
    "node": node,
    "node_index": os.environ.get("SRL_NODE_INDEX"),
    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "argv": [os.path.basename(sys.argv[0])] + sys.argv[1:],
    "env": {
        k: v
        for k, v in os.environ.items()
        if k.startswith(("SRL_", "MASTER_", "VLLM_", "TRITON_"))
        or k in ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "SLURM_PROCID", "TORCHINDUCTOR_CACHE_DIR", "EVIL")
    },
    "pid": os.getpid(),
}
out = run / "probe"
out.mkdir(exist_ok=True)
tmp = out / f".{name}@{node}#{restart}.json.tmp"
tmp.write_text(json.dumps(rec, indent=1))
restarted = (out / f"{name}@{node}#{restart}.json").exists()
tmp.rename(out / f"{name}@{node}#{restart}.json")
print(f"probe {name} ({role}) on {node}, restart {restart}", flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0 if role in ("inference", "router") else 143))
if role == "inference":
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
stop = run / "control" / "STOP"
if role in ("inference", "router"):
    # Serve /health on the planned host and port, like an engine or the router once ready.
    import http.server

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    delay = out / "engine_restart_delay_s"
    if restarted and role == "inference" and delay.exists():
        time.sleep(float(delay.read_text()))
    host = sys.argv[sys.argv.index("--host") + 1]
    port = int(sys.argv[sys.argv.index("--port") + 1])
    http.server.ThreadingHTTPServer((host, port), Health).serve_forever()
if role == "orchestrator":
    while not stop.exists():
        time.sleep(0.2)
    sys.exit(0)
limit_file = out / "trainer_seconds"
limit = float(limit_file.read_text()) if limit_file.exists() else 4.0
t0 = time.monotonic()
while time.monotonic() - t0 < limit:
    if stop.exists():
        ck = run / "checkpoints" / "step_1"
        ck.mkdir(parents=True, exist_ok=True)
        (ck / "COMPLETE").write_text("")
        sys.exit(0)
    time.sleep(0.2)
sys.exit(0)
