//! Every input the fuzzer (`fuzz/`) ever crashed on, replayed through the same target code:
//! each must now end in an `Ok` or an error, not a panic. Inputs live in
//! `fuzz/regressions/TARGET/`; see docs/robustness.md.

mod common;

#[path = "../fuzz/src/targets.rs"]
#[allow(dead_code)]
mod targets;

#[test]
fn past_fuzzer_findings_no_longer_panic() {
    let mlp = std::fs::read(common::fixture("mlp")).unwrap();
    let fixtures = targets::Fixtures::new(&mlp);
    let mut replayed = 0;
    for target in targets::TARGETS {
        let dir = common::root().join("fuzz/regressions").join(target);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            let input = std::fs::read(&path).unwrap();
            let outcome = fixtures.run(target, &input);
            // The finding is fixed when the run returns; the outcome says where it stopped.
            assert!(!outcome.is_empty(), "{}", path.display());
            replayed += 1;
        }
    }
    assert!(
        replayed >= 1,
        "no regression inputs found under fuzz/regressions/"
    );
}
