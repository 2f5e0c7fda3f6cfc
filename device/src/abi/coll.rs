//! What the host hands the device-callable collectives: [`CollContext`]
//! (scratch memory and barriers, made once per communicator) and
//! [`CollArgs`] (one host-launched collective).

use super::{DevComm, WindowDesc};

/// The memory and barriers the collectives of [`crate::coll`] work with,
/// on one rank: a device communicator's LSA barriers `barrier_base..
/// barrier_base + parts` (one per [`Part`](crate::coll::Part)), and a
/// scratch window laid out as:
///
/// * the LL area at `ll_offset` ([`CollContext::ll_area_bytes`]), zeroed
///   when made: the all-reduce's slots, 2 parities × `lsa_size` sources ×
///   `2 * ll_bytes` bytes (each 8 bytes of payload travel with two 4-byte
///   flags in 16 bytes); then the LL broadcast's and reduce's channels
///   (`coll::ll_rooted`): one slot of `2 * ll_bytes` bytes per source,
///   then 16 bytes holding this rank's count of those calls (a `u32`) and
///   its count of device-counted LL all-reduces (`seq == 0`, a `u32`),
///   then per peer the flag of the last message sent to it and the flag it
///   last acknowledged (a `u32` each); then the device-counted
///   all-reduce's slots, laid out as the first ones (kept apart so that
///   calls numbered by the host and by the device never share a slot);
/// * staging at `stage_offset`: two areas of `stage_bytes` bytes each,
///   used by barrier-epoch parity (pushed and staged chunks);
/// * point-to-point channels at `p2p_offset` (when `p2p_slots > 0`, see
///   [`CollContext::with_p2p`]): per source rank `p2p_slots` slots of
///   `p2p_chunk` bytes, then three arrays of `lsa_size * p2p_slots` `u64`s:
///   the slots' flags and message lengths (written by the sender) and the
///   credits (written by the receiver into the sender's copy), all zeroed
///   when made.
///
/// Made by the host crate (`devcomm::coll::Collectives::context`), passed
/// to kernels by value.
#[doc(alias = "ncclDevComm")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct CollContext {
    pub(crate) comm: DevComm,
    pub(crate) scratch: WindowDesc,
    pub(crate) ll_offset: u64,
    pub(crate) ll_bytes: u64,
    pub(crate) stage_offset: u64,
    pub(crate) stage_bytes: u64,
    pub(crate) barrier_base: u32,
    pub(crate) parts: u32,
    pub(crate) p2p_offset: u64,
    pub(crate) p2p_chunk: u64,
    pub(crate) p2p_slots: u32,
    pub(crate) a2a_slots: u32,
    pub(crate) a2a_offset: u64,
    pub(crate) gin_scratch: WindowDesc,
    pub(crate) gin_signal_base: u32,
    pub(crate) gin_context: u32,
    pub(crate) rail_offset: u64,
    pub(crate) rail_chunk: u64,
    pub(crate) rail_signal_base: u32,
    pub(crate) p2p_gin_slots: u32,
    pub(crate) p2p_gin_chunk: u64,
    pub(crate) stamps: u64,
}

/// Stamps per part of a collective's stage timing
/// ([`CollContext::with_stage_stamps`]): one `u64` per [`CollStage`].
pub const COLL_STAGES: usize = 5;

/// The moments a collective's part records (`%globaltimer`, by the coop's
/// leader) when its context has stage stamps. A chunked call records its
/// last chunk's; a stage an algorithm does not have is not recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum CollStage {
    /// The host collective's kernel started (the all-reduce kernels).
    Start = 0,
    /// The part's barrier session is set up (one-shot, two-shot).
    Ready = 1,
    /// The part's first data step (its pushes) is issued, before the
    /// first barrier (one-shot and two-shot on local inputs).
    Sent = 2,
    /// The first barrier's wait is over (one-shot, two-shot).
    Synced = 3,
    /// The host collective's kernel is done (the all-reduce kernels).
    Done = 4,
}

const _: () = assert!(CollStage::Done as usize + 1 == COLL_STAGES);

