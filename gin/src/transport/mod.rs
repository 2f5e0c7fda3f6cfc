//! Transports: how the proxy's operations reach a peer.
//!
//! A [`Transport`] carries puts and signals from this rank to its peers and
//! lands what peers send here through a [`Landing`]: the data is written
//! first (with [`LocalMemory::write_device`], or queued on a
//! [`crate::CopyQueue`] and a fence behind it waited for), and only once it
//! is visible is the signal added, so a signal never becomes visible before
//! its data.
//! Operations to one peer are delivered in the order they were issued.
//!
//! * [`tcp::TcpTransport`]: a full mesh of TCP connections (between hosts,
//!   or between emulated nodes on one host).
//! * [`copy_engine::CopyEngineTransport`]: same-host peers through the copy
//!   engine, asynchronously (work retires when a fence behind it passes:
//!   [`Transport::issued`] / [`Transport::retired`]).

pub mod copy_engine;
pub mod tcp;
#[cfg(feature = "verbs")]
pub mod verbs;

use crate::descriptor::RemoteSignal;
use crate::{GinHostError, GinResult, LocalMemory};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A peer the transport found failed (connection broken, protocol error).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerFailure {
    /// World rank of the peer.
    pub peer: usize,
    /// What happened.
    pub error: GinHostError,
}

/// Where a put lands and what follows it: the part of every put that a
/// [`Transport`] carries, whatever the data's source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PutTarget {
    /// The peer (world rank).
    pub peer: usize,
    /// The destination window.
    pub dst_window: u32,
    /// Byte offset in it.
    pub dst_offset: u64,
    /// A signal to add to at the peer once the data is visible there.
    pub signal: Option<RemoteSignal>,
}

impl PutTarget {
    /// `signal` after the data, at `dst_offset` of window `dst_window` of `peer`.
    pub const fn new(peer: usize, dst_window: u32, dst_offset: u64, signal: Option<RemoteSignal>) -> Self {
        PutTarget { peer, dst_window, dst_offset, signal }
    }
}

/// Where a get reads: `bytes` at `src_offset` of window `src_window` of
/// `peer` (the byte count travels beside it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GetSource {
    /// The peer (world rank) whose window is read.
    pub peer: usize,
    /// The window there.
    pub src_window: u32,
    /// Byte offset in it.
    pub src_offset: u64,
}

/// Carries operations to peers and applies what peers send. Driven by one
/// proxy thread.
pub trait Transport: Send {
    /// Sends `data` to `to.dst_offset` of window `to.dst_window` on
    /// `to.peer`, then (in order after the data) applies `to.signal` there.
    /// Returns once `data` has been consumed (the caller may reuse it);
    /// delivery may complete later but stays ordered with every other
    /// operation to `peer`. `Remote` if `peer` is unreachable; `Invalid`
    /// if the request is malformed (detected locally).
    fn put(&mut self, to: PutTarget, data: &[u8]) -> GinResult<()>;
    /// Adds `value` to signal `signal` on `peer`, after every earlier
    /// operation to `peer`.
    fn signal(&mut self, peer: usize, signal: u32, value: u64) -> GinResult<()>;
    /// Puts `bytes` from this rank's device address `src` to `to` (as
    /// [`Transport::put`]). The default stages the data through `buf` in
    /// pieces of at most [`crate::proxy::PUT_CHUNK`] bytes read with
    /// [`LocalMemory::read_device`]; transports with a device data path
    /// (the copy engine) override it.
    fn put_from_device(
        &mut self,
        local: &dyn LocalMemory,
        to: PutTarget,
        src: u64,
        bytes: u64,
        buf: &mut Vec<u8>,
    ) -> GinResult<()> {
        let PutTarget { peer, dst_window, dst_offset, signal } = to;
        if bytes == 0 {
            return self.put(PutTarget::new(peer, dst_window, dst_offset, signal), &[]);
        }
        let mut done = 0u64;
        while done < bytes {
            let n = (bytes - done).min(crate::proxy::PUT_CHUNK as u64) as usize;
            if buf.len() < n {
                buf.resize(n, 0);
            }
            local.read_device(src + done, &mut buf[..n])?;
            let last = done + n as u64 == bytes;
            self.put(PutTarget::new(peer, dst_window, dst_offset + done, if last { signal } else { None }), &buf[..n])?;
            done += n as u64;
        }
        Ok(())
    }
    /// Reads `bytes` (> 0) from `from` into this rank's device address `dst`
    /// (inside one of its windows: the proxy resolved it). Returns once
    /// issued; the data is visible here once [`Transport::retired`] reaches
    /// the [`Transport::issued`] mark taken after this call, and it stays
    /// ordered with nothing else (a get is no fence for earlier puts).
    /// `Remote` if `peer` is unreachable; `Invalid` for a bad request, or
    /// from transports that carry no gets (the default).
    fn get(&mut self, from: GetSource, dst: u64, bytes: u64) -> GinResult<()> {
        let _ = (dst, bytes);
        Err(GinHostError::Invalid(format!("this GIN transport carries no gets (a get from rank {})", from.peer)))
    }
    /// Receives and applies what peers sent (where the transport does that
    /// on the caller's thread), and appends peers found failed since the
    /// last call to `failed`. `Err` means the whole transport failed.
    fn progress(&mut self, failed: &mut Vec<PeerFailure>) -> GinResult<()>;
    /// Pushes out everything issued so far (no buffering left on this side),
    /// or — where that costs a driver call per flush — at least arranges
    /// that [`Transport::progress`] pushes it out soon without further
    /// calls (the copy engine holds work back while a fence is in flight).
    /// Peers that fail here are reported by the next [`Transport::progress`].
    fn flush(&mut self) -> GinResult<()>;
    /// A mark for the work issued so far: once [`Transport::retired`]
    /// reaches it, that work no longer needs its source (a put's source may
    /// be reused) and its signals have been applied or handed off in order.
    /// Transports that finish each operation before returning keep the
    /// default (0: always retired).
    fn issued(&self) -> u64 {
        0
    }
    /// How far issued work has retired (see [`Transport::issued`]); applies
    /// the signals whose data has landed. `Err` means the whole transport
    /// failed.
    fn retired(&mut self) -> GinResult<u64> {
        Ok(0)
    }
    /// Closes the transport. `graceful`: peers are told this rank leaves (they
    /// do not treat it as a failure); otherwise connections are cut as if
    /// the process had died. After it returns, nothing is written to this
    /// rank's memory or signals any more.
    fn close(&mut self, graceful: bool);
}

