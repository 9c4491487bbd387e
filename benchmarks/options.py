"""The options of ``python -m benchmarks`` and the data set they name.

:func:`build_parser` is the k = 50 benchmark's command line (``python -m benchmarks
--help``); :func:`load_dataset` loads the data set it names (``--dataset``, ``--data``,
``--quick`` subsamples). The large-k benchmark, the phase profiler and ``fit_timing``
parse the same options and load the same data through them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks import datasets, mnist, threads

__all__ = ["all_names", "build_parser", "load_dataset", "log", "mnist_path"]


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m benchmarks`` (``--help`` lists them with defaults)."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Time-to-energy benchmark of nmbatch against its baselines and peers "
        "(Newling & Fleuret 2016, Results section).",
    )
    d = p.add_argument_group("data")
    d.add_argument("--data", type=Path, help="an .npz with keys train and test; for "
                   "--dataset mnist or infmnist, MNIST in that layout (default: "
                   f"{mnist.MNIST_NPZ} in $NMBATCH_DATA_HOME, else $XDG_CACHE_HOME/nmbatch "
                   "or ~/.cache/nmbatch, downloaded there once from the standard MNIST "
                   "files, SHA-256 checked)")
    d.add_argument("--dataset", choices=("npz", "mnist", "patches", "infmnist", "blobs"),
                   help="default: npz if --data is given, else blobs")
    d.add_argument("--infmnist-n", type=int, default=400_000)
    d.add_argument("--data-seed", type=int, default=0,
                   help="seed of the data generators and hold-out splits (not of the runs)")
    d.add_argument("--cache-dir", type=Path, default=None,
                   help=f"where generated data is cached (default {datasets.default_cache_dir()})")
    d.add_argument("--max-train", type=int, help="subsample the training set to this size")
    d.add_argument("--max-test", type=int, help="subsample the validation set to this size")
    r = p.add_argument_group("protocol")
    r.add_argument("--k", type=int, default=50)
    r.add_argument("--batch-size", type=int, default=5000,
                   help="initial batch of nmbatch, batch of mbatch")
    r.add_argument("--rho", type=float, default=100.0)
    r.add_argument("--seeds", type=int, default=None, help="number of seeds (default 5; quick 2)")
    r.add_argument("--first-seed", type=int, default=0)
    r.add_argument("--threads", type=threads.parse_threads, action=threads.ThreadsAction,
                   default=1, help="threads of every pool (default 1); a list (1,2,4) runs "
                   "the benchmark once per count, each in its own process, into "
                   "OUT/threads-N, and writes OUT/scaling.json, scaling.md and scaling.png")
    p.set_defaults(thread_counts=[1])
    r.add_argument("--budget", type=float, default=None,
                   help="seconds of its own time per algorithm and seed (default 20; quick 0.5)")
    r.add_argument("--max-iter", type=int, default=None,
                   help="iterations per algorithm and seed (default 100000; quick 300)")
    r.add_argument("--eval-grid", type=float, default=0.01,
                   help="after the first 20 iterations, evaluate E_V when the algorithm's "
                   "time grew by this fraction since the last evaluation (0: every step)")
    r.add_argument("--warmup", type=float, default=None,
                   help="seconds (at most 3 iterations) each algorithm runs untimed before "
                   "the first seed (default 0.5; quick 0.05)")
    r.add_argument("--prefault-gb", type=float, default=None,
                   help="GiB of memory to touch once before timing (default: 8x the training "
                   "set, at least 1, at most half the available memory; quick 0.25)")
    r.add_argument("--no-keep-memory", action="store_true",
                   help="let glibc return freed memory to the system (see keep_freed_memory)")
    r.add_argument("--algorithms", default=None,
                   help="comma-separated subset of: " + ", ".join(all_names())
                   + "; also ray.P: nmbatch on P Ray shard actors (needs nmbatch[ray])")
    r.add_argument("--reference-seconds", type=float, default=float("inf"),
                   help="cap on the untimed reference Lloyd run (default: to its fixed point)")
    r.add_argument("--faiss-blas-fixed", action="store_true",
                   help="also run faiss in a subprocess with OPENBLAS_CORETYPE set "
                   "(labelled faiss.blasfixed; not in results.json)")
    r.add_argument("--faiss-coretype", default="SkylakeX")
    r.add_argument("--rho-study", action="store_true",
                   help="also run nmbatch and nmbatch.deact for each --rho-values")
    r.add_argument("--rho-values", default="1,10,100,1000")
    r.add_argument("--rho-slices", default=None,
                   help="times (s) at which the rho study reports E_V "
                   "(default 2,10; quick 0.05,0.2)")
    p.add_argument("--drift", action="store_true",
                   help="run the drift benchmark instead (its options: --drift --help; "
                   "benchmarks.drift)")
    p.add_argument("--quick", action="store_true",
                   help="small version for CI: blobs (or a subsample of the data), 2 seeds, "
                   "short budgets; under a minute")
    p.add_argument("--out", type=Path, default=None,
                   help="output directory (default bench-results/<dataset>)")
    return p


def all_names() -> tuple[str, ...]:
    """Every algorithm the benchmark can run by name (``--algorithms``), report order."""
    from benchmarks.report import RESULT_NAMES

    return RESULT_NAMES


def log(msg: str) -> None:
    """One progress line on stderr."""
    print(msg, file=sys.stderr, flush=True)


def mnist_path(args: argparse.Namespace) -> Path:
    """``--data``, else MNIST from the data folder (downloaded there if missing)."""
    return args.data or mnist.fetch_mnist(log=log)


def load_dataset(args: argparse.Namespace) -> datasets.Dataset:
    """The data set of the parsed options ``args`` (``--dataset``, ``--data``, ``--quick``,
    ``--max-train``, ``--max-test``): float32 rows ``train (n, d)`` and ``test (m, d)``."""
    kind = args.dataset or ("npz" if args.data else "blobs")
    if kind == "npz":
        if args.data is None:
            raise SystemExit("--dataset npz needs --data FILE.npz")
        ds = datasets.load_npz(args.data)
    elif kind == "mnist":
        ds = datasets.load_npz(mnist_path(args), name="mnist")
    elif kind == "patches":
        ds = datasets.make_patches(seed=args.data_seed)
    elif kind == "infmnist":
        n = min(args.infmnist_n, 20_000) if args.quick else args.infmnist_n
        ds = datasets.make_infmnist(
            mnist_path(args), n=n, seed=args.data_seed, cache_dir=args.cache_dir
        )
    else:
        ds = (datasets.make_blobs(n_train=20_000, n_test=4_000, seed=args.data_seed)
              if args.quick else
              datasets.make_blobs(n_train=200_000, n_test=20_000, seed=args.data_seed))
    max_train = args.max_train or (10_000 if args.quick and kind != "blobs" else None)
    max_test = args.max_test or (2_000 if args.quick and kind != "blobs" else None)
    if max_train or max_test:
        ds = datasets.subsample(
            ds, max_train or ds.train.shape[0], max_test or ds.test.shape[0], args.data_seed
        )
    return ds
