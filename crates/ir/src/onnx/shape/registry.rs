//! The table of shape rules by op: each op family fills it through [`Registry::add`] (the one
//! list that calls every family is `families.rs`, tract's `register_all_ops`); the driver looks
//! rules up in it.

use std::collections::HashMap;

use super::context::{OpCtx, RuleResult};

/// A shape rule.
pub(crate) type Rule = fn(&OpCtx) -> RuleResult;

/// Rules by (domain, op type); the default domain is `""`. Hashed with foldhash, as the graph's
/// names are ([`crate::graph`]): one lookup per node.
#[derive(Default)]
pub(crate) struct Registry {
    rules: HashMap<(&'static str, &'static str), Rule, foldhash::fast::RandomState>,
}

impl Registry {
    /// Registers `rule` for each op of `ops` in `domain`.
    pub fn add(&mut self, domain: &'static str, ops: &[&'static str], rule: Rule) {
        for op in ops {
            let previous = self.rules.insert((domain, op), rule);
            debug_assert!(previous.is_none(), "op {domain}:{op} registered twice");
        }
    }

    /// The rule for an op, if any.
    pub fn lookup(&self, domain: &str, op: &str) -> Option<Rule> {
        self.rules.get(&(canonical_domain(domain), op)).copied()
    }

    /// Every registered op as `domain:op`, sorted (for documentation and tests).
    pub fn ops(&self) -> Vec<String> {
        let mut ops: Vec<String> = self
            .rules
            .keys()
            .map(|(d, op)| format!("{}:{op}", if d.is_empty() { "ai.onnx" } else { d }))
            .collect();
        ops.sort();
        ops
    }
}

/// The domain under which rules are registered (`ai.onnx` is the default domain `""`).
pub(crate) fn canonical_domain(domain: &str) -> &str {
    if domain == "ai.onnx" {
        ""
    } else {
        domain
    }
}
