//! Peer-access queries by device UUID that need no context: asking about
//! every GPU of an LSA team must not retain a primary context (hundreds of
//! MiB of GPU memory each) on GPUs this rank never uses.

use super::{cuda, Device, RuntimeKind};
use crate::error::{Error, Result};
use cudarc::driver::sys;

fn check(what: &str, r: sys::CUresult) -> Result<()> {
    r.result().map_err(|e| Error::CudaError(format!("{what}: {e}")))
}

fn cu_device(ordinal: usize) -> Result<sys::CUdevice> {
    let mut d: sys::CUdevice = 0;
    // SAFETY: valid out-pointer; the driver was initialised by `device_count`.
    check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut d, ordinal as i32) })?;
    Ok(d)
}

/// Whether `me` can load/store the GPU with UUID `peer_uuid`: `Some(answer)`,
/// or `None` when this process does not see that GPU (or `me` is not a CUDA
/// device). Creates no context.
pub(crate) fn cuda_can_access_uuid(me: &Device, peer_uuid: &[u8; 16]) -> Result<Option<bool>> {
    if me.kind() != RuntimeKind::Cuda {
        return Ok(None);
    }
    if &me.uuid() == peer_uuid {
        return Ok(Some(true));
    }
    let mine = cu_device(me.ordinal())?;
    for i in 0..cuda::device_count()? {
        let d = cu_device(i)?;
        // SAFETY: a plain C struct for which all-zero is valid; valid out-pointer.
        let mut u: sys::CUuuid = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        check("cuDeviceGetUuid", unsafe { sys::cuDeviceGetUuid_v2(&mut u, d) })?;
        if u.bytes.iter().zip(peer_uuid).all(|(a, b)| *a as u8 == *b) {
            let mut ok = 0;
            // SAFETY: valid out-pointer and device handles.
            check("cuDeviceCanAccessPeer", unsafe { sys::cuDeviceCanAccessPeer(&mut ok, mine, d) })?;
            return Ok(Some(ok != 0));
        }
    }
    Ok(None)
}
