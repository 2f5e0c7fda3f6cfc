//! Mapping the LSA peers' allocations: peer access check, descriptor
//! exchange ([`super::fd_passing`]) and the flat mapping (peer `i` at
//! `base + i * stride`).

use super::fd_passing::{self, Header};
use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::runtime::{cuda_can_access_uuid, AddressRange, RuntimeKind, ShareableAlloc};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::time::Instant;

/// Whether this rank's device can load/store every device of its LSA block
/// of `lsa_size` ranks (cached per communicator). On the emulated runtime
/// always true; on CUDA, peers are found by UUID among this process's GPUs
/// (a GPU this process cannot see is assumed reachable: CUDA's IPC handles
/// still work, and the driver reports a failure at mapping time).
pub(crate) fn peer_access_ok(comm: &Communicator, lsa_size: usize) -> Result<bool> {
    let mut cached = comm.ext.p2p_ok.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(ok) = *cached {
        return Ok(ok);
    }
    let me = comm.device();
    let mut ok = true;
    if me.kind() == RuntimeKind::Cuda && lsa_size > 1 {
        let base = comm.rank() - comm.rank() % lsa_size;
        for peer in base..base + lsa_size {
            let info = comm.rank_info(peer)?;
            if info.runtime != RuntimeKind::Cuda {
                ok = false;
                break;
            }
            match cuda_can_access_uuid(me, &info.device_uuid)? {
                Some(true) => {}
                Some(false) => {
                    tracing::warn!(rank = comm.rank(), peer, "GPU {} cannot access rank {peer}'s GPU", me.ordinal());
                    ok = false;
                    break;
                }
                None => tracing::debug!(peer, "peer GPU not visible here; assuming peer access"),
            }
        }
    } else if lsa_size > 1 {
        let base = comm.rank() - comm.rank() % lsa_size;
        for peer in base..base + lsa_size {
            if comm.rank_info(peer)?.runtime != me.kind() {
                ok = false;
            }
        }
    }
    *cached = Some(ok);
    Ok(ok)
}

/// The mapped LSA block of one registration.
pub(crate) struct LsaMapping {
    pub(crate) range: AddressRange,
    pub(crate) stride: u64,
}

/// Everything [`map_peers`] needs.
pub(crate) struct MapParams<'a> {
    pub(crate) seq: u64,
    pub(crate) lsa_size: usize,
    /// Allocation sizes of the LSA block's ranks, by LSA rank.
    pub(crate) alloc_sizes: &'a [u64],
    /// Granularities of the LSA block's ranks.
    pub(crate) granularities: &'a [u64],
    /// The listener bound before the proposal allgather (present iff `lsa_size > 1`).
    pub(crate) listener: Option<&'a UnixListener>,
}

/// Exchanges descriptors with the LSA peers and maps every peer's whole
/// allocation (ours included) into one reserved range.
pub(crate) fn map_peers(comm: &Communicator, mine: &ShareableAlloc, p: &MapParams<'_>) -> Result<LsaMapping> {
    let l = p.lsa_size;
    let lsa_rank = comm.rank() % l;
    let base_rank = comm.rank() - lsa_rank;
    let gran = p.granularities.iter().copied().max().unwrap_or(1).max(1);
    let max_size = p.alloc_sizes.iter().copied().max().unwrap_or(0);
    let stride =
        max_size.checked_next_multiple_of(gran).ok_or_else(|| Error::invalid_argument("window stride overflows"))?;
    let total = stride
        .checked_mul(l as u64)
        .and_then(|t| usize::try_from(t).ok())
        .ok_or_else(|| Error::invalid_argument(format!("{l} peers of {stride} bytes overflow the address space")))?;

    let own_fd = mine.export_fd()?;
    let mut fds: Vec<Option<OwnedFd>> = (0..l).map(|_| None).collect();
    if l > 1 {
        let listener = p.listener.ok_or_else(|| Error::internal("no listener for an LSA exchange"))?;
        let magic = comm.unique_id().magic();
        let deadline = Instant::now() + comm.config().op_timeout;
        let abort = comm.abort_flag();
        let header = Header { magic, seq: p.seq, from_rank: comm.rank() as u64, alloc_size: mine.size() as u64 };
        for peer in 0..l {
            if peer != lsa_rank {
                let name = fd_passing::socket_name(magic, p.seq, base_rank + peer);
                fd_passing::send_fd(&name, &header, own_fd.as_fd(), deadline, abort)?;
            }
        }
        for (h, fd) in fd_passing::accept_fds(listener, l - 1, deadline, abort)? {
            let from = h.from_rank as usize;
            let peer = from.wrapping_sub(base_rank);
            if h.magic != magic || h.seq != p.seq || peer >= l || peer == lsa_rank {
                return Err(Error::remote(format!(
                    "a stray allocation handle arrived (rank {from}, registration {}) during registration {}",
                    h.seq, p.seq
                )));
            }
            if fds[peer].is_some() {
                return Err(Error::remote(format!("rank {from} sent its allocation handle twice")));
            }
            if h.alloc_size != p.alloc_sizes[peer] {
                return Err(Error::remote(format!(
                    "rank {from} sent a handle of {} bytes after announcing {}",
                    h.alloc_size, p.alloc_sizes[peer]
                )));
            }
            fds[peer] = Some(fd);
        }
    }
    fds[lsa_rank] = Some(own_fd);

    let mut range = AddressRange::reserve(comm.device(), total)?;
    for (peer, fd) in fds.iter().enumerate() {
        let fd = fd.as_ref().ok_or_else(|| Error::internal(format!("no handle for LSA peer {peer}")))?;
        let len = usize::try_from(p.alloc_sizes[peer]).map_err(|_| Error::internal("allocation size overflows"))?;
        range
            .map_fd(peer * stride as usize, fd.as_fd(), len)
            .map_err(|e| e.context(format!("mapping LSA peer {peer} (rank {})", base_rank + peer)))?;
        if peer != lsa_rank {
            range.mark_peer(peer * stride as usize, len);
        }
    }
    // The descriptors close here; the mappings keep the memory alive.
    Ok(LsaMapping { range, stride })
}
