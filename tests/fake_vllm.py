"""A fake vLLM server (a small script the tests start as a real process: /health, /v1/models, chat
streaming, /metrics, and faults on request) for tests of server handling with no vLLM installed."""

import textwrap

import psutil

# Processes a test started (see the ``reaper`` fixture in conftest.py).
Reaper = list[psutil.Process]

# A stand-in for `vllm serve`: parses the --host/--port that VLLMServer appends, then behaves as
# --behaviour says. It records its pid, its engine-core child's pid, argv and env in --state.
FAKE_SERVER = textwrap.dedent('''
    import argparse, json, os, signal, subprocess, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    parser = argparse.ArgumentParser()
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--behaviour", default="ok")
    parser.add_argument("--served", default="fake-model")
    parser.add_argument("--state", required=True)
    parser.add_argument("--healthy-after", type=float, default=0.0)
    parser.add_argument("--api-key", default=None)
    args, unknown = parser.parse_known_args()
    # as vLLM: --api-key, else VLLM_API_KEY; demanded on every path (vLLM demands it under /v1 only), so
    # a test sees each of specgate's calls carry it
    api_key = args.api_key or os.environ.get("VLLM_API_KEY")
    started = time.monotonic()
    restarted = os.path.exists(args.state)  # an earlier start of this test wrote it

    if args.behaviour == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by the child below, across exec

    print(f"fake-vllm: starting, argv={sys.argv[1:]!r}", flush=True)
    child = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(600)"])
    state = {"pid": os.getpid(), "pgid": os.getpgid(0), "child": child.pid, "argv": sys.argv[1:],
             "unknown": unknown, "env_mark": os.environ.get("FAKE_MARK")}
    with open(args.state + ".tmp", "w") as handle:
        json.dump(state, handle)
    os.replace(args.state + ".tmp", args.state)

    if args.behaviour == "exit3" or (args.behaviour == "exit3-when-restarted" and restarted):
        for i in range(5):
            print(f"fake-vllm: loading shard {i}", flush=True)
        print("fake-vllm: RuntimeError: CUDA out of memory (pretend)", flush=True)
        sys.exit(3)

    sleep_state = {"sleeping": False}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *a):
            print("fake-vllm: " + fmt % a, flush=True)

        def _json(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _refused(self):
            if api_key and self.headers.get("Authorization") != f"Bearer {api_key}":
                self._json(401, {"error": "Unauthorized"})
                return True
            return False

        def do_GET(self):
            if self._refused():
                return
            healthy = args.behaviour != "never-healthy" and time.monotonic() - started >= args.healthy_after
            if self.path == "/health":
                self._json(200 if healthy else 503, {})
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": args.served, "object": "model"}]})
            elif self.path == "/is_sleeping":  # sleep mode, as VLLM_SERVER_DEV_MODE=1 exposes it
                self._json(200, {"is_sleeping": sleep_state["sleeping"]})
            else:
                self._json(404, {"error": self.path})

        def do_POST(self):
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length)) if length else {}
            if self._refused():
                return
            if self.path.split("?")[0] in ("/sleep", "/wake_up"):
                sleep_state["sleeping"] = self.path.startswith("/sleep")
                self._json(200, {})
                return
            if args.behaviour in ("hang-generation", "engine-error"):
                if args.behaviour == "engine-error":  # as vLLM 0.26 logged it with pipeline parallel 2
                    print("(Worker_PP0 pid=8000) ERROR 11-30 11:30:22 [multiproc_executor.py:1007] "
                          "WorkerProc hit an exception.", flush=True)
                    print("AttributeError: 'GPUModelRunner' object has no attribute 'drafter'", flush=True)
                time.sleep(600)  # the engine is hung: the request never completes
            if self.path == "/v1/chat/completions" and body.get("model") == args.served:
                print(f"fake-vllm: generation for {body['model']}", flush=True)
                self._json(200, {"choices": [{"message": {"role": "assistant", "content": "Hello"}}]})
            else:
                self._json(404, {"error": f"no model {body.get('model')!r}"})

    httpd = ThreadingHTTPServer((args.host, args.port), Handler)  # "Address already in use" if taken
    print(f"fake-vllm: listening on {args.host}:{args.port}", flush=True)
    httpd.serve_forever()
''')
