"""Cost of the real network transport: ``splitinfer serve`` on loopback against the in-process link.

Both links run the same frame codec, so the difference between their
per-step times is what the WebSocket path adds: socket send/receive, the
websockets framing, the hop into the server's event loop and its compute
thread, and back. Measured per single-token decode step (median over steps
and repeats, the two links interleaved so machine noise hits both), as the
whole step's difference (``overhead_ms``, which also absorbs any difference in
compute speed between the two processes) and as the transport share alone
(``transport_ms``: round trip minus the server-reported body and codec time,
plus the extra codec time):

- at the given model's hidden size (576 for the default model, real compute);
- on synthetic bodies at other hidden sizes (default 576 and 4096): Llama
  configs whose attention and MLP are only 8/16 wide, so compute is
  negligible and the figure isolates frame size x transport;

and aggregate throughput against the number of concurrent sessions
(1, 2, 4, 8 clients, each with its own connection, in threads of this process).
The server is a separate process (``python -m splitinfer.cli serve``) with
``OMP_NUM_THREADS`` threads; on a small shared machine client and server
compete for the same cores, which inflates the concurrency figures.
"""

from __future__ import annotations

import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from splitinfer.client import SplitModel
from splitinfer.errors import SplitInferError
from splitinfer.models import LoadedModel, load_model, tiny_tokenizer
from splitinfer.partition import SplitConfig
from splitinfer.ws_link import WebSocketLink

log = logging.getLogger(__name__)

PROMPT = "Explain in a few sentences why the sky is blue."


