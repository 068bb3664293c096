"""Tests of scripts/gpu_sanitize.sh's verdicts and exit status, on a machine with no GPU.

    python3 scripts/test_gpu_sanitize.py

The script is run for real against a made-up build folder: a CTestTestfile.cmake that
lists GPU tests, and a stand-in `compute-sanitizer` (and `nvidia-smi`) first on PATH.
The stand-in behaves by the test's name, as the real tool would on such a test: it passes,
reports a hazard, reports one and then hangs, hangs without one, or fails the test. It also
writes the arguments it was given, so the tests can see which tool left out which kernels.
"""
import os
import re
import shutil
import subprocess
import tempfile
import textwrap
import unittest

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(SCRIPTS)
SCRIPT = os.path.join(SCRIPTS, "gpu_sanitize.sh")

# What each made-up test does under the stand-in sanitizer (any other name: passes).
STAND_IN = textwrap.dedent("""\
    #!/usr/bin/env bash
    exe=""
    for arg in "$@"; do [ -x "$arg" ] && [ -f "$arg" ] && exe="$arg"; done
    name=$(basename "$exe")
    echo "$*" >"$ARGS_DIR/$name.$2.args"
    echo "========= COMPUTE-SANITIZER"
    case "$name" in
      *clean*) echo "========= ERROR SUMMARY: 0 errors"; exit 0 ;;
      *hazard_then_hang*) echo "========= Error: Race reported between Read access at k+0x10"; exec sleep 30 ;;
      *hazard*) echo "========= Error: Race reported between Read access at k+0x10"; exit 86 ;;
      *hang*) exec sleep 30 ;;
      *broken*) echo "test assertion failed"; exit 1 ;;
    esac
    echo "========= ERROR SUMMARY: 0 errors"
    """)


class GpuSanitizeTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="gpu_sanitize_test_")
        self.bin = os.path.join(self.dir, "bin")
        self.build = os.path.join(self.dir, "build")
        self.out = os.path.join(self.dir, "out")
        self.args_dir = os.path.join(self.dir, "args")
        for d in (self.bin, self.build, self.args_dir):
            os.makedirs(d)
        self.write_executable(os.path.join(self.bin, "compute-sanitizer"), STAND_IN)
        self.write_executable(os.path.join(self.bin, "nvidia-smi"), "#!/bin/sh\necho 'GPU 0: stand-in'\n")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    @staticmethod
    def write_executable(path, text):
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o755)

    def make_tests(self, names):
        """A build folder whose ctest lists `names` as GPU tests, each a real executable."""
        lines = []
        for name in names:
            exe = os.path.join(self.build, "chapters", name)
            os.makedirs(os.path.dirname(exe), exist_ok=True)
            self.write_executable(exe, "#!/bin/sh\nexit 0\n")
            lines.append(f'add_test([=[{name}]=] "{exe}")')
            lines.append(f'set_tests_properties([=[{name}]=] PROPERTIES LABELS "gpu")')
        with open(os.path.join(self.build, "CTestTestfile.cmake"), "w") as f:
            f.write("\n".join(lines) + "\n")

    def run_script(self, **env_changes):
        env = dict(os.environ)
        env.update({"PATH": self.bin + os.pathsep + env["PATH"], "BUILD": self.build, "OUT": self.out,
                    "ARGS_DIR": self.args_dir, "SANITIZE_SECONDS": "60", "SANITIZE_TEST_SECONDS": "1"})
        env.pop("SANITIZE_EXCLUDE", None)
        env.update(env_changes)
        result = subprocess.run(["bash", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
        rows = {}
        for line in result.stdout.splitlines():
            cells = [c.strip() for c in line.strip("|").split("|")]
            if len(cells) == 4 and cells[0].startswith("test_"):
                rows[(cells[0], cells[1])] = cells[2]
        return result.returncode, rows, result.stderr

    def args_of(self, name, tool):
        with open(os.path.join(self.args_dir, f"{name}.{tool}.args")) as f:
            return f.read().split()

    def test_each_verdict_and_a_failing_exit(self):
        self.make_tests(["test_ch01_clean_gpu", "test_ch02_hazard_gpu", "test_ch03_hazard_then_hang_gpu",
                         "test_ch04_hang_gpu", "test_ch05_broken_gpu"])
        status, rows, _ = self.run_script(SANITIZE_TOOLS="memcheck")
        self.assertEqual(status, 1)
        self.assertTrue(rows[("test_ch01_clean_gpu", "memcheck")].startswith("clean"))
        self.assertIn("**hazards reported**", rows[("test_ch02_hazard_gpu", "memcheck")])
        self.assertIn("**hazards reported before the cut**", rows[("test_ch03_hazard_then_hang_gpu", "memcheck")])
        self.assertEqual(rows[("test_ch04_hang_gpu", "memcheck")], "not finished in 1 s")
        self.assertIn("**test failed, exit 1**", rows[("test_ch05_broken_gpu", "memcheck")])

    def test_a_hazard_before_the_cut_fails_even_where_unfinished_runs_are_allowed(self):
        self.make_tests(["test_ch01_clean_gpu", "test_ch03_hazard_then_hang_gpu"])
        status, rows, _ = self.run_script(SANITIZE_TOOLS="racecheck", SANITIZE_ALLOW_UNFINISHED="1")
        self.assertEqual(status, 1)
        self.assertIn("before the cut", rows[("test_ch03_hazard_then_hang_gpu", "racecheck")])

    def test_unfinished_runs_exit_3_unless_allowed(self):
        self.make_tests(["test_ch01_clean_gpu", "test_ch04_hang_gpu"])
        status, rows, stderr = self.run_script(SANITIZE_TOOLS="memcheck")
        self.assertEqual(status, 3)
        self.assertIn("did not finish", stderr)
        status, _, _ = self.run_script(SANITIZE_TOOLS="memcheck", SANITIZE_ALLOW_UNFINISHED="1")
        self.assertEqual(status, 0)

    def test_no_test_starts_once_the_budget_is_spent(self):
        self.make_tests(["test_ch04_hang_gpu", "test_ch01_clean_gpu"])
        status, rows, _ = self.run_script(SANITIZE_TOOLS="memcheck", SANITIZE_SECONDS="1")
        self.assertEqual(status, 3)
        self.assertEqual(rows[("test_ch01_clean_gpu", "memcheck")], "not started: SANITIZE_SECONDS spent")

    def test_clean_run_exits_0(self):
        self.make_tests(["test_ch01_clean_gpu", "test_ch02_clean_too_gpu"])
        status, rows, _ = self.run_script()
        self.assertEqual(status, 0)
        self.assertEqual(len(rows), 4)  # two tests under two tools
        self.assertTrue(all(v.startswith("clean") for v in rows.values()))

    def test_racecheck_leaves_out_library_kernels_and_memcheck_does_not(self):
        self.make_tests(["test_ch01_clean_gpu"])
        status, _, _ = self.run_script()
        self.assertEqual(status, 0)
        race = self.args_of("test_ch01_clean_gpu", "racecheck")
        mem = self.args_of("test_ch01_clean_gpu", "memcheck")
        self.assertIn("--kernel-name-exclude", race)
        excluded = race[race.index("--kernel-name-exclude") + 1]
        self.assertTrue(excluded.startswith("regex=") and "nvjet" in excluded, excluded)
        self.assertNotIn("--kernel-name-exclude", mem)
        # An empty SANITIZE_EXCLUDE checks the library kernels too.
        status, _, _ = self.run_script(SANITIZE_EXCLUDE="")
        self.assertEqual(status, 0)
        self.assertNotIn("--kernel-name-exclude", self.args_of("test_ch01_clean_gpu", "racecheck"))

    def test_chapter_08_runs_only_memcheck_on_its_kernel_cases(self):
        self.make_tests(["test_ch08_model_cuda", "test_chat_cli_cuda"])
        status, rows, _ = self.run_script()
        self.assertEqual(status, 0)
        self.assertEqual(set(rows), {("test_ch08_model_cuda [kernels]", "memcheck"),
                                     ("test_chat_cli_cuda", "memcheck")})
        self.assertEqual(self.args_of("test_ch08_model_cuda", "memcheck")[-1], "[kernels]")


class LibraryKernelPatternTest(unittest.TestCase):
    """The default exclusion must not leave out a kernel of this project: no name that can
    appear in one of its kernels' mangled names (the kernel functions, their namespaces, the
    structs and classes their templates take) matches it."""

    def test_no_kernel_of_ours_matches(self):
        with open(SCRIPT) as f:
            default = re.search(r'SANITIZE_EXCLUDE-([^}]*)\}', f.read()).group(1)
        pattern = re.compile(default)
        kernels, names = set(), set()
        for folder in ("chapters", "common", "tests"):
            for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
                for file in files:
                    if not file.endswith((".cu", ".cuh")):
                        continue
                    with open(os.path.join(dirpath, file), encoding="utf-8") as f:
                        text = f.read()
                    text = re.sub(r"__launch_bounds__\s*\([^)]*\)", "", text)
                    kernels.update(re.findall(r"__global__[^(;{]*?\b(\w+)\s*\(", text))
                    names.update(re.findall(r"\b(?:namespace|struct|class)\s+(\w+)", text))
        self.assertGreater(len(kernels), 60)  # the walk found the kernels
        names |= kernels
        self.assertEqual(sorted(n for n in names if pattern.search(n)), [])


if __name__ == "__main__":
    unittest.main()
