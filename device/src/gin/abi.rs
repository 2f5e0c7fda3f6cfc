//! The GIN proxy ABI: descriptor rings the GPU fills and a CPU progress
//! thread drains. Everything here is `#[repr(C)]` and pinned by the tests
//! at the bottom; `devcomm-gin` (the proxy) and `devcomm` (allocation) use
//! these definitions and no copies of their own.
//!
//! ## Memory
//!
//! | what | where | written by | read by |
//! |---|---|---|---|
//! | rings: `[context][peer][depth]` × [`GinDescriptor`] | host memory mapped into the GPU | GPU producers | proxy |
//! | tails: `[context][peer]` × [`QueueTail`] | host memory mapped into the GPU | proxy | GPU (credit, flush) |
//! | heads: `[context][peer]` × `u64` tickets | device memory | GPU (atomic add) | GPU |
//! | tail cache: `[context][peer]` × (`u64` tail, `u64` read stamp) | device memory | GPU | GPU |
//! | signals: `[signal_count]` × `u64` | host memory mapped into the GPU (shared between the processes of a host) | proxies (atomic add) | GPU |
//! | counters: `[counter_count]` × `u64` | host memory mapped into the GPU | own proxy | GPU |
//! | shadows: `[signal_count]` × `u64` | device memory | GPU | GPU |
//!
//! ## Protocol of one ring (one context, one peer)
//!
//! 1. A producer takes ticket `t` with an atomic add on `heads[q]` (lanes
//!    of a warp posting to one ring together take a range with one add).
//! 2. Credit: it may write slot `t % depth` only once `t < tail + depth`
//!    (`tail` = [`QueueTail::completed`]). While the ring is full it watches
//!    the tail cache in device memory; one waiter at a time (elected by the
//!    read stamp, at most every [`crate::gin::queue::TAIL_READ_INTERVAL_NS`])
//!    reads the tail itself and refreshes the cache; everyone backs off and
//!    watches the abort flag. Nothing is dropped.
//! 3. It writes the descriptor's body, then `ticket_plus_one = t + 1` with a
//!    release store at system scope: the slot is ready.
//! 4. The proxy serves tickets in order: it waits for slot `t % depth` to
//!    show `t + 1` and hands the operation to its transport, reading ahead
//!    (never past `completed + depth`) while earlier tickets are in flight.
//!    Once the transport has retired a ticket (its source read, its data
//!    delivered or handed off), the proxy applies the local action, then
//!    advances `completed` past it (release; once per ring per turn of the
//!    proxy). Completion in ticket order is what makes `flush` a wait for
//!    `completed >= head`.
//! 5. Remote actions (signals) are applied by the transport after the data
//!    they follow is visible at the destination.

/// Bytes of one descriptor.
pub const DESCRIPTOR_BYTES: usize = 64;
/// Stride of one [`QueueTail`] (its own cache-line pair, so proxies writing
/// neighbouring tails do not share lines).
pub const TAIL_STRIDE: usize = 128;

/// What a descriptor asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum GinOp {
    /// Copy `bytes` from the source window to the destination window of `peer`.
    Put = 1,
    /// Write the inline payload (carried in `src_offset`, its low `bytes` ≤ 8
    /// bytes, little-endian) into the destination window.
    PutValue = 2,
    /// Only the remote action (a signal), ordered after earlier operations.
    Signal = 3,
}

impl GinOp {
    /// Decodes a raw op byte.
    pub const fn from_u8(v: u8) -> Option<GinOp> {
        match v {
            1 => Some(GinOp::Put),
            2 => Some(GinOp::PutValue),
            3 => Some(GinOp::Signal),
            _ => None,
        }
    }
}

/// What happens at the destination once the data has landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RemoteActionKind {
    /// Nothing.
    None = 0,
    /// `signals[signal] += 1` on the peer.
    SignalInc = 1,
    /// `signals[signal] += value` on the peer.
    SignalAdd = 2,
}

impl RemoteActionKind {
    /// Decodes a raw byte.
    pub const fn from_u8(v: u8) -> Option<RemoteActionKind> {
        match v {
            0 => Some(RemoteActionKind::None),
            1 => Some(RemoteActionKind::SignalInc),
            2 => Some(RemoteActionKind::SignalAdd),
            _ => None,
        }
    }
}

/// What happens locally once the source has been read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum LocalActionKind {
    /// Nothing.
    None = 0,
    /// `counters[counter] += 1` on the caller's rank.
    CounterInc = 1,
}

impl LocalActionKind {
    /// Decodes a raw byte.
    pub const fn from_u8(v: u8) -> Option<LocalActionKind> {
        match v {
            0 => Some(LocalActionKind::None),
            1 => Some(LocalActionKind::CounterInc),
            _ => None,
        }
    }
}

/// Descriptor flag: the signal also orders earlier puts of this context to
/// this peer (always true of the proxy, which completes in order; recorded
/// so that transports that could reorder know what they must keep).
pub const FLAG_STRONG: u8 = 1;

/// One GPU → proxy request. 64 bytes, 64-byte aligned.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct GinDescriptor {
    /// Ticket + 1; written last, with release. 0: never written.
    pub ticket_plus_one: u64,
    /// [`GinOp`] as a byte.
    pub op: u8,
    /// [`RemoteActionKind`] as a byte.
    pub remote_action: u8,
    /// [`LocalActionKind`] as a byte.
    pub local_action: u8,
    /// `FLAG_*` bits.
    pub flags: u8,
    /// Destination world rank.
    pub peer: u32,
    /// Signal id of the remote action.
    pub signal: u32,
    /// Counter id of the local action.
    pub counter: u32,
    /// Window id (`WindowDesc::id`) of the source.
    pub src_window: u32,
    /// Window id of the destination.
    pub dst_window: u32,
    /// Byte offset in the source window (`Put`), or the inline payload (`PutValue`).
    pub src_offset: u64,
    /// Byte offset in the destination window.
    pub dst_offset: u64,
    /// Bytes to move (`PutValue`: 1..=8).
    pub bytes: u64,
    /// Signal increment of the remote action (1 for `SignalInc`).
    pub value: u64,
}

