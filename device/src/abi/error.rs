//! The one table of error codes kernels report (0 is "no error"); the host
//! crate turns them into `devcomm::Error` (`Error::from_device_code`), the
//! device API's error types convert through them ([`crate::error::ErrorCode`]).

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
    /// A collective's part is not below the context's part count.
    CollPartOutOfRange = 48,
    /// A collective's message does not fit the algorithm's scratch (LL).
    CollTooLarge = 49,
    /// A collective's datatype, operator, root or algorithm code is invalid.
    CollBadArgument = 50,
    /// A receive's byte count differs from the matching send's.
    CollCountMismatch = 51,
    /// A token's top-k names an expert id not below the group's expert count.
    MoeBadExpert = 64,
    /// MoE count or flag words out of step (ranks ran different sequences
    /// of dispatch and combine, or a count above the group's maximum).
    MoeOutOfStep = 65,
    /// MoE arguments a kernel cannot use (token count above the maximum,
    /// shapes the context does not hold).
    MoeBadArgument = 66,
}

impl DeviceError {
    /// Every code, in order.
    pub const ALL: [DeviceError; 20] = [
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
        DeviceError::CollPartOutOfRange,
        DeviceError::CollTooLarge,
        DeviceError::CollBadArgument,
        DeviceError::CollCountMismatch,
        DeviceError::MoeBadExpert,
        DeviceError::MoeOutOfStep,
        DeviceError::MoeBadArgument,
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
            DeviceError::CollPartOutOfRange => "collective part (CTA) index or count beyond the context's parts",
            DeviceError::CollTooLarge => "collective message larger than the LL slots of the context",
            DeviceError::CollBadArgument => "collective datatype, operator, root or algorithm code invalid",
            DeviceError::CollCountMismatch => "a receive's byte count differs from the matching send's",
            DeviceError::MoeBadExpert => "a top-k expert id is not below the expert-parallel group's expert count",
            DeviceError::MoeOutOfStep => {
                "MoE dispatch/combine out of step across ranks (different call sequences, or a count above max_tokens)"
            }
            DeviceError::MoeBadArgument => "MoE arguments outside the group's shapes (tokens above max_tokens)",
        }
    }
}