impl CollContext {
    /// A context from its parts.
    ///
    /// # Safety
    /// `comm` is live and has LSA barriers `barrier_base..barrier_base +
    /// parts`, used by nothing else while collectives run; `scratch` is a
    /// window of the same LSA team whose every rank's copy holds the layout
    /// above (`ll_offset + ll_area_bytes(lsa_size, ll_bytes) <= stage_offset`, the
    /// staging areas inside the window, offsets and sizes multiples of 16,
    /// the LL slots zeroed before first use), used by nothing else.
    #[allow(clippy::too_many_arguments)]
    pub const unsafe fn from_raw_parts(
        comm: DevComm,
        scratch: WindowDesc,
        ll_offset: u64,
        ll_bytes: u64,
        stage_offset: u64,
        stage_bytes: u64,
        barrier_base: u32,
        parts: u32,
    ) -> Self {
        CollContext {
            comm,
            scratch,
            ll_offset,
            ll_bytes,
            stage_offset,
            stage_bytes,
            barrier_base,
            parts,
            p2p_offset: 0,
            p2p_chunk: 0,
            p2p_slots: 0,
            a2a_slots: 0,
            a2a_offset: 0,
            gin_scratch: WindowDesc::NONE,
            gin_signal_base: 0,
            gin_context: 0,
            rail_offset: 0,
            rail_chunk: 0,
            rail_signal_base: 0,
            p2p_gin_slots: 0,
            p2p_gin_chunk: 0,
            stamps: 0,
        }
    }

    /// The context with stage stamps: each part's leader records
    /// `%globaltimer` at every [`CollStage`] into `stamps[part *
    /// COLL_STAGES + stage]` (the host: `CollConfig::stage_stamps`,
    /// `Collectives::stage_times`). 0 turns them off (the default).
    ///
    /// # Safety
    /// `stamps` is 0 or the device address of `parts * COLL_STAGES` `u64`s,
    /// 8-byte aligned, that nothing else uses while collectives run.
    pub const unsafe fn with_stage_stamps(mut self, stamps: u64) -> Self {
        self.stamps = stamps;
        self
    }

    /// The context with point-to-point channels (`send`/`recv` of
    /// [`crate::coll`]) at byte `offset` of the scratch window: `slots`
    /// slots of `chunk` bytes per source rank, then the flag, length and
    /// credit arrays ([`CollContext::p2p_bytes`] bytes in all).
    ///
    /// # Safety
    /// Every rank's scratch holds that area at `offset` (16-byte aligned,
    /// `chunk` a non-zero multiple of 16, `slots > 0`), its three arrays
    /// zeroed before any rank's first send, used by nothing else.
    pub const unsafe fn with_p2p(mut self, offset: u64, chunk: u64, slots: u32) -> Self {
        self.p2p_offset = offset;
        self.p2p_chunk = chunk;
        self.p2p_slots = slots;
        self
    }

    /// The context with point-to-point channels to ranks outside the LSA
    /// team, over GIN (context `gin_context` of the communicator): in
    /// window `scratch` (registered for GIN on every rank,
    /// [`CollContext::p2p_gin_bytes`] bytes: per world rank `slots` inbox
    /// slots, then as many outbox slots, of `chunk` bytes, then one length
    /// word per inbox slot), and GIN signals `signal_base .. signal_base +
    /// 2 * nranks * slots` (one per inbox slot: chunks arrived; one per
    /// outbox slot: chunks consumed by the receiver). GIN channels have
    /// their own chunk size: each chunk costs the proxy a fixed time, so
    /// they want larger chunks than NVLink's. Call after
    /// [`CollContext::with_p2p`].
    ///
    /// # Safety
    /// The device communicator has GIN with those signals (zero) and that
    /// context, used by nothing else; `scratch` as above, on every rank,
    /// used by nothing else; `chunk` a non-zero multiple of 16, `slots >
    /// 0`.
    pub const unsafe fn with_p2p_gin(
        mut self,
        scratch: WindowDesc,
        signal_base: u32,
        gin_context: u32,
        chunk: u64,
        slots: u32,
    ) -> Self {
        self.p2p_gin_chunk = chunk;
        self.p2p_gin_slots = slots;
        self.gin_scratch = scratch;
        self.gin_signal_base = signal_base;
        self.gin_context = gin_context;
        self
    }

