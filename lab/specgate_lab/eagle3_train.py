"""The EAGLE-3 recipe: train a draft head for the target offline, on text the target generates.

Stages, each cached in the work folder so an interrupted run resumes where it stopped:

1. ``prompts``: two thirds from the running Python's standard-library docstrings (explain, code,
   summarize, JSON, extract), one third from fixtures/eagle3/corpus.toml's templates (seeded).
2. ``generate``: the target answers each prompt greedily through vLLM's offline engine (a child
   process, so the engine's memory is gone before training); token ids go to ``corpus.jsonl``.
3. ``features``: transformers runs the target over prompt + answer and keeps the three auxiliary
   hidden states vLLM feeds an EAGLE-3 head (``features.pt``, float16).
4. ``train``: the head (specgate_lab.eagle3) learns to predict the target's tokens over 3 unrolled draft
   steps; its output layer starts from the target's own output rows for the draft vocabulary.
   The held-out sequences' per-step top-1 accuracy is logged and kept in the head's marker file.

Run: ``python -m specgate_lab train-eagle3 --out DIR`` (``--help`` for sizes and time budget).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import string
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from specgate.errors import SpecgateError
from specgate_lab.eagle3 import HeadShape, build_head, save_head, unrolled_loss

# the checkout's fixtures/ (the lab runs from a checkout: lab/specgate_lab/ is two folders below its root)
CORPUS_TEMPLATES = Path(__file__).resolve().parents[2] / "fixtures" / "eagle3" / "corpus.toml"


def expand_prompts(path: Path, count: int, *, seed: int = 0) -> list[dict]:
    """``count`` distinct prompts from the templates file, templates taken in turn."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SpecgateError(f"{path}: {exc}") from exc
    templates, slots = data.get("templates") or [], data.get("slots") or {}
    if not templates:
        raise SpecgateError(f"{path}: no [[templates]]")
    for i, t in enumerate(templates):
        for _, name, _, _ in string.Formatter().parse(t.get("text", "")):
            if name and name not in slots:
                raise SpecgateError(f"{path}: templates[{i}] ({t.get('genre', '?')}) uses "
                                    f"{{{name}}}, which [slots] does not define")
    rng = random.Random(seed)
    seen: set[str] = set()
    prompts: list[dict] = []
    for attempt in itertools.count():
        if len(prompts) >= count or attempt > 50 * count:
            break
        t = templates[attempt % len(templates)]
        text = t["text"].format(**{k: rng.choice(v) for k, v in slots.items()})
        if text not in seen:
            seen.add(text)
            prompts.append({"genre": t.get("genre", "misc"), "text": text})
    return prompts


DOC_MODULES = ("abc", "argparse", "array", "asyncio", "base64", "bisect", "calendar", "collections", "contextlib",
               "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "email.message", "enum", "fractions",
               "functools", "glob", "gzip", "hashlib", "heapq", "hmac", "html", "http.client", "inspect", "io",
               "ipaddress", "itertools", "json", "logging", "math", "mimetypes", "operator", "os", "pathlib",
               "pickle", "pprint", "queue", "random", "re", "sched", "secrets", "selectors", "shlex", "shutil",
               "signal", "socket", "sqlite3", "statistics", "string", "struct", "subprocess", "tarfile", "tempfile",
               "textwrap", "threading", "time", "timeit", "tokenize", "traceback", "typing", "unittest", "urllib.parse",
               "uuid", "warnings", "weakref", "xml.etree.ElementTree", "zipfile", "zlib")
DOC_FORMS = (
    ("explanatory", "Here is the documentation of Python's `{name}`:\n\n{doc}\n\nExplain what it does, when to use "
                    "it, and show a short example."),
    ("coding", "Write a complete Python program that puts `{name}` to real use. Its documentation says:\n\n{doc}\n\n"
               "Add comments and a main block."),
    ("summarization", "Summarize this documentation of `{name}` in three sentences:\n\n{doc}"),
    ("structured_json", "Describe `{name}` as a JSON object with the fields name, kind, purpose, parameters (an array) "
                        "and example, from its documentation:\n\n{doc}"),
    ("extraction", "From the documentation below, list every parameter, value and name it mentions, copied exactly, "
                   "one per line:\n\n{doc}"),
)


