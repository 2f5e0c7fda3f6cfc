//! One error type for the whole host API, mirroring NCCL's result codes.

use std::fmt;

/// The result of every fallible devcomm call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, with a message that says what exactly.
///
/// The variants mirror NCCL's `ncclResult_t` (plus `Timeout`), so code that
/// maps NCCL errors maps these the same way: see [`Error::code`].
#[doc(alias = "ncclResult_t")]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A value passed in is out of range or malformed (`ncclInvalidArgument`).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A call made in a state where it is not allowed (`ncclInvalidUsage`).
    #[error("invalid usage: {0}")]
    InvalidUsage(String),
    /// The operating system refused something: socket, file, memory (`ncclSystemError`).
    #[error("system error: {0}")]
    SystemError(String),
    /// An invariant of devcomm itself broke (`ncclInternalError`): a bug.
    #[error("internal error: {0}")]
    InternalError(String),
    /// Another rank failed, aborted, or sent something invalid (`ncclRemoteError`).
    #[error("remote error: {0}")]
    RemoteError(String),
    /// The CUDA driver returned an error, or CUDA is absent (`ncclUnhandledCudaError`).
    #[error("CUDA error: {0}")]
    CudaError(String),
    /// A non-blocking operation has not finished yet (`ncclInProgress`).
    #[error("in progress: {0}")]
    InProgress(String),
    /// A wait ran past its configured timeout.
    #[error("timed out: {0}")]
    Timeout(String),
}

/// The numeric code of an [`Error`], as NCCL numbers its results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ErrorCode {
    /// `ncclUnhandledCudaError`.
    CudaError = 1,
    /// `ncclSystemError`.
    SystemError = 2,
    /// `ncclInternalError`.
    InternalError = 3,
    /// `ncclInvalidArgument`.
    InvalidArgument = 4,
    /// `ncclInvalidUsage`.
    InvalidUsage = 5,
    /// `ncclRemoteError`.
    RemoteError = 6,
    /// `ncclInProgress`.
    InProgress = 7,
    /// No NCCL equivalent: a wait timed out.
    Timeout = 100,
}

impl Error {
    /// The error a kernel reported as device error `code`
    /// ([`devcomm_device::error::DeviceError`]), while doing `what`: a
    /// timeout is [`Error::Timeout`], an abort or a failed GIN operation
    /// [`Error::RemoteError`], a bad argument [`Error::InvalidArgument`];
    /// the message names the code and what it means. `None` for 0 (no error).
    pub fn from_device_code(code: u32, what: &str) -> Option<Error> {
        use devcomm_device::error::DeviceError as D;
        if code == 0 {
            return None;
        }
        let Some(d) = D::from_code(code) else {
            return Some(Error::InternalError(format!("{what}: unknown device error code {code}")));
        };
        let msg = format!("{what}: {} (device error {code}, {d:?})", d.message());
        Some(match d {
            D::Timeout => Error::Timeout(msg),
            D::Aborted | D::RingFailed => Error::RemoteError(msg),
            D::NoGin => Error::InvalidUsage(msg),
            _ => Error::InvalidArgument(msg),
        })
    }

    /// The NCCL-style code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::InvalidArgument(_) => ErrorCode::InvalidArgument,
            Error::InvalidUsage(_) => ErrorCode::InvalidUsage,
            Error::SystemError(_) => ErrorCode::SystemError,
            Error::InternalError(_) => ErrorCode::InternalError,
            Error::RemoteError(_) => ErrorCode::RemoteError,
            Error::CudaError(_) => ErrorCode::CudaError,
            Error::InProgress(_) => ErrorCode::InProgress,
            Error::Timeout(_) => ErrorCode::Timeout,
        }
    }

    /// The message without the code prefix.
    pub fn message(&self) -> &str {
        match self {
            Error::InvalidArgument(m)
            | Error::InvalidUsage(m)
            | Error::SystemError(m)
            | Error::InternalError(m)
            | Error::RemoteError(m)
            | Error::CudaError(m)
            | Error::InProgress(m)
            | Error::Timeout(m) => m,
        }
    }

    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid_argument(msg: impl fmt::Display) -> Self {
        Error::InvalidArgument(msg.to_string())
    }

    /// Shorthand for [`Error::InvalidUsage`].
    pub fn invalid_usage(msg: impl fmt::Display) -> Self {
        Error::InvalidUsage(msg.to_string())
    }

    /// Shorthand for [`Error::RemoteError`].
    pub fn remote(msg: impl fmt::Display) -> Self {
        Error::RemoteError(msg.to_string())
    }

    /// Shorthand for [`Error::InternalError`].
    pub fn internal(msg: impl fmt::Display) -> Self {
        Error::InternalError(msg.to_string())
    }

    /// A [`Error::SystemError`] from an I/O error, with what was being done.
    pub fn system(what: impl fmt::Display, err: impl fmt::Display) -> Self {
        Error::SystemError(format!("{what}: {err}"))
    }

    /// Prefixes the message with some context, keeping the variant.
    pub fn context(self, ctx: impl fmt::Display) -> Self {
        let wrap = |m: String| format!("{ctx}: {m}");
        match self {
            Error::InvalidArgument(m) => Error::InvalidArgument(wrap(m)),
            Error::InvalidUsage(m) => Error::InvalidUsage(wrap(m)),
            Error::SystemError(m) => Error::SystemError(wrap(m)),
            Error::InternalError(m) => Error::InternalError(wrap(m)),
            Error::RemoteError(m) => Error::RemoteError(wrap(m)),
            Error::CudaError(m) => Error::CudaError(wrap(m)),
            Error::InProgress(m) => Error::InProgress(wrap(m)),
            Error::Timeout(m) => Error::Timeout(wrap(m)),
        }
    }
}

impl From<cudarc::driver::DriverError> for Error {
    fn from(e: cudarc::driver::DriverError) -> Self {
        Error::CudaError(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_codes_become_typed_errors_that_say_what_happened() {
        use devcomm_device::error::DeviceError;
        assert_eq!(Error::from_device_code(0, "x"), None);
        for d in DeviceError::ALL {
            let e = Error::from_device_code(d.code(), "my kernel").unwrap();
            let m = e.to_string();
            assert!(m.contains("my kernel") && m.contains(d.message()) && m.contains(&d.code().to_string()), "{m}");
        }
        assert!(matches!(Error::from_device_code(1, "w"), Some(Error::Timeout(_))));
        assert!(matches!(Error::from_device_code(2, "w"), Some(Error::RemoteError(_))));
        assert!(
            matches!(Error::from_device_code(38, "w"), Some(Error::InvalidArgument(ref m)) if m.contains("window"))
        );
        assert!(matches!(Error::from_device_code(999, "w"), Some(Error::InternalError(_))));
    }
}
