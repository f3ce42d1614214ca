//! Misuse of `#[resilient(...)]` is a compile error pointing at the
//! offending token. The expected messages are in `tests/ui/*.stderr`
//! (regenerate with `TRYBUILD=overwrite`, then review the diff).

#[test]
fn compile_errors() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