def doc_prompts(count: int, *, seed: int = 0) -> list[dict]:
    """Prompts about the running Python's standard library, built from its docstrings: thousands of
    distinct topics, offline (the templates alone are too narrow: a head trained on them reached
    AL 3.1 on their own kind of prompt and 1.3-1.6 on the measured prompts)."""
    import importlib
    import inspect

    entries, seen = [], set()

    def add(name: str, obj) -> None:
        doc = inspect.getdoc(obj) or ""
        if len(doc) >= 120 and doc not in seen and not doc.startswith(("int(", "str(", "Built-in")):
            seen.add(doc)
            entries.append((name, doc[:700]))

    for mod_name in DOC_MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:
            continue
        for attr in sorted(dir(mod)):
            obj = getattr(mod, attr, None)
            if attr.startswith("_") or inspect.ismodule(obj):
                continue
            add(f"{mod_name}.{attr}", obj)
            if inspect.isclass(obj):
                for meth in sorted(vars(obj)):
                    if not meth.startswith("_"):
                        add(f"{mod_name}.{attr}.{meth}", getattr(obj, meth, None))
    rng = random.Random(seed)
    rng.shuffle(entries)
    # each entry under two forms, so one topic yields two kinds of answer
    forms = [(name, doc, DOC_FORMS[(i + k) % len(DOC_FORMS)]) for i, (name, doc) in enumerate(entries)
             for k in (0, 2)]
    rng.shuffle(forms)
    return [{"genre": genre, "text": text.format(name=name, doc=doc)} for name, doc, (genre, text) in forms[:count]]


def generate(target: Path, prompts: list[dict], out: Path, *, max_tokens: int, dtype: str) -> None:
    """Greedy answers from the target through vLLM's offline engine; one JSON line per prompt."""
    import torch
    from vllm import LLM, SamplingParams  # the server's own build
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    per_call = 256 if torch.cuda.is_available() else 64
    llm = LLM(model=str(target), dtype=dtype, max_model_len=2048, seed=0, max_num_seqs=per_call,
              enforce_eager=True, **({"gpu_memory_utilization": 0.5} if per_call == 256 else {}))
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    tmp = out.with_suffix(".partial")
    with tmp.open("w") as fh:
        for start in range(0, len(prompts), per_call):
            batch = prompts[start:start + per_call]
            results = llm.chat([[{"role": "user", "content": p["text"]}] for p in batch], params,
                               use_tqdm=False)
            for p, r in zip(batch, results, strict=True):
                fh.write(json.dumps({"genre": p["genre"], "prompt_ids": list(r.prompt_token_ids),
                                     "answer_ids": list(r.outputs[0].token_ids)}) + "\n")
            fh.flush()
            print(f"generate: {min(start + per_call, len(prompts))}/{len(prompts)} prompts", flush=True)
    tmp.replace(out)


def features(target: Path, corpus: Path, out: Path, shape: HeadShape, *, device: str) -> None:
    """The target's auxiliary hidden states over each prompt + answer (float16, on CPU)."""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).to(device).eval()
    rows = [json.loads(line) for line in corpus.read_text().splitlines() if line.strip()]
    seqs = []
    started = time.monotonic()
    with torch.no_grad():
        for n, row in enumerate(rows, 1):
            ids = row["prompt_ids"] + row["answer_ids"]
            hs = model(torch.tensor([ids], device=device), output_hidden_states=True).hidden_states
            aux = torch.cat([hs[i][0] for i in shape.aux_layers], dim=-1).half().cpu()
            seqs.append({"ids": torch.tensor(ids), "start": len(row["prompt_ids"]), "aux": aux,
                         "genre": row["genre"]})
            if n % 50 == 0 or n == len(rows):
                print(f"features: {n}/{len(rows)} sequences ({time.monotonic() - started:.0f}s)", flush=True)
    embed = model.get_input_embeddings().weight.detach().float().cpu()
    lm_head = model.get_output_embeddings().weight.detach().float().cpu()
    norm = model.model.norm.weight.detach().float().cpu()
    torch.save({"seqs": seqs, "embed": embed, "lm_head": lm_head, "norm": norm}, str(out) + ".partial")
    Path(str(out) + ".partial").replace(out)


