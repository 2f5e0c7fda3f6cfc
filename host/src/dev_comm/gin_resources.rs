//! The GIN part of a device communicator: memory shared by the GPU and the
//! proxy, the proxy itself, and the adapters `devcomm-gin` needs.
//!
//! Memory (see `devcomm_device::gin::abi` for who writes what):
//!
//! * host memory the GPU can read and write ([`HostMappedBuffer`]): rings,
//!   tails, signals, counters — each region 4096-byte aligned;
//! * device memory: producer tickets, cached tails, signal shadows.

use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::gin::GinType;
use crate::runtime::{DeviceBuffer, HostMappedBuffer, Stream};
use devcomm_device::gin::abi::{GinDescriptor, GinState, QueueTail, DESCRIPTOR_BYTES, TAIL_STRIDE};
use devcomm_gin::{Bootstrap, GinHostError, GinHostMemory, GinResult, LocalMemory};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::DevCommRequirements;

/// Maps the proxy's errors onto devcomm's.
pub(crate) fn from_gin(e: GinHostError) -> Error {
    match e {
        GinHostError::Invalid(m) => Error::InvalidArgument(format!("GIN: {m}")),
        GinHostError::Remote(m) => Error::RemoteError(format!("GIN: {m}")),
        GinHostError::System(m) => Error::SystemError(format!("GIN: {m}")),
        GinHostError::Timeout(m) => Error::Timeout(format!("GIN: {m}")),
        GinHostError::Unavailable(m) => Error::InvalidUsage(format!("GIN: {m}")),
    }
}

/// The communicator's bootstrap, as `devcomm-gin` sees it.
pub(crate) struct CommBootstrap<'c>(pub(crate) &'c Communicator);

impl Bootstrap for CommBootstrap<'_> {
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn nranks(&self) -> usize {
        self.0.count()
    }
    fn allgather(&self, data: &[u8]) -> GinResult<Vec<Vec<u8>>> {
        self.0.bootstrap_allgather(data).map_err(|e| GinHostError::Remote(e.to_string()))
    }
}

/// This rank's windows, as the proxy reaches them: window ids resolve
/// through the communicator's window table; copies go through a stream of
/// the proxy's own and return once complete.
pub(crate) struct CommMemory {
    stream: Stream,
    table: Arc<Mutex<HashMap<u32, (u64, u64)>>>,
}

impl LocalMemory for CommMemory {
    fn window_addr(&self, window: u32, offset: u64, bytes: u64) -> GinResult<u64> {
        let table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let &(base, size) = table
            .get(&window)
            .ok_or_else(|| GinHostError::Invalid(format!("window {window} is not registered on this rank")))?;
        if offset.checked_add(bytes).is_none_or(|end| end > size) {
            return Err(GinHostError::Invalid(format!(
                "{bytes} bytes at offset {offset} exceed window {window} ({size} bytes)"
            )));
        }
        Ok(base + offset)
    }

    fn write_device(&self, addr: u64, data: &[u8]) -> GinResult<()> {
        self.stream.write_raw(addr, data).map_err(|e| GinHostError::System(e.to_string()))
    }

    fn read_device(&self, addr: u64, out: &mut [u8]) -> GinResult<()> {
        self.stream.read_raw(addr, out).map_err(|e| GinHostError::System(e.to_string()))
    }
}

/// Offsets of the regions inside the host buffer.
struct HostLayout {
    rings: usize,
    tails: usize,
    signals: usize,
    counters: usize,
    len: usize,
}

fn host_layout(rings: usize, depth: usize, signals: usize, counters: usize) -> HostLayout {
    let page = |x: usize| x.next_multiple_of(4096);
    let r = 0;
    let t = page(r + rings * depth * DESCRIPTOR_BYTES);
    let s = page(t + rings * TAIL_STRIDE);
    let c = page(s + signals * 8);
    HostLayout { rings: r, tails: t, signals: s, counters: c, len: page(c + counters.max(1) * 8) }
}

/// GIN memory and the running proxy of one device communicator.
pub(crate) struct GinResources {
    pub(crate) state: GinState,
    pub(crate) backend: GinType,
    /// Host view of the memory the proxy serves (signals, counters).
    pub(crate) mem: GinHostMemory,
    proxy: Option<devcomm_gin::proxy::Proxy>,
    // Dropped after the proxy (field order): the proxy reads this memory.
    _host: HostMappedBuffer,
    _dev: DeviceBuffer<u64>,
}

