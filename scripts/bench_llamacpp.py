"""llama.cpp on the same GPU and checkpoint as bench_model: issue 7's llama.cpp baseline, measured.

    python3 scripts/bench_llamacpp.py --model models/bielik-shaped-random \
        --bench-dir build-bench/bench [--work-dir build-bench/llamacpp] \
        [--llamacpp third_party/llama.cpp] [--cuda-arch 90] [--reps 5] [--llama-bench PATH]
    python3 scripts/bench_llamacpp.py --build-only --cuda-arch 90 --work-dir build-llamacpp
        (-> build-llamacpp/llama-bench.xz, for --llama-bench on a GPU machine)

Issue 7 gives llama.cpp's speed on the H200 as an anchor (218 tokens/s, an early-2025
build). This measures a current llama.cpp in the same run as our own numbers instead, so
the report's ratio compares two engines on one GPU, one checkpoint and one day:

  1. builds llama.cpp's `llama-bench` with its CUDA backend for --cuda-arch (the source
     comes from scripts/fetch_llamacpp.sh, on a machine with network; CMake + nvcc; the
     first build on a 16-core GPU machine takes minutes, later ones are incremental).
     --llama-bench PATH skips this and uses a llama-bench built before, elsewhere:
     --build-only builds one (and needs no checkpoint) on any machine with nvcc and packs
     it (stripped, xz: ~41 MB), so a GPU machine lent by the minute spends its time
     measuring; the binary links the CUDA runtime and cuBLAS dynamically, so the GPU
     machine needs the same CUDA major version;
  2. writes the checkpoint as GGUF, f16 (scripts/checkpoint_to_gguf.py: every tensor,
     biases included; reused while newer than the checkpoint);
  3. runs llama-bench with every layer on the GPU and flash attention on, as llama.cpp's
     CUDA users run it: prompts of 16, 128, 512 and 2048 tokens in a fresh context
     (TTFT: llama.cpp's whole prompt pass, as ours), then 256 tokens generated one at a
     time after a 16-token prompt (our decode benchmark's shape: `-n 256 -d 16`); --reps
     repetitions each after llama-bench's warm-up run;
  4. writes --bench-dir/llamacpp.json: medians over the repetitions, the GPU's name and
     the checkpoint's folder (make_bench_report.py uses the file only beside a model.json
     of the same GPU and checkpoint), llama.cpp's commit and the raw samples.
     llama-bench's own JSON stays beside it (llamacpp_bench_*.json).

Exit status 0 when llamacpp.json was written; otherwise 1 with the reason on stderr.
"""
import argparse
import json
import lzma
import os
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

PROMPTS = [16, 128, 512, 2048]
DECODE_TOKENS = 256
DECODE_DEPTH = 16  # bench_model decodes after a 16-token prompt

# llama-bench and its libraries only, statically linked, CUDA on. NCCL (multi-GPU only) is
# off, so a binary built on one machine needs nothing beyond the CUDA toolkit on another.
CMAKE_OPTIONS = [
    "-DGGML_CUDA=ON", "-DGGML_CUDA_NCCL=OFF", "-DBUILD_SHARED_LIBS=OFF", "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_OPENSSL=OFF",
]


def log(message):
    print(f"bench_llamacpp: {message}", flush=True)


def fail(message):
    print(f"bench_llamacpp: {message}", file=sys.stderr)
    raise SystemExit(1)


