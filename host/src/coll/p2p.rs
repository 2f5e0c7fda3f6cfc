//! Point-to-point operations: `send`, `recv`, groups of them launched as
//! one kernel, and `all_to_all_v` built on a group (NCCL's `ncclSend`,
//! `ncclRecv`, `ncclGroupStart`/`ncclGroupEnd`).
//!
//! They run over the point-to-point channels of the device collectives
//! ([`devcomm_device::coll::send`]): a message is pushed in chunks into
//! slots in the receiver's scratch and copied out by the receiver. A send
//! of up to `p2p_slots × p2p_chunk_bytes` bytes ([`super::CollConfig`])
//! completes without its receive (eager); a longer one waits for it. Two
//! ranks that exchange long messages must therefore put the send and the
//! receive in one [`Group`] (as with NCCL): its operations run at once, in
//! one launch.

use super::{CollType, Collectives, Kind, Op, Operand};
use crate::error::{Error, Result};
use crate::runtime::{LaunchConfig, Stream};
use devcomm_device::coll::{p2p_chunks, P2pArgs, P2pKind, P2pOp, MAX_GROUP_OPS};
use devcomm_device::coll::{CollArgs, CollBuffer, DataType};
use devcomm_device::comm::WindowDesc;
use std::marker::PhantomData;

/// Sends and receives that run together, in one launch, when the group
/// ends (NCCL's `ncclGroupStart` … `ncclGroupEnd`).
///
/// Made by [`Collectives::group_start`] (ended by [`Group::end`], or by its
/// drop, which keeps a failure for the next call of the [`Collectives`])
/// or by [`Collectives::group`] (a closure). Operations to the same peer in
/// the same direction run in the order they were added and match the
/// peer's in that order. Collectives called while a group is open are
/// issued at once, before the group's launch.
///
/// ```
/// use devcomm::prelude::*;
///
/// let comms = Communicator::init_all_count(RuntimeSelection::Emulated, 2)?;
/// std::thread::scope(|s| {
///     for comm in &comms {
///         s.spawn(move || -> devcomm::Result<()> {
///             let coll = comm.collectives()?;
///             let stream = comm.device().stream();
///             let peer = 1 - comm.rank();
///             let mine = comm.device().alloc_from(&[comm.rank() as u32; 100])?;
///             let theirs = comm.device().alloc::<u32>(100)?;
///             coll.group(stream, |g| {
///                 g.send(&mine, peer)?;
///                 g.recv(&theirs, peer)
///             })?;
///             assert_eq!(stream.read_vec(&theirs)?, vec![peer as u32; 100]);
///             Ok(())
///         });
///     }
/// });
/// # Ok::<(), devcomm::Error>(())
/// ```
#[doc(alias = "ncclGroupStart")]
#[doc(alias = "ncclGroupEnd")]
pub struct Group<'g, 'c, 'a> {
    coll: &'g Collectives<'c>,
    stream: &'g Stream,
    /// (kind, peer, device address, bytes), in the order added.
    ops: Vec<(P2pKind, usize, u64, u64)>,
    ended: bool,
    /// Whether checking mode compares it across ranks (not for the steps
    /// of a hierarchical collective, which only some ranks take and whose
    /// collective was compared already).
    checked: bool,
    _operands: PhantomData<&'a ()>,
}

impl std::fmt::Debug for Group<'_, '_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group").field("ops", &self.ops.len()).field("ended", &self.ended).finish()
    }
}

impl<'a> Group<'_, '_, 'a> {
    /// Adds a send of `buf` to `peer` (`ncclSend`); the peer adds the
    /// matching [`Group::recv`] (same byte count).
    ///
    /// Errors: [`Error::InvalidArgument`] for a peer out of range, a buffer
    /// on another device or communicator, a group already holding
    /// `MAX_GROUP_OPS` (64) operations.
    #[doc(alias = "ncclSend")]
    pub fn send<T: CollType>(&mut self, buf: impl Into<Operand<'a, T>>, peer: usize) -> Result<()> {
        self.add(P2pKind::Send, "send", buf.into(), peer)
    }

