//! The device API's error codes: one table for every error a kernel can
//! report, and the conversion every error type makes to and from it.
//!
//! Kernels report failures as `u32` codes (in error words the host reads,
//! and between the threads of a coop: [`crate::coop::Coop::agree`]). The
//! codes are the discriminants of [`DeviceError`]; the error types of the
//! API ([`WaitError`], [`QueueError`], [`BarrierError`], [`GinError`])
//! convert through it.

use crate::gin::queue::QueueError;
use crate::gin::GinError;
use crate::lsa::BarrierError;
use crate::wait::WaitError;

/// Every failure a device-API call can report, by code (0 is "no error").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum DeviceError {
    /// A wait's deadline passed.
    Timeout = 1,
    /// The host raised the communicator's abort flag.
    Aborted = 2,
    /// The GIN proxy marked a ring failed (dead peer, transport error).
    RingFailed = 3,
    /// An LSA barrier index is not below `lsa_barrier_count`.
    LsaBarrierOutOfRange = 16,
    /// The device communicator has no GIN backend.
    NoGin = 32,
    /// A GIN context id is not below the context count.
    ContextOutOfRange = 33,
    /// A peer index is not below its team's size.
    PeerNotInTeam = 34,
    /// The peer is not reachable with this GIN connection type.
    PeerNotConnected = 35,
    /// A GIN signal id is out of range.
    SignalOutOfRange = 36,
    /// A GIN counter id is out of range.
    CounterOutOfRange = 37,
    /// Offset + bytes past a window's end.
    OutOfWindow = 38,
    /// `put_value` of a type wider than 8 bytes.
    ValueTooWide = 39,
    /// A GIN barrier index is out of range.
    GinBarrierOutOfRange = 40,
}

impl DeviceError {
    /// Every code, in order.
    pub const ALL: [DeviceError; 13] = [
        DeviceError::Timeout,
        DeviceError::Aborted,
        DeviceError::RingFailed,
        DeviceError::LsaBarrierOutOfRange,
        DeviceError::NoGin,
        DeviceError::ContextOutOfRange,
        DeviceError::PeerNotInTeam,
        DeviceError::PeerNotConnected,
        DeviceError::SignalOutOfRange,
        DeviceError::CounterOutOfRange,
        DeviceError::OutOfWindow,
        DeviceError::ValueTooWide,
        DeviceError::GinBarrierOutOfRange,
    ];

    /// The code kernels report.
    #[inline(always)]
    pub const fn code(self) -> u32 {
        self as u32
    }

    /// The error with this code, if any.
    pub const fn from_code(code: u32) -> Option<DeviceError> {
        let mut i = 0;
        while i < Self::ALL.len() {
            if Self::ALL[i] as u32 == code {
                return Some(Self::ALL[i]);
            }
            i += 1;
        }
        None
    }

    /// What happened, in a few words (the host's error messages use it).
    pub const fn message(self) -> &'static str {
        match self {
            DeviceError::Timeout => "a device wait timed out",
            DeviceError::Aborted => "the communicator was aborted while a kernel waited",
            DeviceError::RingFailed => "the GIN proxy failed an operation (dead peer or transport error)",
            DeviceError::LsaBarrierOutOfRange => "LSA barrier index not below lsa_barrier_count",
            DeviceError::NoGin => "the device communicator has no GIN backend (gin_connection_type None)",
            DeviceError::ContextOutOfRange => "GIN context id not below gin_context_count",
            DeviceError::PeerNotInTeam => "peer index not below the team's size",
            DeviceError::PeerNotConnected => "peer not reachable with this GIN connection type",
            DeviceError::SignalOutOfRange => "GIN signal id not below gin_signal_count",
            DeviceError::CounterOutOfRange => "GIN counter id not below gin_counter_count",
            DeviceError::OutOfWindow => "offset + bytes past the window's end (or a window not in use_window)",
            DeviceError::ValueTooWide => "put_value of a type wider than 8 bytes",
            DeviceError::GinBarrierOutOfRange => "GIN barrier index out of range",
        }
    }
}

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