def run_logged(command, log_path):
    """Runs command with its output in log_path; on failure, stops with the log's end."""
    with open(log_path, "w") as log_file:
        result = subprocess.run(command, stdout=log_file, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        with open(log_path) as log_file:
            tail = log_file.read()[-4000:]
        fail(f"`{' '.join(command[:4])} ...` exited with {result.returncode} (log: {log_path}):\n{tail}")


def build(source, build_dir, cuda_arch, jobs):
    """Configures (once) and builds llama-bench; returns its path."""
    if not os.path.isfile(os.path.join(source, "CMakeLists.txt")):
        fail(f"{source}: no llama.cpp source there. On a machine with network run `bash scripts/fetch_llamacpp.sh`; "
             "a GPU machine without network needs third_party/llama.cpp carried over with the working tree")
    os.makedirs(build_dir, exist_ok=True)
    if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
        command = ["cmake", "-S", source, "-B", build_dir, f"-DCMAKE_CUDA_ARCHITECTURES={cuda_arch}"] + CMAKE_OPTIONS
        commit_file = os.path.join(source, ".commit")  # fetch_llamacpp.sh: the tree has no git history
        if os.path.exists(commit_file):
            command.append(f"-DLLAMA_BUILD_COMMIT={open(commit_file).read().strip()}")
        if shutil.which("ninja"):
            command += ["-G", "Ninja"]
        run_logged(command, os.path.join(build_dir, "configure.log"))
    start = time.time()
    run_logged(["cmake", "--build", build_dir, "--target", "llama-bench", "-j", str(jobs)],
               os.path.join(build_dir, "build.log"))
    log(f"llama-bench built in {time.time() - start:.0f} s")
    binary = os.path.join(build_dir, "bin", "llama-bench")
    if not os.access(binary, os.X_OK):
        fail(f"the build left no {binary}")
    return binary


def pack(binary, packed_path):
    """Writes binary, stripped of its symbols, xz-compressed to packed_path.

    A CUDA llama-bench for one architecture is ~79 MB, more than the device tool carries
    (64 MiB); stripped and compressed it is ~41 MB. (Stripping keeps the GPU code: it only
    drops the host symbol table.)"""
    start = time.time()
    stripped = packed_path + ".stripped"
    if not (shutil.which("strip") and
            subprocess.run(["strip", "-o", stripped, binary], stderr=subprocess.DEVNULL).returncode == 0):
        shutil.copyfile(binary, stripped)  # not an ELF file, or no binutils: packed as it is
    with open(stripped, "rb") as source, lzma.open(packed_path + ".partial", "wb", preset=6) as packed:
        shutil.copyfileobj(source, packed, 1 << 20)
    os.remove(stripped)
    os.replace(packed_path + ".partial", packed_path)
    log(f"{packed_path}: {os.path.getsize(packed_path) / 1e6:.1f} MB ({time.time() - start:.0f} s)")
    return packed_path


def prebuilt(path, work):
    """A llama-bench built before (--build-only), checked before anything else runs; a
    packed one (.xz) is unpacked into work first."""
    if not os.path.isfile(path):
        fail(f"--llama-bench {path}: no such file (build one with `python3 scripts/bench_llamacpp.py --build-only`)")
    if path.endswith(".xz"):
        unpacked = os.path.join(work, "llama-bench-prebuilt")
        os.makedirs(work, exist_ok=True)
        try:
            with lzma.open(path, "rb") as packed, open(unpacked + ".partial", "wb") as out:
                shutil.copyfileobj(packed, out, 1 << 20)
        except (lzma.LZMAError, EOFError) as e:
            if os.path.exists(unpacked + ".partial"):
                os.remove(unpacked + ".partial")
            fail(f"--llama-bench {path}: not a complete xz file ({e}); pack it again with --build-only")
        os.chmod(unpacked + ".partial", 0o755)
        os.replace(unpacked + ".partial", unpacked)
        log(f"llama-bench: {path} unpacked to {unpacked} (built before this run)")
        return unpacked
    if not os.access(path, os.X_OK):
        fail(f"--llama-bench {path}: not executable")
    log(f"llama-bench: {path} (built before this run)")
    return path


def newest_weights_mtime(model):
    files = [f for f in os.listdir(model) if f.endswith(".safetensors") or f == "config.json"]
    if not files:
        fail(f"{model}: no .safetensors files")
    return max(os.path.getmtime(os.path.join(model, f)) for f in files)


def convert(model, gguf_path, gguf_py):
    if os.path.exists(gguf_path) and os.path.getmtime(gguf_path) > newest_weights_mtime(model):
        log(f"{gguf_path}: up to date")
        return
    os.makedirs(os.path.dirname(gguf_path) or ".", exist_ok=True)
    start = time.time()
    subprocess.run([sys.executable, os.path.join(HERE, "checkpoint_to_gguf.py"), "--model", model, "--out", gguf_path,
                    "--dtype", "f16", "--gguf-py", gguf_py], check=True)
    log(f"GGUF written in {time.time() - start:.0f} s")


def run_bench(binary, gguf_path, extra, reps, raw_path):
    command = [binary, "-m", gguf_path, "-ngl", "99", "-fa", "on", "-r", str(reps), "-o", "json"] + extra
    log(" ".join(command))
    result = subprocess.run(command, check=False, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        fail(f"llama-bench exited with {result.returncode}:\n{result.stderr[-3000:]}")
    with open(raw_path, "w") as f:
        f.write(result.stdout)
    try:
        return json.loads(result.stdout)
    except ValueError as e:
        fail(f"llama-bench's output is not JSON ({e}); kept in {raw_path}")


def median_ms(entry):
    samples = entry.get("samples_ns") or []
    if not samples:
        fail(f"llama-bench's result for n_prompt={entry.get('n_prompt')}, n_gen={entry.get('n_gen')} has no samples")
    return statistics.median(samples) / 1e6


def summarize(prefill_runs, decode_runs, model, reps, source_note=""):
    """llamacpp.json's content from llama-bench's JSON lists (one entry per test)."""
    runs = list(prefill_runs) + list(decode_runs)
    if not runs:
        fail("llama-bench reported no tests")
    first = runs[0]
    prefill_ms, samples = {}, {}
    for entry in prefill_runs:
        if entry.get("n_gen", 0) == 0 and entry.get("n_prompt", 0) > 0 and entry.get("n_depth", 0) == 0:
            prefill_ms[str(entry["n_prompt"])] = median_ms(entry)
            samples[f"pp{entry['n_prompt']}"] = entry["samples_ns"]
    decode = [e for e in decode_runs if e.get("n_gen", 0) > 0 and e.get("n_prompt", 0) == 0]
    if not decode:
        fail("llama-bench reported no generation test")
    n_gen = decode[0]["n_gen"]
    decode_ms = median_ms(decode[0])
    samples[f"tg{n_gen}@d{decode[0].get('n_depth', 0)}"] = decode[0]["samples_ns"]
    return {
        "engine": "llama.cpp",
        "device": (first.get("gpu_info") or "").split(",")[0].strip(),
        "model": model,
        "build_commit": first.get("build_commit"),
        "source": source_note,
        "model_type": first.get("model_type"),
        "weights": "f16",
        "flash_attn": first.get("flash_attn"),
        "n_gpu_layers": first.get("n_gpu_layers"),
        "decode_tokens": n_gen,
        "decode_depth": decode[0].get("n_depth", 0),
        "decode_tok_s": n_gen / (decode_ms / 1000),
        "decode_ms_per_token": decode_ms / n_gen,
        "prefill_ms": prefill_ms,
        "reps": reps,
        "samples_ns": samples,
        "finished_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="the checkpoint folder bench_model measured (all but --build-only)")
    parser.add_argument("--bench-dir", default="build-bench/bench")
    parser.add_argument("--work-dir", default=None, help="build tree and GGUF (default: beside --bench-dir)")
    parser.add_argument("--llamacpp", default=os.path.join(ROOT, "third_party", "llama.cpp"))
    parser.add_argument("--cuda-arch", default=os.environ.get("CUDA_ARCH") or "90")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 4)
    parser.add_argument("--prepare-only", action="store_true",
                        help="build llama-bench and write the GGUF, measure nothing (bench_all.sh BUILD_ONLY=1)")
    parser.add_argument("--build-only", action="store_true",
                        help="only build llama-bench, pack it as WORK_DIR/llama-bench.xz and print that path "
                             "(no checkpoint, no GPU needed)")
    parser.add_argument("--llama-bench", default=None, metavar="PATH",
                        help="a llama-bench built before (--build-only's .xz, or the binary): no build in this run")
    args = parser.parse_args(argv)
    if args.build_only and args.llama_bench:
        parser.error("--build-only builds llama-bench; --llama-bench uses one built before: pass one of them")
    if not args.build_only and not args.model:
        parser.error("--model is required (the checkpoint to convert and measure)")

    work = args.work_dir or os.path.join(os.path.dirname(os.path.normpath(args.bench_dir)), "llamacpp")
    if args.llama_bench:
        binary = prebuilt(args.llama_bench, work)
    else:
        binary = build(args.llamacpp, os.path.join(work, "build"), args.cuda_arch, args.jobs)
    if args.build_only:
        print(pack(binary, os.path.join(work, "llama-bench.xz")))
        return 0
    os.makedirs(args.bench_dir, exist_ok=True)
    gguf_path = os.path.join(work, os.path.basename(os.path.normpath(args.model)) + "-f16.gguf")
    convert(args.model, gguf_path, os.path.join(args.llamacpp, "gguf-py"))
    if args.prepare_only:
        return 0
    prefill = run_bench(binary, gguf_path, ["-p", ",".join(map(str, PROMPTS)), "-n", "0"], args.reps,
                        os.path.join(args.bench_dir, "llamacpp_bench_prefill.json"))
    decode = run_bench(binary, gguf_path, ["-p", "0", "-n", str(DECODE_TOKENS), "-d", str(DECODE_DEPTH)], args.reps,
                       os.path.join(args.bench_dir, "llamacpp_bench_decode.json"))
    stamp = os.path.join(args.llamacpp, ".fetched-from")
    source = open(stamp).read().strip() if os.path.exists(stamp) else "unknown"
    built = "built before this run" if args.llama_bench else "built in this run"
    result = summarize(prefill, decode, args.model, args.reps, f"llama.cpp vendored by {source}; llama-bench {built}")
    out = os.path.join(args.bench_dir, "llamacpp.json")
    with open(out + ".partial", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(out + ".partial", out)
    log(f"{out}: decode {result['decode_tok_s']:.0f} tokens/s, prefill " +
        ", ".join(f"{n}: {ms:.2f} ms" for n, ms in result["prefill_ms"].items()) + f" on {result['device']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
