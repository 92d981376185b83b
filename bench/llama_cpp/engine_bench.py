"""llama.cpp reference side of the engine benchmark.

Runs the workload the Rust side wrote (workload.json) through llama.cpp, via the
low-level ctypes API of llama-cpp-python, and writes the figures as JSON, so that
they can be set beside the Rust engine's figures for the same model and prompts.

    python engine_bench.py --model M.gguf --workload workload.json --json out.json [--threads 2]

Every prompt is already chat-templated text; it is tokenized without BOS and with
special tokens parsed, so both engines see the same token ids. Sampling is greedy
argmax over the logits in numpy, and generation never stops at EOS, so every run
decodes exactly the requested number of tokens. n_threads = n_threads_batch =
--threads. Each figure is the best (fastest) of `repeats` runs, which drops
one-off noise (page faults, other load); every run's figure is kept in "runs".
Flash attention, KV cache type (f16) and the rest are llama.cpp's defaults.

Figures:
- prefill: for each prompt, the KV cache is cleared and ONE llama_decode of the
  whole prompt is timed (n_batch = n_ubatch >= the longest prompt, so it is a
  single ubatch; logits only for the last token, as a server needs for the first
  sampled token). tokens_per_s = prompt_tokens / that time.
- decode_1: decode_prompt is prefilled (untimed); then decode_tokens tokens are
  generated with one llama_decode per token (batch of 1, logits for it).
  tokens_per_s = decode_tokens / summed time of those decode calls, i.e. the
  single-stream token rate with the prompt's context in the cache.
- multi: for each entry, every prompt is prefilled into its own sequence
  (untimed, one decode per prompt); then `tokens` steps are timed, each ONE
  llama_decode whose batch holds one token per sequence, each at its own
  position and seq_id with logits for each. total_tokens_per_s =
  sequences * tokens / summed time: the batched (continuous-batching) rate.
  Sequences use llama.cpp's non-unified KV cache (one stream per sequence), so
  a sequence's attention only spans its own cells.
- rss_mb: the process's peak resident memory (VmHWM in /proc/self/status; not
  getrusage's ru_maxrss, which Linux carries over from the parent across fork and
  exec, so a child of the Rust bench would report the bench's own peak).

Each context is sized to what its phase needs (per-sequence cells rounded up to
256), so the KV buffers - and so rss_mb - are not inflated by slack. A context
first decodes one token untimed, so that the mmap'd weights are paged in.
"""
import argparse
import ctypes
import json
import resource
import sys
import time

import numpy as np
import llama_cpp as L


@L.llama_log_callback
def _log(level, text, _user_data):
    if level == 3:  # GGML_LOG_LEVEL_ERROR; info/warn/debug stay quiet
        sys.stderr.write(text.decode("utf-8", "replace"))


def peak_resident_mb():
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def say(msg):
    print(f"llama.cpp: {msg}", file=sys.stderr, flush=True)


