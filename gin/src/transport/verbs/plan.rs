//! The planning layer of the verbs transport: pure functions and plain
//! state machines, no FFI, no NIC.
//!
//! * [`plan_put`] and [`plan_signal`] translate one proxy operation into the
//!   list of work requests ([`WrSpec`]) to post on the queue pair of its
//!   peer: RDMA WRITEs split at the largest message, inline when small and
//!   from host memory, then (for a signal) an optional flush READ and the
//!   fenced ATOMIC FETCH_AND_ADD on the peer's signal word. Every remote
//!   range is checked against what the peer advertised ([`RemotePeer`]).
//! * [`SendQueue`] accounts for one send queue: sequence numbers, which work
//!   requests are signaled (selective signaling that can never leave a full
//!   queue without a completion to wait for) and how much room is left.
//! * [`Staging`] allocates slots of the registered staging ring that host
//!   data is copied into, and frees them as completions arrive (out of order
//!   across queue pairs).
//!
//! The executor in the parent module drives these and does nothing but
//! fill in addresses and keys and call libibverbs.

use crate::descriptor::RemoteSignal;
use crate::{GinHostError, GinResult};
use std::collections::{BTreeMap, VecDeque};

/// Opcode of a planned work request (the `ibv_wr_opcode` it becomes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WrOpcode {
    /// `IBV_WR_RDMA_WRITE`: data into the peer's window.
    RdmaWrite,
    /// `IBV_WR_RDMA_READ`: the flush read that makes earlier writes visible
    /// (see the parent module's ordering notes), or a get's data.
    RdmaRead,
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`: the signal.
    AtomicFetchAdd,
}

/// Where the local side of a work request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalRef {
    /// Bytes `offset..offset + len` of the operation's host data, copied into
    /// the work queue entry when it is posted (`IBV_SEND_INLINE`).
    Inline {
        /// Offset in the operation's data.
        offset: u64,
    },
    /// Bytes `offset..offset + len` of the operation's data, read by the NIC
    /// from registered memory: the source window itself (zero copy) or the
    /// staging slot the executor copies them into.
    Data {
        /// Offset in the operation's data.
        offset: u64,
    },
    /// The transport's registered scratch word: the destination of a flush
    /// read and of the value an atomic fetches.
    Scratch,
}

/// One planned work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WrSpec {
    /// What it does.
    pub opcode: WrOpcode,
    /// Its local buffer.
    pub local: LocalRef,
    /// Bytes moved (8 for the atomic).
    pub len: u32,
    /// Remote virtual address (as registered by the peer).
    pub remote_addr: u64,
    /// Remote key of the peer's memory region.
    pub rkey: u32,
    /// The atomic's increment (0 otherwise).
    pub add: u64,
    /// `IBV_SEND_FENCE`: do not start before every earlier READ and ATOMIC of
    /// this queue pair has completed.
    pub fence: bool,
    /// Whether the operation needs a completion for this request (the last
    /// request of every operation). The [`SendQueue`] may signal more.
    pub signaled: bool,
}

impl WrSpec {
    /// Whether the data travels inline in the work queue entry.
    pub fn inline(&self) -> bool {
        matches!(self.local, LocalRef::Inline { .. })
    }
}

/// A window of a peer as it advertised it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteWindow {
    /// Remote virtual address of byte 0.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
    /// Remote key.
    pub rkey: u32,
}

/// What this rank knows of one peer's memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RemotePeer {
    /// World rank (for messages).
    pub rank: usize,
    /// Windows by id.
    pub windows: BTreeMap<u32, RemoteWindow>,
    /// Address of the peer's signal array (8-aligned).
    pub signals_addr: u64,
    /// Remote key of the signal array.
    pub signals_rkey: u32,
    /// Signals in the array.
    pub total_signals: u32,
}

/// Limits a plan respects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanLimits {
    /// Largest message of one work request (the port's `max_msg_sz`, and for
    /// staged data the staging piece). At least 1.
    pub max_msg: u64,
    /// Largest inline payload of the queue pair (0: never inline).
    pub max_inline: u32,
    /// Whether a signal that follows unflushed writes is preceded by a
    /// flush read.
    pub flush_read: bool,
}

/// Where an operation's data comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Host memory the CPU can read: small operations go inline.
    Host,
    /// Registered memory the CPU must not read (a GPU window): never inline.
    Registered,
}

/// Planning state of one queue pair.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpPlanState {
    /// The last data write not yet followed by a flush read: remote address,
    /// key and length of its last segment.
    pub unflushed: Option<(u64, u32, u32)>,
}

/// Bytes the flush read fetches (at most; fewer if the last write was shorter).
pub const FLUSH_READ_BYTES: u32 = 8;

fn invalid<T>(msg: String) -> GinResult<T> {
    Err(GinHostError::Invalid(msg))
}

/// Remote address of `bytes` at `offset` of `peer`'s window `window`, and its key.
pub fn remote_range(peer: &RemotePeer, window: u32, offset: u64, bytes: u64) -> GinResult<(u64, u32)> {
    let Some(w) = peer.windows.get(&window) else {
        return invalid(format!("window {window} of rank {} is not registered with the verbs transport", peer.rank));
    };
    if offset.checked_add(bytes).is_none_or(|end| end > w.len) {
        return invalid(format!(
            "{bytes} bytes at offset {offset} exceed window {window} of rank {} ({} bytes)",
            peer.rank, w.len
        ));
    }
    // Cannot overflow: the peer's window was validated when decoded (addr + len fits).
    Ok((w.addr + offset, w.rkey))
}

/// Remote address of signal `signal` of `peer`.
pub fn remote_signal(peer: &RemotePeer, signal: u32) -> GinResult<u64> {
    if signal >= peer.total_signals {
        return invalid(format!("signal {signal} of rank {} out of range ({})", peer.rank, peer.total_signals));
    }
    Ok(peer.signals_addr + 8 * signal as u64)
}

fn check_limits(lim: &PlanLimits) -> GinResult<()> {
    if lim.max_msg == 0 || lim.max_msg > u32::MAX as u64 {
        return invalid(format!("largest message {} must be in 1..=u32::MAX", lim.max_msg));
    }
    Ok(())
}

/// Appends the flush read (when needed) and the fenced atomic of `signal`.
fn push_signal(lim: &PlanLimits, st: &mut QpPlanState, addr: u64, rkey: u32, value: u64, out: &mut Vec<WrSpec>) {
    if let (true, Some((raddr, rk, len))) = (lim.flush_read, st.unflushed) {
        out.push(WrSpec {
            opcode: WrOpcode::RdmaRead,
            local: LocalRef::Scratch,
            len: len.min(FLUSH_READ_BYTES),
            remote_addr: raddr,
            rkey: rk,
            add: 0,
            fence: false,
            signaled: false,
        });
    }
    st.unflushed = None;
    out.push(WrSpec {
        opcode: WrOpcode::AtomicFetchAdd,
        local: LocalRef::Scratch,
        len: 8,
        remote_addr: addr,
        rkey,
        add: value,
        fence: true,
        signaled: true,
    });
}

/// Plans a put of `bytes` to `dst_offset` of `peer`'s window `dst_window`,
/// then `signal` there, appending the work requests to `out`.
///
/// Host data of at most `max_inline` bytes is one inline write; other data
/// is written in segments of at most `max_msg` bytes. A signal follows as
/// a fenced fetch-and-add, preceded by a flush read of the last written
/// bytes when `flush_read` is set. The last request is signaled. On error
/// (`Invalid`: unknown window, range past it, signal out of range, bad
/// limits) nothing is appended and `st` is unchanged.
#[allow(clippy::too_many_arguments)]
pub fn plan_put(
    peer: &RemotePeer,
    lim: &PlanLimits,
    st: &mut QpPlanState,
    dst_window: u32,
    dst_offset: u64,
    bytes: u64,
    source: Source,
    signal: Option<RemoteSignal>,
    out: &mut Vec<WrSpec>,
) -> GinResult<()> {
    check_limits(lim)?;
    let (raddr, rkey) = if bytes == 0 { (0, 0) } else { remote_range(peer, dst_window, dst_offset, bytes)? };
    let sig = match signal {
        Some((id, value)) => Some((remote_signal(peer, id)?, value)),
        None => None,
    };
    let start = out.len();
    if bytes > 0 {
        let inline = source == Source::Host && bytes <= lim.max_inline as u64 && bytes <= lim.max_msg;
        let mut done = 0u64;
        while done < bytes {
            let n = (bytes - done).min(lim.max_msg);
            out.push(WrSpec {
                opcode: WrOpcode::RdmaWrite,
                local: if inline { LocalRef::Inline { offset: done } } else { LocalRef::Data { offset: done } },
                len: n as u32,
                remote_addr: raddr + done,
                rkey,
                add: 0,
                fence: false,
                signaled: false,
            });
            done += n;
        }
        let last = &out[out.len() - 1];
        st.unflushed = Some((last.remote_addr, rkey, last.len));
    }
    if let Some((addr, value)) = sig {
        push_signal(lim, st, addr, peer.signals_rkey, value, out);
    }
    if out.len() > start {
        let last = out.len() - 1;
        out[last].signaled = true;
    }
    Ok(())
}

/// Plans a get of `bytes` (> 0) from `src_offset` of `peer`'s window
/// `src_window` into the operation's registered destination: RDMA READs of
/// at most `max_msg` bytes ([`LocalRef::Data`]: the destination), the last
/// signaled (its completion means every read of the get has landed: RC
/// completions are in order). On error nothing is appended.
pub fn plan_get(
    peer: &RemotePeer,
    lim: &PlanLimits,
    src_window: u32,
    src_offset: u64,
    bytes: u64,
    out: &mut Vec<WrSpec>,
) -> GinResult<()> {
    check_limits(lim)?;
    if bytes == 0 {
        return invalid("a get of 0 bytes".to_string());
    }
    let (raddr, rkey) = remote_range(peer, src_window, src_offset, bytes)?;
    let mut done = 0u64;
    while done < bytes {
        let n = (bytes - done).min(lim.max_msg);
        out.push(WrSpec {
            opcode: WrOpcode::RdmaRead,
            local: LocalRef::Data { offset: done },
            len: n as u32,
            remote_addr: raddr + done,
            rkey,
            add: 0,
            fence: false,
            signaled: done + n == bytes,
        });
        done += n;
    }
    Ok(())
}

/// Plans `signals[signal] += value` on `peer`, ordered after every earlier
/// operation of the queue pair: a fenced fetch-and-add, preceded by a flush
/// read when earlier writes are unflushed and `flush_read` is set.
pub fn plan_signal(
    peer: &RemotePeer,
    lim: &PlanLimits,
    st: &mut QpPlanState,
    signal: u32,
    value: u64,
    out: &mut Vec<WrSpec>,
) -> GinResult<()> {
    check_limits(lim)?;
    let addr = remote_signal(peer, signal)?;
    push_signal(lim, st, addr, peer.signals_rkey, value, out);
    Ok(())
}

/// Bits of a work request id that carry the sequence number; the peer's
/// rank is in the bits above.
pub const SEQ_BITS: u32 = 40;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;

/// The `wr_id` of request `seq` on the queue pair to `peer`.
pub fn wr_id(peer: usize, seq: u64) -> u64 {
    ((peer as u64) << SEQ_BITS) | (seq & SEQ_MASK)
}

/// The peer and low sequence bits of a `wr_id`.
pub fn split_wr_id(id: u64) -> (usize, u64) {
    ((id >> SEQ_BITS) as usize, id & SEQ_MASK)
}

/// Accounting of one send queue.
///
/// Every posted request gets the next sequence number. Completions of one
/// RC send queue arrive in order, and a signaled request's completion
/// implies every earlier one completed, so `completed` (the first sequence
/// not known complete) moves to `seq + 1` on each. A request is signaled
/// when the caller asks for it (last of an operation, data in a staging
/// slot) or when `interval` unsignaled ones precede it: since
/// `interval <= depth`, a full queue always holds a signaled request, so
/// waiting on the completion queue frees room and never deadlocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendQueue {
    depth: u32,
    interval: u32,
    posted: u64,
    completed: u64,
    unsignaled_run: u32,
}

impl SendQueue {
    /// A queue of `depth` requests (at least 1) signaling at least every
    /// `interval` requests (clamped to `1..=depth`).
    pub fn new(depth: u32, interval: u32) -> SendQueue {
        let depth = depth.max(1);
        SendQueue { depth, interval: interval.clamp(1, depth), posted: 0, completed: 0, unsignaled_run: 0 }
    }

    /// Requests that can be posted now.
    pub fn room(&self) -> u32 {
        self.depth - (self.posted - self.completed) as u32
    }

    /// Requests posted and not known complete.
    pub fn outstanding(&self) -> u64 {
        self.posted - self.completed
    }

    /// Whether nothing is outstanding.
    pub fn idle(&self) -> bool {
        self.posted == self.completed
    }

    /// Sequence number the next posted request gets.
    pub fn next_seq(&self) -> u64 {
        self.posted
    }

    /// Whether request `seq` is known complete.
    pub fn is_done(&self, seq: u64) -> bool {
        seq < self.completed
    }

    /// Takes the next sequence number for a request; returns it and whether
    /// the request must be signaled. `None` if the queue is full (wait for
    /// completions first).
    pub fn push(&mut self, want_signal: bool) -> Option<(u64, bool)> {
        if self.room() == 0 {
            return None;
        }
        let seq = self.posted;
        self.posted += 1;
        let signaled = want_signal || self.unsignaled_run + 1 >= self.interval;
        self.unsignaled_run = if signaled { 0 } else { self.unsignaled_run + 1 };
        Some((seq, signaled))
    }

    /// Gives back the sequence number of the last [`SendQueue::push`]
    /// (its request could not be posted).
    pub fn unpush(&mut self) {
        if self.posted > self.completed {
            self.posted -= 1;
        }
    }

    /// A completion of the request whose `wr_id` carried `low` (the low
    /// [`SEQ_BITS`] of its sequence): everything up to it is complete.
    /// Returns the full sequence number, or `None` if no outstanding request
    /// has these bits (a stale or foreign completion).
    pub fn complete(&mut self, low: u64) -> Option<u64> {
        let out = self.posted - self.completed;
        // The outstanding request with these low bits: posted - 1 - back.
        let back = (self.posted.wrapping_sub(1).wrapping_sub(low)) & SEQ_MASK;
        if back >= out {
            return None;
        }
        let seq = self.posted - 1 - back;
        self.completed = seq + 1;
        Some(seq)
    }

    /// Marks every outstanding request complete (the queue pair failed: its
    /// requests are flushed, and their buffers are free).
    pub fn fail_all(&mut self) {
        self.completed = self.posted;
        self.unsignaled_run = 0;
    }
}

/// One allocated slot of the staging ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slot {
    /// Ring position just past the slot (covers bytes skipped at a wrap).
    end: u64,
    peer: usize,
    seq: u64,
}

/// Allocator of the staging ring: contiguous slots handed out in ring
/// order, each owned by the request `(peer, seq)` that reads it; a slot is
/// free once its request is complete. Completions of different queue pairs
/// arrive in any order: the ring frees its oldest slots as soon as they are
/// done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Staging {
    cap: u64,
    head: u64,
    tail: u64,
    slots: VecDeque<Slot>,
}

impl Staging {
    /// A ring of `cap` bytes.
    pub fn new(cap: u64) -> Staging {
        Staging { cap, head: 0, tail: 0, slots: VecDeque::new() }
    }

    /// Bytes of the ring.
    pub fn capacity(&self) -> u64 {
        self.cap
    }

    /// Bytes in use (including bytes skipped at a wrap).
    pub fn used(&self) -> u64 {
        self.head - self.tail
    }

    /// Allocates `len` contiguous bytes for request `(peer, seq)`; returns
    /// their offset in the ring, or `None` if they do not fit now (wait for
    /// completions and [`Staging::release`]). `len` must be in `1..=cap/2`
    /// for a ring that is not empty to always fit it eventually.
    pub fn alloc(&mut self, len: u64, peer: usize, seq: u64) -> Option<u64> {
        if len == 0 || len > self.cap {
            return None;
        }
        let at = self.head % self.cap;
        let skip = if at + len > self.cap { self.cap - at } else { 0 };
        if self.used() + skip + len > self.cap {
            return None;
        }
        let start = self.head + skip;
        self.head = start + len;
        self.slots.push_back(Slot { end: self.head, peer, seq });
        Some(start % self.cap)
    }

    /// Takes back the last allocation (its request was never posted).
    pub fn unalloc_last(&mut self) {
        if self.slots.pop_back().is_some() {
            self.head = self.slots.back().map_or(self.tail, |s| s.end);
        }
    }

    /// Frees the oldest slots whose requests are complete (`done(peer, seq)`).
    pub fn release(&mut self, mut done: impl FnMut(usize, u64) -> bool) {
        while let Some(s) = self.slots.front() {
            if !done(s.peer, s.seq) {
                break;
            }
            self.tail = s.end;
            self.slots.pop_front();
        }
        if self.slots.is_empty() {
            // Nothing in use: start over at offset 0 (no wrap needed soon).
            self.head = 0;
            self.tail = 0;
        }
    }

    /// The peer whose request owns the oldest slot (the one to wait for).
    pub fn front_owner(&self) -> Option<usize> {
        self.slots.front().map(|s| s.peer)
    }

    /// Whether nothing is allocated.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn peer() -> RemotePeer {
        let mut windows = BTreeMap::new();
        windows.insert(0, RemoteWindow { addr: 0x1000_0000, len: 1 << 20, rkey: 0xaaaa });
        windows.insert(7, RemoteWindow { addr: 0x7f00_0000_0000, len: 10 << 30, rkey: 0x7777 });
        RemotePeer { rank: 3, windows, signals_addr: 0x5000, signals_rkey: 0x5151, total_signals: 16 }
    }

    const LIM: PlanLimits = PlanLimits { max_msg: 1 << 30, max_inline: 64, flush_read: true };

    fn plan(
        source: Source,
        window: u32,
        offset: u64,
        bytes: u64,
        signal: Option<RemoteSignal>,
        lim: &PlanLimits,
    ) -> GinResult<Vec<WrSpec>> {
        let mut out = Vec::new();
        let mut st = QpPlanState::default();
        plan_put(&peer(), lim, &mut st, window, offset, bytes, source, signal, &mut out).map(|()| out)
    }

    #[test]
    fn small_host_put_is_one_inline_signaled_write() {
        let wrs = plan(Source::Host, 0, 16, 8, None, &LIM).unwrap();
        assert_eq!(
            wrs,
            vec![WrSpec {
                opcode: WrOpcode::RdmaWrite,
                local: LocalRef::Inline { offset: 0 },
                len: 8,
                remote_addr: 0x1000_0010,
                rkey: 0xaaaa,
                add: 0,
                fence: false,
                signaled: true,
            }]
        );
        assert!(wrs[0].inline());
        // At the inline limit still inline, one byte more not.
        assert!(plan(Source::Host, 0, 0, 64, None, &LIM).unwrap()[0].inline());
        assert!(!plan(Source::Host, 0, 0, 65, None, &LIM).unwrap()[0].inline());
        // Registered (GPU) memory is never inlined: the CPU cannot read it.
        assert!(!plan(Source::Registered, 0, 0, 8, None, &LIM).unwrap()[0].inline());
        // No inline support.
        let lim = PlanLimits { max_inline: 0, ..LIM };
        assert!(!plan(Source::Host, 0, 0, 1, None, &lim).unwrap()[0].inline());
    }

    #[test]
    fn put_with_signal_is_write_flush_read_fenced_atomic() {
        let wrs = plan(Source::Registered, 0, 100, 4096, Some((5, 3)), &LIM).unwrap();
        let ops: Vec<_> = wrs.iter().map(|w| (w.opcode, w.fence, w.signaled)).collect();
        assert_eq!(
            ops,
            vec![
                (WrOpcode::RdmaWrite, false, false),
                (WrOpcode::RdmaRead, false, false),
                (WrOpcode::AtomicFetchAdd, true, true)
            ]
        );
        // The read reads back the written bytes (same key, inside the write).
        assert_eq!((wrs[1].remote_addr, wrs[1].rkey, wrs[1].len), (0x1000_0000 + 100, 0xaaaa, 8));
        assert_eq!(wrs[1].local, LocalRef::Scratch);
        // The atomic adds 3 to signal 5's 8-byte word.
        assert_eq!((wrs[2].remote_addr, wrs[2].rkey, wrs[2].add, wrs[2].len), (0x5000 + 40, 0x5151, 3, 8));
        assert_eq!(wrs[2].local, LocalRef::Scratch);
        // Without the flush read: write then fenced atomic.
        let lim = PlanLimits { flush_read: false, ..LIM };
        let wrs = plan(Source::Host, 0, 0, 4, Some((0, 1)), &lim).unwrap();
        let ops: Vec<_> = wrs.iter().map(|w| (w.opcode, w.fence, w.signaled, w.inline())).collect();
        assert_eq!(ops, vec![(WrOpcode::RdmaWrite, false, false, true), (WrOpcode::AtomicFetchAdd, true, true, false)]);
        // A short last write reads only its bytes.
        let wrs = plan(Source::Host, 0, 0, 3, Some((0, 1)), &LIM).unwrap();
        assert_eq!((wrs[1].opcode, wrs[1].len), (WrOpcode::RdmaRead, 3));
    }

    #[test]
    fn large_put_splits_at_max_message() {
        let lim = PlanLimits { max_msg: 1000, ..LIM };
        let wrs = plan(Source::Registered, 7, 5, 2500, Some((1, 9)), &lim).unwrap();
        let writes: Vec<_> = wrs
            .iter()
            .filter(|w| w.opcode == WrOpcode::RdmaWrite)
            .map(|w| (w.local, w.len, w.remote_addr - 0x7f00_0000_0000, w.rkey))
            .collect();
        assert_eq!(
            writes,
            vec![
                (LocalRef::Data { offset: 0 }, 1000, 5, 0x7777),
                (LocalRef::Data { offset: 1000 }, 1000, 1005, 0x7777),
                (LocalRef::Data { offset: 2000 }, 500, 2005, 0x7777),
            ]
        );
        // Flush read of the last segment, then the atomic; only the atomic signaled.
        assert_eq!(wrs[3].opcode, WrOpcode::RdmaRead);
        assert_eq!(wrs[3].remote_addr, 0x7f00_0000_0000 + 2005);
        assert_eq!(wrs.iter().filter(|w| w.signaled).count(), 1);
        assert!(wrs[4].signaled && wrs[4].fence);
        // Without a signal the last write is the signaled one.
        let wrs = plan(Source::Registered, 7, 0, 2000, None, &lim).unwrap();
        assert_eq!(wrs.iter().map(|w| w.signaled).collect::<Vec<_>>(), vec![false, true]);
        // A put larger than 4 GiB (beyond a u32 length) splits too.
        let wrs = plan(Source::Registered, 7, 0, 5 << 30, None, &LIM).unwrap();
        assert_eq!(wrs.len(), 5);
        assert!(wrs.iter().all(|w| w.len == 1 << 30));
    }

    #[test]
    fn empty_put() {
        // No data, no signal: nothing to post.
        assert!(plan(Source::Host, 0, 0, 0, None, &LIM).unwrap().is_empty());
        // No data, a signal: just the fenced atomic (the window is not checked).
        let wrs = plan(Source::Host, 99, u64::MAX, 0, Some((2, 1)), &LIM).unwrap();
        assert_eq!(wrs.len(), 1);
        assert_eq!((wrs[0].opcode, wrs[0].fence, wrs[0].signaled), (WrOpcode::AtomicFetchAdd, true, true));
    }

    #[test]
    fn standalone_signal_flushes_earlier_writes_once() {
        let p = peer();
        let mut st = QpPlanState::default();
        let mut out = Vec::new();
        // Nothing written yet: just the atomic.
        plan_signal(&p, &LIM, &mut st, 1, 1, &mut out).unwrap();
        assert_eq!(out.iter().map(|w| w.opcode).collect::<Vec<_>>(), vec![WrOpcode::AtomicFetchAdd]);
        // A put without a signal leaves its write unflushed ...
        out.clear();
        plan_put(&p, &LIM, &mut st, 0, 64, 256, Source::Registered, None, &mut out).unwrap();
        assert_eq!(st.unflushed, Some((0x1000_0040, 0xaaaa, 256)));
        // ... so the next signal reads it back first, and the one after does not.
        out.clear();
        plan_signal(&p, &LIM, &mut st, 1, 1, &mut out).unwrap();
        assert_eq!(
            out.iter().map(|w| w.opcode).collect::<Vec<_>>(),
            vec![WrOpcode::RdmaRead, WrOpcode::AtomicFetchAdd]
        );
        assert_eq!(out[0].remote_addr, 0x1000_0040);
        out.clear();
        plan_signal(&p, &LIM, &mut st, 1, 1, &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(st.unflushed, None);
    }

    #[test]
    fn bad_requests_are_invalid_and_change_nothing() {
        let p = peer();
        let mut st = QpPlanState { unflushed: Some((1, 2, 3)) };
        let before = st;
        let mut out = vec![];
        let cases: [(u32, u64, u64, Option<RemoteSignal>); 5] = [
            (1, 0, 8, None),                // unknown window
            (0, (1 << 20) - 4, 8, None),    // past the window's end
            (0, u64::MAX, 2, None),         // offset overflow
            (0, 0, 8, Some((16, 1))),       // signal out of range
            (0, 0, 0, Some((u32::MAX, 1))), // signal out of range, no data
        ];
        for (w, off, n, sig) in cases {
            let r = plan_put(&p, &LIM, &mut st, w, off, n, Source::Host, sig, &mut out);
            assert!(matches!(r, Err(GinHostError::Invalid(_))), "{w} {off} {n} {sig:?}: {r:?}");
        }
        assert!(matches!(plan_signal(&p, &LIM, &mut st, 16, 1, &mut out), Err(GinHostError::Invalid(_))));
        let bad = PlanLimits { max_msg: 0, ..LIM };
        assert!(plan_put(&p, &bad, &mut st, 0, 0, 8, Source::Registered, None, &mut out).is_err());
        assert!(out.is_empty());
        assert_eq!(st, before);
        // The message names the peer and the window.
        let e = plan_put(&p, &LIM, &mut st, 4, 0, 1, Source::Host, None, &mut out).unwrap_err();
        assert!(e.to_string().contains("window 4 of rank 3"), "{e}");
    }

    #[test]
    fn wr_id_round_trip() {
        for (peer, seq) in [(0usize, 0u64), (5, 12345), ((1 << 24) - 1, (1 << 40) - 1), (9, 1 << 41)] {
            let (p, low) = split_wr_id(wr_id(peer, seq));
            assert_eq!((p, low), (peer, seq & SEQ_MASK));
        }
    }

    #[test]
    fn send_queue_signals_and_room() {
        let mut q = SendQueue::new(4, 2);
        assert_eq!(q.room(), 4);
        assert_eq!(q.push(false), Some((0, false)));
        assert_eq!(q.push(false), Some((1, true))); // interval reached
        assert_eq!(q.push(true), Some((2, true)));
        assert_eq!(q.push(false), Some((3, false)));
        assert_eq!(q.push(false), None); // full
        assert_eq!(q.room(), 0);
        assert_eq!(q.complete(wr_id(0, 1) & SEQ_MASK), Some(1));
        assert!(q.is_done(0) && q.is_done(1) && !q.is_done(2));
        assert_eq!(q.room(), 2);
        // A completion for something not outstanding is refused.
        assert_eq!(q.complete(1), None);
        assert_eq!(q.complete(7), None);
        assert_eq!(q.complete(3), Some(3));
        assert!(q.idle());
        q.push(false).unwrap();
        q.unpush();
        assert!(q.idle());
        q.push(false).unwrap();
        q.fail_all();
        assert!(q.idle() && q.room() == 4);
    }

    #[test]
    fn send_queue_sequence_wraps_the_wr_id_bits() {
        let mut q = SendQueue::new(8, 8);
        q.posted = SEQ_MASK - 2;
        q.completed = SEQ_MASK - 2;
        let seqs: Vec<u64> = (0..6).map(|_| q.push(false).unwrap().0).collect();
        assert_eq!(seqs[5], SEQ_MASK + 3);
        assert_eq!(q.complete(seqs[4] & SEQ_MASK), Some(seqs[4]));
        assert_eq!(q.outstanding(), 1);
    }

    #[test]
    fn staging_wraps_and_frees_out_of_order() {
        let mut s = Staging::new(100);
        let a = s.alloc(40, 0, 0).unwrap();
        let b = s.alloc(40, 1, 0).unwrap();
        assert_eq!((a, b), (0, 40));
        // 30 bytes do not fit at 80..110: they would wrap to 0, still in use.
        assert_eq!(s.alloc(30, 0, 1), None);
        // Peer 1 completes first: slot a (peer 0) still holds the front.
        s.release(|p, _| p == 1);
        assert_eq!(s.used(), 80);
        s.release(|_, _| true);
        assert!(s.is_empty());
        assert_eq!(s.used(), 0);
        // Empty again: starts at 0.
        assert_eq!(s.alloc(60, 0, 2), Some(0));
        assert_eq!(s.alloc(30, 0, 3), Some(60));
        s.release(|_, seq| seq <= 2);
        // 20 bytes at 90 would pass the end: skip to 0 (free since slot 2 went).
        assert_eq!(s.alloc(20, 0, 4), Some(0));
        assert_eq!(s.used(), 30 + 10 + 20);
        s.unalloc_last();
        assert_eq!(s.used(), 30);
        assert_eq!(s.alloc(0, 0, 5), None);
        assert_eq!(s.alloc(101, 0, 5), None);
    }

    fn request() -> impl Strategy<Value = (u32, u64, u64, Option<RemoteSignal>, bool)> {
        (
            prop_oneof![Just(0u32), Just(7u32), Just(3u32)],
            0..(2u64 << 20),
            0..(3u64 << 20),
            proptest::option::of((0..20u32, any::<u64>())),
            any::<bool>(),
        )
    }

    proptest! {
        /// Whatever the request, a successful plan covers exactly the bytes
        /// asked for, in order, inside the window, within the limits, with
        /// the signal (if any) last, fenced and signaled.
        #[test]
        fn plans_are_well_formed(
            (window, offset, bytes, signal, host) in request(),
            max_msg in 1u64..(1 << 21),
            max_inline in 0u32..256,
            flush_read in any::<bool>(),
        ) {
            let p = peer();
            let lim = PlanLimits { max_msg, max_inline, flush_read };
            let source = if host { Source::Host } else { Source::Registered };
            let mut st = QpPlanState::default();
            let mut out = Vec::new();
            match plan_put(&p, &lim, &mut st, window, offset, bytes, source, signal, &mut out) {
                Err(e) => {
                    prop_assert!(matches!(e, GinHostError::Invalid(_)));
                    prop_assert!(out.is_empty());
                    prop_assert_eq!(st, QpPlanState::default());
                }
                Ok(()) => {
                    let writes: Vec<&WrSpec> = out.iter().filter(|w| w.opcode == WrOpcode::RdmaWrite).collect();
                    let mut covered = 0u64;
                    for w in &writes {
                        let off = match w.local { LocalRef::Inline { offset } | LocalRef::Data { offset } => offset, LocalRef::Scratch => u64::MAX };
                        prop_assert_eq!(off, covered);
                        prop_assert!(w.len as u64 >= 1 && w.len as u64 <= max_msg);
                        let win = p.windows[&window];
                        prop_assert_eq!(w.remote_addr, win.addr + offset + off);
                        prop_assert!(w.remote_addr + w.len as u64 <= win.addr + win.len);
                        prop_assert_eq!(w.rkey, win.rkey);
                        prop_assert!(!w.fence);
                        prop_assert!(!w.inline() || (host && w.len <= max_inline));
                        covered += w.len as u64;
                    }
                    prop_assert_eq!(covered, bytes);
                    prop_assert!(writes.iter().all(|w| w.inline()) || writes.iter().all(|w| !w.inline()));
                    if let Some((id, v)) = signal {
                        let a = out.last().unwrap();
                        prop_assert_eq!(a.opcode, WrOpcode::AtomicFetchAdd);
                        prop_assert!(a.fence && a.signaled);
                        prop_assert_eq!((a.remote_addr, a.rkey, a.add), (p.signals_addr + 8 * id as u64, p.signals_rkey, v));
                        let reads = out.iter().filter(|w| w.opcode == WrOpcode::RdmaRead).count();
                        prop_assert_eq!(reads, usize::from(flush_read && bytes > 0));
                        prop_assert_eq!(st.unflushed, None);
                    } else {
                        prop_assert!(out.iter().all(|w| w.opcode == WrOpcode::RdmaWrite));
                    }
                    prop_assert_eq!(out.iter().filter(|w| w.signaled).count(), usize::from(!out.is_empty()));
                    prop_assert!(out.is_empty() || out.last().unwrap().signaled);
                }
            }
        }

        /// Driving a send queue and the staging ring with random posts and
        /// completions: never more outstanding than the depth, never a full
        /// queue without a signaled request in it, live staging slots never
        /// overlap and stay in bounds, and everything drains.
        #[test]
        fn send_queues_and_staging_never_wedge(
            steps in proptest::collection::vec((0usize..3, 1u64..=50, any::<bool>(), any::<bool>()), 1..300),
            depth in 1u32..10,
            interval in 1u32..12,
        ) {
            const PEERS: usize = 3;
            let mut qs: Vec<SendQueue> = (0..PEERS).map(|_| SendQueue::new(depth, interval)).collect();
            // Per queue: the signaled outstanding sequence numbers, oldest first.
            let mut signaled: Vec<VecDeque<u64>> = vec![VecDeque::new(); PEERS];
            let mut staging = Staging::new(100);
            let mut live: Vec<(u64, u64, usize, u64)> = Vec::new();
            for (peer, len, staged, complete) in steps {
                if complete {
                    // The NIC completes the oldest signaled request of `peer`.
                    if let Some(seq) = signaled[peer].pop_front() {
                        prop_assert_eq!(qs[peer].complete(seq & SEQ_MASK), Some(seq));
                        staging.release(|p, s| qs[p].is_done(s));
                        live.retain(|&(_, _, p, s)| !qs[p].is_done(s));
                    }
                    continue;
                }
                let q = &mut qs[peer];
                if q.room() == 0 {
                    // Full: there must be a signaled request to wait for.
                    prop_assert!(!signaled[peer].is_empty());
                    continue;
                }
                let mut off = None;
                if staged {
                    off = staging.alloc(len, peer, q.next_seq());
                    if off.is_none() {
                        // Staging full: it holds slots, and each one's request is
                        // signaled and outstanding, so a completion will free it.
                        prop_assert!(!live.is_empty());
                        prop_assert!(live.iter().all(|&(_, _, p, s)| signaled[p].contains(&s)));
                        continue;
                    }
                }
                let (seq, sig) = q.push(staged).unwrap();
                prop_assert!(q.outstanding() <= depth as u64);
                if sig {
                    signaled[peer].push_back(seq);
                }
                if let Some(o) = off {
                    prop_assert!(o + len <= 100);
                    for &(lo, ll, _, _) in &live {
                        prop_assert!(o + len <= lo || lo + ll <= o, "overlap {o}+{len} with {lo}+{ll}");
                    }
                    live.push((o, len, peer, seq));
                }
            }
            // Drain: complete everything signaled; then every queue is idle
            // except for unsignaled tails (which the transport never leaves:
            // an operation's last request is always signaled).
            for peer in 0..PEERS {
                while let Some(seq) = signaled[peer].pop_front() {
                    qs[peer].complete(seq & SEQ_MASK);
                }
            }
            staging.release(|p, s| qs[p].is_done(s));
            prop_assert!(staging.is_empty());
            for (p, q) in qs.iter().enumerate() {
                prop_assert!(q.outstanding() < interval.clamp(1, depth) as u64, "peer {p}: {q:?}");
            }
        }
    }
}