    /// The context with the rail exchange of the hierarchical
    /// collectives ([`crate::coll::hier`]) at byte `offset` of the GIN
    /// window given to [`CollContext::with_p2p_gin`]: per part (of
    /// `parts`) `teams + 1` slots of `chunk` bytes (an inbox slot per rail
    /// rank, then an outbox slot), and GIN signals `signal_base ..
    /// signal_base + 2 * parts` (per part: chunks arrived, chunks
    /// consumed), counted with their shadows. Call after
    /// [`CollContext::with_p2p_gin`].
    ///
    /// # Safety
    /// The GIN window holds [`CollContext::rail_bytes`] bytes at `offset`
    /// (16-byte aligned, `chunk` a non-zero multiple of 16) on every rank;
    /// those signals exist, start at zero with their shadows and are used
    /// by nothing else; so is the area.
    pub const unsafe fn with_rail(mut self, offset: u64, chunk: u64, signal_base: u32) -> Self {
        self.rail_offset = offset;
        self.rail_chunk = chunk;
        self.rail_signal_base = signal_base;
        self
    }

    /// Bytes of the rail exchange's area for `parts` parts, `teams` LSA
    /// teams and `chunk`-byte slots.
    pub const fn rail_bytes(parts: u32, teams: u32, chunk: u64) -> u64 {
        parts as u64 * (teams as u64 + 1) * chunk
    }

    /// GIN signals the rail exchange uses for `parts` parts.
    pub const fn rail_signals(parts: u32) -> u32 {
        2 * parts
    }

    /// Whether the hierarchical collectives' rail exchange is set up.
    #[inline(always)]
    pub const fn has_rail(&self) -> bool {
        self.rail_chunk != 0 && self.has_p2p_gin()
    }

    /// Bytes of each rail exchange slot.
    #[inline(always)]
    pub(crate) const fn rail_chunk(&self) -> u64 {
        self.rail_chunk
    }

    /// Offset in the GIN window of part `part`'s inbox slot from rail rank
    /// `from` (`from == teams`: its outbox slot).
    #[inline(always)]
    pub(crate) const fn rail_slot_offset(&self, part: u32, from: u32) -> u64 {
        let teams = self.comm.nranks / if self.comm.lsa_size == 0 { 1 } else { self.comm.lsa_size };
        self.rail_offset + (part as u64 * (teams as u64 + 1) + from as u64) * self.rail_chunk
    }

    /// Part `part`'s rail signal: chunks arrived (`consumed`: chunks its
    /// rail peers are done with).
    #[inline(always)]
    pub(crate) const fn rail_signal(&self, part: u32, consumed: bool) -> u32 {
        self.rail_signal_base + 2 * part + consumed as u32
    }

    /// Bytes of the GIN point-to-point window for `nranks` ranks.
    pub const fn p2p_gin_bytes(nranks: u32, chunk: u64, slots: u32) -> u64 {
        nranks as u64 * slots as u64 * (2 * chunk + 8)
    }

    /// GIN signals the GIN point-to-point channels use.
    pub const fn p2p_gin_signals(nranks: u32, slots: u32) -> u32 {
        2 * nranks * slots
    }

    /// Whether channels to ranks outside the LSA team exist (over GIN).
    #[inline(always)]
    pub const fn has_p2p_gin(&self) -> bool {
        self.gin_scratch.size != 0
    }

    /// The GIN point-to-point window.
    #[inline(always)]
    pub(crate) const fn gin_scratch(&self) -> &WindowDesc {
        &self.gin_scratch
    }

    /// GIN context of the GIN channels.
    #[inline(always)]
    pub(crate) const fn gin_context(&self) -> u32 {
        self.gin_context
    }

    /// Offset in the GIN window of inbox slot `[src][slot]` (`outbox`:
    /// outbox slot `[dst][slot]`), or of its length word (`len`).
    #[inline(always)]
    pub(crate) const fn p2p_gin_offset(&self, rank: u32, slot: u32, what: u32) -> u64 {
        let n = self.comm.nranks as u64 * self.p2p_gin_slots as u64;
        let i = rank as u64 * self.p2p_gin_slots as u64 + slot as u64;
        match what {
            0 => i * self.p2p_gin_chunk,
            1 => (n + i) * self.p2p_gin_chunk,
            _ => 2 * n * self.p2p_gin_chunk + i * 8,
        }
    }

