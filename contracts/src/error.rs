//! The one error every backend returns.
//!
//! Callers decide by [`ErrorKind`] (retry, fail readiness, alert on corrupt
//! data), never by a backend's own error type, so services need no backend
//! crate to handle failures. The source is kept for logs and operators; its
//! text never reaches an API client (the API answers 500 "failed to fetch
//! data").

use std::fmt;

pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong, as far as a caller can act on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The backend cannot be reached or refused the work for now (broker
    /// down, budget exhausted, timeout). Retrying later may succeed; ingest
    /// answers 503 with `Retry-After`.
    Unavailable,
    /// Stored data does not decode: never retried, always alerted on.
    Corrupt,
    /// The request conflicts with stored state (an idempotency key reused
    /// with another body).
    Conflict,
    /// Any other backend failure.
    Backend,
}

#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    /// Which backend failed: `sqlite`, `kafka`, `cql`.
    backend: &'static str,
    source: BoxError,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(kind: ErrorKind, backend: &'static str, source: impl Into<BoxError>) -> Self {
        Error {
            kind,
            backend,
            source: source.into(),
        }
    }

    pub fn unavailable(backend: &'static str, source: impl Into<BoxError>) -> Self {
        Self::new(ErrorKind::Unavailable, backend, source)
    }

    pub fn corrupt(backend: &'static str, source: impl Into<BoxError>) -> Self {
        Self::new(ErrorKind::Corrupt, backend, source)
    }

    pub fn conflict(backend: &'static str, source: impl Into<BoxError>) -> Self {
        Self::new(ErrorKind::Conflict, backend, source)
    }

    pub fn backend(backend: &'static str, source: impl Into<BoxError>) -> Self {
        Self::new(ErrorKind::Backend, backend, source)
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn backend_name(&self) -> &'static str {
        self.backend
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Corrupt => "corrupt stored data",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Backend => "error",
        };
        write!(f, "{} {what}: {}", self.backend, self.source)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.source.as_ref())
    }
}
