"""A fake `vllm serve` for the default suite: the routes and JSON shapes of vLLM 0.32 that the
vllm-server engine uses (vllm/entrypoints/openai/completion/protocol.py, serve/lora/api_router.py,
rl/online/api_router.py), generating by a deterministic rule instead of a model.

The weight-transfer routes (rl/online/) keep vLLM's rules: `/start_weight_update` needs
`/init_weight_transfer_engine` before it and no update in progress, `/update_weights` and
`/finish_weight_update` need one in progress, the version named at finish becomes the served
one; a completion while `/pause`d (never `/resume`d) is refused, so a push that forgets to resume
fails the test. `GET /get_world_size` answers `world_size` (its workers).

A server can be told to answer a route wrongly (`answer_wrongly(fault, route, after, times)`):
each fault of FAULTS, from the `after`+1-th request of that route on, `times` times (None: every
later one); tests/test_rollout_checks.py drives the trainer into each.

Stop strings (a tool turn's pause) are honoured as vLLM does with `include_stop_str_in_output`
where the server is given the faked model's tokenizer's `decode`: the response ends at the token
whose text completes the first string, kept, `stop_reason` naming the string.

A response's tokens depend on the prompt, the request's seed and the adapter it names (its
folder's adapter_model.safetensors bytes), so a test can tell which adapter sampled it; a request
naming a model that is neither the base nor a loaded adapter is refused with vLLM's 404. Every
request is recorded. Run in a thread (`FakeVLLMServer().start()`) or as a process
(`python -m tests.fake_vllm_server PORT`).
"""

from __future__ import annotations

import hashlib
import json
import socket
import struct
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

BASE = "base-model"
TRANSFER_ROUTES = ("/pause", "/resume", "/init_weight_transfer_engine", "/start_weight_update", "/update_weights",
                   "/finish_weight_update")
VOCAB = 53  # the tiny tokenizer's


def rule_tokens(prompt: list[int], seed: int, salt: int, body: dict) -> tuple[list[int], list[float], str]:
    """The response to one request: token i = (31 * sum(prompt) + 7 * seed + 13 * i + salt) mod VOCAB,
    stopping after a stop id (not before min_tokens), log-prob -(1 + token mod 5) / 10."""
    tokens, logprobs, finish, _ = rule_completion(prompt, seed, salt, body)
    return tokens, logprobs, finish


def rule_completion(prompt: list[int], seed: int, salt: int, body: dict,
                    decode: Callable[[list[int]], str] | None = None) -> tuple[list[int], list[float], str, object]:
    """rule_tokens' tokens, log-probs and finish_reason, and vLLM's stop_reason: the stop id that
    ended it, or the first of the body's `stop` strings its text (`decode` of the tokens so far,
    after each token) holds, which ends it at the token that completed it, the string kept
    (include_stop_str_in_output, the only way meds asks); None where it ran to max_tokens."""
    tokens, stop_ids, stop_strings = [], set(body.get("stop_token_ids") or []), body.get("stop") or []
    if stop_strings and (decode is None or not body.get("include_stop_str_in_output")):
        raise ValueError("the fake honours stop strings with a tokenizer's decode and include_stop_str_in_output")
    for i in range(int(body.get("max_tokens", 16))):
        token = (31 * sum(prompt) + 7 * seed + 13 * i + salt) % VOCAB
        if token in stop_ids and i < int(body.get("min_tokens", 0)):
            token = (token + 1) % VOCAB
        tokens.append(token)
        if token in stop_ids:
            return tokens, [-(1 + t % 5) / 10 for t in tokens], "stop", token
        text = decode(tokens) if stop_strings else ""
        found = [(text.find(s), s) for s in stop_strings if s in text]
        if found:
            return tokens, [-(1 + t % 5) / 10 for t in tokens], "stop", min(found)[1]
    return tokens, [-(1 + t % 5) / 10 for t in tokens], "length", None


def _first_choice(answer: dict) -> dict:
    return answer["choices"][0]


def _set_logprob(value: float):
    def tamper(answer: dict) -> None:
        _first_choice(answer)["logprobs"]["token_logprobs"][0] = value
    return tamper


def _set_token(value: int):
    def tamper(answer: dict) -> None:
        _first_choice(answer)["token_ids"][0] = value
    return tamper


def _too_many_tokens(answer: dict) -> None:
    choice = _first_choice(answer)
    choice["token_ids"] = [3] * 40
    choice["logprobs"]["token_logprobs"] = [-0.5] * 40
    choice["finish_reason"] = "length"


