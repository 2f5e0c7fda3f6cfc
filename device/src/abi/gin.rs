//! The GIN proxy ABI: descriptor rings the GPU fills and a CPU progress
//! thread drains. Everything here is `#[repr(C)]` and pinned by the tests
//! at the bottom; `devcomm-gin` (the proxy) and `devcomm` (allocation) use
//! these definitions and no copies of their own.
//!
//! ## Memory
//!
//! | what | where | written by | read by |
//! |---|---|---|---|
//! | rings: `[context][peer][depth]` × [`GinSlot`] | host memory mapped into the GPU | GPU producers | proxy |
//! | tails: `[context][peer]` × [`QueueTail`] | host memory mapped into the GPU | proxy (`abandoned`: GPU, on failure only) | GPU (credit, flush); proxy (`abandoned`) |
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
//!    read stamp, at most every [`crate::gin::proxy::TAIL_READ_INTERVAL_NS`])
//!    reads the tail itself and refreshes the cache; everyone backs off and
//!    watches the abort flag. Nothing is dropped. A producer whose credit
//!    wait fails (timeout, abort, failed ring) holds a ticket it cannot
//!    write: it records it in [`QueueTail::abandoned`] and marks the tail
//!    cache failed, so that the proxy fails the ring when it reaches the
//!    hole (instead of waiting for it forever) and every later wait or
//!    flush on the ring ends with an error at once.
//! 3. It writes the slot: the descriptor's 56 bytes spread over eight
//!    8-byte words, each word's high byte a *tag* naming the ring's lap
//!    ([`slot_tag`]), with plain relaxed system-scope stores — no fence
//!    after them. Each 8-byte word is single-copy atomic, so a slot whose
//!    eight tags all read the lap of ticket `t` holds all of `t`'s body
//!    (the previous lap's tag differs; later laps cannot be written before
//!    `t` completes). A put first fences at system scope
//!    (`fence.acq_rel.sys`), so the source data the caller wrote is
//!    visible before the proxy can see the descriptor; put-value and
//!    signal carry everything in the slot and need no fence.
//! 4. The proxy serves tickets in order: it waits for slot `t % depth` to
//!    show `t`'s tag in all eight words and hands the operation to its transport, reading ahead
//!    (never past `completed + depth`) while earlier tickets are in flight.
//!    Once the transport has retired a ticket (its source read, its data
//!    delivered or handed off), the proxy applies the local action, then
//!    advances `completed` past it (release; once per ring per turn of the
//!    proxy). Completion in ticket order is what makes `flush` a wait for
//!    `completed >= head`.
//! 5. Remote actions (signals) are applied by the transport after the data
//!    they follow is visible at the destination.
//! 6. A get ([`GinOp::Get`]) reads the peer's window and lands the bytes in
//!    this rank's window; its ticket completes (and its counter, if any,
//!    counts) only once they are visible here.

/// Bytes of one descriptor ([`GinDescriptor`]).
pub const DESCRIPTOR_BYTES: usize = 56;
/// Bytes of one ring slot ([`GinSlot`]): the descriptor plus one tag byte
/// per 8-byte word.
pub const SLOT_BYTES: usize = 64;
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
    /// Copy `bytes` from `peer`'s source window (`src_window` at
    /// `src_offset`) into this rank's destination window (`dst_window` at
    /// `dst_offset`). No remote action; the local action and the ticket's
    /// completion follow once the data has landed here, so a flush or a
    /// counter wait that covers it means the data is visible.
    Get = 4,
}

