"""
Measure dev/data/tokenize.py: tokens/s and peak memory for each --workers on a generated .jsonl.zst
corpus of about --size-mb MB (compressed). docs/data.md quotes its results.

The corpus is written into a temporary folder (removed at the end unless --keep): documents of 50 to 1500
words drawn from tiny-shakespeare's words with their frequencies, so that the text compresses and
tokenizes about as natural text does. Each run is timed by /usr/bin/time -v: its user + system time
covers the workers too (the main process reaps them), so tokens per CPU-second do not depend on what
else the machine runs, unlike tokens/s of wall time; its "Maximum resident set size" is that of the
largest single process, while this script samples the whole process tree's resident memory every 0.1 s.
"""
import os
import sys

# dev/data/tokenize.py would shadow the standard library's `tokenize` (imported by numpy through
# inspect -> linecache), so this folder must not be first on sys.path.
_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or os.curdir) == _HERE:
    sys.path.append(sys.path.pop(0))

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import zstandard  # noqa: E402

import llm8_data  # noqa: E402
import sample_corpus  # noqa: E402

SAMPLE_S = 0.1
DOCS_PER_BATCH = 2000


def write_corpus(path, size_mb, seed):
    """A .jsonl.zst of about `size_mb` MB; returns (documents, uncompressed bytes)."""
    words = np.array(llm8_data.resolve_data_file("tinyshakespeare").read_text(encoding="utf-8").split())
    rng = np.random.default_rng(seed)
    docs = text_bytes = 0
    with open(path, "wb") as f:
        compressor = zstandard.ZstdCompressor(level=sample_corpus.ZSTD_LEVEL, write_checksum=True)
        with compressor.stream_writer(f) as z:
            while f.tell() < size_mb * 1e6:
                lines = []
                for n in rng.integers(50, 1500, size=DOCS_PER_BATCH):
                    lines.append(json.dumps({"text": " ".join(rng.choice(words, size=int(n)))}) + "\n")
                data = "".join(lines).encode("utf-8")
                z.write(data)
                z.flush()
                docs, text_bytes = docs + len(lines), text_bytes + len(data)
    return docs, text_bytes


def tree_rss(pid):
    """Resident bytes of process `pid` and all its descendants (0 when it is gone)."""
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += int(re.search(r"VmRSS:\s+(\d+) kB", status)[1]) * 1024
            for task in Path(f"/proc/{p}/task").iterdir():
                stack += map(int, (task / "children").read_text().split())
        except (OSError, TypeError):
            continue
    return total


def measure(corpus, workers, out):
    """Run tokenize.py once; returns (wall seconds, CPU seconds, tokens, peak tree RSS bytes, max RSS of
    one process)."""
    cmd = ["/usr/bin/time", "-v", sys.executable, str(Path(_HERE) / "tokenize.py"), "--out-dir", str(out),
           "--workers", str(workers), "--val-fraction", "0.01", "--progress-every", "30", str(corpus)]
    t0 = time.time()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(SAMPLE_S)
    seconds = time.time() - t0
    stderr = proc.stderr.read()
    if proc.returncode != 0:
        sys.exit(f"tokenize.py failed:\n{stderr}")
    one = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", stderr)[1]) * 1024
    cpu = sum(float(re.search(rf"{kind} time \(seconds\): ([\d.]+)", stderr)[1]) for kind in ("User", "System"))
    tokens = json.loads((out / "manifest.json").read_text())["tokens"]
    return seconds, cpu, tokens, peak, one


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=float, default=100,
                        help="compressed corpus size (default: %(default)s)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2],
                        help="--workers values (default: 1 2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the corpus (default: %(default)s)")
    parser.add_argument("--keep", type=Path, help="write the corpus and the data sets here and keep them")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="llm8-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        corpus = folder / "corpus.jsonl.zst"
        t0 = time.time()
        docs, text_bytes = write_corpus(corpus, args.size_mb, args.seed)
        size = corpus.stat().st_size
        print(f"corpus: {docs:,} documents, {size / 1e6:.1f} MB compressed, {text_bytes / 1e6:.1f} MB of JSONL "
              f"(written in {time.time() - t0:.0f} s); {os.cpu_count()} CPUs")
        print("| --workers | wall s | tokens/s | input MB/s (compressed) | CPU s | tokens per CPU-s | "
              "peak RSS, all processes | max RSS of one process | load average |")
        print("|---|---|---|---|---|---|---|---|---|")
        for workers in args.workers:
            out = folder / f"out_w{workers}"
            seconds, cpu, tokens, peak, one = measure(corpus, workers, out)
            print(f"| {workers} | {seconds:.1f} | {tokens / seconds:,.0f} | {size / seconds / 1e6:.2f} | "
                  f"{cpu:.1f} | "
                  f"{tokens / cpu:,.0f} | {peak / 2**20:.0f} MiB | {one / 2**20:.0f} MiB | "
                  f"{os.getloadavg()[0]:.1f} |", flush=True)
            if not args.keep:
                shutil.rmtree(out)
    finally:
        if not args.keep:
            shutil.rmtree(folder)


if __name__ == "__main__":
    main()