    /// GIN signal counting chunks arrived in inbox slot `[src][slot]`
    /// (`credit`: consumed from outbox slot `[dst][slot]`).
    #[inline(always)]
    pub(crate) const fn p2p_gin_signal(&self, rank: u32, slot: u32, credit: bool) -> u32 {
        let n = self.comm.nranks * self.p2p_gin_slots;
        self.gin_signal_base + credit as u32 * n + rank * self.p2p_gin_slots + slot
    }

    /// The context with LL all-to-all sessions
    /// ([`crate::coll::LlA2aSession`]) at byte `offset` of the scratch
    /// window: per part (block) one 16-byte epoch line, then 2 parities ×
    /// `slots` slots of 16 bytes ([`CollContext::ll_a2a_bytes`] in all).
    ///
    /// # Safety
    /// Every rank's scratch holds that area at `offset` (16-byte aligned),
    /// zeroed before any rank's first session, used by nothing else.
    pub const unsafe fn with_ll_a2a(mut self, offset: u64, slots: u32) -> Self {
        self.a2a_offset = offset;
        self.a2a_slots = slots;
        self
    }

    /// Bytes of the LL all-to-all area for `parts` blocks of `slots` slots.
    pub const fn ll_a2a_bytes(parts: u32, slots: u32) -> u64 {
        parts as u64 * (1 + 2 * slots as u64) * 16
    }

    /// Slots per parity of each block's LL all-to-all inbox (0: none).
    #[inline(always)]
    pub const fn ll_a2a_slots(&self) -> u32 {
        self.a2a_slots
    }

    /// Offset of block `block`'s LL all-to-all area (its epoch line first).
    #[inline(always)]
    pub(crate) const fn ll_a2a_offset(&self, block: u32) -> u64 {
        self.a2a_offset + block as u64 * (1 + 2 * self.a2a_slots as u64) * 16
    }

    /// Bytes of the point-to-point area for `lsa_size` ranks, `slots` slots
    /// of `chunk` bytes: the data slots, then the flags, lengths and credits.
    pub const fn p2p_bytes(lsa_size: u32, chunk: u64, slots: u32) -> u64 {
        lsa_size as u64 * slots as u64 * (chunk + 3 * 8)
    }

    /// Payload bytes of one point-to-point slot (0: no channels).
    #[inline(always)]
    pub const fn p2p_chunk(&self) -> u64 {
        self.p2p_chunk
    }

    /// Slots per channel (0: no channels).
    #[inline(always)]
    pub const fn p2p_slots(&self) -> u32 {
        self.p2p_slots
    }

    /// Payload bytes of each GIN point-to-point slot (0: no GIN channels).
    #[inline(always)]
    pub const fn p2p_gin_chunk(&self) -> u64 {
        self.p2p_gin_chunk
    }

    /// Slots of each GIN point-to-point channel.
    #[inline(always)]
    pub const fn p2p_gin_slots(&self) -> u32 {
        self.p2p_gin_slots
    }

    /// Offset of the data of slot `slot` from source `src`.
    #[inline(always)]
    pub(crate) const fn p2p_data_offset(&self, src: u32, slot: u32) -> u64 {
        self.p2p_offset + (src as u64 * self.p2p_slots as u64 + slot as u64) * self.p2p_chunk
    }

    /// Offset of `u64` word `[rank][slot]` of array `which` (0 flags, 1
    /// lengths, 2 credits).
    #[inline(always)]
    pub(crate) const fn p2p_word_offset(&self, which: u32, rank: u32, slot: u32) -> u64 {
        let n = self.scratch.lsa_size as u64 * self.p2p_slots as u64;
        self.p2p_offset
            + n * self.p2p_chunk
            + (which as u64 * n + rank as u64 * self.p2p_slots as u64 + slot as u64) * 8
    }

    /// The device communicator.
    #[inline(always)]
    pub const fn comm(&self) -> &DevComm {
        &self.comm
    }

