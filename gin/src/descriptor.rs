//! Decoding of raw [`GinDescriptor`]s into validated [`Request`]s.
//!
//! A descriptor comes from a GPU kernel, so every byte of it is checked
//! before the proxy acts on it: an unknown op or action byte, an unknown flag
//! bit, a peer, signal or counter id out of range, or an inline put of a
//! size other than 1..=8 bytes is [`GinHostError::Invalid`]. Window ids and
//! ranges are checked later, by [`crate::LocalMemory::window_addr`] on the
//! rank that owns the window.

use crate::{GinDescriptor, GinHostError, GinOp, GinResult, LocalActionKind, RemoteActionKind};
use devcomm_device::abi::gin::FLAG_STRONG;

/// A remote action: `(signal id, increment)` applied on the destination
/// rank after the data of the operation has landed there.
pub type RemoteSignal = (u32, u64);

/// A validated GIN request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// Copy `bytes` from this rank's `src_window` to `peer`'s `dst_window`.
    Put {
        /// Destination world rank.
        peer: u32,
        /// Source window id.
        src_window: u32,
        /// Byte offset in the source window.
        src_offset: u64,
        /// Destination window id.
        dst_window: u32,
        /// Byte offset in the destination window.
        dst_offset: u64,
        /// Bytes to copy.
        bytes: u64,
        /// Signal applied at `peer` after the data.
        remote: Option<RemoteSignal>,
        /// Counter incremented here once the source has been read.
        local: Option<u32>,
    },
    /// Write `payload[..len]` to `peer`'s `dst_window`.
    PutValue {
        /// Destination world rank.
        peer: u32,
        /// Destination window id.
        dst_window: u32,
        /// Byte offset in the destination window.
        dst_offset: u64,
        /// Inline payload, little-endian; bytes past `len` are zero.
        payload: [u8; 8],
        /// Payload bytes, 1..=8.
        len: u8,
        /// Signal applied at `peer` after the data.
        remote: Option<RemoteSignal>,
        /// Counter incremented here once posted.
        local: Option<u32>,
    },
    /// Copy `bytes` from `peer`'s `src_window` into this rank's `dst_window`.
    Get {
        /// Source world rank.
        peer: u32,
        /// Source window id (on `peer`).
        src_window: u32,
        /// Byte offset in the source window.
        src_offset: u64,
        /// Destination window id (here).
        dst_window: u32,
        /// Byte offset in the destination window.
        dst_offset: u64,
        /// Bytes to copy.
        bytes: u64,
        /// Counter incremented here once the data has landed.
        local: Option<u32>,
    },
    /// Only a signal (or nothing: a no-op that still completes in order).
    Signal {
        /// Destination world rank.
        peer: u32,
        /// Signal applied at `peer` after every earlier operation of the ring.
        remote: Option<RemoteSignal>,
        /// Counter incremented here once processed.
        local: Option<u32>,
    },
}

impl Request {
    /// Destination world rank.
    pub fn peer(&self) -> u32 {
        match *self {
            Request::Put { peer, .. }
            | Request::PutValue { peer, .. }
            | Request::Get { peer, .. }
            | Request::Signal { peer, .. } => peer,
        }
    }

    /// The remote action.
    pub fn remote(&self) -> Option<RemoteSignal> {
        match *self {
            Request::Put { remote, .. } | Request::PutValue { remote, .. } | Request::Signal { remote, .. } => remote,
            Request::Get { .. } => None,
        }
    }

    /// The local action's counter.
    pub fn local(&self) -> Option<u32> {
        match *self {
            Request::Put { local, .. }
            | Request::PutValue { local, .. }
            | Request::Get { local, .. }
            | Request::Signal { local, .. } => local,
        }
    }
}

/// The ranges descriptors are checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Ranks: a peer must be below.
    pub nranks: u32,
    /// Signals: a signal id must be below.
    pub total_signals: u32,
    /// Counters: a counter id must be below.
    pub counters: u32,
}

fn invalid<T>(msg: String) -> GinResult<T> {
    Err(GinHostError::Invalid(msg))
}