impl GinOp {
    /// Decodes a raw op byte.
    pub const fn from_u8(v: u8) -> Option<GinOp> {
        match v {
            1 => Some(GinOp::Put),
            2 => Some(GinOp::PutValue),
            3 => Some(GinOp::Signal),
            4 => Some(GinOp::Get),
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

/// One GPU → proxy request: 56 bytes of plain integers (every bit pattern
/// is a value; the proxy validates it). It travels in a [`GinSlot`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C, align(8))]
pub struct GinDescriptor {
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

/// Words of a [`GinDescriptor`].
const BODY_WORDS: usize = DESCRIPTOR_BYTES / 8;
/// Bits of a slot word that carry the body (the high byte is the tag).
const CHUNK_BITS: u32 = 56;
const CHUNK_MASK: u64 = (1 << CHUNK_BITS) - 1;

/// The tag of ticket `ticket` in a ring of `depth` slots (a power of two):
/// `0x80 | lap % 128`, where `lap = ticket / depth`. Never 0 (fresh, zeroed
/// memory matches no ticket) and different for consecutive laps, which is
/// all the protocol needs: a slot holds ticket `t`'s words or those of
/// `t - depth` (completed before `t` could be written).
#[inline(always)]
pub const fn slot_tag(ticket: u64, depth: u32) -> u8 {
    0x80 | ((ticket >> depth.trailing_zeros()) & 0x7f) as u8
}

/// A ring slot as written to host memory: the 56 bytes of a
/// [`GinDescriptor`] cut into eight 7-byte chunks, chunk `i` in the low 56
/// bits of `words[i]` and the ticket's [`slot_tag`] in its high byte.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct GinSlot {
    /// Tagged words.
    pub words: [u64; 8],
}

impl GinDescriptor {
    /// The descriptor as seven little-endian words (its memory image).
    #[inline(always)]
    pub fn to_words(&self) -> [u64; BODY_WORDS] {
        // SAFETY: GinDescriptor is repr(C), 56 bytes of integers without
        // padding (layout tests), so its image is seven initialised u64s.
        unsafe { core::mem::transmute::<GinDescriptor, [u64; BODY_WORDS]>(*self) }
    }

    /// The descriptor whose memory image is `w`.
    #[inline(always)]
    pub fn from_words(w: [u64; BODY_WORDS]) -> GinDescriptor {
        // SAFETY: same size; every field is an integer, so every bit
        // pattern is a valid GinDescriptor.
        unsafe { core::mem::transmute::<[u64; BODY_WORDS], GinDescriptor>(w) }
    }
}

impl GinSlot {
    /// `body` tagged with `tag`: word `i` holds bits `56 i .. 56 i + 56` of
    /// the body's 448 bits.
    #[inline(always)]
    pub fn encode(body: &GinDescriptor, tag: u8) -> GinSlot {
        let b = body.to_words();
        let t = (tag as u64) << CHUNK_BITS;
        let mut words = [0u64; 8];
        words[0] = (b[0] & CHUNK_MASK) | t;
        let mut i = 1;
        while i < 8 {
            let lo = b[i - 1] >> (64 - 8 * i as u32);
            let hi = if i < BODY_WORDS { b[i] << (8 * i as u32) } else { 0 };
            words[i] = ((lo | hi) & CHUNK_MASK) | t;
            i += 1;
        }
        GinSlot { words }
    }

    /// The body, if every word carries `tag` (else the slot is not yet, or
    /// not completely, written for that ticket).
    #[inline(always)]
    pub fn decode(words: &[u64; 8], tag: u8) -> Option<GinDescriptor> {
        let mut i = 0;
        while i < 8 {
            if (words[i] >> CHUNK_BITS) as u8 != tag {
                return None;
            }
            i += 1;
        }
        let c = |i: usize| words[i] & CHUNK_MASK;
        let mut b = [0u64; BODY_WORDS];
        let mut k = 0;
        while k < BODY_WORDS {
            b[k] = (c(k) >> (8 * k as u32)) | (c(k + 1) << (CHUNK_BITS - 8 * k as u32));
            k += 1;
        }
        Some(GinDescriptor::from_words(b))
    }
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
    /// Written by a GPU producer, never by the proxy: non-zero
    /// ([`abandon_word`]) once a producer took a ticket and then gave up
    /// before writing its slot (its wait for credit timed out, was aborted
    /// or found the ring failed). The proxy serves tickets in order, so it
    /// can never get past that hole: when it finds the next slot empty and
    /// this word set, it fails the ring (and reports why) instead of
    /// waiting for a descriptor that never comes.
    pub abandoned: u64,
}

/// Cause of an abandoned ticket ([`QueueTail::abandoned`]): the credit wait timed out.
pub const ABANDON_TIMEOUT: u64 = 1;
/// Cause of an abandoned ticket: the credit wait saw the abort flag.
pub const ABANDON_ABORTED: u64 = 2;
/// Cause of an abandoned ticket: the credit wait found the ring failed.
pub const ABANDON_RING_FAILED: u64 = 3;

/// The [`QueueTail::abandoned`] word of ticket `ticket` given up for
/// `cause` (`ABANDON_*`): `(ticket + 1) << 2 | cause`, never 0.
#[inline(always)]
pub const fn abandon_word(ticket: u64, cause: u64) -> u64 {
    (ticket.wrapping_add(1) << 2) | (cause & 3)
}

/// The (ticket, cause) an [`abandon_word`] names; `None` for 0 (nothing
/// abandoned). With several producers giving up, the word holds the last
/// one's ticket, not necessarily the lowest.
#[inline(always)]
pub const fn abandoned_ticket(word: u64) -> Option<(u64, u64)> {
    if word == 0 {
        None
    } else {
        Some(((word >> 2).wrapping_sub(1), word & 3))
    }
}

/// The GIN backend a device communicator has.
#[doc(alias = "ncclGinType_t")]
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

/// Which peers a device communicator's GIN reaches (`ncclGinConnectionType`),
/// as [`GinState`] carries it; the host's `devcomm::gin::GinConnectionType`
/// converts to it.
#[doc(alias = "ncclGinConnectionType_t")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GinConnection {
    /// No GIN.
    None = 0,
    /// Every rank.
    Full = 1,
    /// The rail team only (same LSA index on every node).
    Rail = 2,
}

/// What a kernel needs to issue GIN operations: addresses of the memory in
/// the module docs' table, and the sizes. Part of [`crate::comm::DevComm`].
/// Made by the host crate from [`GinStateParts`] ([`GinState::from_parts`]);
/// private fields, so that safe code cannot aim GIN at the wrong memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct GinState {
    /// [`GinBackend`] as a number (0: no GIN).
    pub(crate) backend: u32,
    /// [`GinConnection`] as a number.
    pub(crate) connection: u32,
    /// Contexts (rings per peer).
    pub(crate) contexts: u32,
    /// Descriptors per ring, a power of two.
    pub(crate) queue_depth: u32,
    /// Signals available to the user (ids `0..signal_count`); barrier signals follow.
    pub(crate) signal_count: u32,
    /// Counters (ids `0..counter_count`).
    pub(crate) counter_count: u32,
    /// Rail GIN barriers (their signals follow the user's).
    pub(crate) rail_barrier_count: u32,
    /// World GIN barriers (their signals follow the rail barriers').
    pub(crate) world_barrier_count: u32,
    /// Rings, `[context][peer][depth]` [`GinSlot`]s.
    pub(crate) rings: u64,
    /// Tails, `[context][peer]` at [`TAIL_STRIDE`].
    pub(crate) tails: u64,
    /// Producer tickets, `[context][peer]` u64s (device memory).
    pub(crate) heads: u64,
    /// Tail caches, `[context][peer]` pairs of u64s (device memory): the
    /// highest tail a producer has read, and when (`%globaltimer`) one last
    /// went to read it ([`crate::gin::proxy`] elects one reader at a time).
    pub(crate) tail_cache: u64,
    /// This rank's signals (`signal_count + barrier signals` u64s).
    pub(crate) signals: u64,
    /// This rank's counters.
    pub(crate) counters: u64,
    /// This rank's signal shadows (device memory, one per signal).
    pub(crate) shadows: u64,
}

/// The fields of a [`GinState`], for the host crate that builds one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GinStateParts {
    /// [`GinBackend`] as a number (0: no GIN).
    pub backend: u32,
    /// [`GinConnection`] as a number.
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
    /// Rings, `[context][peer][depth]` [`GinSlot`]s.
    pub rings: u64,
    /// Tails, `[context][peer]` at [`TAIL_STRIDE`].
    pub tails: u64,
    /// Producer tickets, `[context][peer]` u64s (device memory).
    pub heads: u64,
    /// Tail caches, `[context][peer]` pairs of u64s (device memory): the
    /// highest tail a producer has read, and when (`%globaltimer`) one last
    /// went to read it ([`crate::gin::proxy`] elects one reader at a time).
    pub tail_cache: u64,
    /// This rank's signals (`signal_count + barrier signals` u64s).
    pub signals: u64,
    /// This rank's counters.
    pub counters: u64,
    /// This rank's signal shadows (device memory, one per signal).
    pub shadows: u64,
}

