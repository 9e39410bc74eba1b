//! `pipecut._native`: the Python package's extension module.
//!
//! Each Python call (`pipecut.partition(...)`, `pipecut.check(...)`, ...) runs the `pipecut`
//! command it mirrors, in this process, through [`pipecut::cli::run_captured`]: the arguments
//! are the command's own flags, checked by the same parser, and the work is the same code. So
//! the package has every capability of the command line and no second implementation that
//! could drift from it. `python/pipecut/` turns the command's files and JSON into typed objects.
//!
//! What crosses into Python is always an exception, never an abort: usage errors, failures,
//! and panics (caught here) become `pipecut.Error` subclasses, and the GIL is released while
//! the command works, so other Python threads run during a solve.

use std::panic::{catch_unwind, AssertUnwindSafe};

use clap::Parser;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

use pipecut::cli::{exit_code, one_line, run_captured, Cli};

create_exception!(
    _native,
    Error,
    PyException,
    "Any failure of a pipecut call; its message is the command's one-line error."
);
create_exception!(
    _native,
    NoAnswer,
    Error,
    "The request was understood but has no answer: the model does not fit the devices, or a \
     plan is invalid for its model (the command's exit code 1)."
);
create_exception!(
    _native,
    Undecided,
    Error,
    "No plan that fits was found, and the time limit or work budget ran out before \"does not \
     fit\" was proven (the command's exit code 3): a longer time_limit may decide it."
);
create_exception!(
    _native,
    BadInput,
    Error,
    "Unreadable or malformed files, bad arguments, unsupported models (the command's exit code 2)."
);
create_exception!(
    _native,
    InternalError,
    Error,
    "A bug in pipecut (a panic inside it), reported instead of aborting the interpreter."
);

/// What a command gave: its printed report, or why it failed.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// The command succeeded; what it would have printed on stdout.
    Printed(String),
    /// The command line was refused by the parser (exit code 2); `--help` is not an error and
    /// comes back as `Printed`.
    Usage(String),
    /// The command failed with this exit code and one-line message.
    Failed(u8, String),
    /// The command panicked: a bug, with the panic's message.
    Panicked(String),
}

/// Runs `pipecut ARGS...` in this process. `args` excludes the program name.
pub fn run_command(args: Vec<String>) -> Outcome {
    let argv = std::iter::once("pipecut".to_string()).chain(args);
    let cli = match Cli::try_parse_from(argv) {
        Ok(cli) => cli,
        Err(err) if !err.use_stderr() => return Outcome::Printed(err.to_string()),
        Err(err) => return Outcome::Usage(first_line(&err.to_string())),
    };
    match catch_unwind(AssertUnwindSafe(|| run_captured(cli))) {
        Ok((Ok(_), printed)) => Outcome::Printed(printed),
        Ok((Err(err), _)) => Outcome::Failed(exit_code(&err), one_line(&err)),
        Err(panic) => Outcome::Panicked(panic_message(panic.as_ref())),
    }
}

/// clap's errors run over several lines (a tip, the usage); Python gets the first, without the
/// `error: ` that the terminal needs.
fn first_line(text: &str) -> String {
    let line = text
        .lines()
        .find(|line| !line.trim().is_empty())
        .unwrap_or(text);
    line.trim_start_matches("error: ").to_string()
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|text| text.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

/// Runs `pipecut ARGS...` and returns what it printed; raises `NoAnswer`, `Undecided`,
/// `BadInput` or `InternalError` when it fails. The GIL is released while it runs.
#[pyfunction]
fn command(py: Python<'_>, args: Vec<String>) -> PyResult<String> {
    match py.detach(move || run_command(args)) {
        Outcome::Printed(text) => Ok(text),
        Outcome::Usage(message) => Err(BadInput::new_err(message)),
        Outcome::Failed(1, message) => Err(NoAnswer::new_err(message)),
        Outcome::Failed(3, message) => Err(Undecided::new_err(message)),
        Outcome::Failed(_, message) => Err(BadInput::new_err(message)),
        Outcome::Panicked(message) => Err(InternalError::new_err(format!(
            "pipecut panicked (a bug; please report it): {message}"
        ))),
    }
}

/// The version of the pipecut crates inside this module.
#[pyfunction]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(command, m)?)?;
    m.add_function(wrap_pyfunction!(version, m)?)?;
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("NoAnswer", py.get_type::<NoAnswer>())?;
    m.add("Undecided", py.get_type::<Undecided>())?;
    m.add("BadInput", py.get_type::<BadInput>())?;
    m.add("InternalError", py.get_type::<InternalError>())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn a_command_prints_into_its_outcome_not_stdout() {
        let Outcome::Printed(text) = run_command(args("schema")) else {
            panic!("schema failed");
        };
        assert!(text.contains("\"$schema\""), "{text}");
    }

    #[test]
    fn usage_errors_come_back_as_one_line() {
        let outcome = run_command(args("partition --no-such-flag"));
        let Outcome::Usage(message) = outcome else {
            panic!("{outcome:?}");
        };
        assert!(message.contains("--no-such-flag"), "{message}");
        assert!(!message.contains('\n'), "{message}");
    }

    #[test]
    fn failures_keep_the_commands_exit_code() {
        let outcome = run_command(args("inspect /no/such/model.onnx"));
        let Outcome::Failed(2, message) = outcome else {
            panic!("{outcome:?}");
        };
        assert!(message.contains("/no/such/model.onnx"), "{message}");
    }
}
