//! The high-throughput mode's host side ([`EpMode::HighThroughput`]):
//! its defaults, the handle's two tables, and its kernels' launches. The
//! checks, the sequence numbers and the outputs are the group's, shared
//! with the low-latency mode.

use super::{EpConfig, EpGroup, EpMode, Handle, HtLayout, MoeType};
use crate::coll::DataType;
use crate::error::{Error, Result};
use crate::memory::SymmetricMemory;
use crate::runtime::{DeviceBuffer, RuntimeKind, Stream};
use devcomm_device::moe::{MoeArgs, MoeHtArgs};
use std::marker::PhantomData;

/// Channels per destination rank: the config's, else `512 / ranks` in
/// `1..=256` on GPUs (about 512 streams in all, each taken by a span of warps) and 2 on the
/// emulated runtime. Only the config, the rank count and the runtime kind decide,
/// so every rank gets the same.
pub(super) fn channels(c: &EpConfig, kind: RuntimeKind, nranks: usize) -> u32 {
    match (c.channels, kind) {
        (0, RuntimeKind::Cuda) => (512 / nranks.max(1)).clamp(1, 256) as u32,
        (0, RuntimeKind::Emulated) => 2,
        (g, _) => g,
    }
}

/// CTAs of the high-throughput kernels on a GPU: one per SM, up to 128
/// (the launch is co-resident). The kernels give each item a span of as
/// many warps as the grid has for the items (`Items::spans` in
/// `devcomm-kernels`), so no CTA only waits. On 2 × H200 (4096 tokens, 2
/// ranks, bf16 hidden 7168) the combine took 843 µs with 64 CTAs, 779 with
/// 96, 564 with 128 and 574 with 132
/// (`benches/results/2026-11-27-h200x2-moe-stages.md`). Before the spans,
/// with a CTA per item, CTAs beyond the items slowed the others badly
/// (combine 2.3 ms with 64 CTAs, 88 ms with 128;
/// `benches/results/2026-11-23-h200x2-gin-frees-moe-hier.md`).
pub(super) fn default_ctas(sms: u32) -> u32 {
    sms.clamp(1, 128)
}

/// A high-throughput handle's tables (see `MoeHtArgs`): `rank_pos`
/// always; `recv_rows` in the per-expert layout; the received routing and
/// per-source counts in the per-source layout.
pub(super) struct HtTables {
    rank_pos: DeviceBuffer<u32>,
    recv_rows: Option<DeviceBuffer<u32>>,
    per_source: Option<PerSource>,
}

/// The per-source layout's outputs kept in the handle.
struct PerSource {
    idx: DeviceBuffer<i32>,
    weights: DeviceBuffer<f32>,
    counts: DeviceBuffer<u32>,
}

impl Handle {
    /// High-throughput mode: `u32 [max_tokens][ranks]`, the position of
    /// each token among those this rank sent to each rank ([`super::NO_POS`]:
    /// not sent there), for device code ([`devcomm_device::moe::ht`]);
    /// `None` in low-latency mode.
    pub fn rank_positions(&self) -> Option<&DeviceBuffer<u32>> {
        self.ht.as_ref().map(|h| &h.rank_pos)
    }

    /// High-throughput mode, [`HtLayout::PerExpert`]: `u32 [ranks ×
    /// max_tokens][top_k]`, for each received token's top-k entry that
    /// names a local expert, its row in the packed output (what combine
    /// reads the expert output from); `None` otherwise.
    pub fn recv_rows(&self) -> Option<&DeviceBuffer<u32>> {
        self.ht.as_ref().and_then(|h| h.recv_rows.as_ref())
    }

    /// [`HtLayout::PerSource`]: `i32 [ranks × max_tokens][top_k]`, row
    /// `s·M + p` the top-k entries of the received token in the same row
    /// of `recv_x`, as local expert indices (`0..L`), -1 for an expert of
    /// another rank; `None` otherwise. Written by the dispatch (read it
    /// after the stream gets there).
    pub fn recv_topk_idx(&self) -> Option<&DeviceBuffer<i32>> {
        self.per_source().map(|p| &p.idx)
    }

