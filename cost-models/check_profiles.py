#!/usr/bin/env python3
"""Sanity checks for the hardware profiles in cost-models/.

Run from anywhere:  python3 cost-models/check_profiles.py
Exits non-zero and prints every problem found.

Checks:
  * every *.json under devices/ and links/ parses;
  * top-level keys are exactly those of pipecut-device-v1 / pipecut-link-v1;
  * every numeric leaf (and every null placeholder) sits in an object
    {"value": ..., "source": "<non-empty>"} and nowhere else;
  * units are plausible (positive numbers, efficiencies in (0, 1]);
  * names and aliases are unique (case-insensitive) within devices and within links;
  * every device's intra_node_link names an existing link (or is null);
  * each file's name matches nothing else (no duplicate names).
"""
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent

DEVICE_KEYS = [
    "schema", "name", "aliases", "vendor", "kind", "memory_bytes",
    "memory_bandwidth_bytes_per_sec", "peak_flops_per_sec",
    "kernel_launch_overhead_secs", "efficiency", "intra_node_link", "notes",
]
DTYPES = ["fp32", "tf32", "fp16", "bf16", "fp8", "int8"]
EFF_KEYS = ["matmul", "conv", "elementwise", "reduction", "data_movement"]
LINK_KEYS = [
    "schema", "name", "aliases", "bandwidth_bytes_per_sec_per_direction",
    "latency_secs", "scope", "notes",
]

problems = []


def err(path, msg):
    problems.append(f"{path.relative_to(ROOT.parent)}: {msg}")


def is_number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def walk_leaves(path, node, where, parent_is_sourced=False):
    """Every number/null must be the 'value' of a sourced object."""
    if isinstance(node, dict):
        sourced = "value" in node
        if sourced:
            if set(node) != {"value", "source"}:
                err(path, f"{where}: sourced object must have exactly 'value' and 'source', has {sorted(node)}")
            src = node.get("source")
            if not isinstance(src, str) or not src.strip():
                err(path, f"{where}: empty or missing source")
            val = node.get("value")
            if not (val is None or is_number(val)):
                err(path, f"{where}: value must be a number or null")
            if val is None and isinstance(src, str) and "not supported" not in src.lower():
                err(path, f"{where}: null value must say 'not supported' in its source")
            return
        for k, v in node.items():
            walk_leaves(path, v, f"{where}.{k}" if where else k)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            walk_leaves(path, v, f"{where}[{i}]")
    elif is_number(node):
        err(path, f"{where}: bare number {node!r} without a source object")
    elif node is None and where not in ("intra_node_link",):
        err(path, f"{where}: bare null without a source object")


def value_of(obj):
    return obj.get("value") if isinstance(obj, dict) else None


def positive(path, where, obj, allow_null=False):
    if not isinstance(obj, dict):
        err(path, f"{where}: must be a {{value, source}} object")
        return
    val = obj.get("value")
    if val is None:
        if not allow_null:
            err(path, f"{where}: value must not be null")
        return
    if not is_number(val) or val <= 0:
        err(path, f"{where}: value must be > 0, got {val!r}")


def load(path):
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        err(path, f"invalid JSON: {e}")
        return None


def check_names(kind, docs):
    seen = {}
    for path, doc in docs:
        for n in [doc.get("name", "")] + list(doc.get("aliases", [])):
            key = n.lower()
            if key in seen and seen[key] != path:
                err(path, f"{kind} name/alias {n!r} also used by {seen[key].name}")
            seen[key] = path
    return seen


def main():
    devices, links = [], []
    for path in sorted((ROOT / "devices").glob("*.json")):
        doc = load(path)
        if doc is None:
            continue
        devices.append((path, doc))
        if list(doc) != DEVICE_KEYS:
            err(path, f"top-level keys {list(doc)} != {DEVICE_KEYS}")
        if doc.get("schema") != "pipecut-device-v1":
            err(path, "schema must be pipecut-device-v1")
        if doc.get("kind") not in ("gpu", "cpu"):
            err(path, "kind must be gpu or cpu")
        walk_leaves(path, doc, "")
        positive(path, "memory_bytes", doc.get("memory_bytes"))
        if not isinstance(value_of(doc.get("memory_bytes")), int):
            err(path, "memory_bytes.value must be an integer")
        positive(path, "memory_bandwidth_bytes_per_sec", doc.get("memory_bandwidth_bytes_per_sec"))
        positive(path, "kernel_launch_overhead_secs", doc.get("kernel_launch_overhead_secs"))
        peaks = doc.get("peak_flops_per_sec")
        peaks = peaks if isinstance(peaks, dict) else {}
        if list(peaks) != DTYPES:
            err(path, f"peak_flops_per_sec keys {list(peaks)} != {DTYPES}")
        for dt in DTYPES:
            positive(path, f"peak_flops_per_sec.{dt}", peaks.get(dt, {}), allow_null=(dt != "fp32"))
        eff = doc.get("efficiency")
        eff = eff if isinstance(eff, dict) else {}
        if list(eff) != EFF_KEYS:
            err(path, f"efficiency keys {list(eff)} != {EFF_KEYS}")
        for k in EFF_KEYS:
            val = value_of(eff.get(k))
            if not is_number(val) or not (0 < val <= 1):
                err(path, f"efficiency.{k} must be in (0, 1], got {val!r}")

    for path in sorted((ROOT / "links").glob("*.json")):
        doc = load(path)
        if doc is None:
            continue
        links.append((path, doc))
        if list(doc) != LINK_KEYS:
            err(path, f"top-level keys {list(doc)} != {LINK_KEYS}")
        if doc.get("schema") != "pipecut-link-v1":
            err(path, "schema must be pipecut-link-v1")
        if doc.get("scope") not in ("intra_node", "inter_node"):
            err(path, "scope must be intra_node or inter_node")
        walk_leaves(path, doc, "")
        positive(path, "bandwidth_bytes_per_sec_per_direction", doc.get("bandwidth_bytes_per_sec_per_direction"))
        positive(path, "latency_secs", doc.get("latency_secs"))

    check_names("device", devices)
    link_names = check_names("link", links)
    for path, doc in devices:
        ref = doc.get("intra_node_link")
        if ref is None:
            continue
        if not isinstance(ref, str) or ref.lower() not in link_names:
            err(path, f"intra_node_link {ref!r} matches no link name or alias")

    for p in problems:
        print("FAIL", p)
    print(f"checked {len(devices)} devices, {len(links)} links: "
          f"{'OK' if not problems else str(len(problems)) + ' problem(s)'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
