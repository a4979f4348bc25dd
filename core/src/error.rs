//! The one error type of jaxmpi. It says which op failed and why in words a user can act on;
//! MPI failures also carry the library's error class and string.

use std::borrow::Cow;
use std::fmt;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The caller passed something that cannot work (bad rank, wrong handle, bad count).
    InvalidArgument,
    /// Valid, but this library or build cannot do it.
    Unsupported,
    /// No usable MPI library could be selected, loaded or initialized.
    Library,
    /// An MPI call returned an error. `class` is the library's error class (its numbering
    /// differs between families); the library's own text is in the message.
    Mpi { class: i32 },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    /// The operation that failed: an op name (`allreduce`), or, for failures outside any
    /// op, what jaxmpi was doing (`select MPI`).
    pub op: Cow<'static, str>,
    /// The step inside the op that failed (`error handler check`), when it was not the op's
    /// MPI call itself. Shown in parentheses after the op.
    pub step: Option<Cow<'static, str>>,
    pub message: String,
    /// What the failed call was doing (comm, peer or root, tag, bytes), when a handler
    /// knows it; shown last, in brackets, where `jaxmpi.MPIError` reads it back.
    pub call: Option<String>,
}

impl Error {
    pub fn new(
        kind: ErrorKind,
        op: impl Into<Cow<'static, str>>,
        message: impl Into<String>,
    ) -> Self {
        Error {
            kind,
            op: op.into(),
            step: None,
            message: message.into(),
            call: None,
        }
    }

    pub fn invalid_argument(op: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidArgument, op, message)
    }

    pub fn unsupported(op: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Unsupported, op, message)
    }

    pub fn library(op: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Library, op, message)
    }

    pub fn mpi(op: impl Into<Cow<'static, str>>, class: i32, message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Mpi { class }, op, message)
    }

    /// The MPI error class, for errors that came from the library.
    pub fn mpi_class(&self) -> Option<i32> {
        match self.kind {
            ErrorKind::Mpi { class } => Some(class),
            _ => None,
        }
    }

    /// Prefixes the message with context (e.g. the rank), keeping kind and op.
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }

    /// Names `op`, the operation the user called, as the one that failed; what the error
    /// named until now (an MPI function, a step such as the error handler check) becomes
    /// its step.
    pub fn in_op(mut self, op: &'static str) -> Self {
        if self.op != op {
            self.step = Some(std::mem::replace(&mut self.op, op.into()));
        }
        self
    }

    /// Records what the failed call was doing.
    pub fn with_call(mut self, call: impl fmt::Display) -> Self {
        self.call = Some(call.to_string());
        self
    }
}

/// `op (step) failed: message (MPI error class c) [call]`, with the step, the word
/// `failed` and the class only where they apply: `jaxmpi.MPIError`
/// (python/jaxmpi/_runtime/errors.py) parses this.
impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.op)?;
        if let Some(step) = &self.step {
            write!(f, " ({step})")?;
        }
        match self.kind {
            ErrorKind::Mpi { class } => {
                write!(f, " failed: {} (MPI error class {class})", self.message)
            }
            _ => write!(f, ": {}", self.message),
        }?;
        match &self.call {
            Some(call) => write!(f, " [{call}]"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_op_class_and_library_text() {
        let err = Error::mpi("recv", 15, "Message truncated").context("rank 1");
        assert_eq!(
            err.to_string(),
            "recv failed: rank 1: Message truncated (MPI error class 15)"
        );
        assert_eq!(err.mpi_class(), Some(15));
        let bad = Error::invalid_argument("bcast", "root 5 is out of range for 2 ranks");
        assert_eq!(bad.to_string(), "bcast: root 5 is out of range for 2 ranks");
        assert_eq!(bad.mpi_class(), None);
        let described = Error::mpi("recv", 15, "rank 1: Message truncated")
            .with_call("comm 0x44000000, source 0, tag 9, 16 bytes");
        assert_eq!(
            described.to_string(),
            "recv failed: rank 1: Message truncated (MPI error class 15) \
             [comm 0x44000000, source 0, tag 9, 16 bytes]"
        );
    }

    #[test]
    fn display_puts_the_step_after_the_op() {
        let err =
            Error::mpi("error handler check", 5, "rank 0: Invalid communicator").in_op("allreduce");
        assert_eq!(err.op, "allreduce");
        assert_eq!(err.step.as_deref(), Some("error handler check"));
        // Named twice after the same op (a handler naming its own error): no step appears.
        assert_eq!(Error::mpi("recv", 15, "x").in_op("recv").step, None);
        assert_eq!(
            err.with_call("comm 0x84000004, 8 bytes").to_string(),
            "allreduce (error handler check) failed: rank 0: Invalid communicator \
             (MPI error class 5) [comm 0x84000004, 8 bytes]"
        );
        let mut bad =
            Error::invalid_argument("allreduce", "rank 0: the communicator is MPI_COMM_NULL");
        bad.step = Some("error handler check".into());
        assert_eq!(
            bad.to_string(),
            "allreduce (error handler check): rank 0: the communicator is MPI_COMM_NULL"
        );
    }
}