    /// [`HtLayout::PerSource`]: `f32 [ranks × max_tokens][top_k]`, the
    /// entries' gate weights (0 where [`Handle::recv_topk_idx`] is -1);
    /// `None` otherwise.
    pub fn recv_topk_weights(&self) -> Option<&DeviceBuffer<f32>> {
        self.per_source().map(|p| &p.weights)
    }

    /// [`HtLayout::PerSource`]: `u32 [ranks]`, the tokens received from
    /// each source rank (rows `s·M .. s·M + count` of `recv_x`); `None`
    /// otherwise.
    #[doc(alias = "num_recv_tokens_per_rank")]
    pub fn recv_source_counts(&self) -> Option<&DeviceBuffer<u32>> {
        self.per_source().map(|p| &p.counts)
    }

    fn per_source(&self) -> Option<&PerSource> {
        self.ht.as_ref().and_then(|h| h.per_source.as_ref())
    }
}

impl EpGroup<'_> {
    /// Whether this group's dispatch leaves its tokens per source
    /// ([`HtLayout::PerSource`] in high-throughput mode).
    pub(super) fn per_source(&self) -> bool {
        self.config.mode == EpMode::HighThroughput
            && matches!(self.config.ht_layout, HtLayout::PerSource | HtLayout::PerSourceInWindow)
    }

    /// Whether the per-source output stays in the window ([`HtLayout::PerSourceInWindow`]).
    pub(super) fn in_window(&self) -> bool {
        self.config.mode == EpMode::HighThroughput && self.config.ht_layout == HtLayout::PerSourceInWindow
    }

    /// Elements of a dispatch's `recv_x` (none when the output is the window's).
    pub(super) fn recv_x_len(&self) -> usize {
        if self.in_window() {
            0
        } else {
            self.recv_rows_total() * self.config.hidden
        }
    }

    /// Device address of this rank's receive slots (the in-window output),
    /// as the kernels' own window pointer gives it
    /// (`devcomm_device::moe::ht::window_rows`: the window's LSA mapping of
    /// this rank), not `mem`'s address: the per-source receive skips its copy
    /// out only when the output *is* that address. With `mem`'s, a second
    /// mapping of the same bytes, every received row was copied onto itself
    /// (~20 µs of each 4096-token dispatch on 2 × H200, session 30).
    pub(super) fn window_rows_addr(&self) -> u64 {
        self.ctx.window().local_ptr::<u8>(self.ctx.ht_recv_slot_offset(0, 0)) as u64
    }

    /// The tokens the latest dispatch left in the window, `[N·M × H]` by
    /// (source rank, position) as [`HtLayout::PerSource`]'s `recv_x`:
    /// source `s`'s first [`Handle::recv_source_counts`]`[s]` rows hold its
    /// tokens. Valid from when the dispatch is done on the stream until the
    /// next dispatch is queued (its tokens land here); rows past a source's
    /// count hold whatever an earlier dispatch left.
    ///
    /// Errors: [`Error::InvalidUsage`] on a group without
    /// [`HtLayout::PerSourceInWindow`]; [`Error::InvalidArgument`] for `T`
    /// other than the group's element type.
    #[doc(alias = "recv_x")]
    pub fn recv_rows<T: MoeType>(&self) -> Result<WindowRows<'_, T>> {
        if !self.in_window() {
            return Err(Error::invalid_usage(
                "recv_rows: the group's tokens are in Dispatched::recv_x (HtLayout::PerSourceInWindow leaves them in the window)",
            ));
        }
        self.check_type::<T>()?;
        Ok(WindowRows {
            mem: &self.mem,
            addr: self.window_rows_addr(),
            offset: self.ctx.ht_recv_slot_offset(0, 0) as usize,
            len: self.recv_rows_total() * self.config.hidden,
            _t: PhantomData,
        })
    }
}

/// Rows of `T` in an [`EpGroup`]'s window ([`EpGroup::recv_rows`]): a
/// view, borrowed from the group, of memory its kernels write.
pub struct WindowRows<'g, T> {
    mem: &'g SymmetricMemory,
    /// The rows' device address as the kernels see them (the group's
    /// `window_rows_addr`), for kernel arguments.
    addr: u64,
    offset: usize,
    len: usize,
    _t: PhantomData<&'g [T]>,
}

impl<T> std::fmt::Debug for WindowRows<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WindowRows").field("addr", &format_args!("{:#x}", self.addr)).field("len", &self.len).finish()
    }
}

