//! Per-stage timing of the MoE kernels ([`EpConfig::stage_stamps`]): each
//! CTA's leader records `%globaltimer` at the kernel's start and after its
//! send, wait, counting and last steps; [`EpGroup::stage_times`] turns the latest
//! dispatch's and combine's stamps into times since the earliest CTA's start.

use super::{EpConfig, EpGroup};
use crate::error::{Error, Result};
use crate::runtime::{DeviceBuffer, Stream};
use devcomm_device::moe::STAGES;

/// When the slowest CTA of one kernel finished each stage, in nanoseconds
/// since the earliest CTA started (`%globaltimer`; its resolution is the
/// GPU's, about 1 µs on some, 32 ns on H100/H200). A stage's time includes
/// the ones before it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StageTimes {
    /// The send step's end (dispatch: with its prepare step).
    pub sent_ns: u64,
    /// The wait for every peer's data. The high-throughput per-source
    /// dispatch (`HtLayout::PerSource*`) waits per channel inside its
    /// receive: there, when the CTA's last channel word was seen; the
    /// low-latency single-node dispatch (the streamed receive) waits per
    /// token slot inside its receive: there, the send's end again.
    pub waited_ns: u64,
    /// The low-latency dispatch's counting and grid barrier (before its
    /// token-major pack; with per-expert packing, the pack; single-node:
    /// the streamed receive of every token); the high-throughput
    /// per-source dispatch's last channel copied out (its receive); other
    /// kernels stamp it right before their last step.
    pub counted_ns: u64,
    /// The last step's end (dispatch: the pack; combine: the reduce): the kernel's.
    pub done_ns: u64,
    /// CTAs that recorded every stage of this kernel. The stamps are not
    /// cleared between launches: a CTA that failed this time stops after a
    /// fresh start stamp, its later stamps are an earlier launch's (older),
    /// and it is left out.
    pub ctas: u32,
}

/// The latest high-level dispatch's and combine's [`StageTimes`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelStages {
    /// The dispatch kernel's.
    pub dispatch: StageTimes,
    /// The combine kernel's.
    pub combine: StageTimes,
}

/// Which kernel's stamps: the first or the second half of the buffer.
#[derive(Clone, Copy)]
pub(super) enum Kernel {
    Dispatch = 0,
    Combine = 1,
}

/// A group's stamp buffer: `u64 [2][ctas][STAGES]` (dispatch, combine).
pub(super) fn alloc(
    config: &EpConfig,
    device: &crate::runtime::Device,
    ctas: u32,
) -> Result<Option<DeviceBuffer<u64>>> {
    if !config.stage_stamps {
        return Ok(None);
    }
    Ok(Some(device.alloc::<u64>(2 * ctas as usize * STAGES)?))
}

/// [`StageTimes`] of one kernel's stamps (`u64 [ctas][STAGES]`, 0: never
/// recorded), from the CTAs whose stamps are all set and in order.
fn times(stamps: &[u64]) -> StageTimes {
    let full: Vec<&[u64]> =
        stamps.chunks_exact(STAGES).filter(|c| c[0] != 0 && c.windows(2).all(|p| p[0] <= p[1])).collect();
    let Some(start) = full.iter().map(|c| c[0]).min() else {
        return StageTimes::default();
    };
    let end = |s: usize| full.iter().map(|c| c[s].saturating_sub(start)).max().unwrap_or(0);
    StageTimes { sent_ns: end(1), waited_ns: end(2), counted_ns: end(3), done_ns: end(4), ctas: full.len() as u32 }
}

impl EpGroup<'_> {
    /// The device address of `kernel`'s stamps (0 without [`EpConfig::stage_stamps`]).
    pub(super) fn stamps_addr(&self, kernel: Kernel) -> u64 {
        self.stamps.as_ref().map_or(0, |b| {
            b.device_addr() + (kernel as usize * self.ctas as usize * STAGES * std::mem::size_of::<u64>()) as u64
        })
    }

    /// The stage times of the latest dispatch and combine queued on this
    /// group, read after `stream` (theirs) has finished them (this call
    /// waits for it). Made for finding where a kernel's time goes: with
    /// stamps on, each CTA syncs at every stage, which the plain kernels don't.
    ///
    /// Errors: [`Error::InvalidUsage`] when the group was made without
    /// [`EpConfig::stage_stamps`]; the stream's.
    pub fn stage_times(&self, stream: &Stream) -> Result<KernelStages> {
        let Some(buf) = &self.stamps else {
            return Err(Error::invalid_usage("stage_times: make the group with EpConfig::stage_stamps set"));
        };
        let v = stream.read_vec(buf)?;
        let (d, c) = v.split_at(self.ctas as usize * STAGES);
        Ok(KernelStages { dispatch: times(d), combine: times(c) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_from_stamps() {
        // Two CTAs; the second starts later and finishes last; a third never recorded.
        let s = [100, 150, 180, 190, 300, 120, 200, 220, 240, 260, 0, 0, 0, 0, 0];
        assert_eq!(times(&s), StageTimes { sent_ns: 100, waited_ns: 120, counted_ns: 140, done_ns: 200, ctas: 2 });
        assert_eq!(times(&[0; 10]), StageTimes::default());
        // A CTA that failed after its start: its later stamps are an earlier launch's.
        let s = [100, 150, 180, 190, 300, 400, 150, 180, 190, 200];
        assert_eq!(times(&s), StageTimes { sent_ns: 50, waited_ns: 80, counted_ns: 90, done_ns: 200, ctas: 1 });
    }
}