    /// The scratch window.
    #[inline(always)]
    pub const fn scratch(&self) -> WindowDesc {
        self.scratch
    }

    /// Payload bytes one LL slot carries per source rank: the largest
    /// message (all_reduce input) the LL algorithm takes.
    #[inline(always)]
    pub const fn ll_bytes(&self) -> u64 {
        self.ll_bytes
    }

    /// Bytes of each of the two staging areas.
    #[inline(always)]
    pub const fn stage_bytes(&self) -> u64 {
        self.stage_bytes
    }

    /// How many parts (CTAs working on one collective) the context has
    /// barriers for.
    #[inline(always)]
    pub const fn parts(&self) -> u32 {
        self.parts
    }

    /// First LSA barrier index of the context.
    #[inline(always)]
    pub const fn barrier_base(&self) -> u32 {
        self.barrier_base
    }

    /// Offset of LL slot `[parity][src]` in the scratch window.
    #[inline(always)]
    pub const fn ll_slot_offset(&self, parity: u32, src: u32) -> u64 {
        self.ll_offset + ((parity as u64 & 1) * self.scratch.lsa_size as u64 + src as u64) * 2 * self.ll_bytes
    }

    /// Offset of the device-counted LL all-reduce's slot `[parity][src]`
    /// (calls with `seq == 0`, see [`crate::coll::all_reduce`]).
    #[inline(always)]
    pub const fn ll_counted_slot_offset(&self, parity: u32, src: u32) -> u64 {
        let n = self.scratch.lsa_size as u64;
        let base = self.ll_offset + 6 * n * self.ll_bytes + 16 + (8 * n).next_multiple_of(16);
        base + ((parity as u64 & 1) * n + src as u64) * 2 * self.ll_bytes
    }

    /// Offset of this rank's `u32` count of device-counted LL all-reduces.
    #[inline(always)]
    pub const fn ll_counted_seq_offset(&self) -> u64 {
        self.ll_chan_word_offset(2, 0) + 4
    }

    /// Bytes of the LL area (see the type's docs) of a team of
    /// `lsa_size` ranks with LL slots of `ll_bytes` payload bytes.
    pub const fn ll_area_bytes(lsa_size: u32, ll_bytes: u64) -> u64 {
        let n = lsa_size as u64;
        10 * n * ll_bytes + 16 + (8 * n).next_multiple_of(16)
    }

    /// Offset of the LL broadcast's and reduce's slot for messages from
    /// `src`.
    #[inline(always)]
    pub const fn ll_chan_slot_offset(&self, src: u32) -> u64 {
        self.ll_offset + (4 * self.scratch.lsa_size as u64 + 2 * src as u64) * self.ll_bytes
    }

    /// Offset of the LL channels' `u32` word `which` about `peer` (`0`:
    /// the flag last sent to it, `1`: the flag it last acknowledged), or
    /// (`which == 2`) of this rank's count of LL broadcasts and reduces.
    #[inline(always)]
    pub const fn ll_chan_word_offset(&self, which: u32, peer: u32) -> u64 {
        let n = self.scratch.lsa_size as u64;
        let words = self.ll_offset + 6 * n * self.ll_bytes;
        if which == 2 {
            words
        } else {
            words + 16 + (which as u64 * n + peer as u64) * 4
        }
    }

    /// Offset of staging area `parity & 1` (two areas of
    /// [`stage_bytes`](Self::stage_bytes) each, one after the other). A
    /// collective writes staged data at barrier epoch `e` into area `e & 1`
    /// (see `coll::staging`).
    #[inline(always)]
    pub const fn stage_area_offset(&self, parity: u32) -> u64 {
        self.stage_offset + (parity & 1) as u64 * self.stage_bytes
    }
}

// SAFETY: #[repr(C)] plain data (two ABI structs, u64s, u32s) with the same
// layout on both targets.
unsafe impl crate::KernelParam for CollContext {}

/// Where one operand of a host-launched collective lives: a local device
/// address, and, when the operand lies in a registered window, that window
/// and the offset (peers then read it in place).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct CollBuffer {
    /// Local device address of element 0.
    pub ptr: u64,
    /// The window, when `in_window` is 1.
    pub window: WindowDesc,
    /// Byte offset of element 0 in `window`.
    pub offset: u64,
    /// 1: in `window` at `offset` (and `ptr` is that window's local address).
    pub in_window: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

