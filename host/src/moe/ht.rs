//! The high-throughput mode's host side ([`EpMode::HighThroughput`]):
//! its defaults, the handle's two tables, and its kernels' launches. The
//! checks, the sequence numbers and the outputs are the group's, shared
//! with the low-latency mode.

use super::{EpConfig, EpGroup, EpMode, Handle, MoeType};
use crate::coll::DataType;
use crate::error::{Error, Result};
use crate::runtime::{DeviceBuffer, RuntimeKind, Stream};
use devcomm_device::moe::{MoeArgs, MoeHtArgs};

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

impl Handle {
    /// High-throughput mode: `u32 [max_tokens][ranks]`, the position of
    /// each token among those this rank sent to each rank ([`super::NO_POS`]:
    /// not sent there), for device code ([`devcomm_device::moe::ht`]);
    /// `None` in low-latency mode.
    pub fn rank_positions(&self) -> Option<&DeviceBuffer<u32>> {
        self.ht.as_ref().map(|h| &h.0)
    }

    /// High-throughput mode: `u32 [ranks × max_tokens][top_k]`, for each
    /// received token's top-k entry that names a local expert, its row in
    /// the packed output (what combine reads the expert output from);
    /// `None` in low-latency mode.
    pub fn recv_rows(&self) -> Option<&DeviceBuffer<u32>> {
        self.ht.as_ref().map(|h| &h.1)
    }
}

impl EpGroup<'_> {
    /// The handle's high-throughput tables (None in low-latency mode).
    pub(super) fn alloc_ht_handle(&self) -> Result<Option<(DeviceBuffer<u32>, DeviceBuffer<u32>)>> {
        if self.config.mode != EpMode::HighThroughput {
            return Ok(None);
        }
        let dev = self.comm.device();
        let (n, m, k) = (self.comm.count(), self.config.max_tokens_per_rank, self.config.top_k);
        Ok(Some((dev.alloc::<u32>(m * n)?, dev.alloc::<u32>(n * m * k)?)))
    }

    /// `args` with the handle's tables (checked to be this group's shapes).
    fn ht_args(&self, args: MoeArgs, handle: &Handle) -> Result<MoeHtArgs> {
        let (n, m, k) = (self.comm.count(), self.config.max_tokens_per_rank, self.config.top_k);
        match &handle.ht {
            Some((rank_pos, recv_rows)) if rank_pos.len() == m * n && recv_rows.len() == n * m * k => {
                Ok(MoeHtArgs { args, rank_pos: rank_pos.device_addr(), recv_rows: recv_rows.device_addr() })
            }
            _ => Err(Error::invalid_argument("the handle was not made by this high-throughput group")),
        }
    }

    /// Queues the high-throughput dispatch kernel (`args` checked by
    /// `launch_dispatch`'s callers).
    pub(super) fn launch_ht_dispatch(&self, args: MoeArgs, handle: &Handle, stream: &Stream) -> Result<()> {
        let a = self.ht_args(args, handle)?;
        // SAFETY: as for the low-latency dispatch (`launch_dispatch`): this
        // group's live high-throughput context and buffers of the checked
        // shapes, the handle's tables of `M × N` and `N × M × K` (checked
        // by `ht_args`), kept alive by the callers' borrows while queued;
        // the same dispatch on every rank; co-resident, threads a multiple of 32.
        unsafe { stream.launch::<devcomm_kernels::moe::moe_ht_dispatch>(self.launch_config(), (a,)) }
    }

    /// Queues the high-throughput combine kernel of `T` (`args` checked by
    /// `combine_into`).
    pub(super) fn launch_ht_combine<T: MoeType>(&self, args: MoeArgs, handle: &Handle, stream: &Stream) -> Result<()> {
        let a = self.ht_args(args, handle)?;
        let cfg = self.launch_config();
        use devcomm_kernels::moe as k;
        // SAFETY: as in `combine_into`: live context, `expert_out` and `y`
        // of the checked shapes, the handle of this group's latest dispatch
        // (its tables written by that dispatch's kernel, earlier on the
        // stream), the same combine on every rank; `T` matches the kernel.
        unsafe {
            match T::DTYPE {
                DataType::F32 => stream.launch::<k::moe_ht_combine_f32>(cfg, (a,)),
                DataType::Bf16 => stream.launch::<k::moe_ht_combine_bf16>(cfg, (a,)),
                _ => stream.launch::<k::moe_ht_combine_f16>(cfg, (a,)),
            }
        }
    }
}