# What a completion's JSON answer gets wrong (a 200 with vLLM's shape otherwise).
TAMPERS = {
    "nan_logprob": _set_logprob(float("nan")),  # json.dumps writes NaN, as a server could
    "inf_logprob": _set_logprob(float("inf")),
    "positive_logprob": _set_logprob(0.7),
    "out_of_vocab_id": _set_token(10**6),
    "negative_id": _set_token(-1),
    "too_many_tokens": _too_many_tokens,
    "logprob_count": lambda a: _first_choice(a)["logprobs"]["token_logprobs"].append(-0.5),
    "empty_choices": lambda a: a.update(choices=[]),
    "no_token_ids": lambda a: _first_choice(a).pop("token_ids"),
}
# What goes wrong below the JSON, on any route.
RAW_FAULTS = ("non_json", "cut_off", "trickle", "reset")
FAULTS = (*TAMPERS, *RAW_FAULTS)


class _Listening(ThreadingHTTPServer):
    # uvicorn's backlog, near enough: several training processes open 32 connections each at once,
    # beyond http.server's 5 (the rest would be reset)
    request_queue_size = 1024

    def handle_error(self, request, client_address):  # a connection the fake reset or cut on purpose: quiet
        pass


class FakeVLLMServer:
    def __init__(self, port: int = 0, delay_s: float = 0.0, world_size: int = 1,
                 decode: Callable[[list[int]], str] | None = None):
        # `decode`: the faked model's tokenizer's, to honour stop strings (a request with `stop` and
        # none is refused with a 400)
        self.decode = decode
        self.adapters: dict[str, tuple[str, int]] = {}  # name -> (path, salt)
        self.weight_version: str | None = None
        self.world_size = world_size
        self.transfer_ready = self.updating = self.paused = False
        self.completions: list[dict] = []  # every /v1/completions body
        self.calls: list[tuple[str, dict]] = []  # (route, body) of every other POST
        self.routes: list[str] = []  # every POST's route, completions too, in the order they came
        self.delay_s = delay_s
        self.lock = threading.Lock()
        self.faults: dict[str, list] = {}  # route -> [fault, requests still answered right, faulty answers left]
        self.faulty_answers = 0
        self.stopping = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):  # noqa: N802 - http.server's name
                if self.path == "/health":
                    return self._send(200, None)
                if self.path == "/weight_info":
                    return self._send(200, {"weight_version": fake.weight_version})
                if self.path.split("?")[0] == "/get_world_size":
                    return self._send(200, {"world_size": fake.world_size})
                return self._send(404, {"detail": "Not Found"})

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                status, answer = fake.handle(self.path, body)
                fault = fake.fault_for(self.path)
                if fault in TAMPERS and status == 200 and isinstance(answer, dict):
                    TAMPERS[fault](answer)
                if fault in RAW_FAULTS:
                    return self._send_wrongly(fault, status, answer)
                self._send(status, answer)

            def _payload(self, answer) -> bytes:
                return b"" if answer is None else (answer.encode() if isinstance(answer, str)
                                                   else json.dumps(answer).encode())

            def _send(self, status: int, answer):
                data = self._payload(answer)
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _send_wrongly(self, fault: str, status: int, answer) -> None:
                self.close_connection = True
                if fault == "non_json":
                    return self._send(200, "<html><body>502 Bad Gateway (a proxy's page)</body></html>")
                if fault == "reset":  # close with a TCP reset, before any answer
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                    return None
                data = self._payload(answer)
                head = (f"HTTP/1.1 {status} OK\r\nContent-Length: {len(data) + (50 if fault == 'cut_off' else 0)}"
                        f"\r\n\r\n").encode()
                if fault == "cut_off":  # 50 bytes fewer than the header promised, then the connection closes
                    self.wfile.write(head + data)
                    return None
                for byte in head + data:  # trickle: one byte a second, the status line too
                    if fake.stopping.wait(1.0):
                        return None
                    try:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                    except OSError:  # the client gave up
                        return None
                return None

        self.httpd = _Listening(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread: threading.Thread | None = None

    # ------------------------------------------------------------ answering wrongly

    def answer_wrongly(self, fault: str, route: str = "/v1/completions", after: int = 0,
                       times: int | None = None) -> "FakeVLLMServer":
        """Answer `route` with `fault` (FAULTS) after `after` right answers, `times` times (None: always)."""
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
        self.faults[route] = [fault, after, times]
        return self

    def fault_for(self, route: str) -> str | None:
        """The fault this request of `route` gets, counted, or None."""
        with self.lock:
            plan = self.faults.get(route)
            if plan is None:
                return None
            if plan[1] > 0:
                plan[1] -= 1
                return None
            if plan[2] is not None:
                if plan[2] <= 0:
                    return None
                plan[2] -= 1
            self.faulty_answers += 1
            return plan[0]

    # ------------------------------------------------------------ routes

    def handle(self, route: str, body: dict):
        with self.lock:
            self.routes.append(route)
            if route != "/v1/completions":
                self.calls.append((route, body))
            if route == "/v1/load_lora_adapter":
                name, path = body.get("lora_name"), body.get("lora_path")
                if name in self.adapters and not body.get("load_inplace"):
                    return _error(400, f"The lora adapter '{name}' has already been loaded.", "InvalidUserInput")
                weights = Path(path) / "adapter_model.safetensors"
                if not weights.is_file() or not (Path(path) / "adapter_config.json").is_file():
                    return _error(404, f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError")
                salt = int(hashlib.sha256(weights.read_bytes()).hexdigest(), 16) % VOCAB
                self.adapters[name] = (path, salt)
                return 200, f"Success: LoRA adapter '{name}' added successfully."
            if route == "/v1/unload_lora_adapter":
                name = body.get("lora_name")
                if name not in self.adapters:
                    return _error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
                del self.adapters[name]
                return 200, f"Success: LoRA adapter '{name}' removed successfully."
            if route == "/update_weight_version":
                self.weight_version = body["new_version"]
                return 200, {"success": True, "new_version": body["new_version"]}
            if route.split("?")[0] in TRANSFER_ROUTES:
                return self._transfer(route.split("?")[0], body)
            if route != "/v1/completions":
                return 404, {"detail": "Not Found"}
            self.completions.append(body)
            if self.paused:
                return _error(503, "generation is paused (the fake: /resume was never called)", "ServiceUnavailable")
            model = body.get("model") or BASE
            if model != BASE and model not in self.adapters:
                return _error(404, f"The model `{model}` does not exist.", "NotFoundError")
            salt = 0 if model == BASE else self.adapters[model][1]
        if self.delay_s:
            threading.Event().wait(self.delay_s)
        try:
            tokens, logprobs, finish, stop_reason = rule_completion(body["prompt"], int(body.get("seed") or 0), salt,
                                                                    body, self.decode)
        except ValueError as error:
            return _error(400, str(error), "BadRequestError")
        want_logprobs = body.get("logprobs") is not None
        choice = {"index": 0, "text": "", "finish_reason": finish, "stop_reason": stop_reason,
                  "logprobs": {"text_offset": [], "token_logprobs": logprobs,
                               "tokens": [f"token_id:{t}" for t in tokens], "top_logprobs": []}
                  if want_logprobs else None,
                  "token_ids": tokens if body.get("return_token_ids") else None, "prompt_token_ids": None}
        return 200, {"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": model, "choices": [choice],
                     "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(tokens),
                               "total_tokens": len(body["prompt"]) + len(tokens)}}

    def _transfer(self, route: str, body: dict):
        """vLLM's weight-transfer and pause routes (the module docstring), under the lock."""
        if route in ("/pause", "/resume"):
            self.paused = route == "/pause"
            return 200, {"status": "paused" if self.paused else "resumed"}
        if route == "/init_weight_transfer_engine":
            self.transfer_ready = True
            return 200, {"message": "Weight transfer initialized"}
        if not self.transfer_ready:
            return 500, {"error": "Weight transfer not initialized: call /init_weight_transfer_engine first"}
        if route == "/start_weight_update":
            if self.updating:
                return 500, {"error": "start_weight_update called while a weight update is already active"}
            self.updating = True
            return 200, {"message": "Weight update started"}
        if not self.updating:
            return 500, {"error": f"{route} needs start_weight_update before it"}
        if route == "/finish_weight_update":
            self.updating = False
            if body.get("weight_version") is not None:
                self.weight_version = body["weight_version"]
            return 200, {"message": "Weight update finished"}
        return 200, {"message": "Weights updated"}

    # ------------------------------------------------------------ life

    def start(self) -> "FakeVLLMServer":
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        """As a server that died: nobody answers on its port any more."""
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def _error(code: int, message: str, kind: str):
    """vLLM's ErrorResponse."""
    return code, {"error": {"message": message, "type": kind, "param": None, "code": code}}


if __name__ == "__main__":
    server = FakeVLLMServer(int(sys.argv[1]))
    print(f"fake vLLM server on {server.url}", flush=True)
    server.httpd.serve_forever()