impl<T: MoeType> WindowRows<'_, T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the view has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address of the first element, for kernel arguments: the
    /// address `devcomm_device::moe::ht::window_rows` gives in a kernel, so
    /// a user kernel that passes it to `dispatch_recv_channel` as `out`
    /// leaves the tokens where they landed (no copy).
    pub fn device_addr(&self) -> u64 {
        self.addr
    }

    /// The device address as a pointer, for kernel arguments (meaningful
    /// to dereference on the host only on the emulated runtime).
    pub fn as_ptr(&self) -> *const T {
        self.device_addr() as *const T
    }

    /// Reads every element (waits for the work queued on `stream` first).
    pub fn read_vec(&self, stream: &Stream) -> Result<Vec<T>> {
        let mut v = vec![T::zeroed(); self.len];
        self.mem.read(stream, self.offset, &mut v)?;
        Ok(v)
    }

    /// Queues a device-to-device copy of every element into `dst` (for
    /// example a combine's input made from the received tokens).
    ///
    /// Errors: [`Error::InvalidArgument`] for `dst` of another length or
    /// device, or `stream` of another device.
    pub fn copy_to(&self, dst: &mut DeviceBuffer<T>, stream: &Stream) -> Result<()> {
        self.check_peer(dst)?;
        stream.check_buffer(dst.device())?;
        // SAFETY: both ranges are live device memory of the stream's device (the
        // window borrowed for `'g`, `dst` borrowed mutably) of `len`
        // elements each, and distinct allocations, so they do not overlap.
        unsafe { stream.memcpy_raw(dst.device_addr(), self.device_addr(), self.len * std::mem::size_of::<T>()) }
    }

    /// Queues a device-to-device copy of `src` over every element (for
    /// example outputs made elsewhere, before [`EpGroup::combine_in_window`]).
    ///
    /// Errors: [`Error::InvalidArgument`] for `src` of another length or
    /// device, or `stream` of another device.
    pub fn copy_from(&self, src: &DeviceBuffer<T>, stream: &Stream) -> Result<()> {
        self.check_peer(src)?;
        stream.check_buffer(src.device())?;
        // SAFETY: as in `copy_to`, the other way round.
        unsafe { stream.memcpy_raw(self.device_addr(), src.device_addr(), self.len * std::mem::size_of::<T>()) }
    }

    /// `Ok` when `buf` has this view's length and device.
    fn check_peer(&self, buf: &DeviceBuffer<T>) -> Result<()> {
        if buf.len() != self.len || buf.device().ordinal() != self.mem.device().ordinal() {
            return Err(Error::invalid_argument(format!(
                "WindowRows: {} elements on device {}, the buffer {} on device {}",
                self.len,
                self.mem.device().ordinal(),
                buf.len(),
                buf.device().ordinal()
            )));
        }
        Ok(())
    }
}

