//! Errors of the host side of GIN.

/// Errors of the host side of GIN.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GinHostError {
    /// A descriptor or argument is malformed (bad op, id out of range, bytes past a window).
    #[error("invalid GIN request: {0}")]
    Invalid(String),
    /// A peer failed or a connection broke.
    #[error("GIN peer failure: {0}")]
    Remote(String),
    /// The operating system refused something.
    #[error("GIN system error: {0}")]
    System(String),
    /// A wait ran past its limit.
    #[error("GIN timeout: {0}")]
    Timeout(String),
    /// The backend or transport asked for does not exist here.
    #[error("GIN backend unavailable: {0}")]
    Unavailable(String),
}

/// Result of this crate's calls.
pub type GinResult<T> = Result<T, GinHostError>;