def round_up(n, m):
    return -(-n // m) * m


class Engine:
    def __init__(self, path, threads):
        L.llama_log_set(_log, ctypes.c_void_p(0))
        L.llama_backend_init()
        self.model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
        if not self.model:
            sys.exit(f"llama.cpp: cannot load {path}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.threads = threads
        self.ctx = None

    def tokenize(self, text):
        data = text.encode("utf-8")
        buf = (L.llama_token * (len(data) + 8))()
        n = L.llama_tokenize(self.vocab, data, len(data), buf, len(buf), False, True)
        if n < 0:
            raise RuntimeError(f"tokenize failed ({n})")
        return list(buf[:n])

    def open(self, n_seq, per_seq, n_batch, warm_token):
        """A fresh context of n_seq sequences with per_seq KV cells each."""
        self.close()
        p = L.llama_context_default_params()
        p.n_ctx = n_seq * round_up(per_seq, 256)
        p.n_batch = p.n_ubatch = round_up(max(n_batch, 512), 64)
        p.n_seq_max = n_seq
        p.kv_unified = False
        p.n_threads = p.n_threads_batch = self.threads
        self.ctx = L.llama_init_from_model(self.model, p)
        if not self.ctx:
            sys.exit("llama.cpp: cannot create context")
        self.mem = L.llama_get_memory(self.ctx)
        self.batch = L.llama_batch_init(p.n_batch, 0, 1)
        self.fill([(warm_token, 0, 0, True)])
        self.run()
        self.clear()

    def close(self):
        if self.ctx:
            L.llama_batch_free(self.batch)
            L.llama_free(self.ctx)
            self.ctx = None

    def clear(self):
        L.llama_memory_clear(self.mem, True)

    def fill(self, entries):
        """entries: (token, position, seq_id, want_logits) per batch slot."""
        b = self.batch
        for i, (tok, pos, seq, out) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, out
            b.seq_id[i][0] = seq
        b.n_tokens = len(entries)

    def run(self):
        """One timed llama_decode of the filled batch; seconds."""
        t = time.perf_counter()
        rc = L.llama_decode(self.ctx, self.batch)
        L.llama_synchronize(self.ctx)
        dt = time.perf_counter() - t
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        return dt

    def argmax(self, i):
        logits = np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,))
        return int(logits.argmax())

    def prefill(self, toks, seq=0):
        self.fill([(t, p, seq, p == len(toks) - 1) for p, t in enumerate(toks)])
        return self.run()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--workload", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    w = json.load(open(a.workload))
    reps = max(1, int(w.get("repeats", 1)))
    eng = Engine(a.model, a.threads)
    out = {"engine": "llama.cpp", "llama_cpp_python": L.__version__, "threads": a.threads}

    prompts = [eng.tokenize(t) for t in w["prefill_prompts"]]
    dec_prompt, dec_n = eng.tokenize(w["decode_prompt"]), int(w["decode_tokens"])
    longest = max([len(t) for t in prompts] + [len(dec_prompt)])
    eng.open(1, max(longest, len(dec_prompt) + dec_n + 1), longest, dec_prompt[0])

    out["prefill"] = []
    for toks in prompts:
        runs = []
        for r in range(reps):
            say(f"prefill {len(toks)} tokens (run {r + 1}/{reps})")
            eng.clear()
            runs.append(len(toks) / eng.prefill(toks))
        out["prefill"].append({"prompt_tokens": len(toks), "tokens_per_s": max(runs), "runs": runs})

    runs = []
    for r in range(reps):
        say(f"decode_1 {dec_n} tokens after {len(dec_prompt)} (run {r + 1}/{reps})")
        eng.clear()
        eng.prefill(dec_prompt)
        tok, n, spent = eng.argmax(len(dec_prompt) - 1), len(dec_prompt), 0.0
        for k in range(dec_n):
            eng.fill([(tok, n + k, 0, True)])
            spent += eng.run()
            tok = eng.argmax(0)
        runs.append(dec_n / spent)
    out["decode_1"] = {"tokens": dec_n, "tokens_per_s": max(runs), "runs": runs}

    out["multi"] = []
    for entry in w.get("multi", []):
        seqs, steps = [eng.tokenize(t) for t in entry["prompts"]], int(entry["tokens"])
        lens = [len(t) for t in seqs]
        eng.open(len(seqs), max(lens) + steps + 1, max(lens), seqs[0][0])
        runs = []
        for r in range(reps):
            say(f"multi {len(seqs)} sequences x {steps} tokens, prompts {lens} (run {r + 1}/{reps})")
            eng.clear()
            nxt = []
            for s, toks in enumerate(seqs):
                eng.prefill(toks, s)
                nxt.append(eng.argmax(len(toks) - 1))
            spent = 0.0
            for k in range(steps):
                eng.fill([(nxt[s], lens[s] + k, s, True) for s in range(len(seqs))])
                spent += eng.run()
                nxt = [eng.argmax(s) for s in range(len(seqs))]
            runs.append(len(seqs) * steps / spent)
        out["multi"].append({"sequences": len(seqs), "prompt_tokens": lens, "tokens": steps,
                             "total_tokens_per_s": max(runs), "runs": runs})

    eng.close()
    L.llama_model_free(eng.model)
    out["rss_mb"] = peak_resident_mb()
    with open(a.json, "w") as f:
        json.dump(out, f, indent=2)
    say(f"wrote {a.json}")


if __name__ == "__main__":
    main()