def draft_vocabulary(seqs, size: int, vocab: int):
    """The ``size`` most frequent answer tokens, as target ids in ascending order."""
    import torch
    counts = torch.zeros(vocab, dtype=torch.long)
    for s in seqs:
        counts += torch.bincount(s["ids"][s["start"]:], minlength=vocab)
    keep = torch.topk(counts, size).indices.sort().values
    coverage = float(counts[keep].sum()) / max(1, int(counts.sum()))
    return keep, coverage


def _batches(seqs, batch_tokens: int, rng: random.Random):
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]["ids"]))
    groups, cur, longest = [], [], 0
    for i in order:
        longest = max(longest, len(seqs[i]["ids"]))
        if cur and longest * (len(cur) + 1) > batch_tokens:
            groups.append(cur)
            cur, longest = [], len(seqs[i]["ids"])
        cur.append(i)
    if cur:
        groups.append(cur)
    rng.shuffle(groups)
    return groups


def _collate(seqs, idx, device):
    import torch
    T = max(len(seqs[i]["ids"]) for i in idx)
    H3 = seqs[idx[0]]["aux"].shape[-1]
    ids = torch.zeros(len(idx), T, dtype=torch.long)
    aux = torch.zeros(len(idx), T, H3)
    mask = torch.zeros(len(idx), T)
    for r, i in enumerate(idx):
        n = len(seqs[i]["ids"])
        ids[r, :n] = seqs[i]["ids"]
        aux[r, :n] = seqs[i]["aux"].float()
        mask[r, seqs[i]["start"]:n] = 1
    return ids.to(device), aux.to(device), mask.to(device)


