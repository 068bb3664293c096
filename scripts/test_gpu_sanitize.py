"""Tests of scripts/gpu_sanitize.sh's verdicts and exit status, on a machine with no GPU.

    python3 scripts/test_gpu_sanitize.py

The script is run for real against a made-up build folder: a CTestTestfile.cmake that
lists GPU tests, and a stand-in `compute-sanitizer` (and `nvidia-smi`) first on PATH.
The stand-in behaves by the test's name, as the real tool would on such a test: it passes,
reports a hazard (in one of our kernels, in cuBLASLt's only, or in both), reports one and
then hangs, hangs without one, fails the test, or fails itself (an internal error). It also
writes the arguments it was given and the test's BIELIK_TEST_OWN_KERNELS_ONLY,
BIELIK_TEST_SHORT_SWEEPS and BIELIK_TEST_SANITIZER, so the tests can see which tool left
out which kernels and which test cases, which shortened the long sweeps, and that each
run told the test its tool.
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

# The Catch2 test spec racecheck's runs get by default (the table's rows name it).
SLOW_CASES_LEFT_OUT = "~[racecheck-slow]"

# What each made-up test does under the stand-in sanitizer (any other name: passes).
STAND_IN = textwrap.dedent("""\
    #!/usr/bin/env bash
    exe=""
    for arg in "$@"; do [ -x "$arg" ] && [ -f "$arg" ] && exe="$arg"; done
    name=$(basename "$exe")
    echo "$*" >"$ARGS_DIR/$name.$2.args"
    echo "${BIELIK_TEST_OWN_KERNELS_ONLY-unset}" >"$ARGS_DIR/$name.$2.own"
    echo "${BIELIK_TEST_SHORT_SWEEPS-unset}" >"$ARGS_DIR/$name.$2.short"
    echo "${BIELIK_TEST_SANITIZER-unset}" >"$ARGS_DIR/$name.$2.tool"
    echo "========= COMPUTE-SANITIZER"
    library_race() {
      echo "========= Error: Race reported between Read access at nvjet_sm90_tst_72x64_64x12_2x1_v_bz_TNN+0xab0"
      echo "=========     and Write access at nvjet_sm90_tst_72x64_64x12_2x1_v_bz_TNN+0x2da0 [504 hazards]"
    }
    case "$name" in
      *clean*) echo "========= ERROR SUMMARY: 0 errors"; exit 0 ;;
      *internal_error*)
        echo "========= Internal Sanitizer Error: The Sanitizer failed to handle a hardware exception."
        echo "test cases: 11 |  0 passed | 11 failed"
        echo "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"; exit 1 ;;
      *library_hazard_then_hang*) library_race; exec sleep 30 ;;
      *library_hazard_failing*) library_race; echo "test cases: 2 | 1 passed | 1 failed"; exit 86 ;;
      *library_hazard*) library_race; echo "All tests passed (5 assertions in 2 test cases)"; exit 86 ;;
      *unread_hazard*)
        library_race
        echo "========= Error: Potential WAW hazard detected at __shared__ 0x10 in block (0,0,0)"
        echo "All tests passed (5 assertions in 2 test cases)"; exit 86 ;;
      *mixed_hazard*)
        library_race
        echo "========= Error: Race reported between Write access at void bielik::tile_kernel<int>(const float *)+0x10"
        echo "=========     and Read access at void bielik::tile_kernel<int>(const float *)+0x40 [8 hazards]"
        echo "All tests passed (5 assertions in 2 test cases)"; exit 86 ;;
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
        for name in ("SANITIZE_EXCLUDE", "SANITIZE_LIBRARY_KERNELS", "SANITIZE_ONLY", "SANITIZE_TOOLS",
                     "SANITIZE_OWN_KERNELS_ONLY", "SANITIZE_RACECHECK_CASES", "SANITIZE_SHORT_SWEEPS",
                     "BIELIK_TEST_OWN_KERNELS_ONLY", "BIELIK_TEST_SHORT_SWEEPS", "BIELIK_TEST_SANITIZER"):
            env.pop(name, None)
        env.update(env_changes)
        result = subprocess.run(["bash", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
        rows = {}
        for line in result.stdout.splitlines():
            cells = [c.strip() for c in line.strip("|").split("|")]
            if len(cells) == 4 and cells[0].startswith("test_"):
                rows[(cells[0], cells[1])] = cells[2]
        return result.returncode, rows, result.stderr

    def racecheck_alone(self, name):
        """The exit status and verdict of a racecheck run on the one test `name`."""
        self.make_tests([name])
        status, rows, _ = self.run_script(SANITIZE_TOOLS="racecheck")
        return status, rows[(f"{name} {SLOW_CASES_LEFT_OUT}", "racecheck")]

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
        self.assertIn("before the cut", rows[(f"test_ch03_hazard_then_hang_gpu {SLOW_CASES_LEFT_OUT}", "racecheck")])

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

    def test_reports_in_library_kernels_only_are_listed_not_failed(self):
        self.make_tests(["test_ch03_library_hazard_gpu", "test_ch01_clean_gpu"])
        status, rows, _ = self.run_script(SANITIZE_TOOLS="racecheck")
        self.assertEqual(status, 0)
        verdict = rows[(f"test_ch03_library_hazard_gpu {SLOW_CASES_LEFT_OUT}", "racecheck")]
        self.assertTrue(verdict.startswith("library kernels only"), verdict)
        self.assertIn("nvjet_sm90_tst_72x64_64x12_2x1_v_bz_TNN", verdict)
        # memcheck's reports are never excused: there a library kernel's bad access is ours.
        status, rows, _ = self.run_script(SANITIZE_TOOLS="memcheck")
        self.assertEqual(status, 1)
        self.assertIn("**hazards reported**", rows[("test_ch03_library_hazard_gpu", "memcheck")])

    def test_a_report_in_one_of_our_kernels_fails_beside_library_ones(self):
        status, verdict = self.racecheck_alone("test_ch03_mixed_hazard_gpu")
        self.assertEqual(status, 1)
        self.assertIn("**hazards reported**", verdict)

    def test_a_report_that_names_no_kernel_is_not_excused(self):
        status, verdict = self.racecheck_alone("test_ch03_unread_hazard_gpu")
        self.assertEqual(status, 1)
        self.assertIn("**hazards reported**", verdict)

    def test_library_reports_do_not_excuse_a_failing_test(self):
        status, verdict = self.racecheck_alone("test_ch03_library_hazard_failing_gpu")
        self.assertEqual(status, 1)
        self.assertIn("**test failed**", verdict)

    def test_library_reports_before_the_cut_leave_the_run_unfinished(self):
        status, verdict = self.racecheck_alone("test_ch03_library_hazard_then_hang_gpu")
        self.assertEqual(status, 3)
        self.assertTrue(verdict.startswith("not finished in 1 s"), verdict)
        self.assertIn("library kernels only", verdict)

    def test_an_internal_sanitizer_error_is_a_failure_of_its_own(self):
        status, verdict = self.racecheck_alone("test_ch06_internal_error_gpu")
        self.assertEqual(status, 1)
        self.assertIn("**sanitizer failed**", verdict)

    def test_nothing_is_excluded_unless_asked_and_then_only_from_racecheck(self):
        self.make_tests(["test_ch01_clean_gpu"])
        status, _, _ = self.run_script()
        self.assertEqual(status, 0)
        race = self.args_of("test_ch01_clean_gpu", "racecheck")
        self.assertNotIn("--kernel-name-exclude", race)
        # racecheck prints every report, so that the verdict sees every kernel named.
        self.assertEqual(race[race.index("--print-limit") + 1], "0")
        status, _, _ = self.run_script(SANITIZE_EXCLUDE="nvjet")
        self.assertEqual(status, 0)
        race = self.args_of("test_ch01_clean_gpu", "racecheck")
        self.assertEqual(race[race.index("--kernel-name-exclude") + 1], "regex=nvjet")
        self.assertNotIn("--kernel-name-exclude", self.args_of("test_ch01_clean_gpu", "memcheck"))

    def variable_seen(self, name, tool, variable):
        """The value the stand-in saw for a BIELIK_TEST_* variable ("own", "short" or "tool")."""
        with open(os.path.join(self.args_dir, f"{name}.{tool}.{variable}")) as f:
            return f.read().strip()

    def own_kernels_only_of(self, name, tool):
        return self.variable_seen(name, tool, "own")

    def short_sweeps_of(self, name, tool):
        return self.variable_seen(name, tool, "short")

    def test_racecheck_shortens_the_long_sweeps_unless_asked_not_to(self):
        self.make_tests(["test_ch07_clean_gpu"])
        status, _, _ = self.run_script()
        self.assertEqual(status, 0)
        self.assertEqual(self.short_sweeps_of("test_ch07_clean_gpu", "racecheck"), "1")
        self.assertEqual(self.short_sweeps_of("test_ch07_clean_gpu", "memcheck"), "unset")
        # Off: not set for racecheck, and never for memcheck, even from the caller's shell;
        # the other racecheck setting is independent of it.
        status, _, _ = self.run_script(SANITIZE_SHORT_SWEEPS="0", BIELIK_TEST_SHORT_SWEEPS="1")
        self.assertEqual(status, 0)
        self.assertEqual(self.short_sweeps_of("test_ch07_clean_gpu", "racecheck"), "unset")
        self.assertEqual(self.short_sweeps_of("test_ch07_clean_gpu", "memcheck"), "unset")
        self.assertEqual(self.own_kernels_only_of("test_ch07_clean_gpu", "racecheck"), "1")

    def test_each_run_tells_the_test_its_tool(self):
        # The tests leave out what racecheck cannot carry through by this variable, so it
        # must name the tool of each run, whatever the caller's shell says.
        self.make_tests(["test_ch07_clean_gpu"])
        status, _, _ = self.run_script(BIELIK_TEST_SANITIZER="memcheck")
        self.assertEqual(status, 0)
        self.assertEqual(self.variable_seen("test_ch07_clean_gpu", "racecheck", "tool"), "racecheck")
        self.assertEqual(self.variable_seen("test_ch07_clean_gpu", "memcheck", "tool"), "memcheck")

    def test_racecheck_leaves_out_library_paths_unless_asked_not_to(self):
        # Under racecheck the tests leave out what runs only through cuBLASLt; memcheck
        # runs every case.
        self.make_tests(["test_ch06_clean_gpu"])
        status, _, _ = self.run_script()
        self.assertEqual(status, 0)
        self.assertEqual(self.own_kernels_only_of("test_ch06_clean_gpu", "racecheck"), "1")
        self.assertEqual(self.own_kernels_only_of("test_ch06_clean_gpu", "memcheck"), "unset")
        # Off: not set for racecheck, and never for memcheck, even from the caller's shell.
        status, _, _ = self.run_script(SANITIZE_OWN_KERNELS_ONLY="0", BIELIK_TEST_OWN_KERNELS_ONLY="1")
        self.assertEqual(status, 0)
        self.assertEqual(self.own_kernels_only_of("test_ch06_clean_gpu", "racecheck"), "unset")
        self.assertEqual(self.own_kernels_only_of("test_ch06_clean_gpu", "memcheck"), "unset")

    def test_racecheck_leaves_the_slow_cases_to_memcheck_unless_asked_not_to(self):
        self.make_tests(["test_ch03_clean_gpu"])
        status, _, _ = self.run_script()
        self.assertEqual(status, 0)
        self.assertEqual(self.args_of("test_ch03_clean_gpu", "racecheck")[-1], SLOW_CASES_LEFT_OUT)
        self.assertTrue(self.args_of("test_ch03_clean_gpu", "memcheck")[-1].endswith("test_ch03_clean_gpu"))
        # Another spec is passed as it is; an empty one runs every case.
        self.run_script(SANITIZE_TOOLS="racecheck", SANITIZE_RACECHECK_CASES="[ch03]")
        self.assertEqual(self.args_of("test_ch03_clean_gpu", "racecheck")[-1], "[ch03]")
        self.run_script(SANITIZE_TOOLS="racecheck", SANITIZE_RACECHECK_CASES="")
        self.assertTrue(self.args_of("test_ch03_clean_gpu", "racecheck")[-1].endswith("test_ch03_clean_gpu"))

    def test_chapter_08_runs_only_memcheck_on_its_kernel_cases(self):
        self.make_tests(["test_ch08_model_cuda", "test_chat_cli_cuda"])
        status, rows, _ = self.run_script()
        self.assertEqual(status, 0)
        self.assertEqual(set(rows), {("test_ch08_model_cuda [kernels]", "memcheck"),
                                     ("test_chat_cli_cuda", "memcheck")})
        self.assertEqual(self.args_of("test_ch08_model_cuda", "memcheck")[-1], "[kernels]")


class LibraryKernelPatternTest(unittest.TestCase):
    """The library-kernel pattern must not excuse a kernel of this project: no name that can
    appear in one of its kernels' mangled names (the kernel functions, their namespaces, the
    structs and classes their templates take) matches it."""

    def test_no_kernel_of_ours_matches(self):
        with open(SCRIPT) as f:
            default = re.search(r'SANITIZE_LIBRARY_KERNELS-([^}]*)\}', f.read()).group(1)
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