def synthetic_model_dir(hidden: int, out: Path) -> Path:
    """A 3-layer Llama with hidden size ``hidden`` and 8-wide attention / 16-wide MLP, saved under ``out``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tiny_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=16, num_hidden_layers=3,
                      num_attention_heads=1, num_key_value_heads=1, head_dim=8, max_position_embeddings=2048,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    path = out / f"synthetic-{hidden}"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


class ServerProcess:
    """``splitinfer serve`` in a subprocess on 127.0.0.1 with a free port."""

    def __init__(self, model: str, split: str, threads: int = 1, extra: tuple[str, ...] = ()):
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
        cmd = [sys.executable, "-m", "splitinfer.cli", "serve", "--model", model, "--split", split,
               "--port", "0", *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
        line = self.proc.stdout.readline()  # blocks until ready (or the process dies: empty line)
        if not line.startswith("listening on "):
            self.stop()
            raise SplitInferError(f"the benchmark server did not start (model {model!r}); run the command by hand: "
                                  f"{' '.join(cmd)}")
        self.url = line.split()[-1]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _decode_steps(sm: SplitModel, prompt_ids: list[int], n: int):
    return sm.generate(prompt_ids, n, stop_on_eos=False).steps[1:]  # drop the prefill step


def step_overhead(loaded: LoadedModel, split: SplitConfig, url: str, n_tokens: int, repeats: int, wire: str) -> dict:
    """Median per-step time of the in-process link and of the WebSocket link, interleaved."""
    local = SplitModel(loaded, split, wire_dtype=wire)
    remote = SplitModel(loaded, split, cloud=WebSocketLink(url), wire_dtype=wire)
    prompt_ids = local.encode_prompt(PROMPT)
    for sm in (local, remote):
        _decode_steps(sm, prompt_ids, 4)  # warm-up
    steps = {"inproc": [], "ws": []}
    for _ in range(repeats):
        steps["inproc"] += _decode_steps(local, prompt_ids, n_tokens)
        steps["ws"] += _decode_steps(remote, prompt_ids, n_tokens)
    remote.close()

    def med(kind, attr):
        return statistics.median(getattr(s, attr) for s in steps[kind])

    row = {"hidden_size": loaded.hidden_size, "model": loaded.spec, "steps": len(steps["ws"]),
           "bytes_per_step": med("ws", "bytes_up") + med("ws", "bytes_down")}
    for kind in steps:
        row[f"{kind}_step_ms"] = med(kind, "total_ms")
        row[f"{kind}_codec_ms"] = med(kind, "codec_ms")
        row[f"{kind}_network_ms"] = med(kind, "network_ms")
        row[f"{kind}_body_ms"] = med(kind, "body_ms")
    row["overhead_ms"] = row["ws_step_ms"] - row["inproc_step_ms"]
    row["transport_ms"] = _transport_ms(row)
    return row


def _transport_ms(row: dict) -> float:
    """What the wire adds, free of compute noise: extra network share (round trip minus the server's
    reported body and codec time) plus extra codec time, WebSocket minus in-process."""
    return (row["ws_network_ms"] - row["inproc_network_ms"]) + (row["ws_codec_ms"] - row["inproc_codec_ms"])


def concurrency(loaded: LoadedModel, split: SplitConfig, url: str, sessions: list[int], n_tokens: int,
                wire: str) -> list[dict]:
    """Aggregate decode throughput with k clients generating at once (own connection and session each)."""
    rows = []
    for k in sessions:
        models = [SplitModel(loaded, split, cloud=WebSocketLink(url), wire_dtype=wire) for _ in range(k)]
        prompt_ids = models[0].encode_prompt(PROMPT)
        for sm in models:
            _decode_steps(sm, prompt_ids, 2)
        barrier, results = threading.Barrier(k + 1), [None] * k

        def run(i):
            barrier.wait()
            results[i] = models[i].generate(prompt_ids, n_tokens, stop_on_eos=False)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(k)]
        for t in threads:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        tokens = sum(len(r.token_ids) for r in results)
        rows.append({"sessions": k, "tokens": tokens, "wall_s": wall, "aggregate_tok_s": tokens / wall,
                     "per_session_tok_s": statistics.mean(r.tok_s for r in results),
                     "identical_outputs": all(r.token_ids == results[0].token_ids for r in results)})
        for sm in models:
            sm.close()
    return rows


def run_transport(model: str = "default", split: str = "2,2", n_tokens: int = 64, repeats: int = 3,
                  sessions: tuple[int, ...] = (1, 2, 4, 8), synthetic_hidden: tuple[int, ...] = (576, 4096),
                  wire: str = "fp16", server_threads: int = 1) -> dict:
    """Run the whole benchmark; returns a JSON-able dict (see the module docstring)."""
    sp = SplitConfig.parse(split)
    rows, conc = [], []
    loaded = load_model(model)
    server = ServerProcess(model, split, server_threads)
    try:
        rows.append({**step_overhead(loaded, sp, server.url, n_tokens, repeats, wire), "kind": "model"})
        conc = concurrency(loaded, sp, server.url, list(sessions), n_tokens, wire)
    finally:
        server.stop()
    with tempfile.TemporaryDirectory() as tmp:
        for d in synthetic_hidden:
            path = synthetic_model_dir(d, Path(tmp))
            syn = load_model(str(path))
            server = ServerProcess(str(path), "1,1", server_threads)
            try:
                row = step_overhead(syn, SplitConfig(1, 1), server.url, n_tokens, repeats, wire)
                rows.append({**row, "model": f"synthetic-{d}", "kind": "synthetic"})
            finally:
                server.stop()
    return {"model": model, "split": split, "wire_dtype": wire, "n_tokens": n_tokens, "repeats": repeats,
            "client_threads": torch.get_num_threads(), "server_threads": server_threads,
            "cpus": os.cpu_count(), "overhead": rows, "concurrency": conc}


def format_transport(r: dict) -> str:
    """Human-readable tables of :func:`run_transport`'s result."""
    lines = [f"transport benchmark: model {r['model']} split {r['split']}, wire {r['wire_dtype']}, "
             f"{r['n_tokens']} tokens x {r['repeats']} repeats, client threads {r['client_threads']}, "
             f"server threads {r['server_threads']}, {r['cpus']} CPUs", "",
             "per single-token decode step (medians), in-process link vs WebSocket on loopback:",
             f"{'body':>18} {'d':>5} {'bytes/step':>10} {'inproc ms':>10} {'ws ms':>8} {'overhead ms':>12} "
             f"{'transport ms':>13} {'codec ms':>9}"]
    for row in r["overhead"]:
        lines.append(f"{row['model']:>18} {row['hidden_size']:>5} {row['bytes_per_step']:>10.0f} "
                     f"{row['inproc_step_ms']:>10.2f} {row['ws_step_ms']:>8.2f} {row['overhead_ms']:>12.2f} "
                     f"{row.get('transport_ms', _transport_ms(row)):>13.2f} {row['ws_codec_ms']:>9.2f}")
    lines += ["", "throughput against concurrent sessions (one connection each):",
              f"{'sessions':>8} {'aggregate tok/s':>16} {'per-session tok/s':>18} {'identical':>10}"]
    for row in r["concurrency"]:
        lines.append(f"{row['sessions']:>8} {row['aggregate_tok_s']:>16.1f} {row['per_session_tok_s']:>18.1f} "
                     f"{str(row['identical_outputs']):>10}")
    return "\n".join(lines)
