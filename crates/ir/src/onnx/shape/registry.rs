//! The one place where every op family registers its shape rules (tract's `register_all_ops`).

use std::collections::HashMap;
use std::sync::OnceLock;

use super::context::{OpCtx, RuleResult};

/// A shape rule.
pub(crate) type Rule = fn(&OpCtx) -> RuleResult;

/// Rules by (domain, op type); the default domain is `""`.
#[derive(Default)]
pub(crate) struct Registry {
    rules: HashMap<(&'static str, &'static str), Rule>,
}

impl Registry {
    /// Registers `rule` for each op of `ops` in `domain`.
    pub fn add(&mut self, domain: &'static str, ops: &[&'static str], rule: Rule) {
        for op in ops {
            let previous = self.rules.insert((domain, op), rule);
            debug_assert!(previous.is_none(), "op {domain}:{op} registered twice");
        }
    }
}

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut r = Registry::default();
        super::elementwise::register(&mut r);
        super::linalg::register(&mut r);
        super::nn::register(&mut r);
        super::movement::register(&mut r);
        super::reduce::register(&mut r);
        super::control::register(&mut r);
        super::sequence::register(&mut r);
        super::microsoft::register(&mut r);
        super::collective::register(&mut r);
        super::quant::register(&mut r);
        super::attention::register(&mut r);
        super::loss::register(&mut r);
        super::signal::register(&mut r);
        super::crop::register(&mut r);
        super::recurrent::register(&mut r);
        super::strings::register(&mut r);
        super::ml::register(&mut r);
        super::data_dependent::register(&mut r);
        super::spatial::register(&mut r);
        super::random::register(&mut r);
        r
    })
}

/// The domain under which rules are registered (`ai.onnx` is the default domain `""`).
pub(crate) fn canonical_domain(domain: &str) -> &str {
    if domain == "ai.onnx" {
        ""
    } else {
        domain
    }
}

/// The rule for an op, if any.
pub(crate) fn lookup(domain: &str, op: &str) -> Option<Rule> {
    registry()
        .rules
        .get(&(canonical_domain(domain), op))
        .copied()
}

/// Every registered op as `domain:op`, sorted (for documentation and tests).
pub fn supported_ops() -> Vec<String> {
    let mut ops: Vec<String> = registry()
        .rules
        .keys()
        .map(|(d, op)| format!("{}:{op}", if d.is_empty() { "ai.onnx" } else { d }))
        .collect();
    ops.sort();
    ops
}