impl GinResources {
    /// Allocates GIN memory, connects the transport and starts the proxy.
    /// Collective (the transport connects every pair of ranks).
    pub(crate) fn create(comm: &Communicator, req: &DevCommRequirements, backend: GinType) -> Result<GinResources> {
        if backend != GinType::Proxy {
            return Err(Error::invalid_usage(format!(
                "GIN backend {backend} has no host implementation in this build (the proxy does)"
            )));
        }
        let dev = comm.device().clone();
        let nranks = comm.count();
        let (contexts, depth) = req.gin_shape();
        let rings = contexts as usize * nranks;
        let total_signals =
            req.gin_signal_count as usize + req.rail_gin_barrier_count as usize + req.world_gin_barrier_count as usize;
        let counters = req.gin_counter_count as usize;
        let lay = host_layout(rings, depth as usize, total_signals, counters);
        let host = HostMappedBuffer::new(&dev, lay.len)?;
        let dev_words = 2 * rings + total_signals.max(1);
        let mut dev_mem = dev.alloc::<u64>(dev_words)?;
        dev.stream().memset(&mut dev_mem, 0)?;
        dev.stream().synchronize()?;
        let h = host.host_ptr();
        let d = host.device_addr();
        let state = GinState {
            backend: backend.code(),
            connection: req.gin_connection_type.code(),
            contexts,
            queue_depth: depth,
            signal_count: req.gin_signal_count,
            counter_count: req.gin_counter_count,
            rail_barrier_count: req.rail_gin_barrier_count,
            world_barrier_count: req.world_gin_barrier_count,
            rings: d + lay.rings as u64,
            tails: d + lay.tails as u64,
            heads: dev_mem.device_addr(),
            tail_cache: dev_mem.device_addr() + rings as u64 * 8,
            signals: d + lay.signals as u64,
            counters: d + lay.counters as u64,
            shadows: dev_mem.device_addr() + 2 * rings as u64 * 8,
        };
        // SAFETY: offsets inside the live host buffer, which outlives the proxy
        // (field order of GinResources).
        let mem = unsafe {
            GinHostMemory {
                rings: h.add(lay.rings) as *mut GinDescriptor,
                tails: h.add(lay.tails) as *mut QueueTail,
                signals: h.add(lay.signals) as *mut u64,
                counters: h.add(lay.counters) as *mut u64,
                contexts,
                nranks: nranks as u32,
                depth,
                total_signals: total_signals as u32,
                counters_len: counters as u32,
            }
        };
        let local: Arc<dyn LocalMemory> =
            Arc::new(CommMemory { stream: dev.new_stream()?, table: comm.ext.window_table.clone() });
        let boot = CommBootstrap(comm);
        // SAFETY: the signals region holds `total_signals` u64s of the host
        // buffer, which outlives the transport and the proxy (field order).
        let landing = unsafe { devcomm_gin::transport::Landing::new(local.clone(), mem.signals, total_signals as u32) };
        let tcp = devcomm_gin::transport::tcp::TcpConfig::from_env().map_err(from_gin)?;
        let transport = devcomm_gin::transport::tcp::TcpTransport::connect(&boot, landing, &tcp).map_err(from_gin)?;
        // SAFETY: `mem` names the live host buffer (kept until the proxy has
        // stopped, by field order and `stop`); producers post with
        // `devcomm_device::gin::queue::post`, which accesses shared words atomically.
        let proxy = unsafe { devcomm_gin::proxy::Proxy::start(mem, local, Box::new(transport), comm.rank()) }
            .map_err(from_gin)?;
        Ok(GinResources { state, backend, mem, proxy: Some(proxy), _host: host, _dev: dev_mem })
    }

    /// Stops the proxy after it has drained its rings; reports its error.
    pub(crate) fn stop(&mut self) -> Result<()> {
        match self.proxy.take() {
            Some(p) => p.stop().map_err(from_gin),
            None => Ok(()),
        }
    }
}

impl Drop for GinResources {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::warn!("GIN proxy stopped with an error: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_regions_are_page_aligned_and_disjoint() {
        let l = host_layout(8 * 4, 256, 10, 3);
        assert_eq!(l.rings, 0);
        assert!(l.tails >= 32 * 256 * 64 && l.tails % 4096 == 0);
        assert!(l.signals >= l.tails + 32 * TAIL_STRIDE && l.signals % 4096 == 0);
        assert!(l.counters >= l.signals + 80 && l.counters % 4096 == 0);
        assert!(l.len >= l.counters + 24);
    }
}
