//! NCCL beside devcomm in the benchmarks (through cudarc's bindings;
//! libnccl is loaded at run time, only when a benchmark asks for it): one
//! communicator type that the programs build their NCCL columns on.

pub use cudarc::nccl::{result, sys};
use devcomm::comm::Communicator;
use devcomm::runtime::Stream;
use devcomm::{Error, Result};

/// An NCCL failure as a devcomm error naming the call.
pub fn err(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::system(format!("NCCL {what}"), std::io::Error::other(format!("{e:?}")))
}

/// A fresh NCCL unique id, as bytes to hand to the other ranks.
pub fn unique_id() -> Result<Vec<u8>> {
    let id = result::get_uniqueid().map_err(|e| err("get_uniqueid", e))?;
    Ok(id.internal.iter().map(|&c| c as u8).collect())
}

/// `stream` as NCCL takes it (CUDA streams only; binds the context).
pub fn cuda_stream(stream: &Stream) -> Result<sys::cudaStream_t> {
    let s = stream.cu_stream()?.ok_or_else(|| Error::invalid_usage("NCCL needs the CUDA runtime"))?;
    Ok(s as sys::cudaStream_t)
}

/// An NCCL communicator, destroyed on drop.
pub struct NcclComm {
    comm: sys::ncclComm_t,
}

impl NcclComm {
    /// Rank `rank` of `nranks` from the id bytes of [`unique_id`] (every
    /// rank calls with the same bytes, on its CUDA device's bound context).
    pub fn init(id: &[u8], nranks: i32, rank: i32) -> Result<NcclComm> {
        let mut uid = sys::ncclUniqueId { internal: [0; 128] };
        for (d, s) in uid.internal.iter_mut().zip(id) {
            *d = *s as _;
        }
        let mut c = std::mem::MaybeUninit::uninit();
        // SAFETY: a valid out-pointer; every rank calls with the same id.
        unsafe { result::comm_init_rank(c.as_mut_ptr(), nranks, uid, rank) }.map_err(|e| err("comm_init_rank", e))?;
        // SAFETY: initialised by the successful call above.
        Ok(NcclComm { comm: unsafe { c.assume_init() } })
    }

    /// An NCCL communicator over `comm`'s ranks and devices (rank 0's id
    /// travels over devcomm's bootstrap); `stream` must be a CUDA stream.
    pub fn over(comm: &Communicator, stream: &Stream) -> Result<NcclComm> {
        cuda_stream(stream)?;
        let id = if comm.rank() == 0 { unique_id()? } else { vec![0; 128] };
        let id = comm.bootstrap_broadcast(0, &id)?;
        NcclComm::init(&id, comm.count() as i32, comm.rank() as i32)
    }

    /// The raw communicator, for `result::*` calls.
    pub fn raw(&self) -> sys::ncclComm_t {
        self.comm
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        // SAFETY: the communicator is ours, destroyed once.
        let _ = unsafe { result::comm_destroy(self.comm) };
    }
}
