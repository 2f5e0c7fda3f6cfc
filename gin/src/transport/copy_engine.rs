//! The CopyEngine transport: peers on the same host, reached without a
//! network.
//!
//! For each same-host peer, `devcomm` maps into this process the peer's
//! windows (the device memory behind them, imported from file descriptors)
//! and the peer's signal array (host shared memory). A put then is one
//! copy-engine copy from this rank's window into the peer's mapped window,
//! returning once it is complete, followed by an atomic add on the peer's
//! signal word: the signal can only be seen after the data it follows.
//! Operations to one peer run one after another on the proxy thread, so
//! they stay ordered. Peers on other hosts go to the `fallback` transport
//! (TCP), which also keeps receiving for this rank.

use super::{PeerFailure, Transport};
use crate::descriptor::RemoteSignal;
use crate::{GinHostError, GinResult, LocalMemory};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A same-host peer as this process sees it.
pub struct SameHostPeer {
    /// The peer's windows mapped here: window id → (device address, usable size).
    pub windows: HashMap<u32, (u64, u64)>,
    /// The peer's signal array mapped here (host address of `total_signals` u64s).
    pub signals: *mut u64,
    /// Length of the signal array.
    pub total_signals: u32,
}

// SAFETY: `signals` is only accessed atomically, and `devcomm` keeps the
// mapping alive while the transport exists (see `CopyEngineTransport::new`).
unsafe impl Send for SameHostPeer {}

/// Same-host peers through the copy engine, the others through `fallback`.
pub struct CopyEngineTransport {
    local: Arc<dyn LocalMemory>,
    peers: Vec<Option<SameHostPeer>>,
    fallback: Box<dyn Transport>,
}

impl CopyEngineTransport {
    /// A transport over `peers` (indexed by world rank; `None`: not on this
    /// host, served by `fallback`).
    ///
    /// # Safety
    /// Every mapping named in `peers` (windows and signal arrays) stays
    /// mapped until the transport is dropped, and every access to the
    /// signal words is atomic.
    pub unsafe fn new(
        local: Arc<dyn LocalMemory>,
        peers: Vec<Option<SameHostPeer>>,
        fallback: Box<dyn Transport>,
    ) -> CopyEngineTransport {
        CopyEngineTransport { local, peers, fallback }
    }

    /// Number of peers reached through the copy engine.
    pub fn same_host_peers(&self) -> usize {
        self.peers.iter().filter(|p| p.is_some()).count()
    }

    fn peer(&self, peer: usize) -> Option<&SameHostPeer> {
        self.peers.get(peer).and_then(|p| p.as_ref())
    }

    fn dst(p: &SameHostPeer, peer: usize, window: u32, offset: u64, bytes: u64) -> GinResult<u64> {
        let &(base, size) = p.windows.get(&window).ok_or_else(|| {
            GinHostError::Invalid(format!(
                "window {window} of rank {peer} is not mapped here (declare it with use_window)"
            ))
        })?;
        if offset.checked_add(bytes).is_none_or(|end| end > size) {
            return Err(GinHostError::Invalid(format!(
                "{bytes} bytes at offset {offset} exceed window {window} of rank {peer} ({size} bytes)"
            )));
        }
        Ok(base + offset)
    }

    fn add_signal(p: &SameHostPeer, peer: usize, signal: RemoteSignal) -> GinResult<()> {
        let (id, value) = signal;
        if id >= p.total_signals {
            return Err(GinHostError::Invalid(format!("signal {id} of rank {peer} does not exist")));
        }
        // SAFETY: id < total_signals; the mapping is alive and only accessed
        // atomically (the contract of `new`).
        unsafe { AtomicU64::from_ptr(p.signals.add(id as usize)) }.fetch_add(value, Ordering::SeqCst);
        Ok(())
    }
}

impl Transport for CopyEngineTransport {
    fn put(
        &mut self,
        peer: usize,
        dst_window: u32,
        dst_offset: u64,
        data: &[u8],
        signal: Option<RemoteSignal>,
    ) -> GinResult<()> {
        let Some(p) = self.peer(peer) else {
            return self.fallback.put(peer, dst_window, dst_offset, data, signal);
        };
        if !data.is_empty() {
            let dst = Self::dst(p, peer, dst_window, dst_offset, data.len() as u64)?;
            self.local.write_device(dst, data)?;
        }
        match signal {
            Some(s) => Self::add_signal(p, peer, s),
            None => Ok(()),
        }
    }

    fn signal(&mut self, peer: usize, signal: u32, value: u64) -> GinResult<()> {
        match self.peer(peer) {
            Some(p) => Self::add_signal(p, peer, (signal, value)),
            None => self.fallback.signal(peer, signal, value),
        }
    }

    fn put_from_device(
        &mut self,
        local: &dyn LocalMemory,
        peer: usize,
        dst_window: u32,
        dst_offset: u64,
        src: u64,
        bytes: u64,
        signal: Option<RemoteSignal>,
        buf: &mut Vec<u8>,
    ) -> GinResult<()> {
        let Some(p) = self.peer(peer) else {
            return self.fallback.put_from_device(local, peer, dst_window, dst_offset, src, bytes, signal, buf);
        };
        if bytes > 0 {
            let dst = Self::dst(p, peer, dst_window, dst_offset, bytes)?;
            self.local.copy_device(dst, src, bytes)?;
        }
        match signal {
            Some(s) => Self::add_signal(p, peer, s),
            None => Ok(()),
        }
    }

    fn progress(&mut self, failed: &mut Vec<PeerFailure>) -> GinResult<()> {
        self.fallback.progress(failed)
    }

    fn flush(&mut self) -> GinResult<()> {
        self.fallback.flush()
    }

    fn close(&mut self, graceful: bool) {
        self.fallback.close(graceful)
    }
}
