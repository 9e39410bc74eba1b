//! The one place where every op family registers its shape rules (tract's `register_all_ops`):
//! the families know only the [`Registry`] they fill, and the driver reads the filled one here.

use std::sync::OnceLock;

use super::registry::Registry;
use super::{
    attention, collective, control, crop, data_dependent, elementwise, linalg, loss, microsoft, ml,
    movement, ms_quant, nn, quant, random, recurrent, reduce, sequence, signal, spatial,
    state_space, strings,
};

/// Every family's rules, registered on first use.
pub(super) fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut r = Registry::default();
        elementwise::register(&mut r);
        linalg::register(&mut r);
        nn::register(&mut r);
        movement::register(&mut r);
        reduce::register(&mut r);
        control::register(&mut r);
        sequence::register(&mut r);
        microsoft::register(&mut r);
        collective::register(&mut r);
        quant::register(&mut r);
        ms_quant::register(&mut r);
        attention::register(&mut r);
        loss::register(&mut r);
        signal::register(&mut r);
        crop::register(&mut r);
        recurrent::register(&mut r);
        strings::register(&mut r);
        ml::register(&mut r);
        data_dependent::register(&mut r);
        spatial::register(&mut r);
        random::register(&mut r);
        state_space::register(&mut r);
        r
    })
}

/// Every op with a shape rule as `domain:op`, sorted (for documentation and tests).
pub fn supported_ops() -> Vec<String> {
    registry().ops()
}
