"""A stand-in for `vllm serve` in launcher tests: takes the same command line, answers
`GET /health`, and misbehaves on request (environment variables):

- FAKE_VLLM_EXIT=CODE: print a vLLM-like error and exit with CODE before listening
- FAKE_VLLM_DELAY=S: wait S seconds before listening (a slow model load)
- FAKE_VLLM_IGNORE_SIGTERM=1: ignore SIGTERM (so only SIGKILL stops it)
- FAKE_VLLM_RECORD=FILE: write {"argv", "cuda_visible_devices", "lora_updating"} as JSON
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import signal
import sys
import time


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("subcommand", choices=["serve"])
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args, unknown = parser.parse_known_args()
    record = os.environ.get("FAKE_VLLM_RECORD")
    if record:
        with open(record, "w") as f:
            json.dump(
                {
                    "argv": sys.argv[1:],
                    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                    "lora_updating": os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING"),
                },
                f,
            )
    print(f"INFO starting fake vLLM for {args.model} with {len(unknown)} extra args", flush=True)
    if os.environ.get("FAKE_VLLM_IGNORE_SIGTERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.environ.get("FAKE_VLLM_EXIT"):
        print("ERROR torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
        sys.exit(int(os.environ["FAKE_VLLM_EXIT"]))
    time.sleep(float(os.environ.get("FAKE_VLLM_DELAY", "0")))
    server = http.server.HTTPServer((args.host, args.port), Health)
    print(f"INFO Uvicorn running on http://{args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