/// Decodes and validates `d`.
pub fn decode(d: &GinDescriptor, limits: &Limits) -> GinResult<Request> {
    let Some(op) = GinOp::from_u8(d.op) else {
        return invalid(format!("unknown op {}", d.op));
    };
    if d.flags & !FLAG_STRONG != 0 {
        return invalid(format!("unknown flags {:#x}", d.flags));
    }
    if d.peer >= limits.nranks {
        return invalid(format!("peer {} out of range (nranks {})", d.peer, limits.nranks));
    }
    let remote = match RemoteActionKind::from_u8(d.remote_action) {
        None => return invalid(format!("unknown remote action {}", d.remote_action)),
        Some(RemoteActionKind::None) => None,
        Some(kind) => {
            if d.signal >= limits.total_signals {
                return invalid(format!("signal {} out of range ({} signals)", d.signal, limits.total_signals));
            }
            Some((d.signal, if kind == RemoteActionKind::SignalInc { 1 } else { d.value }))
        }
    };
    let local = match LocalActionKind::from_u8(d.local_action) {
        None => return invalid(format!("unknown local action {}", d.local_action)),
        Some(LocalActionKind::None) => None,
        Some(LocalActionKind::CounterInc) => {
            if d.counter >= limits.counters {
                return invalid(format!("counter {} out of range ({} counters)", d.counter, limits.counters));
            }
            Some(d.counter)
        }
    };
    let peer = d.peer;
    if op == GinOp::Get && remote.is_some() {
        return invalid("a get carries no remote action".to_string());
    }
    if matches!(op, GinOp::Put | GinOp::Get)
        && (d.src_offset.checked_add(d.bytes).is_none() || d.dst_offset.checked_add(d.bytes).is_none())
    {
        return invalid(format!("put of {} bytes at {} -> {} overflows", d.bytes, d.src_offset, d.dst_offset));
    }
    Ok(match op {
        GinOp::Put => Request::Put {
            peer,
            src_window: d.src_window,
            src_offset: d.src_offset,
            dst_window: d.dst_window,
            dst_offset: d.dst_offset,
            bytes: d.bytes,
            remote,
            local,
        },
        GinOp::PutValue => {
            if !(1..=8).contains(&d.bytes) {
                return invalid(format!("inline put of {} bytes (1..=8)", d.bytes));
            }
            let mut payload = d.src_offset.to_le_bytes();
            payload[d.bytes as usize..].fill(0);
            Request::PutValue {
                peer,
                dst_window: d.dst_window,
                dst_offset: d.dst_offset,
                payload,
                len: d.bytes as u8,
                remote,
                local,
            }
        }
        GinOp::Get => Request::Get {
            peer,
            src_window: d.src_window,
            src_offset: d.src_offset,
            dst_window: d.dst_window,
            dst_offset: d.dst_offset,
            bytes: d.bytes,
            local,
        },
        GinOp::Signal => Request::Signal { peer, remote, local },
    })
}