    /// Adds a receive from `peer` into `buf` (`ncclRecv`); the peer adds
    /// the matching [`Group::send`]. A sender's different byte count is
    /// reported by the device (`Error` from the next call or
    /// [`Collectives::synchronize`]); nothing is written past `buf`.
    ///
    /// Errors as [`Group::send`].
    #[doc(alias = "ncclRecv")]
    pub fn recv<T: CollType>(&mut self, buf: impl Into<Operand<'a, T>>, peer: usize) -> Result<()> {
        self.add(P2pKind::Recv, "recv", buf.into(), peer)
    }

    fn add<T: CollType>(&mut self, kind: P2pKind, what: &str, buf: Operand<'a, T>, peer: usize) -> Result<()> {
        let n = self.coll.comm.count();
        if peer >= n {
            return Err(Error::invalid_argument(format!("{what}: peer {peer} is not below the rank count {n}")));
        }
        if !buf.is_empty() {
            self.coll.check_operand(what, &buf)?;
        }
        if self.ops.len() == MAX_GROUP_OPS {
            return Err(Error::invalid_argument(format!(
                "{what}: a group holds at most {MAX_GROUP_OPS} sends and receives; end it and start another"
            )));
        }
        let bytes = (buf.len() as u64)
            .checked_mul(std::mem::size_of::<T>() as u64)
            .ok_or_else(|| Error::invalid_argument(format!("{what}: byte count overflows")))?;
        self.ops.push((kind, peer, buf.ptr, bytes));
        Ok(())
    }

    /// Launches the group's operations (one kernel) on the group's stream.
    ///
    /// Errors: a failure an earlier operation of the [`Collectives`]
    /// reported; in checking mode, sends and receives that do not match
    /// across ranks ([`Error::InvalidArgument`] naming them); launch errors.
    #[doc(alias = "ncclGroupEnd")]
    pub fn end(mut self) -> Result<()> {
        self.ended = true;
        let ops = std::mem::take(&mut self.ops);
        self.coll.launch_group(ops, self.stream, self.checked)
    }
}

impl Drop for Group<'_, '_, '_> {
    /// Ends a group that was not ended: launches it, and keeps a failure
    /// for the [`Collectives`]' next call.
    fn drop(&mut self) {
        if !self.ended {
            let ops = std::mem::take(&mut self.ops);
            if let Err(e) = self.coll.launch_group(ops, self.stream, self.checked) {
                self.coll.keep(e);
            }
        }
    }
}