impl GinState {
    /// No GIN (`backend` 0): every GIN call returns `GinError::NoGin`.
    pub const NONE: GinState = GinState {
        backend: 0,
        connection: 0,
        contexts: 0,
        queue_depth: 0,
        signal_count: 0,
        counter_count: 0,
        rail_barrier_count: 0,
        world_barrier_count: 0,
        rings: 0,
        tails: 0,
        heads: 0,
        tail_cache: 0,
        signals: 0,
        counters: 0,
        shadows: 0,
    };

    /// The GIN state with these parts.
    ///
    /// # Safety
    /// The addresses are this rank's live GIN memory as the module docs lay
    /// it out, sized by the counts (`contexts * nranks` rings of
    /// `queue_depth` slots, tails, heads, tail caches, `total_signals()`
    /// signals and shadows, `counter_count` counters), valid while kernels
    /// use it, and served by a proxy that follows the ring protocol.
    pub const unsafe fn from_parts(p: GinStateParts) -> GinState {
        GinState {
            backend: p.backend,
            connection: p.connection,
            contexts: p.contexts,
            queue_depth: p.queue_depth,
            signal_count: p.signal_count,
            counter_count: p.counter_count,
            rail_barrier_count: p.rail_barrier_count,
            world_barrier_count: p.world_barrier_count,
            rings: p.rings,
            tails: p.tails,
            heads: p.heads,
            tail_cache: p.tail_cache,
            signals: p.signals,
            counters: p.counters,
            shadows: p.shadows,
        }
    }