/// One host-launched collective: what the kernels of `devcomm-kernels`'
/// `coll` module take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct CollArgs {
    /// The context.
    pub ctx: CollContext,
    /// Input.
    pub src: CollBuffer,
    /// Output (`ptr` only; local).
    pub dst: CollBuffer,
    /// Elements per rank (see each collective).
    pub count: u64,
    /// `PreMulSum`'s scalar, as the element's bits (little-endian, low bytes).
    pub scalar: u64,
    /// When non-zero: the device address the scalar is read from instead.
    pub scalar_ptr: u64,
    /// Where the kernel reports a failure: one `u32` error code (0 stays
    /// when it succeeds), device memory.
    pub errors: u64,
    /// `RedOp` code.
    pub op: u32,
    /// Root rank (LSA rank) for rooted collectives.
    pub root: u32,
    /// `Algorithm` code.
    pub algorithm: u32,
    /// The collective's sequence number, non-zero, the same on every rank
    /// (the LL flag).
    pub seq: u32,
}

// SAFETY: #[repr(C)] plain data with the same layout on both targets.
unsafe impl crate::KernelParam for CollArgs {}

/// Whether a [`P2pOp`] sends or receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum P2pKind {
    /// `ncclSend`.
    Send = 0,
    /// `ncclRecv`.
    Recv = 1,
}

/// One send or receive of a point-to-point channel (see `coll::send`).
///
/// A message of `bytes` travels as `max(1, ceil(bytes / p2p_chunk))`
/// chunks; chunk `i` carries sequence number `first_seq + i`. Both ends
/// number the chunks of their channel alike: `first_seq` is one more than
/// the chunks the channel (this pair of ranks, this direction) carried
/// before (`devcomm::coll::Collectives` counts them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct P2pOp {
    /// Local device address: the data sent, or where it is received.
    pub ptr: u64,
    /// Message bytes (the sender's and the receiver's must match).
    pub bytes: u64,
    /// Sequence number of the message's first chunk (non-zero).
    pub first_seq: u64,
    /// The peer's world rank (inside the LSA team the channel is LSA
    /// stores, outside GIN puts).
    pub peer: u32,
    /// [`P2pKind`] code.
    pub kind: u32,
}

impl P2pOp {
    /// No operation (fills unused entries of [`P2pArgs::ops`]).
    pub const NONE: P2pOp = P2pOp { ptr: 0, bytes: 0, first_seq: 0, peer: 0, kind: 0 };
}

// SAFETY: #[repr(C)] plain data with the same layout on both targets.
unsafe impl crate::KernelParam for P2pOp {}

/// The most sends and receives one host-launched group carries.
pub const MAX_GROUP_OPS: usize = 64;

/// A group of sends and receives launched as one kernel: `n_ops` entries
/// of `ops`, sorted into *tasks* (runs of entries with the same peer and
/// kind, run in order by the same CTAs); task `t` is done by CTAs `t *
/// ctas_per_task ..` (parts of each of its operations).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct P2pArgs {
    /// The context.
    pub ctx: CollContext,
    /// Where the kernel reports a failure (as [`CollArgs::errors`]).
    pub errors: u64,
    /// How many entries of `ops` are used.
    pub n_ops: u32,
    /// CTAs per task.
    pub ctas_per_task: u32,
    /// The operations.
    pub ops: [P2pOp; MAX_GROUP_OPS],
}

// SAFETY: #[repr(C)] plain data with the same layout on both targets.
unsafe impl crate::KernelParam for P2pArgs {}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts() {
        assert_eq!(size_of::<CollBuffer>(), 8 + 40 + 8 + 8);
        assert_eq!(size_of::<CollContext>(), size_of::<DevComm>() + 40 + 32 + 8 + 32 + 48 + 32 + 8);
        assert_eq!(size_of::<CollArgs>() % 8, 0);
        assert_eq!(size_of::<P2pOp>(), 32);
        // Kernel parameters stay within the 4 KiB every CUDA version takes.
        assert!(size_of::<P2pArgs>() <= 4096);
    }
}