def train(feat_path: Path, shape: HeadShape, out: Path, *, minutes: float, device: str, lr: float,
          batch_tokens: int, seed: int, meta: dict) -> dict:
    import torch
    data = torch.load(str(feat_path), weights_only=False)
    seqs = data["seqs"]
    rng = random.Random(seed)
    order = list(range(len(seqs)))
    rng.shuffle(order)
    n_eval = max(4, len(seqs) // 20)
    eval_set = [seqs[i] for i in order[:n_eval]]
    train_set = [seqs[i] for i in order[n_eval:]]
    keep, coverage = draft_vocabulary(train_set, shape.draft_vocab, shape.vocab)
    head = build_head(shape, seed=seed)
    with torch.no_grad():
        head.d2t.copy_(keep - torch.arange(shape.draft_vocab))
        head.t2d.zero_()
        head.t2d[keep] = True
        head.lm_head.weight.copy_(data["lm_head"][keep])
        head.norm.weight.copy_(data["norm"])
    head.to(device)
    embed = torch.nn.Embedding.from_pretrained(data["embed"].to(device), freeze=True)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
    budget = minutes * 60.0
    started = time.monotonic()
    step, epoch = 0, 0
    print(f"train: {len(train_set)} sequences, {n_eval} held out; draft vocabulary {shape.draft_vocab} "
          f"covers {coverage:.1%} of answer tokens; {budget:.0f}s budget on {device}", flush=True)
    done = False
    while not done:
        epoch += 1
        for idx in _batches(train_set, batch_tokens, rng):
            frac = min(1.0, (time.monotonic() - started) / budget)
            for g in opt.param_groups:  # warm-up, then cosine to zero over the time budget
                g["lr"] = lr * min(1.0, (step + 1) / 30) * 0.5 * (1 + math.cos(math.pi * frac))
            ids, aux, mask = _collate(train_set, idx, device)
            loss, accs = unrolled_loss(head, embed, aux, ids, mask)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
            step += 1
            if step % 20 == 0:
                print(f"train: epoch {epoch} step {step} loss {float(loss):.3f} top-1 per step "
                      + " ".join(f"{a:.2f}" for a in accs) + f" ({time.monotonic() - started:.0f}s)", flush=True)
            if time.monotonic() - started >= budget:
                done = True
                break
    head.eval()
    totals = [0.0, 0.0, 0.0]
    weights = [0, 0, 0]
    with torch.no_grad():
        for idx in _batches(eval_set, batch_tokens, rng):
            ids, aux, mask = _collate(eval_set, idx, device)
            _, accs = unrolled_loss(head, embed, aux, ids, mask)
            n = int(mask.sum())
            for s, a in enumerate(accs):
                totals[s] += a * n
                weights[s] += n
    held_out = [round(t / w, 4) if w else None for t, w in zip(totals, weights)]
    print(f"train: held-out top-1 per draft step {held_out} after {step} steps, {epoch} epochs", flush=True)
    head.to("cpu")
    summary = {**meta, "kind": "trained", "steps": step, "epochs": epoch, "train_sequences": len(train_set),
               "held_out_sequences": n_eval, "held_out_top1_per_step": held_out,
               "draft_vocab_coverage": round(coverage, 4), "train_seconds": round(time.monotonic() - started)}
    for p in head.parameters():
        p.data = p.data.to(torch.bfloat16)  # half the size to carry; vLLM casts on load
    save_head(head, out, meta=summary, bos=meta.get("bos"), eos=meta.get("eos"))
    return summary


def run_recipe(target: Path, out: Path, work: Path, *, prompts: int, max_tokens: int, draft_vocab: int,
               minutes: float, device: str, dtype: str, seed: int, lr: float, batch_tokens: int) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    shape = HeadShape.from_target(target, draft_vocab)
    corpus, made = work / "corpus.jsonl", work / "corpus-made-with.json"
    wanted = {"prompts": prompts, "max_tokens": max_tokens, "seed": seed}
    if corpus.exists():  # a resumed run: the head's marker says what the corpus was made with
        used = json.loads(made.read_text()) if made.exists() else {}
        if used != wanted:
            print(f"generate: reusing {corpus} made with {used or 'unknown settings'}, not {wanted}; "
                  "delete the work folder to generate again", flush=True)
    else:
        docs = doc_prompts(prompts * 2 // 3, seed=seed)
        plist = docs + expand_prompts(CORPUS_TEMPLATES, prompts - len(docs), seed=seed)
        (work / "prompts.json").write_text(json.dumps(plist, indent=1))
        print(f"generate: {len(plist)} prompts from {CORPUS_TEMPLATES.name}, {max_tokens} tokens each", flush=True)
        code = ("import json,sys; from pathlib import Path; from specgate_lab.eagle3_train import generate; "
                "generate(Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text()), Path(sys.argv[3]), "
                "max_tokens=int(sys.argv[4]), dtype=sys.argv[5])")
        rc = subprocess.run([sys.executable, "-c", code, str(target), str(work / "prompts.json"), str(corpus),
                             str(max_tokens), dtype], check=False).returncode
        if rc != 0 or not corpus.exists():
            raise SpecgateError(f"generating the corpus failed (exit {rc}); see the output above")
        made.write_text(json.dumps(wanted) + "\n")
        used = wanted
    feats = work / "features.pt"
    if not feats.exists():
        features(target, corpus, feats, shape, device=device)
    cfg = json.loads((target / "config.json").read_text())
    meta = {"target": target.name, "corpus_prompts": used.get("prompts"), "max_tokens": used.get("max_tokens"),
            "templates": str(CORPUS_TEMPLATES.relative_to(CORPUS_TEMPLATES.parent.parent.parent)),
            "seed": seed, "corpus_seed": used.get("seed"), "bos": cfg.get("bos_token_id"),
            "eos": cfg.get("eos_token_id")}
    return train(feats, shape, out, minutes=minutes, device=device, lr=lr, batch_tokens=batch_tokens,
                 seed=seed, meta=meta)
