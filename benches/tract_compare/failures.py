"""Groups the failures of `tract_compare conformance` (its RESULTS file: `name phase reason`
per case) by cause, and counts the ops tract has no implementation of.

    python3 benches/tract_compare/failures.py results.txt
"""
import collections
import re
import sys

CAUSES = [
    ("element type tract lacks (float8, float4, int4/uint4, bfloat16)",
     r"elem_type: (Float\d|Int4|Uint4|Bfloat|\d+,)|Unknown DatumType|unknown enumeration|Float4"),
    ("Sequence / Optional values", r"has no type value|Optional|Sequence|sequence"),
    ("op not implemented", r"Unimplemented\("),
    ("op attribute or mode not supported", r"not supported"),
    ("a shape input (axes, sizes, pads, …) must be a constant",
     r"expected axes as a constant|must be a const|to be a const|input is variable|"
     r"Need .* constant|Neither s|known scalar|must be constant|"
     r"Expected dim and value to be determined"),
]

causes = collections.Counter()
missing_ops = collections.Counter()
total = passed = 0
with open(sys.argv[1]) as results:
    for line in results:
        name, phase, *reason = line.rstrip("\n").split(" ", 2)
        reason = reason[0] if reason else ""
        total += 1
        if phase == "pass":
            passed += 1
            continue
        cause = next((c for c, pattern in CAUSES if re.search(pattern, reason)), None)
        if cause is None:
            cause = "wrong numbers" if phase == "numbers" else f"other ({phase} phase)"
        causes[cause] += 1
        if op := re.search(r"Unimplemented\((\w+)\)", reason):
            missing_ops[op.group(1)] += 1
print(f"{passed} / {total} pass")
print("| cause | cases |\n| --- | ---: |")
for cause, count in causes.most_common():
    print(f"| {cause} | {count} |")
print("\nops not implemented (cases):",
      ", ".join(f"{op} {n}" for op, n in missing_ops.most_common()))