impl EpGroup<'_> {
    /// Rows of a dispatch's `recv_x` (and of a combine's input): `N·M`
    /// per source, else `L·N·M`.
    pub(super) fn recv_rows_total(&self) -> usize {
        let nm = self.comm.count() * self.config.max_tokens_per_rank;
        if self.per_source() {
            nm
        } else {
            self.local_experts() * nm
        }
    }

    /// The handle's high-throughput tables (None in low-latency mode).
    pub(super) fn alloc_ht_handle(&self) -> Result<Option<HtTables>> {
        if self.config.mode != EpMode::HighThroughput {
            return Ok(None);
        }
        let dev = self.comm.device();
        let (n, m, k) = (self.comm.count(), self.config.max_tokens_per_rank, self.config.top_k);
        let (recv_rows, per_source) = if self.per_source() {
            let p = PerSource {
                idx: dev.alloc::<i32>(n * m * k)?,
                weights: dev.alloc::<f32>(n * m * k)?,
                counts: dev.alloc::<u32>(n)?,
            };
            (None, Some(p))
        } else {
            (Some(dev.alloc::<u32>(n * m * k)?), None)
        };
        Ok(Some(HtTables { rank_pos: dev.alloc::<u32>(m * n)?, recv_rows, per_source }))
    }

    /// `args` with the handle's tables (checked to be this group's shapes).
    fn ht_args(&self, args: MoeArgs, handle: &Handle) -> Result<MoeHtArgs> {
        let (n, m, k) = (self.comm.count(), self.config.max_tokens_per_rank, self.config.top_k);
        let bad = || Error::invalid_argument("the handle was not made by this high-throughput group");
        let t = handle.ht.as_ref().ok_or_else(bad)?;
        if t.rank_pos.len() != m * n {
            return Err(bad());
        }
        let mut a = MoeHtArgs {
            args,
            rank_pos: t.rank_pos.device_addr(),
            recv_rows: 0,
            recv_idx: 0,
            recv_weights: 0,
            source_counts: 0,
        };
        match (&t.recv_rows, &t.per_source, self.per_source()) {
            (Some(r), None, false) if r.len() == n * m * k => a.recv_rows = r.device_addr(),
            (None, Some(p), true)
                if p.idx.len() == n * m * k && p.weights.len() == n * m * k && p.counts.len() == n =>
            {
                (a.recv_idx, a.recv_weights, a.source_counts) =
                    (p.idx.device_addr(), p.weights.device_addr(), p.counts.device_addr());
            }
            _ => return Err(bad()),
        }
        Ok(a)
    }

    /// Queues the high-throughput dispatch kernel (`args` checked by
    /// `launch_dispatch`'s callers; per source, `args.counts` zeroed on
    /// the stream by `dispatch_into`).
    pub(super) fn launch_ht_dispatch(&self, args: MoeArgs, handle: &Handle, stream: &Stream) -> Result<()> {
        let a = self.ht_args(args, handle)?;
        // SAFETY: as for the low-latency dispatch (`launch_dispatch`): this
        // group's live high-throughput context and buffers of the checked
        // shapes, the handle's tables of the layout's shapes (checked by
        // `ht_args`: `M × N`, and `N × M × K` / `N` where used), kept alive
        // by the callers' borrows while queued; per source the counts
        // zeroed earlier on the stream; the same dispatch on every rank;
        // co-resident, threads a multiple of 32.
        unsafe {
            if self.per_source() {
                stream.launch::<devcomm_kernels::moe::moe_ht_dispatch_per_source>(self.launch_config(), (a,))
            } else {
                stream.launch::<devcomm_kernels::moe::moe_ht_dispatch>(self.launch_config(), (a,))
            }
        }
    }

    /// Queues the high-throughput combine kernel of `T` (`args` checked by
    /// `combine_into`).
    /// `in_window`: the in-window combine (`args.x` the window rows).
    pub(super) fn launch_ht_combine<T: MoeType>(
        &self,
        args: MoeArgs,
        handle: &Handle,
        stream: &Stream,
        in_window: bool,
    ) -> Result<()> {
        let a = self.ht_args(args, handle)?;
        let cfg = self.launch_config();
        use devcomm_kernels::moe as k;
        // SAFETY: as in `combine_into`: live context, `expert_out` and `y`
        // of the checked shapes, the handle of this group's latest dispatch
        // (its tables written by that dispatch's kernel, earlier on the
        // stream), the same combine on every rank; `T` matches the kernel;
        // in window, `x` this rank's window rows (its whole receive area)
        // and every rank's combine the in-window one (the collective contract).
        unsafe {
            if in_window {
                return match T::DTYPE {
                    DataType::F32 => stream.launch::<k::moe_ht_combine_window_f32>(cfg, (a,)),
                    DataType::Bf16 => stream.launch::<k::moe_ht_combine_window_bf16>(cfg, (a,)),
                    _ => stream.launch::<k::moe_ht_combine_window_f16>(cfg, (a,)),
                };
            }
            match (T::DTYPE, self.per_source()) {
                (DataType::F32, false) => stream.launch::<k::moe_ht_combine_f32>(cfg, (a,)),
                (DataType::Bf16, false) => stream.launch::<k::moe_ht_combine_bf16>(cfg, (a,)),
                (_, false) => stream.launch::<k::moe_ht_combine_f16>(cfg, (a,)),
                (DataType::F32, true) => stream.launch::<k::moe_ht_combine_rows_f32>(cfg, (a,)),
                (DataType::Bf16, true) => stream.launch::<k::moe_ht_combine_rows_bf16>(cfg, (a,)),
                (_, true) => stream.launch::<k::moe_ht_combine_rows_f16>(cfg, (a,)),
            }
        }
    }
}
