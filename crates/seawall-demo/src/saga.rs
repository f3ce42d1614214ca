//! `saga`: a place-order saga with compensations, killed halfway and recovered.

use crate::cli::SagaOptions;
use crate::Failure;

/// Runs the saga demo.
///
/// # Errors
/// Always, for now.
pub(crate) fn run(_options: &SagaOptions) -> Result<(), Failure> {
    Err(Failure::Runtime(
        "the saga demo is not available in this build".to_owned(),
    ))
}
