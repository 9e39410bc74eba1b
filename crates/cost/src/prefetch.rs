//! Asking the memory early for what costing reads a few nodes later.
//!
//! A loaded graph keeps each node's slots and each tensor's dims in allocations of their own,
//! scattered over gigabytes at a million nodes: costing spent about half its time waiting for
//! those reads one at a time (`perf annotate` of `concrete`, docs/benchmarks.md "Limits at any
//! size"). A hint issued some nodes ahead lets them overlap the work on the nodes between: the
//! costing threads' samples fell by about a tenth. The same hints in the pass that reads the
//! names and tensors, and in the bias pairs' pass, only moved the wait to the read that found
//! the address to hint, and were dropped. Hints change no result; on targets without one they
//! are nothing.

use pipecut_ir::graph::{Graph, Node};

/// How many nodes (or tensors) ahead of the one at work a pass asks for its memory: a few
/// hundred nanoseconds of work each, against a memory latency of about a hundred.
pub(crate) const AHEAD: usize = 8;

/// Hints that the memory at `value` will be read soon. Never faults, whatever the address.
#[inline(always)]
pub(crate) fn soon<T>(value: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch only hints the cache; it reads nothing architecturally and cannot
    // fault, even for an address that is not mapped.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(value.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

/// The node's input and output slots: the first read of costing it.
pub(crate) fn node_slots(node: &Node) {
    soon(node.inputs.as_ptr());
    soon(node.outputs.as_ptr());
}

/// The dims of the node's inputs and outputs, which costing reads next (its slots should have
/// been asked for earlier: they are read here).
pub(crate) fn node_shapes(graph: &Graph, node: &Node) {
    for &id in node.inputs.iter().chain(&node.outputs).flatten() {
        if let Some(dims) = &graph.tensor(id).shape {
            soon(dims.as_ptr());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hint_at_any_address_changes_nothing() {
        let values = vec![1u64, 2, 3];
        soon(values.as_ptr());
        // Past the end and at an address that is not mapped: a hint, never a read.
        soon(values.as_ptr().wrapping_add(1 << 40));
        soon(std::ptr::null::<u8>());
        assert_eq!(values, [1, 2, 3]);
    }
}
