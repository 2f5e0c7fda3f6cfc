//! The device API's error codes: one table for every error a kernel can
//! report, and the conversion every error type makes to and from it.
//!
//! Kernels report failures as `u32` codes (in error words the host reads,
//! and between the threads of a coop: [`crate::coop::Coop::agree`]). The
//! codes are the discriminants of [`DeviceError`]; the error types of the
//! API ([`WaitError`], [`QueueError`], [`BarrierError`], [`GinError`])
//! convert through it.

pub use crate::abi::error::DeviceError;
use crate::gin::proxy::QueueError;
use crate::gin::GinError;
use crate::lsa::BarrierError;
use crate::wait::WaitError;

/// An error type of the device API: it has a [`DeviceError`] code and comes
/// back from one. Codes another type reports map to that type's nearest
/// error (only a code of the same type reaches it through
/// [`crate::coop::Coop::agree`], since every thread of a coop makes the same call).
pub trait ErrorCode: Copy {
    /// The non-zero code.
    fn code(self) -> u32;
    /// The error a code stands for.
    fn from_code(code: u32) -> Self;
}

impl ErrorCode for WaitError {
    fn code(self) -> u32 {
        WaitError::code(self)
    }
    fn from_code(code: u32) -> Self {
        if code == DeviceError::Aborted as u32 {
            WaitError::Aborted
        } else {
            WaitError::Timeout
        }
    }
}

impl ErrorCode for QueueError {
    fn code(self) -> u32 {
        match self {
            QueueError::RingFailed => DeviceError::RingFailed as u32,
            QueueError::Wait(w) => w.code(),
        }
    }
    fn from_code(code: u32) -> Self {
        match DeviceError::from_code(code) {
            Some(DeviceError::Timeout) => QueueError::Wait(WaitError::Timeout),
            Some(DeviceError::Aborted) => QueueError::Wait(WaitError::Aborted),
            _ => QueueError::RingFailed,
        }
    }
}

impl ErrorCode for BarrierError {
    fn code(self) -> u32 {
        BarrierError::code(self)
    }
    fn from_code(code: u32) -> Self {
        match DeviceError::from_code(code) {
            Some(DeviceError::LsaBarrierOutOfRange) => BarrierError::IndexOutOfRange,
            _ => BarrierError::Wait(WaitError::from_code(code)),
        }
    }
}

impl ErrorCode for GinError {
    fn code(self) -> u32 {
        GinError::code(self)
    }
    fn from_code(code: u32) -> Self {
        match DeviceError::from_code(code) {
            Some(DeviceError::NoGin) => GinError::NoGin,
            Some(DeviceError::ContextOutOfRange) => GinError::ContextOutOfRange,
            Some(DeviceError::PeerNotInTeam) => GinError::PeerNotInTeam,
            Some(DeviceError::PeerNotConnected) => GinError::PeerNotConnected,
            Some(DeviceError::SignalOutOfRange) => GinError::SignalOutOfRange,
            Some(DeviceError::CounterOutOfRange) => GinError::CounterOutOfRange,
            Some(DeviceError::OutOfWindow) => GinError::OutOfWindow,
            Some(DeviceError::ValueTooWide) => GinError::ValueTooWide,
            Some(DeviceError::GinBarrierOutOfRange) | Some(DeviceError::LsaBarrierOutOfRange) => {
                GinError::BarrierOutOfRange
            }
            _ => GinError::Queue(QueueError::from_code(code)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_round_trips_through_its_code() {
        for d in DeviceError::ALL {
            assert_eq!(DeviceError::from_code(d.code()), Some(d));
            assert!(!d.message().is_empty());
        }
        assert_eq!(DeviceError::from_code(0), None);
        for w in [WaitError::Timeout, WaitError::Aborted] {
            assert_eq!(<WaitError as ErrorCode>::from_code(ErrorCode::code(w)), w);
            let q = QueueError::Wait(w);
            assert_eq!(<QueueError as ErrorCode>::from_code(ErrorCode::code(q)), q);
            let b = BarrierError::Wait(w);
            assert_eq!(<BarrierError as ErrorCode>::from_code(ErrorCode::code(b)), b);
        }
        let b = BarrierError::IndexOutOfRange;
        assert_eq!(<BarrierError as ErrorCode>::from_code(ErrorCode::code(b)), b);
        for g in [
            GinError::NoGin,
            GinError::ContextOutOfRange,
            GinError::PeerNotInTeam,
            GinError::PeerNotConnected,
            GinError::SignalOutOfRange,
            GinError::CounterOutOfRange,
            GinError::OutOfWindow,
            GinError::ValueTooWide,
            GinError::BarrierOutOfRange,
            GinError::Queue(QueueError::RingFailed),
            GinError::Queue(QueueError::Wait(WaitError::Timeout)),
            GinError::Queue(QueueError::Wait(WaitError::Aborted)),
        ] {
            let c = ErrorCode::code(g);
            assert!(DeviceError::from_code(c).is_some(), "{g:?} has code {c}, not in the table");
            assert_eq!(<GinError as ErrorCode>::from_code(c), g);
        }
    }
}
