//! Per-stage timing of the host all-reduce kernels
//! ([`CollConfig::stage_stamps`]): each part's (CTA's) leader records
//! `%globaltimer` when the kernel starts, when its barrier session is set
//! up, after its pushes, after its first barrier and when it is done
//! ([`CollStage`]); [`Collectives::stage_times`] turns the latest
//! all-reduce's stamps into times since its earliest part's start.
//!
//! Where a graphed 2 MiB all-reduce's time goes beyond its in-kernel loop
//! (`devcomm-perf --stages`; `benches/gpu/allreduce_floor.cu` stamps a
//! plain-CUDA one the same way).

use super::{CollConfig, Collectives};
use crate::error::{Error, Result};
use crate::runtime::{Device, DeviceBuffer, Stream};
use devcomm_device::coll::{CollStage, COLL_STAGES};
use std::sync::atomic::Ordering;

/// One part's stages of the latest all-reduce kernel, in nanoseconds since
/// the earliest part of that kernel started (`%globaltimer`: 32 ns
/// resolution on H100/H200). A stage the algorithm does not have (LL has
/// only the start and the end), or did not reach, is `None`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartStages {
    /// The part's index (its CTA).
    pub part: u32,
    /// The kernel started on this part.
    pub start_ns: u64,
    /// Its barrier session was set up.
    pub ready_ns: Option<u64>,
    /// Its pushes were issued (before the first barrier).
    pub sent_ns: Option<u64>,
    /// Its first barrier's wait ended.
    pub synced_ns: Option<u64>,
    /// The kernel was done on this part.
    pub done_ns: u64,
}

/// The stamp buffer: `u64 [max_ctas][COLL_STAGES]`, zeroed.
pub(super) fn alloc(config: &CollConfig, device: &Device) -> Result<Option<DeviceBuffer<u64>>> {
    if !config.stage_stamps {
        return Ok(None);
    }
    Ok(Some(device.alloc_from(&vec![0u64; config.max_ctas as usize * COLL_STAGES])?))
}

/// The [`PartStages`] of a kernel of `ctas` CTAs from the stamps (`u64
/// [parts][COLL_STAGES]`, 0: never recorded), by part.
///
/// The stamps are not cleared between kernels: a part whose end precedes
/// its start (it failed after a fresh start stamp) is left out, and an
/// inner stamp outside its part's start and end is an earlier kernel's
/// (`None`).
pub(super) fn parts(stamps: &[u64], ctas: usize) -> Vec<PartStages> {
    let rows: Vec<(u32, &[u64])> = stamps
        .chunks_exact(COLL_STAGES)
        .take(ctas)
        .enumerate()
        .map(|(i, r)| (i as u32, r))
        .filter(|(_, r)| {
            let (s, d) = (r[CollStage::Start as usize], r[CollStage::Done as usize]);
            s != 0 && d >= s
        })
        .collect();
    let earliest = rows.iter().map(|(_, r)| r[CollStage::Start as usize]).min().unwrap_or(0);
    rows.into_iter()
        .map(|(part, r)| {
            let (s, d) = (r[CollStage::Start as usize], r[CollStage::Done as usize]);
            let inner = |k: CollStage| Some(r[k as usize]).filter(|&v| v >= s && v <= d).map(|v| v - earliest);
            PartStages {
                part,
                start_ns: s - earliest,
                ready_ns: inner(CollStage::Ready),
                sent_ns: inner(CollStage::Sent),
                synced_ns: inner(CollStage::Synced),
                done_ns: d - earliest,
            }
        })
        .collect()
}

impl Collectives<'_> {
    /// Each part's stages of the latest host all-reduce launched (its
    /// kernel's [`CollStage`] stamps, [`PartStages`]; in a CUDA graph, the
    /// last one captured); waits for `stream`. Other
    /// collectives do not record stages; a kernel of yours that calls the
    /// device all-reduce with [`Collectives::context`] records the inner
    /// ones (and may call `CollContext::stamp` for the start and end).
    ///
    /// Errors: [`Error::InvalidUsage`] when the object was made without
    /// [`CollConfig::stage_stamps`]; the stream's.
    pub fn stage_times(&self, stream: &Stream) -> Result<Vec<PartStages>> {
        let Some(buf) = &self.stamps else {
            return Err(Error::invalid_usage("stage_times: make the collectives with CollConfig::stage_stamps set"));
        };
        Ok(parts(&stream.read_vec(buf)?, self.stamped_ctas.load(Ordering::Relaxed) as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_of_the_latest_kernel() {
        // A kernel of 2 CTAs after a larger one: part 2's stamps are the
        // earlier kernel's and are not read; part 1's sent and synced
        // stamps lie after its end (the earlier kernel's: this one is LL,
        // or stopped early).
        let s = [1000, 1100, 1200, 1300, 1400, 1010, 1050, 1500, 1600, 1060, 500, 600, 700, 800, 900];
        let p = parts(&s, 2);
        assert_eq!(p.len(), 2);
        assert_eq!(
            p[0],
            PartStages {
                part: 0,
                start_ns: 0,
                ready_ns: Some(100),
                sent_ns: Some(200),
                synced_ns: Some(300),
                done_ns: 400
            }
        );
        assert_eq!(
            p[1],
            PartStages { part: 1, start_ns: 10, ready_ns: Some(50), sent_ns: None, synced_ns: None, done_ns: 60 }
        );
        assert!(parts(&[0; 10], 2).is_empty());
        // A part that failed after its start stamp (end before start) is left out.
        let s = [1000, 0, 0, 0, 1400, 2000, 0, 0, 0, 1500];
        assert_eq!(parts(&s, 2).iter().map(|p| p.part).collect::<Vec<_>>(), vec![0]);
    }
}