impl<'c> Collectives<'c> {
    /// Opens a group of sends and receives on `stream` (`ncclGroupStart`);
    /// see [`Group`].
    #[doc(alias = "ncclGroupStart")]
    pub fn group_start<'g, 'a>(&'g self, stream: &'g Stream) -> Group<'g, 'c, 'a> {
        Group { coll: self, stream, ops: Vec::new(), ended: false, checked: true, _operands: PhantomData }
    }

    /// [`Collectives::group`] for a step of a collective: not compared
    /// across ranks in checking mode (the collective was).
    pub(super) fn step_group<'g, 'a>(
        &'g self,
        stream: &'g Stream,
        f: impl FnOnce(&mut Group<'g, 'c, 'a>) -> Result<()>,
    ) -> Result<()> {
        let mut g = Group { coll: self, stream, ops: Vec::new(), ended: false, checked: false, _operands: PhantomData };
        let r = f(&mut g);
        if r.is_err() {
            g.ended = true;
        }
        r?;
        g.end()
    }

    /// Runs `f` on a new group and ends it (one launch for all its sends
    /// and receives); returns `f`'s error without launching, else the
    /// launch's.
    pub fn group<'g, 'a, R>(
        &'g self,
        stream: &'g Stream,
        f: impl FnOnce(&mut Group<'g, 'c, 'a>) -> Result<R>,
    ) -> Result<R> {
        let mut g = self.group_start(stream);
        match f(&mut g) {
            Ok(r) => g.end().map(|()| r),
            Err(e) => {
                g.ended = true;
                Err(e)
            }
        }
    }

    /// Sends `buf` to `peer` (`ncclSend`), a group of one: it completes
    /// without the receive only when eager (see [`Group`]);
    /// exchanges of long messages go in one [`Collectives::group`].
    #[doc(alias = "ncclSend")]
    pub fn send<'a, T: CollType>(&self, buf: impl Into<Operand<'a, T>>, peer: usize, stream: &Stream) -> Result<()> {
        let buf = buf.into();
        self.group(stream, |g| g.send(buf, peer))
    }

    /// Receives from `peer` into `buf` (`ncclRecv`), a group of one.
    #[doc(alias = "ncclRecv")]
    pub fn recv<'a, T: CollType>(&self, buf: impl Into<Operand<'a, T>>, peer: usize, stream: &Stream) -> Result<()> {
        let buf = buf.into();
        self.group(stream, |g| g.recv(buf, peer))
    }

    /// All-to-all with per-peer counts and displacements (in elements):
    /// `send[send_displs[p]..][..send_counts[p]]` goes to rank `p`, which
    /// receives it in `recv[recv_displs[me]..][..recv_counts[me]]`
    /// (`ncclAllToAllv`, MPI's `Alltoallv`): a group of one send and one
    /// receive per rank. `recv_counts[p]` must equal rank `p`'s
    /// `send_counts[me]`.
    ///
    /// Errors: [`Error::InvalidArgument`] for count or displacement lists
    /// not one per rank, or a range past its buffer; as [`Group::end`].
    #[doc(alias = "ncclAllToAllv")]
    #[allow(clippy::too_many_arguments)]
    pub fn all_to_all_v<'a, T: CollType>(
        &self,
        send: impl Into<Operand<'a, T>>,
        send_counts: &[usize],
        send_displs: &[usize],
        recv: impl Into<Operand<'a, T>>,
        recv_counts: &[usize],
        recv_displs: &[usize],
        stream: &Stream,
    ) -> Result<()> {
        let (send, recv) = (send.into(), recv.into());
        let n = self.comm.count();
        let me = self.comm.rank();
        for (name, list) in [
            ("send_counts", send_counts),
            ("send_displs", send_displs),
            ("recv_counts", recv_counts),
            ("recv_displs", recv_displs),
        ] {
            if list.len() != n {
                return Err(Error::invalid_argument(format!(
                    "all_to_all_v: {name} has {} entries, it needs one per rank ({n})",
                    list.len()
                )));
            }
        }
        let mut parts = Vec::with_capacity(2 * n);
        for k in 0..n {
            // Start with the next rank, so ranks do not all send to rank 0 first.
            let p = (me + k) % n;
            let s = send.sub(send_displs[p], send_counts[p]).map_err(|e| e.context("all_to_all_v send"))?;
            let r = recv.sub(recv_displs[p], recv_counts[p]).map_err(|e| e.context("all_to_all_v recv"))?;
            parts.push((s, r, p));
        }
        self.group(stream, |g| {
            for (s, r, p) in parts {
                g.send(s, p)?;
                g.recv(r, p)?;
            }
            Ok(())
        })
    }

    /// The first sequence number for a send to (or receive from) `peer` of
    /// `bytes` bytes in a kernel of your own calling
    /// [`devcomm_device::coll::send`] / [`recv`](devcomm_device::coll::recv)
    /// with [`Collectives::context`] ([`P2pOp::first_seq`]): reserves the
    /// message's chunks on that channel, as this object's own sends and
    /// receives do. The peer reserves the matching operation alike.
    ///
    /// Errors: [`Error::InvalidArgument`] for a peer out of range.
    pub fn reserve_p2p(&self, kind: P2pKind, peer: usize, bytes: u64) -> Result<u64> {
        let n = self.comm.count();
        if peer >= n {
            return Err(Error::invalid_argument(format!("reserve_p2p: peer {peer} is not below the rank count {n}")));
        }
        let mut seqs = self.p2p_seq.lock().unwrap_or_else(|p| p.into_inner());
        let counter = &mut seqs[peer][kind as usize];
        let first = *counter + 1;
        *counter += p2p_chunks(&self.ctx, peer as u32, bytes);
        Ok(first)
    }

    /// A collective over several LSA teams, as a group of sends and
    /// receives (flat: every rank with every rank; GIN between teams), the
    /// reductions then reduce the received blocks with a local kernel.
    /// `count` is the per-rank block (as `run` takes it).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_flat<T: CollType>(
        &self,
        kind: Kind,
        send: &Operand<'_, T>,
        recv: &Operand<'_, T>,
        count: usize,
        op: &Op<'_, T>,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        let (n, me) = (self.comm.count(), self.comm.rank());
        if 2 * n > MAX_GROUP_OPS {
            return Err(Error::invalid_usage(format!(
                "{kind:?} over several LSA teams runs as one group of {} sends and receives, more than {MAX_GROUP_OPS}",
                2 * n
            )));
        }
        let (send, recv) = (*send, *recv);
        // Every rank's block `p` of an operand holding `n` blocks.
        fn blk<'o, T: CollType>(o: &Operand<'o, T>, p: usize, count: usize) -> Result<Operand<'o, T>> {
            o.sub(p * count, count)
        }
        let block = |o, p| blk(o, p, count);
        // Peers in the order next rank first.
        let peers = move || (0..n).map(move |k| (me + k) % n);
        match kind {
            Kind::AllGather => self.group(stream, |g| {
                for p in peers() {
                    let dst = block(&recv, p)?;
                    // In place: the own block is already there.
                    if p != me || dst.ptr != send.ptr {
                        g.send(send, p)?;
                        g.recv(dst, p)?;
                    }
                }
                Ok(())
            }),
            Kind::AllToAll => self.group(stream, |g| {
                for p in peers() {
                    g.send(block(&send, p)?, p)?;
                    g.recv(block(&recv, p)?, p)?;
                }
                Ok(())
            }),
            Kind::Broadcast => self.group(stream, |g| {
                if me == root {
                    for p in peers().filter(|&p| p != me || send.ptr != recv.ptr) {
                        g.send(send, p)?;
                    }
                }
                if me != root || send.ptr != recv.ptr {
                    g.recv(recv, root)?;
                }
                Ok(())
            }),
            Kind::Scatter => self.group(stream, |g| {
                if me == root {
                    for p in peers() {
                        g.send(block(&send, p)?, p)?;
                    }
                }
                g.recv(recv, root)
            }),
            Kind::Gather => self.group(stream, |g| {
                g.send(send, root)?;
                if me == root {
                    for p in peers() {
                        g.recv(block(&recv, p)?, p)?;
                    }
                }
                Ok(())
            }),
            Kind::AllReduce | Kind::Reduce | Kind::ReduceScatter => {
                // Receive every rank's block into `temp` (rank order), then
                // reduce the blocks locally (rank order: the same bits on
                // every rank).
                let receives = kind != Kind::Reduce || me == root;
                let temp = self.temp::<T>(0, if receives { n * count } else { 0 })?;
                self.group(stream, |g| {
                    for p in peers() {
                        let (to, part) = match kind {
                            Kind::AllReduce => (Some(p), send),
                            Kind::Reduce => (if p == 0 { Some(root) } else { None }, send),
                            _ => (Some(p), block(&send, p)?),
                        };
                        if let Some(to) = to {
                            g.send(part, to)?;
                        }
                        if receives {
                            g.recv(block(&temp, p)?, p)?;
                        }
                    }
                    Ok(())
                })?;
                if !receives {
                    return Ok(());
                }
                // SAFETY: `temp` holds `n` blocks of `count` elements (the
                // group above fills them, earlier on this stream), `recv`
                // `count` (checked by the caller).
                unsafe { self.reduce_local(&temp, n, recv.ptr, count, op.code(), op.scalar()?, 0, stream) }
            }
        }
    }

    /// Queues `dst[i] = code over b < blocks of src[b * count + i]` for `i <
    /// count` (the local reduction kernel), `scalar` as [`Op::scalar`]
    /// gives it; `Avg` divides by `avg_inputs` (0: by `blocks`).
    ///
    /// # Safety
    /// `src` holds `blocks * count` elements, `dst` is `count` elements of
    /// this device's memory (or `src`'s block 0), both alive until the
    /// stream passes this point.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn reduce_local<T: CollType>(
        &self,
        src: &Operand<'_, T>,
        blocks: usize,
        dst: u64,
        count: usize,
        code: devcomm_device::coll::RedOp,
        (scalar, scalar_ptr): (u64, u64),
        avg_inputs: u32,
        stream: &Stream,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let plain = |ptr: u64| CollBuffer { ptr, window: WindowDesc::NONE, offset: 0, in_window: 0, reserved: 0 };
        let args = CollArgs {
            ctx: self.ctx,
            src: plain(src.ptr),
            dst: plain(dst),
            count: count as u64,
            scalar,
            scalar_ptr,
            errors: self.error.device_addr(),
            op: code as u32,
            root: blocks as u32,
            algorithm: 0,
            seq: avg_inputs,
        };
        let packs = (count * std::mem::size_of::<T>()).div_ceil(16);
        let ctas = packs.div_ceil(self.threads as usize).clamp(1, 512) as u32;
        // SAFETY: the caller's contract; the error word is ours.
        unsafe { launch_reduce_local(stream, T::DTYPE, LaunchConfig::new(ctas, self.threads), args) }
    }

    /// Scratch operand `slot` of `len` elements of `T` for collectives
    /// over several LSA teams (grown on demand; reused in stream order:
    /// one collective uses each slot once).
    pub(super) fn temp<T: CollType>(&self, slot: usize, len: usize) -> Result<Operand<'static, T>> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| Error::invalid_argument("collective over several LSA teams: byte count overflows"))?;
        let mut temps = self.temps.lock().unwrap_or_else(|p| p.into_inner());
        let temp = temps.get_mut(slot).ok_or_else(|| Error::internal(format!("no scratch slot {slot}")))?;
        if temp.as_ref().is_none_or(|b| b.len() < bytes) {
            // The old buffer is freed first (freeing waits for the device).
            *temp = None;
            *temp = Some(self.comm.device().alloc::<u8>(bytes.max(16))?);
        }
        let b = temp.as_ref().ok_or_else(|| Error::internal("temp: no buffer"))?;
        Ok(Operand { ptr: b.device_addr(), len, ordinal: b.device().ordinal(), window: None, _t: PhantomData })
    }

    /// Keeps `e` for the next call (a group ended by its drop).
    fn keep(&self, e: Error) {
        let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        p.get_or_insert(e);
    }

    /// Queues the group `ops` (kind, peer, address, bytes) as one launch.
    fn launch_group(&self, ops: Vec<(P2pKind, usize, u64, u64)>, stream: &Stream, checked: bool) -> Result<()> {
        if let Some(e) = self.error() {
            return Err(e);
        }
        if self.config.check_arguments && checked {
            self.check_group_across_ranks(&ops)?;
        }
        if ops.is_empty() {
            return Ok(());
        }
        super::refuse_capture(stream, "a send or receive")?;
        // Tasks: the operations by (peer, kind), each task's in the order added.
        let mut order: Vec<usize> = (0..ops.len()).collect();
        order.sort_by_key(|&i| (ops[i].1, ops[i].0 as u32, i));
        let mut args = P2pArgs {
            ctx: self.ctx,
            errors: self.error.device_addr(),
            n_ops: ops.len() as u32,
            ctas_per_task: 1,
            ops: [P2pOp::NONE; MAX_GROUP_OPS],
        };
        let mut tasks = 0u32;
        let mut most_chunks = 1u64;
        let mut gin_bytes = 0u64;
        {
            for (slot, &i) in order.iter().enumerate() {
                let (kind, peer, ptr, bytes) = ops[i];
                if slot == 0 || (ops[order[slot - 1]].1, ops[order[slot - 1]].0) != (peer, kind) {
                    tasks += 1;
                }
                most_chunks = most_chunks.max(p2p_chunks(&self.ctx, peer as u32, bytes));
                let first_seq = self.reserve_p2p(kind, peer, bytes)?;
                if kind == P2pKind::Send && peer / self.lsa != self.comm.rank() / self.lsa {
                    gin_bytes += bytes;
                }
                args.ops[slot] = P2pOp { ptr, bytes, first_seq, peer: peer as u32, kind: kind as u32 };
            }
        }
        // Up to 256 CTAs in all (every one resident at once).
        let k = most_chunks.min(self.config.p2p_max_ctas as u64).min((256 / tasks).max(1) as u64) as u32;
        args.ctas_per_task = k;
        // Every task's CTAs run at once (a send may wait for a receive of
        // the same launch, on this rank or a peer's): a co-resident launch.
        let cfg = self.launch_config(tasks * k);
        // SAFETY: `args` describes this object's live context (with
        // channels), operands checked for device and communicator and kept
        // alive by the caller's borrows until the group ends (freeing
        // device memory waits for the device); sequence numbers continue
        // each channel's count, as the peer's do for the same operations
        // (the caller's contract: matching sends and receives, checked in
        // checking mode); the error word is this object's.
        unsafe { stream.launch::<devcomm_kernels::coll::p2p_group>(cfg, (args,)) }?;
        self.gin_bytes.fetch_add(gin_bytes, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Payload bytes this rank has queued on point-to-point channels to
    /// ranks of other LSA teams (over GIN) since this object was made:
    /// every send of its groups, and of its collectives over several LSA
    /// teams (flat or hierarchical). Chunk headers and credits are not
    /// counted. 0 with one LSA team.
    pub fn gin_bytes_sent(&self) -> u64 {
        self.gin_bytes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Checking mode: every rank's sends to `p` match `p`'s receives from
    /// it, in order and in bytes.
    fn check_group_across_ranks(&self, ops: &[(P2pKind, usize, u64, u64)]) -> Result<()> {
        let me = self.comm.rank();
        let mine: Vec<u8> = ops
            .iter()
            .flat_map(|&(k, p, _, b)| [k as u64, p as u64, b].into_iter().flat_map(|v| v.to_le_bytes()))
            .collect();
        let all = self.comm.bootstrap_allgather(&mine)?;
        let decode = |bytes: &[u8]| -> Vec<(u64, usize, u64)> {
            bytes
                .chunks_exact(24)
                .map(|c| {
                    let w = |i: usize| u64::from_le_bytes(c[i * 8..i * 8 + 8].try_into().unwrap_or_default());
                    (w(0), w(1) as usize, w(2))
                })
                .collect()
        };
        let lists: Vec<_> = all.iter().map(|b| decode(b)).collect();
        for (p, theirs) in lists.iter().enumerate() {
            // My sends to p against p's receives from me, and the reverse.
            for (dir, from, to) in [(P2pKind::Send, me, p), (P2pKind::Recv, me, p)] {
                let mine: Vec<u64> =
                    lists[from].iter().filter(|o| o.0 == dir as u64 && o.1 == to).map(|o| o.2).collect();
                let other = if dir == P2pKind::Send { P2pKind::Recv } else { P2pKind::Send };
                let matching: Vec<u64> =
                    theirs.iter().filter(|o| o.0 == other as u64 && o.1 == me).map(|o| o.2).collect();
                if mine != matching {
                    let (a, b) = if dir == P2pKind::Send { ("sends", "receives") } else { ("receives", "sends") };
                    return Err(Error::invalid_argument(format!(
                        "group: rank {me}'s {a} with rank {p} (bytes {mine:?}) do not match rank {p}'s {b} with rank {me} (bytes {matching:?})"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// Launches the local reduction kernel for `dtype`.
///
/// # Safety
/// As for the kernel (see `run_flat`).
unsafe fn launch_reduce_local(stream: &Stream, dtype: DataType, cfg: LaunchConfig, args: CollArgs) -> Result<()> {
    use devcomm_kernels::coll as k;
    macro_rules! by_type {
        ($($d:ident => $k:ident,)*) => {
            match dtype {
                $(
                    // SAFETY: the caller's contract.
                    DataType::$d => unsafe { stream.launch::<k::$k>(cfg, (args,)) },
                )*
            }
        };
    }
    by_type! {
        I8 => reduce_local_i8,
        U8 => reduce_local_u8,
        I32 => reduce_local_i32,
        U32 => reduce_local_u32,
        I64 => reduce_local_i64,
        U64 => reduce_local_u64,
        F16 => reduce_local_f16,
        F32 => reduce_local_f32,
        F64 => reduce_local_f64,
        Bf16 => reduce_local_bf16,
        Fp8E4M3 => reduce_local_fp8e4m3,
        Fp8E5M2 => reduce_local_fp8e5m2,
    }
}