/// Encodes `r` as a descriptor (ticket 0) the way the device API does:
/// a remote increment of 1 becomes `SignalInc`, others `SignalAdd`, and
/// remote actions are marked strong.
pub fn encode(r: &Request) -> GinDescriptor {
    let mut d = GinDescriptor { peer: r.peer(), ..Default::default() };
    if let Some((signal, value)) = r.remote() {
        d.signal = signal;
        d.value = value;
        d.flags = FLAG_STRONG;
        d.remote_action =
            if value == 1 { RemoteActionKind::SignalInc as u8 } else { RemoteActionKind::SignalAdd as u8 };
    }
    if let Some(counter) = r.local() {
        d.counter = counter;
        d.local_action = LocalActionKind::CounterInc as u8;
    }
    match *r {
        Request::Put { src_window, src_offset, dst_window, dst_offset, bytes, .. } => {
            d.op = GinOp::Put as u8;
            d.src_window = src_window;
            d.src_offset = src_offset;
            d.dst_window = dst_window;
            d.dst_offset = dst_offset;
            d.bytes = bytes;
        }
        Request::PutValue { dst_window, dst_offset, payload, len, .. } => {
            d.op = GinOp::PutValue as u8;
            d.dst_window = dst_window;
            d.dst_offset = dst_offset;
            let mut p = [0u8; 8];
            let n = (len as usize).min(8);
            p[..n].copy_from_slice(&payload[..n]);
            d.src_offset = u64::from_le_bytes(p);
            d.bytes = len as u64;
        }
        Request::Get { src_window, src_offset, dst_window, dst_offset, bytes, .. } => {
            d.op = GinOp::Get as u8;
            d.src_window = src_window;
            d.src_offset = src_offset;
            d.dst_window = dst_window;
            d.dst_offset = dst_offset;
            d.bytes = bytes;
        }
        Request::Signal { .. } => d.op = GinOp::Signal as u8,
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LIMITS: Limits = Limits { nranks: 8, total_signals: 16, counters: 4 };

    fn remote() -> impl Strategy<Value = Option<RemoteSignal>> {
        proptest::option::of((0..LIMITS.total_signals, any::<u64>()))
    }

    fn local() -> impl Strategy<Value = Option<u32>> {
        proptest::option::of(0..LIMITS.counters)
    }

    fn request() -> impl Strategy<Value = Request> {
        let put = (
            0..LIMITS.nranks,
            any::<u32>(),
            0..1u64 << 62,
            any::<u32>(),
            0..1u64 << 62,
            0..1u64 << 62,
            remote(),
            local(),
        )
            .prop_map(|(peer, src_window, src_offset, dst_window, dst_offset, bytes, remote, local)| {
                Request::Put { peer, src_window, src_offset, dst_window, dst_offset, bytes, remote, local }
            });
        let value = (0..LIMITS.nranks, any::<u32>(), any::<u64>(), any::<[u8; 8]>(), 1u8..=8, remote(), local())
            .prop_map(|(peer, dst_window, dst_offset, mut payload, len, remote, local)| {
                payload[len as usize..].fill(0);
                Request::PutValue { peer, dst_window, dst_offset, payload, len, remote, local }
            });
        let signal = (0..LIMITS.nranks, remote(), local()).prop_map(|(peer, remote, local)| Request::Signal {
            peer,
            remote,
            local,
        });
        let get = (0..LIMITS.nranks, any::<u32>(), 0..1u64 << 62, any::<u32>(), 0..1u64 << 62, 0..1u64 << 62, local())
            .prop_map(|(peer, src_window, src_offset, dst_window, dst_offset, bytes, local)| Request::Get {
                peer,
                src_window,
                src_offset,
                dst_window,
                dst_offset,
                bytes,
                local,
            });
        prop_oneof![put, value, signal, get]
    }

    proptest! {
        #[test]
        fn round_trip(r in request()) {
            prop_assert_eq!(decode(&encode(&r), &LIMITS), Ok(r));
        }

        #[test]
        fn slot_round_trip(r in request(), ticket in any::<u64>(), depth_log in 0u32..16) {
            // Through the ring's wire form (tagged words) and back.
            let depth = 1u32 << depth_log;
            let d = encode(&r);
            let tag = crate::slot_tag(ticket, depth);
            let slot = crate::GinSlot::encode(&d, tag);
            prop_assert_eq!(crate::GinSlot::decode(&slot.words, tag), Some(d));
            prop_assert_eq!(crate::GinSlot::decode(&slot.words, crate::slot_tag(ticket.wrapping_add(depth as u64), depth)), None);
        }

        #[test]
        fn slot_words_of_two_laps_never_decode(
            a in any::<[u64; 7]>(), b in any::<[u64; 7]>(), mix in 1u8..255, ticket in any::<u64>(),
        ) {
            // A slot half rewritten (some words of the next lap) is not complete.
            let depth = 4u32;
            let (old, new) = (crate::slot_tag(ticket, depth), crate::slot_tag(ticket.wrapping_add(4), depth));
            let x = crate::GinSlot::encode(&GinDescriptor::from_words(a), old);
            let y = crate::GinSlot::encode(&GinDescriptor::from_words(b), new);
            let words: [u64; 8] = core::array::from_fn(|i| if mix >> i & 1 == 1 { y.words[i] } else { x.words[i] });
            prop_assert_eq!(crate::GinSlot::decode(&words, new), None);
            prop_assert_eq!(crate::GinSlot::decode(&words, old), None);
        }

        #[test]
        fn arbitrary_bytes_never_panic(raw in any::<[u64; 7]>()) {
            let d = GinDescriptor::from_words(raw);
            match decode(&d, &LIMITS) {
                Ok(r) => prop_assert_eq!(r.peer(), d.peer),
                Err(e) => prop_assert!(matches!(e, GinHostError::Invalid(_))),
            }
        }

        #[test]
        fn near_valid_never_panic(r in request(), field in 0usize..8, v in any::<u64>()) {
            let mut d = encode(&r);
            match field {
                0 => d.op = v as u8,
                1 => d.remote_action = v as u8,
                2 => d.local_action = v as u8,
                3 => d.peer = v as u32,
                4 => d.signal = v as u32,
                5 => d.counter = v as u32,
                6 => d.bytes = v,
                _ => d.flags = v as u8,
            }
            if let Err(e) = decode(&d, &LIMITS) {
                prop_assert!(matches!(e, GinHostError::Invalid(_)));
            }
        }
    }

    #[test]
    fn rejects() {
        let ok = encode(&Request::Signal { peer: 1, remote: Some((3, 1)), local: Some(0) });
        assert!(decode(&ok, &LIMITS).is_ok());
        for bad in [
            GinDescriptor { op: 0, ..ok },
            GinDescriptor { op: 5, ..ok },
            GinDescriptor { op: GinOp::Get as u8, ..ok }, // a get with a remote action
            GinDescriptor { op: GinOp::Get as u8, remote_action: 0, bytes: u64::MAX, src_offset: 1, ..ok },
            GinDescriptor { peer: 8, ..ok },
            GinDescriptor { signal: 16, ..ok },
            GinDescriptor { counter: 4, ..ok },
            GinDescriptor { remote_action: 3, ..ok },
            GinDescriptor { local_action: 2, ..ok },
            GinDescriptor { flags: 2, ..ok },
            GinDescriptor { op: GinOp::PutValue as u8, bytes: 0, ..ok },
            GinDescriptor { op: GinOp::PutValue as u8, bytes: 9, ..ok },
            GinDescriptor { op: GinOp::Put as u8, bytes: 2, dst_offset: u64::MAX, ..ok },
            GinDescriptor { op: GinOp::Put as u8, bytes: u64::MAX, src_offset: 1, ..ok },
        ] {
            assert!(matches!(decode(&bad, &LIMITS), Err(GinHostError::Invalid(_))), "{bad:?}");
        }
        // SignalInc always adds 1, whatever `value` holds.
        let inc = GinDescriptor { value: 77, ..ok };
        assert_eq!(decode(&inc, &LIMITS).unwrap().remote(), Some((3, 1)));
    }
}