/// The proxy's progress on one ring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C, align(128))]
pub struct QueueTail {
    /// Tickets fully processed (sources read, local actions applied).
    pub completed: u64,
    /// Non-zero once the proxy has failed this ring (peer dead, transport
    /// error): producers and flushes give up instead of waiting for credit.
    pub error: u64,
}

/// The GIN backend a device communicator has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GinBackend {
    /// No GIN.
    None = 0,
    /// CPU progress thread serving descriptor rings.
    Proxy = 1,
    /// GPU-driven NIC queues (DOCA GPUNetIO / mlx5).
    Gdaki = 2,
    /// GPI.
    Gpi = 3,
}

/// What a kernel needs to issue GIN operations: addresses of the memory in
/// the module docs' table, and the sizes. Part of [`crate::comm::DevComm`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct GinState {
    /// [`GinBackend`] as a number (0: no GIN).
    pub backend: u32,
    /// 0 none, 1 full (every peer), 2 rail (the rail team only).
    pub connection: u32,
    /// Contexts (rings per peer).
    pub contexts: u32,
    /// Descriptors per ring, a power of two.
    pub queue_depth: u32,
    /// Signals available to the user (ids `0..signal_count`); barrier signals follow.
    pub signal_count: u32,
    /// Counters (ids `0..counter_count`).
    pub counter_count: u32,
    /// Rail GIN barriers (their signals follow the user's).
    pub rail_barrier_count: u32,
    /// World GIN barriers (their signals follow the rail barriers').
    pub world_barrier_count: u32,
    /// Rings, `[context][peer][depth]` descriptors.
    pub rings: u64,
    /// Tails, `[context][peer]` at [`TAIL_STRIDE`].
    pub tails: u64,
    /// Producer tickets, `[context][peer]` u64s (device memory).
    pub heads: u64,
    /// Tail caches, `[context][peer]` pairs of u64s (device memory): the
    /// highest tail a producer has read, and when (`%globaltimer`) one last
    /// went to read it ([`crate::gin::queue`] elects one reader at a time).
    pub tail_cache: u64,
    /// This rank's signals (`signal_count + barrier signals` u64s).
    pub signals: u64,
    /// This rank's counters.
    pub counters: u64,
    /// This rank's signal shadows (device memory, one per signal).
    pub shadows: u64,
}

impl GinState {
    /// Total signals: the user's plus one per GIN barrier.
    pub const fn total_signals(&self) -> u32 {
        self.signal_count + self.rail_barrier_count + self.world_barrier_count
    }

    /// Index of ring (context, peer) among `contexts * nranks` rings.
    pub const fn ring_index(&self, context: u32, peer: u32, nranks: u32) -> u64 {
        context as u64 * nranks as u64 + peer as u64
    }
}

// SAFETY: #[repr(C)] plain data, same layout on both targets (tests below).
unsafe impl crate::KernelParam for GinState {}

#[cfg(test)]
mod layout {
    use super::*;
    use core::mem::{align_of, offset_of, size_of};

    #[test]
    fn descriptor_layout() {
        assert_eq!(size_of::<GinDescriptor>(), DESCRIPTOR_BYTES);
        assert_eq!(align_of::<GinDescriptor>(), 64);
        assert_eq!(offset_of!(GinDescriptor, ticket_plus_one), 0);
        assert_eq!(offset_of!(GinDescriptor, op), 8);
        assert_eq!(offset_of!(GinDescriptor, remote_action), 9);
        assert_eq!(offset_of!(GinDescriptor, local_action), 10);
        assert_eq!(offset_of!(GinDescriptor, flags), 11);
        assert_eq!(offset_of!(GinDescriptor, peer), 12);
        assert_eq!(offset_of!(GinDescriptor, signal), 16);
        assert_eq!(offset_of!(GinDescriptor, counter), 20);
        assert_eq!(offset_of!(GinDescriptor, src_window), 24);
        assert_eq!(offset_of!(GinDescriptor, dst_window), 28);
        assert_eq!(offset_of!(GinDescriptor, src_offset), 32);
        assert_eq!(offset_of!(GinDescriptor, dst_offset), 40);
        assert_eq!(offset_of!(GinDescriptor, bytes), 48);
        assert_eq!(offset_of!(GinDescriptor, value), 56);
    }

    #[test]
    fn tail_and_state_layout() {
        assert_eq!(size_of::<QueueTail>(), TAIL_STRIDE);
        assert_eq!(offset_of!(QueueTail, error), 8);
        assert_eq!(size_of::<GinState>(), 88);
        assert_eq!(offset_of!(GinState, rings), 32);
        assert_eq!(offset_of!(GinState, shadows), 80);
    }

    #[test]
    fn enums_round_trip() {
        for op in [GinOp::Put, GinOp::PutValue, GinOp::Signal] {
            assert_eq!(GinOp::from_u8(op as u8), Some(op));
        }
        assert_eq!(GinOp::from_u8(0), None);
        for a in [RemoteActionKind::None, RemoteActionKind::SignalInc, RemoteActionKind::SignalAdd] {
            assert_eq!(RemoteActionKind::from_u8(a as u8), Some(a));
        }
        assert_eq!(RemoteActionKind::from_u8(9), None);
        assert_eq!(LocalActionKind::from_u8(1), Some(LocalActionKind::CounterInc));
        assert_eq!(LocalActionKind::from_u8(2), None);
    }
}