/// Where incoming operations land: this rank's windows and signals.
#[derive(Clone)]
pub struct Landing {
    local: Arc<dyn LocalMemory>,
    signals: *mut u64,
    total_signals: u32,
}

// SAFETY: `signals` is only accessed atomically, and `Landing::new`'s
// contract keeps it alive while any `Landing` exists.
unsafe impl Send for Landing {}
// SAFETY: as above.
unsafe impl Sync for Landing {}

impl std::fmt::Debug for Landing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Landing").field("signals", &self.signals).field("total_signals", &self.total_signals).finish()
    }
}

impl Landing {
    /// Lands operations in `local`'s windows and in the `total_signals`
    /// u64 signal words at `signals`.
    ///
    /// # Safety
    /// `signals` points to `total_signals` 8-aligned u64s that stay alive
    /// while this value or a clone of it is used, and that everybody accesses
    /// atomically.
    pub unsafe fn new(local: Arc<dyn LocalMemory>, signals: *mut u64, total_signals: u32) -> Landing {
        Landing { local, signals, total_signals }
    }

    /// The rank's memory.
    pub fn local(&self) -> &Arc<dyn LocalMemory> {
        &self.local
    }

    /// Number of signals.
    pub fn total_signals(&self) -> u32 {
        self.total_signals
    }

    /// Device address of `bytes` at `offset` of window `window` (checked).
    pub fn window_addr(&self, window: u32, offset: u64, bytes: u64) -> GinResult<u64> {
        self.local.window_addr(window, offset, bytes)
    }

    /// Writes `data` at `dst_offset` of window `dst_window`, returning once
    /// it is visible.
    pub fn put(&self, dst_window: u32, dst_offset: u64, data: &[u8]) -> GinResult<()> {
        if data.is_empty() {
            return Ok(());
        }
        let addr = self.local.window_addr(dst_window, dst_offset, data.len() as u64)?;
        self.local.write_device(addr, data)
    }

    /// `signals[signal] += value` (SeqCst), or `Invalid` if out of range.
    pub fn signal(&self, signal: u32, value: u64) -> GinResult<()> {
        if signal >= self.total_signals {
            return Err(GinHostError::Invalid(format!("signal {signal} out of range ({})", self.total_signals)));
        }
        // SAFETY: in range, alive and atomically accessed (Landing::new's contract).
        unsafe { AtomicU64::from_ptr(self.signals.add(signal as usize)) }.fetch_add(value, Ordering::SeqCst);
        Ok(())
    }
}
