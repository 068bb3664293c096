"""Shows what `template <bool HasBias>` buys: the SASS of each kernel's two instantiations.

    python3 chapters/03_matmul_bias/hasbias_sass.py build/chapters/03_matmul_bias/bench_matmul

Runs `cuobjdump --dump-sass` on the binary and, for a few kernels, counts in each
instantiation the instructions, the branches, the global loads, and the references to
the bias argument. Every kernel here takes (y, x, W, bias, ...) and Hopper/Ada put the
kernel arguments at c[0x0][0x210] on, 8 bytes each, so `bias` is c[0x0][0x228]. The
HasBias=false kernel should not mention it at all.
"""
import re
import subprocess
import sys

KERNELS = {
    # label: (mangled name with HasBias=false, with HasBias=true)
    "gemv_v1 T=1 (vector path)": ("_ZN6bielik27gemv_v1_warp_per_row_kernelILi1ELb0ELb1EE",
                                  "_ZN6bielik27gemv_v1_warp_per_row_kernelILi1ELb1ELb1EE"),
    "v4 128x256 (vector path)": ("_ZN6bielik29matmul_v4_tensor_cores_kernelILi128ELi256ELi2ELi4ELb0ELb1EE",
                                 "_ZN6bielik29matmul_v4_tensor_cores_kernelILi128ELi256ELi2ELi4ELb1ELb1EE"),
    "v5 128x192": ("_ZN6bielik22matmul_v5_wgmma_kernelILi192ELi2ELi5ELb0EE",
                   "_ZN6bielik22matmul_v5_wgmma_kernelILi192ELi2ELi5ELb1EE"),
}
BIAS_ARGUMENT = "c[0x0][0x228]"


def functions(sass, arch):
    """{mangled name: [instruction text, ...]} of the cubins for `arch` (a build for
    89;90 holds every kernel twice) from cuobjdump's output."""
    result, current, section_arch = {}, None, None
    for line in sass.splitlines():
        arch_line = re.match(r"\s*arch = (sm_\w+)", line)
        if arch_line:
            section_arch = arch_line.group(1)
            continue
        header = re.search(r"Function : (\S+)", line)
        if header:
            wanted = section_arch is not None and section_arch.startswith(arch)
            current = result.setdefault(header.group(1), []) if wanted else None
            continue
        instruction = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if current is not None and instruction:
            current.append(instruction.group(1).strip())
    return result


def summary(instructions):
    real = [i for i in instructions if not i.startswith("NOP")]
    opcode = lambda i: re.sub(r"^@!?U?P\w+\s+", "", i).split()[0]
    return {
        "instructions": len(real),
        "branches (BRA)": sum(opcode(i).startswith("BRA") for i in real),
        "global loads (LDG)": sum(opcode(i) == "LDG" or opcode(i).startswith("LDG.") for i in real),
        "uses of the bias argument": sum(BIAS_ARGUMENT in i for i in real),
    }


def main():
    binary = sys.argv[1]
    sass = subprocess.run(["cuobjdump", "--dump-sass", binary], check=True, capture_output=True, text=True).stdout
    found = functions(sass, "sm_90")  # sm_90 and sm_90a
    for label, (without, with_bias) in KERNELS.items():
        names = [next((n for n in found if n.startswith(prefix)), None) for prefix in (without, with_bias)]
        if None in names:
            print(f"{label}: not in this binary (built for another GPU?)\n")
            continue
        a, b = summary(found[names[0]]), summary(found[names[1]])
        print(f"{label}")
        print(f"  {'':28s} {'HasBias=false':>14s} {'HasBias=true':>14s}")
        for key in a:
            print(f"  {key:28s} {a[key]:14d} {b[key]:14d}")
        print("  the HasBias=true lines that touch the bias:")
        for instruction in found[names[1]]:
            if BIAS_ARGUMENT in instruction:
                print(f"    {instruction}")
        print()


if __name__ == "__main__":
    main()