    /// [`GinBackend`] as a number (0: no GIN).
    #[inline(always)]
    pub const fn backend(&self) -> u32 {
        self.backend
    }

    /// Contexts (rings per peer).
    #[inline(always)]
    pub const fn contexts(&self) -> u32 {
        self.contexts
    }

    /// Signals available to the user.
    #[inline(always)]
    pub const fn signal_count(&self) -> u32 {
        self.signal_count
    }

    /// Counters.
    #[inline(always)]
    pub const fn counter_count(&self) -> u32 {
        self.counter_count
    }

    /// Descriptors per ring.
    #[inline(always)]
    pub const fn queue_depth(&self) -> u32 {
        self.queue_depth
    }

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
        assert_eq!(align_of::<GinDescriptor>(), 8);
        assert_eq!(size_of::<GinSlot>(), SLOT_BYTES);
        assert_eq!(align_of::<GinSlot>(), 64);
        assert_eq!(offset_of!(GinDescriptor, op), 0);
        assert_eq!(offset_of!(GinDescriptor, remote_action), 1);
        assert_eq!(offset_of!(GinDescriptor, local_action), 2);
        assert_eq!(offset_of!(GinDescriptor, flags), 3);
        assert_eq!(offset_of!(GinDescriptor, peer), 4);
        assert_eq!(offset_of!(GinDescriptor, signal), 8);
        assert_eq!(offset_of!(GinDescriptor, counter), 12);
        assert_eq!(offset_of!(GinDescriptor, src_window), 16);
        assert_eq!(offset_of!(GinDescriptor, dst_window), 20);
        assert_eq!(offset_of!(GinDescriptor, src_offset), 24);
        assert_eq!(offset_of!(GinDescriptor, dst_offset), 32);
        assert_eq!(offset_of!(GinDescriptor, bytes), 40);
        assert_eq!(offset_of!(GinDescriptor, value), 48);
    }

    #[test]
    fn tail_and_state_layout() {
        assert_eq!(size_of::<QueueTail>(), TAIL_STRIDE);
        assert_eq!(offset_of!(QueueTail, error), 8);
        assert_eq!(offset_of!(QueueTail, abandoned), 16);
        assert_eq!(abandoned_ticket(abandon_word(0, ABANDON_TIMEOUT)), Some((0, ABANDON_TIMEOUT)));
        assert_eq!(abandoned_ticket(abandon_word(77, ABANDON_ABORTED)), Some((77, ABANDON_ABORTED)));
        assert_ne!(abandon_word(0, ABANDON_RING_FAILED), 0);
        assert_eq!(abandoned_ticket(0), None);
        assert_eq!(size_of::<GinState>(), 88);
        assert_eq!(offset_of!(GinState, rings), 32);
        assert_eq!(offset_of!(GinState, shadows), 80);
    }

    #[test]
    fn slot_round_trip_and_tags() {
        let d = GinDescriptor {
            op: 1,
            remote_action: 2,
            local_action: 1,
            flags: 1,
            peer: 0xdead_beef,
            signal: 0x0102_0304,
            counter: 0xffff_fffe,
            src_window: 7,
            dst_window: 0x8000_0001,
            src_offset: 0xfedc_ba98_7654_3210,
            dst_offset: u64::MAX,
            bytes: 0x1_0000_0001,
            value: 0x8080_8080_8080_8080,
        };
        for tag in [0x80u8, 0x81, 0xff] {
            let s = GinSlot::encode(&d, tag);
            assert!(s.words.iter().all(|w| (w >> 56) as u8 == tag));
            assert_eq!(GinSlot::decode(&s.words, tag), Some(d));
            assert_eq!(GinSlot::decode(&s.words, tag ^ 1), None);
            // One word of another lap: not complete.
            for i in 0..8 {
                let mut w = s.words;
                w[i] = (w[i] & CHUNK_MASK) | ((tag as u64 ^ 1) << 56);
                assert_eq!(GinSlot::decode(&w, tag), None);
            }
        }
        assert_eq!(GinSlot::decode(&[0; 8], slot_tag(0, 4)), None);
        assert_eq!(slot_tag(0, 4), 0x80);
        assert_eq!(slot_tag(3, 4), 0x80);
        assert_eq!(slot_tag(4, 4), 0x81);
        assert_eq!(slot_tag(127 * 4, 4), 0xff);
        assert_eq!(slot_tag(128 * 4, 4), 0x80);
        for t in 0..1000u64 {
            assert_ne!(slot_tag(t, 8), slot_tag(t + 8, 8));
        }
    }

    #[test]
    fn enums_round_trip() {
        for op in [GinOp::Put, GinOp::PutValue, GinOp::Signal, GinOp::Get] {
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
